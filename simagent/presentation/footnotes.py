"""An answer's numbers with their sources, as the person reads them.

The provenance engine (``context/provenance``) decides each number's status; this module
only draws it, so every front end shows the same statuses: a footnote marker after each
sourced, derived or input number (the engine's span decides where: a table cell, each
end of a range, each side of a ``±``), :data:`UNSOURCED` after an unsourced one, and a
sources block saying where each footnote's number came from. The marker's look is the
medium's (``[1]`` in markdown and HTML, ``¹`` in the terminal); a medium that can link
(the transcript, the notebook) turns a marker into a link to the cell's anchor
(:func:`cell_anchor`). One footnote per distinct source: a value cited twice from the
same line has one number.

Drawing (:func:`footnote`) is pure. :func:`turn_answers` picks the answers worth
footnoting from a trace (each turn's final answer, traced against what came before it,
the session's raw outputs read from disk); :func:`final_numbers` is the final answer's
numbers as ``run --json`` and ACP's ``_meta`` carry them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from simagent.context.provenance.engine import (
    IGNORED,
    Provenance,
    Source,
    SourceIndex,
    Traced,
    trace_answer,
)
from simagent.context.provenance.sources import (
    final_answer,
    sources_from_events,
    trace_final,
)

#: The mark of an unsourced number, in every medium; the sources block says what it means.
UNSOURCED = "[?]"
#: The sources block's line for :data:`UNSOURCED`.
UNSOURCED_NOTE = ("no cell printed this number and it is no simple operation on numbers "
                  "that were printed: unsourced")
#: The heading of the sources block.
SOURCES = "Sources"
_SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")
_OPS = {"difference": "-", "sum": "+", "ratio": "/"}


def cell_anchor(execution: int) -> str:
    """The anchor id of execution ``execution``'s cell in a transcript or notebook."""
    return f"cell-{execution}"


@dataclass(frozen=True)
class Note:
    """One footnote: its number (``key``), the status of the numbers it marks, what the
    sources block says of it (``where``: ``cell 3, output line 1``; ``what``: the line
    shown there, or the derivation), and the cell it points at (``execution``)."""

    key: int
    status: str
    where: str
    what: str
    execution: int | None = None
    line: int | None = None
    kind: str = ""  # the source's kind (engine.SOURCED_KINDS, or input)

    @property
    def anchor(self) -> str | None:
        return None if self.execution is None else cell_anchor(self.execution)

    def plain(self) -> str:
        """``cell 3, output line 1: k_fit = 0.31647`` or ``= [1] - [2] (difference)``."""
        return f"{self.where}: {self.what}" if self.where else self.what


@dataclass(frozen=True)
class Footnoted:
    """An answer with its markers (``text``), its footnotes in order, and the status of
    each claim in the answer's order (what every front end must agree on)."""

    text: str
    notes: tuple[Note, ...]
    statuses: tuple[str, ...]
    unsourced: bool

    def block(self, mark: Callable[[int], str] = lambda k: f"[{k}]") -> list[str]:
        """The sources block as plain lines: each footnote, then what ``[?]`` means."""
        if not self.notes and not self.unsourced:
            return []
        lines = [f"{mark(n.key)} {n.plain()}" for n in self.notes]
        if self.unsourced:
            lines.append(f"{UNSOURCED} {UNSOURCED_NOTE}")
        return lines


def markdown_marker(linked: Callable[[Note], bool]) -> Callable[[Note], str]:
    """A markdown marker: ``[[1]](#cell-3)`` where ``linked(note)`` (its cell is in the
    document), else ``[1]``."""
    return lambda n: f"[[{n.key}]](#{n.anchor})" if linked(n) else f"[{n.key}]"


def markdown_sources(f: Footnoted, linked: Callable[[Note], bool]) -> str:
    """The sources block in markdown, after a blank line (empty without footnotes): each
    footnote, its cell a link where ``linked``, the line shown there as code."""
    lines = []
    for n in f.notes:
        where = f"[{n.where}](#{n.anchor})" if linked(n) else n.where
        what = _inline_code(n.what) if n.status in ("sourced", "input") else n.what
        lines.append(f"- [{n.key}] {where}: {what}" if where else f"- [{n.key}] {what}")
    if f.unsourced:
        lines.append(f"- {f.block()[-1]}")
    return f"\n\n**{SOURCES}**\n\n" + "\n".join(lines) if lines else ""


def _inline_code(text: str) -> str:
    """``text`` as markdown inline code, however many backticks it holds."""
    run = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * (run + 1)
    return f"{ticks} {text} {ticks}" if run else f"{ticks}{text}{ticks}"


def bracket(note: Note) -> str:
    return f"[{note.key}]"


def sup(key: int) -> str:
    """``12`` -> ``¹²``: a footnote's number as the terminal marks it."""
    return str(key).translate(_SUPERSCRIPT)


def superscript(note: Note) -> str:
    return sup(note.key)


def footnote(answer: str, provenance: Provenance,
             marker: Callable[[Note], str] = bracket,
             unsourced: str = UNSOURCED,
             ref: Callable[[int], str] = lambda k: f"[{k}]") -> Footnoted:
    """``answer`` with ``marker(note)`` after each claim that has a source and
    ``unsourced`` after each that has none; ignored numbers (code, years, list markers)
    are left as written. ``ref``: how a derivation names its operands' footnotes."""
    claims = [t for t in provenance.numbers if t.status != IGNORED]
    keys: dict[tuple[Any, ...], int] = {}  # a source's identity -> its footnote, in order
    of_claim: list[tuple[Any, ...] | None] = []
    for t in claims:
        if t.status in ("sourced", "input"):
            of_claim.append(_identity(_sourced(t, 0)))
        elif t.status == "derived" and t.derivation is not None:
            of_claim.append(("derived", t.derivation.op, t.derivation.operands))
        else:
            of_claim.append(None)
        if of_claim[-1] is not None:
            keys.setdefault(of_claim[-1], len(keys) + 1)
    notes: dict[tuple[Any, ...], Note] = {}
    by_text: dict[str, int] = {}
    for t, ident in zip(claims, of_claim, strict=True):
        if ident is not None and ident[0] != "derived":
            notes.setdefault(ident, _sourced(t, keys[ident]))
            by_text.setdefault(t.text, keys[ident])
    for t, ident in zip(claims, of_claim, strict=True):  # operands' footnotes are known
        if ident is not None and ident not in notes:
            notes[ident] = Note(keys[ident], "derived", "",
                                _derivation(t, claims, by_text, ref))
    out, at = [], 0
    for t, ident in zip(claims, of_claim, strict=True):
        out += [answer[at:t.end], unsourced if ident is None else marker(notes[ident])]
        at = t.end
    out.append(answer[at:])
    return Footnoted("".join(out), tuple(sorted(notes.values(), key=lambda n: n.key)),
                     tuple(t.status for t in claims), None in of_claim)


def _identity(note: Note) -> tuple[Any, ...]:
    """What makes two claims one footnote: the same place (or the same derivation)."""
    return (note.status, note.where, note.what)


def _sourced(t: Traced, key: int) -> Note:
    src = t.source
    if src is None:  # the engine always locates these; a bare note if not
        return Note(key, t.status, "", t.text)
    if t.status == "input" or src.kind == "input":
        return Note(key, "input", "from your message", src.excerpt)
    if src.kind in ("output", "code") and src.execution is not None:
        what = "output" if src.kind == "output" else "code"
        return Note(key, "sourced", f"cell {src.execution}, {what} line {src.line}",
                    src.excerpt, src.execution, src.line, src.kind)
    label = src.label or src.kind
    return Note(key, "sourced", f"{label}, line {src.line}", src.excerpt, kind=src.kind)


def _derivation(t: Traced, claims: Sequence[Traced], by_text: dict[str, int],
                ref: Callable[[int], str]) -> str:
    """``= [1] - [3] (difference)``: the operation on the operands' footnotes, in the
    order that gives the derived value."""
    d = t.derivation
    assert d is not None
    a_text, b_text = d.operands
    names = [ref(by_text[x]) if x in by_text else x for x in (a_text, b_text)]
    values = [next((c.seen if c.seen is not None else c.value for c in claims
                    if c.text == x and c.status in ("sourced", "input")), math.nan)
              for x in (a_text, b_text)]
    if _swapped(d.op, d.value, *values):
        names.reverse()
    a, b = names
    if d.op in _OPS:
        return f"= {a} {_OPS[d.op]} {b} ({d.op})"
    if d.op == "mean":
        return f"= mean of {a} and {b}"
    return f"= ({b} - {a}) / {a} (percent change from {a} to {b})"


def _swapped(op: str, value: float, a: float, b: float) -> bool:
    """Whether the derivation reads right with its operands the other way round."""
    a, b = abs(a), abs(b)
    if op == "difference":
        return a < b
    if op == "ratio" and a and b:
        return abs(b / a - value) < abs(a / b - value)
    if op == "percent change" and a and b:
        return abs((a - b) / b - value) < abs((b - a) / a - value)
    return False


# ------------------------------------------------------------------ which answers
@dataclass(frozen=True)
class TracedAnswer:
    """An answer of a trace: its text, its numbers, and the sources they were traced
    against (what an expanded footnote shows lines of)."""

    text: str
    provenance: Provenance
    sources: tuple[Source, ...]


def turn_answers(events: Sequence[Any]) -> dict[int, Provenance]:
    """Each turn's final answer (the main agent's last message before the person's next
    one), by its trace event id, traced against what came before it. Events whose payload
    is no mapping (a trace written by odd hands) are passed over."""
    return {i: t.provenance for i, t in trace_answers(events).items()}


def final_ids(events: Sequence[Any]) -> list[int]:
    """The event ids of each turn's final answer (see :func:`turn_answers`)."""
    finals: list[int] = []
    last = None
    for e in events:
        if not isinstance(e.payload, dict):
            continue
        if e.kind == "message_user" and last is not None:
            finals.append(last)
            last = None
        elif e.kind == "message_assistant" and (e.payload.get("agent") or "main") == "main" \
                and str(e.payload.get("content") or "").strip():
            last = e.id
    return finals + ([last] if last is not None else [])


def trace_answers(events: Sequence[Any], ids: Iterable[int] | None = None
                  ) -> dict[int, TracedAnswer]:
    """The answers ``ids`` (each turn's final answer when ``None``), each traced against
    the events before it, with the sources it was traced against."""
    events = [e for e in events if isinstance(e.payload, dict)]
    wanted = set(final_ids(events) if ids is None else ids)
    out = {}
    for e in events:
        if e.id in wanted:
            sources = tuple(sources_from_events(events, before=e.id))
            text = str(e.payload.get("content") or "")
            out[e.id] = TracedAnswer(text, trace_answer(text, SourceIndex(sources)), sources)
    return out


def cited_cells(answers: dict[int, Provenance]) -> set[int]:
    """The executions whose output or code the answers' numbers come from."""
    return {t.source.execution for prov in answers.values() for t in prov.claims
            if t.source is not None and t.source.kind in ("output", "code")
            and t.source.execution is not None}


def final_provenance(events: Sequence[Any], result: Any) -> Provenance | None:
    """Where each number of the turn's final answer came from; ``None`` for a turn that
    ended with no final answer or in an error (the last answer is an earlier turn's).
    The one reading of a turn's numbers: ``run --json`` and ACP's ``_meta`` both use it."""
    if not getattr(result, "final", None) or getattr(result, "status", None) == "error":
        return None
    return trace_final(events)


def final_numbers(events: Sequence[Any], result: Any) -> list[dict[str, Any]]:
    """The turn's final answer's numbers, ``[{text, value, status, source}]`` (the
    engine's :meth:`Provenance.as_json`, as ``run --json`` writes them)."""
    prov = final_provenance(events, result)
    return [] if prov is None else prov.as_json()


# ------------------------------------------------------------ a source's own lines
#: Lines shown either side of a footnote's line when it is expanded (the TUI's ctrl+O).
AROUND = 2


def trace_last(events: Sequence[Any]) -> TracedAnswer | None:
    """The trace's final answer traced against what came before it, or ``None``."""
    answer = final_answer(events)
    if answer is None:
        return None
    sources = tuple(sources_from_events(events, before=answer.id))
    text = str(answer.payload.get("content", ""))
    return TracedAnswer(text, trace_answer(text, SourceIndex(sources)), sources)


def source_lines(note: Note, sources: Sequence[Source], around: int = AROUND
                 ) -> list[tuple[int, str]]:
    """The lines of ``note``'s source around its line, ``(line number, text)``: what the
    cell printed (or ran) there; none for a derived, input or unplaced note."""
    if note.execution is None or note.line is None:
        return []
    for src in sources:
        if src.kind != note.kind or src.execution != note.execution:
            continue
        lines = src.text.split("\n")
        if lines[-1] == "":  # the text's last newline ends a line; it starts none
            lines.pop()
        at = note.line - src.line_offset - 1
        if 0 <= at < len(lines):
            lo, hi = max(0, at - around), min(len(lines), at + around + 1)
            return [(src.line_offset + i + 1, lines[i].rstrip("\r")) for i in range(lo, hi)]
    return []

