"""The sources of an answer, read from a session's trace and its raw outputs on disk.

An answer's numbers may come from what happened before it (``before``, the answer's own
trace event id): each execution's raw output (``outputs/NNNN.txt``, uncapped, so a
number the model never saw in a capped result still has its cell), the code each
execution ran, every other tool's result (subagent reports included), and the person's
messages. A cell that ran after the answer is no source of it. Simulator warm-up cells
are no one's claim and are skipped. Raw files are read head and tail when huge
(:data:`RAW_HEAD_TAIL_BYTES`); what each shows is read once (``read_cache``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from simagent.context.provenance.engine import (
    INPUT,
    Provenance,
    Source,
    SourceIndex,
    trace_answer,
)
from simagent.context.provenance.read_cache import output_reads
from simagent.tool_names import RUN_PYTHON

#: A raw output file larger than twice this is read as its first and last this many
#: bytes: results are printed last, and progress logs in the middle carry no claims.
RAW_HEAD_TAIL_BYTES = 8 * 1024 * 1024


def raw_sources(path: Path, execution: int | None) -> tuple[Source, ...]:
    """A raw output file as one source (two, head and tail, when it is huge), with what it
    shows read once (``read_cache``)."""
    try:
        st = path.stat()
    except OSError:
        return ()
    size = st.st_size
    reads = output_reads(path, size, st.st_mtime_ns, lambda: _read_parts(path, size))
    return tuple(Source("output", text, execution, line_offset=offset, read=read)
                 for text, offset, read in reads)


def _read_parts(path: Path, size: int) -> list[tuple[str, int]]:
    """The first ``size`` bytes of ``path`` as text: whole, or its head and tail (each
    with the lines before it) when larger than twice :data:`RAW_HEAD_TAIL_BYTES`."""
    limit = RAW_HEAD_TAIL_BYTES
    try:
        with open(path, "rb") as fh:
            if size <= 2 * limit:
                return [(fh.read(size).decode("utf-8", "replace"), 0)]
            head = fh.read(limit)
            skipped = 0
            while fh.tell() < size - limit:  # count the middle's lines, never hold it
                skipped += fh.read(min(1 << 20, size - limit - fh.tell())).count(b"\n")
            tail = fh.read(limit)
    except OSError:
        return []
    head_text = head[:head.rfind(b"\n") + 1].decode("utf-8", "replace")
    cut = tail.find(b"\n") + 1  # the tail may start mid-line: drop that part line
    offset = head.count(b"\n") + skipped + tail[:cut].count(b"\n")
    return [(head_text, 0), (tail[cut:].decode("utf-8", "replace"), offset)]


def execution_number(payload: dict[str, Any]) -> int | None:
    """A ``kernel_exec`` event's execution number: its raw file's (``outputs/NNNN.txt``),
    else the kernel's count."""
    raw = payload.get("raw_path")
    if raw and Path(raw).stem.isdigit():
        return int(Path(raw).stem)
    count = payload.get("execution_count")
    return count if isinstance(count, int) else None


def sources_from_events(events: Iterable[Any], *, before: int | None = None) -> list[Source]:
    """The sources of an answer whose trace event id is ``before`` (``None``: all)."""
    out: list[Source] = []
    asked = 0
    for e in events:
        if before is not None and e.id >= before:
            break
        p = e.payload
        if e.kind == "message_user":
            asked += 1
            out.append(Source(INPUT, str(p.get("content", "")), label=f"message {asked}"))
        elif e.kind == "kernel_exec" and not p.get("warmup"):
            n = execution_number(p)
            out.append(Source("code", str(p.get("code", "")), n))
            if p.get("raw_path"):
                out += raw_sources(Path(p["raw_path"]), n)
        elif e.kind == "tool_result" and not p.get("dropped") and p.get("name") != RUN_PYTHON:
            out.append(Source("tool", str(p.get("content", "")), label=str(p.get("name", ""))))
        elif e.kind == "subagent_end" and p.get("report"):
            out.append(Source("tool", json.dumps(p["report"], ensure_ascii=False),
                              label="subagent report"))
    return out


def final_answer(events: Sequence[Any]) -> Any | None:
    """The main agent's last message event (the turn's final answer), or ``None``."""
    return next((e for e in reversed(events) if e.kind == "message_assistant"
                 and e.payload.get("agent", "main") == "main"
                 and str(e.payload.get("content", "")).strip()), None)


def trace_final(events: Sequence[Any]) -> Provenance | None:
    """The provenance of the last answer in ``events`` against what came before it."""
    answer = final_answer(events)
    if answer is None:
        return None
    index = SourceIndex(sources_from_events(events, before=answer.id))
    return trace_answer(str(answer.payload.get("content", "")), index)
