"""Where does a fact stand for the model: in view, one pointer away, or lost — and at what cost.

Every layer that removes content from the view leaves a path behind (a raw output file,
an evicted result, the conversation history). A yes/no "still reachable" lets every policy
that leaves a path pass, however expensive the way back is, so :func:`locate` splits it:

- ``in_view``: the request holds the fact verbatim; free.
- ``by_pointer``: the request names (by absolute path, under allowed roots, or as a
  kernel handle ``_out[n]`` when the session's ``outputs`` folder is given) a file that
  holds it, possibly through a chain — a history file may itself name a raw output.
- ``lost``: neither.

For ``by_pointer`` facts the recovery cost is what the cheapest recovery the harness offers
would cost a model that knows only the pointer, not the fact: deepagents' ``read_file``
pages a file ``DEFAULT_READ_LIMIT`` lines at a time, and a model reading from the start
stops at the page holding what it wants (the next pointer's path in an intermediate
file, the fact in the last one). A kernel's raw output (``outputs/<n>.txt``) can also be
paged back from its end in the kernel (``_out[n].tail``), where results usually are.
``search_tokens`` is a lower bound for a model that can ``grep`` for the exact fact
(which it does not know, hence a bound, never a ranking).
Tests and the bench's recall score use this.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from deepagents.middleware.filesystem import DEFAULT_READ_LIMIT
from langchain_core.messages import AIMessage, BaseMessage

from simagent.context.counting import count_text
from simagent.kernel_api.outputs import HANDLE, number_of, raw_name

_PATH = re.compile(r"(/[^\s\]\)\"'`,;]+)")
#: A kernel handle as placeholders, markers and the state card name it: ``_out[12]``.
_HANDLE = re.compile(re.escape(HANDLE) + r"\[(\d+)\]")
#: Sentence and markup characters a path in prose may end with (``**/x/y.txt**.``).
_TRAILING = ".:!?*>}…"

#: Lines per ``read_file`` page: deepagents' default ``limit`` (middleware/filesystem.py).
PAGE_LINES = DEFAULT_READ_LIMIT
#: Tokens one tool call costs besides the returned text: the call (name, JSON arguments),
#: the tool message's framing and the read header. An estimate, charged once per call.
CALL_OVERHEAD_TOKENS = 30

Status = Literal["in_view", "by_pointer", "lost"]
STATUSES: tuple[Status, ...] = ("in_view", "by_pointer", "lost")


@dataclass(frozen=True)
class FactLocation:
    """Where a fact is for a model that sees one request (see the module docstring)."""

    status: Status
    pointer: str | None = None  # first path of the chain, as the request names it
    chain: tuple[str, ...] = ()  # paths followed, in order, as each text names them
    recovery_tokens: int | None = None  # read_file pages through each wanted text
    search_tokens: int | None = None  # lower bound: a grep for the fact in the last file


def request_text(messages: Sequence[BaseMessage]) -> str:
    parts = []
    for msg in messages:
        parts.append(msg.text)
        if isinstance(msg, AIMessage):
            parts.extend(str(c.get("args")) for c in msg.tool_calls)
    return "\n".join(parts)


def _pointers(text: str, roots: Sequence[Path], outputs: Path | None = None
              ) -> list[tuple[str, Path, int]]:
    """(name as written, path, end of its first mention) per existing file under ``roots``,
    and per ``_out[n]`` handle whose raw output is in ``outputs`` (the kernel serves it)."""
    first: dict[str, int] = {}
    for m in _PATH.finditer(text):
        name = m.group(1).rstrip(_TRAILING)
        first.setdefault(name, m.start() + len(name))
    found = []
    for name, end in first.items():
        path = Path(name)
        try:
            if path.is_file() and any(path.resolve().is_relative_to(r) for r in roots):
                found.append((name, path, end))
        except OSError:
            continue
    if outputs is not None:
        handles: dict[str, tuple[int, int]] = {}  # name -> (execution, end of first mention)
        for m in _HANDLE.finditer(text):
            handles.setdefault(m.group(0), (int(m.group(1)), m.end()))
        for name, (n, end) in handles.items():
            path = outputs / raw_name(n)
            if path.is_file():
                found.append((name, path, end))
    return found


def paths_in(text: str, roots: Iterable[Path]) -> list[Path]:
    """Existing files under ``roots`` that ``text`` names."""
    return [p for _, p, _ in _pointers(text, [Path(r).resolve() for r in roots])]


def _pages_through(text: str, end: int) -> int:
    """Tokens of paging ``text`` from the start through the page holding index ``end - 1``.

    Pages are cut as deepagents' backends cut them (``splitlines(keepends=True)``, so a page
    is its lines with their terminators).
    """
    lines = text.splitlines(keepends=True)
    last, pos = 0, 0
    while last < len(lines) - 1 and pos + len(lines[last]) < end:  # to the line holding end-1
        pos += len(lines[last])
        last += 1
    return sum(count_text("".join(lines[i * PAGE_LINES:(i + 1) * PAGE_LINES]))
               + CALL_OVERHEAD_TOKENS for i in range(last // PAGE_LINES + 1))


def read_cost(text: str, wanted: str) -> int | None:
    """Tokens of paging ``text`` from the start through the page holding ``wanted``.

    Each page is counted as the tool result it would be (its own lines) plus
    :data:`CALL_OVERHEAD_TOKENS`; None when ``wanted`` is not in ``text``.
    """
    at = text.find(wanted) if wanted else -1
    return None if at < 0 else _pages_through(text, at + len(wanted))


def tail_cost(text: str, wanted: str) -> int | None:
    """Tokens of paging ``text`` back from its end (``_out[n].tail``) through the page
    holding the last occurrence of ``wanted``; None when it is not there."""
    at = text.rfind(wanted) if wanted else -1
    if at < 0:
        return None
    lines = text.splitlines(keepends=True)
    line = text.count("\n", 0, at)  # the line holding the occurrence's start
    from_end = len(lines) - 1 - line
    pages = [lines[max(0, len(lines) - (i + 1) * PAGE_LINES):len(lines) - i * PAGE_LINES]
             for i in range(from_end // PAGE_LINES + 1)]
    return sum(count_text("".join(page)) + CALL_OVERHEAD_TOKENS for page in pages)


def recovery_cost(path: Path, text: str, wanted: str) -> int | None:
    """The cheapest way the harness offers to reach ``wanted`` in the file at ``path``:
    ``read_file`` pages from the start and, for a kernel's raw output, which ``_out[n]``
    serves in the kernel, pages back from the end with ``.tail``."""
    cost = read_cost(text, wanted)
    if cost is not None and number_of(path) is not None:
        back = tail_cost(text, wanted)
        cost = min(cost, back) if back is not None else cost
    return cost


def search_cost(text: str, fact: str) -> int | None:
    """Tokens of a ``grep`` answer for ``fact``: the line(s) it sits on, plus one call."""
    at = text.find(fact)
    if at < 0 or not fact:
        return None
    start = text.rfind("\n", 0, at) + 1
    end = text.find("\n", at + len(fact))
    return count_text(text[start:end if end >= 0 else len(text)]) + CALL_OVERHEAD_TOKENS


def locate(fact: str, text: str, roots: Iterable[Path], hops: int = 2,
           outputs: Path | None = None) -> FactLocation:
    """Where ``fact`` is from request ``text``: in view, behind the cheapest chain, or lost.
    ``outputs``: the session's raw-output folder, which ``_out[n]`` handles point into.

    Chains of up to ``hops`` files are searched level by level (breadth first); a file is
    expanded again only when reached more cheaply, so the cheapest chain wins and, on ties,
    the shortest, then the one named first. Reads files; writes nothing.
    """
    if fact in text:
        return FactLocation("in_view")
    roots = [Path(r).resolve() for r in roots]
    arrived: dict[Path, int] = {}  # cheapest cost so far of reaching each file
    best: tuple[int, tuple[str, ...], int] | None = None  # (cost, chain, search)
    level = [(0, (name,), path) for name, path, _ in _pointers(text, roots, outputs)]
    for depth in range(1, hops + 1):
        nxt: list[tuple[int, tuple[str, ...], Path]] = []
        for arrival, chain, path in level:
            key = path.resolve()
            if arrived.get(key, arrival + 1) <= arrival or (best and arrival >= best[0]):
                continue
            arrived[key] = arrival
            try:
                body = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            cost = recovery_cost(path, body, fact)
            if cost is not None and (best is None or arrival + cost < best[0]):
                best = (arrival + cost, chain, search_cost(body, fact) or 0)
            for name, target, at in _pointers(body, roots, outputs) if depth < hops else ():
                if target.resolve() != key:
                    nxt.append((arrival + _pages_through(body, at), (*chain, name), target))
        level = nxt
    if best is None:
        return FactLocation("lost")
    cost, chain, search = best
    return FactLocation("by_pointer", pointer=chain[0], chain=chain, recovery_tokens=cost,
                        search_tokens=search)


def reachable(fact: str, text: str, roots: Iterable[Path], hops: int = 2,
              outputs: Path | None = None) -> bool:
    """``fact`` is in ``text`` or in a file under ``roots`` that ``text`` names (≤ hops)."""
    return locate(fact, text, roots, hops, outputs).status != "lost"


def recall(facts: Sequence[str], messages: Sequence[BaseMessage], roots: Iterable[Path],
           outputs: Path | None = None) -> float:
    """Share of ``facts`` reachable from a request (1.0 when there are none)."""
    if not facts:
        return 1.0
    text = request_text(messages)
    roots = list(roots)
    return sum(reachable(f, text, roots, outputs=outputs) for f in facts) / len(facts)
