"""The shell of the unsupported-numbers check (``support``): a run's seen corpus from its
trace, with kernel raw outputs read lazily and bounded (head and tail), cached while a
file is unchanged, since a bench replays one recording under every policy.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from simagent.bench.support import RAW_HEAD_TAIL_BYTES, Corpus, SupportReport, check
from simagent.context.provenance.numbers import Number, extract, seen_values


def file_values(path: Path, limit: int = RAW_HEAD_TAIL_BYTES,
                chunk: int = 1 << 20) -> Iterator[float]:
    """The magnitudes in a (possibly huge) text file, streamed in chunks: its first and
    last ``limit`` bytes, cut at whitespace so no number is split."""
    try:
        size = path.stat().st_size
    except OSError:
        return
    ranges = [(0, size)] if size <= 2 * limit else [(0, limit), (size - limit, size)]
    with path.open("rb") as fh:
        for a, b in ranges:
            fh.seek(a)
            carry = b""
            pos = a
            first = a > 0  # a tail read may start mid-number: drop its first token
            while pos < b:
                data = fh.read(min(chunk, b - pos))
                if not data:
                    break
                pos += len(data)
                data = carry + data
                cut = max(data.rfind(b" "), data.rfind(b"\n"), data.rfind(b"\r"))
                if cut < 0 and pos < b:
                    carry = data
                    continue
                head, carry = (data, b"") if pos >= b else (data[:cut + 1], data[cut + 1:])
                if first:
                    head = head[head.find(b"\n") + 1:] if b"\n" in head else b""
                    first = False
                yield from seen_values(head.decode("utf-8", errors="replace"))
            if carry:
                yield from seen_values(carry.decode("utf-8", errors="replace"))


def raw_values(path: Path) -> frozenset[float]:
    """:func:`file_values` of a kernel's raw output, cached while the file is unchanged:
    a bench replays one recording under every policy, so each run reads the same files."""
    try:
        st = path.stat()
    except OSError:
        return frozenset()
    return _raw_cached(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=512)
def _raw_cached(path: str, size: int, mtime_ns: int) -> frozenset[float]:
    return frozenset(abs(v) for v in file_values(Path(path)))


def corpus_from_events(events: Sequence[Any]) -> tuple[Corpus, list[Number]]:
    """The seen corpus of a run's trace and the numbers its prompt(s) wrote.

    Seen: every tool result the run received (the main agent's and its subagents', read
    files included; results of an abandoned turn, ``dropped``, were never shown), each
    kernel execution's code (the inputs it chose: ``dt = 0.05`` in an answer is backed by
    the cell that set it), subagent reports, and last each execution's raw output file
    (read only if needed, see :data:`KINDS`). Not the agent's own messages: a number it
    made up earlier must not back itself later. Simulator warm-up cells are no one's claim
    and are skipped.
    """
    seen, prompt = Corpus(), []
    for e in events:
        p = e.payload
        if e.kind == "message_user":
            # read as the answer is: "Chen2020" or "h2o2" in a prompt give no numbers
            prompt += [n for n in extract(str(p.get("content", ""))) if not n.glued]
        elif e.kind == "tool_result" and not p.get("dropped"):
            seen.add("output", str(p.get("content", "")))
        elif e.kind == "kernel_exec" and not p.get("warmup"):
            seen.add("code", str(p.get("code", "")))
            if p.get("raw_path"):
                seen.add_lazy("raw", lambda path=Path(p["raw_path"]): raw_values(path))
        elif e.kind == "subagent_end" and p.get("report"):
            seen.add("report", json.dumps(p["report"], ensure_ascii=False))
    return seen, prompt


def check_run(final: str, events: Sequence[Any]) -> SupportReport:
    """The support report of one run's final answer against its trace."""
    seen, prompt = corpus_from_events(events)
    return check(final, seen, prompt)
