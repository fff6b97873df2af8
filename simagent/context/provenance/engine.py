"""Trace each number of an answer to where it came from: the provenance engine (pure).

Every number of an assistant message (``numbers.extract``) is either ignored, with a
named reason (:func:`claim_exclusion`: code the answer quotes, a version, a year, a step
or list marker, a date, a small count, an identifier's digits), or gets one status:

- ``input``: the person wrote it (their messages, a file they gave), exactly: their
  own numbers need no computing, and a rounded echo of one is the answer's own claim.
- ``sourced``: a session source shows it to the digits the answer shows
  (``numbers.window``: rounding, unit prefixes, percent and fraction, sign): a cell's raw
  output (all of it, not only what the model saw), another tool's result, or the code a
  cell ran (a parameter it set). Its location is the execution, the line and that line.
  A place that shows it only by chance backs nothing (:func:`_chance`: a row of a dense
  log or table beside none of the answer's numbers around it, a one- or two-digit value
  among many like it on a line that shares no word with the answer's, or on one that
  gives the setting the answer names another value; a member of a list the answer
  proposes, most of it unsourced, on a line that shows no other member:
  :func:`_lists_together`), and a minus the answer writes must be shown too.
- ``derived``: within its shown digits of a difference, ratio, sum, mean or percent
  change of two of the answer's own sourced or input numbers (their full-precision
  source values, or as written); the operation and operands are named.
- ``sourced`` too, when no source shows the number itself: a percent change the answer
  states as one ("+25 %", "20 % lower", "changed by 25 %") whose factor a source shows
  (``k * 1.25``, ``scale=0.8``: :func:`change_factors`); tried before any derivation.
- ``unsourced``: none of these.

Among several places that show a value the engine names one: the same digits before a
rounding, a cell's output before a tool's result before code, and the latest execution
first (a value printed again by a later cell is the one an answer reports). Which
sources count (the executions before the answer, not one printed after it) is the
caller's choice (``sources``).

The result is plain frozen data (:class:`Provenance`); front ends render it
(``footnotes``, ``run --json``) and never re-decide a status.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import re
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from simagent.context.provenance.numbers import (
    Number,
    extract,
    ignore_reason,
    in_prompt,
    seen_readings,
    structure_spans,
    window,
)

#: A number's statuses, in the order counts are written; ``ignored`` is none of them.
STATUSES = ("sourced", "derived", "input", "unsourced")
IGNORED = "ignored"
#: Source kinds that make a number ``sourced``, the preferred first; ``input`` is the
#: person's own text.
SOURCED_KINDS = ("output", "tool", "code")
INPUT = "input"
#: An excerpt is the source line, cut to about this many characters around the number.
EXCERPT_CHARS = 160
#: At most this many places in one source are weighed for one value (a value a log shows
#: thousands of times is as well placed by its first few).
PER_SOURCE = 12
#: Relative difference granted beyond rounding to the shown digits: float noise only.
#: (The bench's support scorer grants ``numbers.REL_TOL``, an extra digit the output never
#: printed; in a session with per-step logs that backs many a fabricated figure by chance.)
REL_TOL = 1e-9
#: A source of at least this many lines is a log: a value only one of its rows shows
#: backs nothing (``SourceIndex.find``).
LOG_LINES = 200
#: ... and a row of it with at least this many numbers is a log row, not a result line.
LOG_ROW_NUMBERS = 3
#: A run of at least this many numbers written as one list ("0.2C, 0.5C and 1C") is one
#: choice: its members are sourced together or the ones a source shows are chance.
LIST_MEMBERS = 3
#: A line is read this many characters either side of a value to weigh its place.
SHARED_CHARS = 120
#: Derivations are tried only for an answer with at most this many sourced or input
#: numbers to combine (pairs grow quadratically; a long table answer has its own sources).
MAX_OPERANDS = 60
#: A derived number shows at least this many significant digits: a figure of one digit
#: ("0.5", "60 %") is within its shown digits of some operation on nearly any two numbers.
MIN_DERIVED_DIGITS = 2
#: A value of one or two significant digits is shown by chance where the sources would
#: show about this many values in its window by chance (``SourceIndex.chance_values``):
#: ln 2, a chance match as likely as not.
CHANCE_VALUES = math.log(2)
#: ... counting the sources' values within this fraction either side of it.
CHANCE_SPAN = 0.25

#: What lies between two members of a list the answer writes: a comma, "and", "or".
_LIST_GAP = re.compile(r"\s*(?:,\s*(?:and\s+|or\s+)?|\s+(?:and|or)\s+)\Z")
#: A setting the answer states by name: ``rtol = 1e-6``, ``dt: 0.1`` (the name just before).
_NAMED_BEFORE = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)`?\s*(?:=|:)\s*`?\Z")
_FIGURE = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_FENCE = re.compile(r"^[ \t]*(```|~~~).*?(?:^[ \t]*\1[ \t]*$|\Z)", re.M | re.S)
_INLINE = re.compile(r"`[^`\n]+`")
#: Words a version number follows: "version 2.1", "Python 3.11", "FiPy 4.0".
_VERSION_BEFORE = re.compile(r"(?:\bversion|\bv|\brelease|\bpython|\bnumpy|\bscipy|\bpandas"
                             r"|\bfipy|\bpybamm|\bsimpy|\bcantera|\base|\bjupyter)\s*\(?$",
                             re.I)
_STEP_BEFORE = re.compile(r"(?:^|\n)[ \t#*>-]*(?:step|stage|phase|part|item)\s+$", re.I)
#: A percentage is a change up or down when a sign is glued to it ("+25 %", "(-20 %)") or
#: a word before or after it says so ("raised by 25 %", "25 % higher").
_SIGN_BEFORE = re.compile(r"(?:^|[\s(])(?P<sign>[+\-\u2212])$")
_UP_BEFORE = re.compile(r"(?:\bup|\b(?:rais|increas|boost|grow|grew|gain|rise|rose|scal)\w*"
                        r"(?:\s+\w+){0,3}\s+by)\s+$", re.I)
_DOWN_BEFORE = re.compile(r"(?:\bdown|\b(?:lower|reduc|decreas|cut|drop|fell|fall|shr[iau]nk)"
                          r"\w*(?:\s+\w+){0,3}\s+by)\s+$", re.I)
_UP_AFTER = re.compile(r"\s*(?:higher|more|larger|greater|longer|faster|increase|rise|gain"
                       r"|boost|up)\b", re.I)
_CHANGED_BY = re.compile(r"\b(?:chang|vari|adjust|perturb|shift|alter)\w*(?:\s+\w+){0,3}"
                         r"\s+by\s+$", re.I)
_DOWN_AFTER = re.compile(r"\s*(?:lower|less|smaller|shorter|slower|cheaper|decrease|reduction"
                         r"|drop|cut|down)\b", re.I)
_YEAR_NEAR = re.compile(r"(?:\bin|\bsince|\buntil|\bby|\bfrom|\bof|\byear|\bet al\.?,?"
                        r"|\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?)"
                        r"\s*$", re.I)


# ------------------------------------------------------------------------------ data
@dataclass(frozen=True)
class Source:
    """One text a number may come from. ``kind`` is one of :data:`SOURCED_KINDS` or
    ``input``; ``execution`` the cell's number (outputs/NNNN); ``line_offset`` the lines
    before ``text`` in its file (a large output read head and tail); ``read`` what
    ``text`` shows when the caller has it already (a raw output's, ``read_cache``), else
    the index reads it."""

    kind: str
    text: str
    execution: int | None = None
    label: str = ""
    line_offset: int = 0
    read: Read | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Location:
    """Where a value is shown: the source kind, the execution (``None`` for a tool result
    or the person's message), the 1-based line in that text, and that line."""

    kind: str
    execution: int | None
    line: int
    excerpt: str
    label: str = ""

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "execution": self.execution,
                               "line": self.line, "excerpt": self.excerpt}
        if self.label:
            out["label"] = self.label
        return out


@dataclass(frozen=True)
class Derivation:
    """A derived number's operation (``difference``, ``ratio``, ``sum``, ``mean``,
    ``percent change``) and its two operands, as the answer wrote them."""

    op: str
    operands: tuple[str, str]
    value: float

    def as_json(self) -> dict[str, Any]:
        return {"op": self.op, "operands": list(self.operands), "value": self.value}


@dataclass(frozen=True)
class Traced:
    """One number of the answer: as written (``text``, ``start``/``end`` in the answer),
    its value in the written unit, and its status with the reason, location or
    derivation that goes with it."""

    text: str
    value: float
    start: int
    end: int
    status: str
    reason: str | None = None  # why it was ignored
    source: Location | None = None  # sourced or input
    derivation: Derivation | None = None  # derived
    seen: float | None = None  # the source's own value (its full precision)

    def as_json(self) -> dict[str, Any]:
        return {"text": self.text, "value": self.value, "status": self.status,
                "source": None if self.source is None else self.source.as_json(),
                **({"derivation": self.derivation.as_json()} if self.derivation else {})}


@dataclass(frozen=True)
class Provenance:
    """Every number of one answer, in order, ignored ones included."""

    numbers: tuple[Traced, ...]

    @property
    def claims(self) -> tuple[Traced, ...]:
        """The numbers that are claims (not ignored)."""
        return tuple(t for t in self.numbers if t.status != IGNORED)

    @property
    def unsourced(self) -> tuple[Traced, ...]:
        return tuple(t for t in self.numbers if t.status == "unsourced")

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATUSES, 0)
        for t in self.claims:
            out[t.status] += 1
        return out

    def summary(self) -> str:
        """``5 sourced, 1 derived, 0 input, 0 unsourced``."""
        return ", ".join(f"{n} {s}" for s, n in self.counts().items())

    def as_json(self) -> list[dict[str, Any]]:
        """The claims, as ``run --json`` writes them."""
        return [t.as_json() for t in self.claims]


# ----------------------------------------------------------------------------- index
class SourceIndex:
    """Every value the sources show, sorted per source (a raw output's read once per
    session, ``read_cache``; any other text once per process, :func:`values_of`): build
    one per answer cheaply, as a session's earlier outputs were read for its earlier
    answers."""

    def __init__(self, sources: Sequence[Source]) -> None:
        self.sources = tuple(s for s in sources if s.kind != INPUT)
        self._values = [s.read if s.read is not None else values_of(s.text)
                        for s in self.sources]
        # read as the answer is: "Chen2020" or "h2o2" in a prompt give no numbers
        self.inputs = [(n, s) for s in sources if s.kind == INPUT
                       for n in extract(s.text) if not n.glued]

    def __len__(self) -> int:
        return sum(len(v.values) for v in self._values)

    def find(self, number: Number, near: Near | None = None) -> tuple[Location, float] | None:
        """The preferred place showing ``number`` and the value shown there, or ``None``.

        Of several, the one whose line also shows most of the telling numbers around it in
        the answer, then most of the answer's other telling numbers (``near``: a table row
        or summary line the answer reports from, not a per-step log line that shows the
        value by chance), then the same written digits, the same value, a line with fewer
        numbers (a result line, not a log row), a cell's output before a tool's result
        before code, the latest execution. A place that shows it only by chance
        (:func:`_chance`) is none, and a number the answer writes with a minus is shown
        only with one.
        """
        near = near or Near.alone()
        readings = [(abs(v), *window(v, q, REL_TOL)) for v, q in number.readings()]
        found: list[_Hit] = []
        for src, read in zip(self.sources, self._values, strict=True):
            values, ends = read.values, read.ends
            if not values:
                continue
            least, most = values[0], values[-1]
            for _v, lo, hi in readings:
                if hi < least or lo > most:
                    continue
                i = bisect.bisect_left(values, lo)
                j = bisect.bisect_right(values, hi, lo=i)
                found += [(src, read, values[k], read.begins[k], ends[k])
                          for k in range(i, min(j, i + PER_SOURCE))]
        if number is near.number and near.negative:
            found = [h for h in found if h[3] and h[0].text[h[3] - 1] in _MINUS]
        if not found:
            return None
        digits = _digits(number.text)
        lines = {id(h): near.weigh(h[1], h[0].text, h[3]) for h in found}

        def weight(hit: _Hit) -> tuple[int, int]:
            local, shared, _line = lines[id(hit)]
            return -local, -shared

        def key(hit: _Hit) -> tuple[Any, ...]:  # the rest of the order, within one weight
            src, _read, seen, a, b = hit
            return (_digits(src.text[a:b]) != digits,
                    not any(math.isclose(seen, v, rel_tol=1e-9) for v, _lo, _hi in readings),
                    lines[id(hit)][2].crowd,
                    SOURCED_KINDS.index(src.kind) if src.kind in SOURCED_KINDS else 9,
                    -(src.execution if src.execution is not None else -1), a)

        common = functools.cache(lambda: self.chance_values(readings) >= CHANCE_VALUES)
        telling = _telling(near.number or number)
        found.sort(key=weight)
        for _weight, group in itertools.groupby(found, key=weight):
            for hit in sorted(group, key=key):  # the preferred place that is no chance
                if not _chance(hit, lines[id(hit)], near, telling, common):
                    return locate(hit[0], hit[3], hit[4]), hit[2]
        return None

    def chance_values(self, readings: Sequence[tuple[float, float, float]]) -> float:
        """How many values the sources would show in the windows of ``readings`` (value,
        low, high) by chance: their values within :data:`CHANCE_SPAN` either side of each,
        spread evenly, times the window's width."""
        total = 0.0
        for read in self._values:
            for v, lo, hi in readings:
                if v > 0:
                    n = (bisect.bisect_right(read.values, v * (1 + CHANCE_SPAN))
                         - bisect.bisect_left(read.values, v * (1 - CHANCE_SPAN)))
                    total += n * (hi - lo) / (2 * CHANCE_SPAN * v)
        return total

    def find_input(self, number: Number) -> Location | None:
        """Where the person wrote ``number`` (exactly: ``numbers.in_prompt``), or ``None``."""
        for n, src in self.inputs:
            if in_prompt(number, [n]):
                return locate(src, n.start, n.end)
        return None


#: A hit: the source, what it shows, the value seen and where (start, end) in its text.
_Hit = tuple[Source, "Read", float, int, int]
_MINUS = ("-", "\u2212")


def _chance(hit: _Hit, weight: tuple[int, int, _Line], near: Near, telling: bool,
            common: Callable[[], bool]) -> bool:
    """Whether ``hit`` shows the answer's number only by chance; ``weight`` is its line's
    (:meth:`Near.weigh`), ``common`` whether the sources hold values near it by chance.

    A line that shows a telling number of the answer's line around it (a neighbour) backs
    it. Else:

    - a telling value (three significant digits or more) on a row of many numbers
      (:data:`LOG_ROW_NUMBERS`): in a long log (:data:`LOG_LINES`) a row of thousands holds
      one that rounds to nearly any figure, and a long answer's hundred numbers hold one
      such a row shows too, so only a neighbour backs it; in a shorter output or file a
      data row backs it when it shows another of the answer's telling numbers or shares a
      word (a label, a unit, a variable's name) with the answer's line around it.
    - a value of one or two digits (``0.5``, ``60 %``, ``1e-6``), where the sources hold
      values near it (``common``: :data:`CHANCE_VALUES`): a line backs it only when it
      shares a word with the answer's line around it (a setting the model chose, matched
      to an unrelated parameter of the same value, is no source); and where the answer
      names it (``rtol = 1e-6``), a line that gives that name another value
      (``1e-3 for rtol and 1e-6 for atol``) backs it not at all
      (:func:`_named_otherwise`).

    Measured on the labelled set: fabricated values that rows of dense logs and tables
    back by chance, and a plan's settings that a parameter listing shows.
    """
    local, shared, line = weight
    if local:
        return False
    if not telling:
        if (name := near.named()) and _named_otherwise(hit, name):
            return True
        return common() and not near.words_shared(hit[0].text, hit[3], hit[4])
    if line.crowd < LOG_ROW_NUMBERS:
        return False
    if hit[1].lines >= LOG_LINES:
        return True
    return not shared and not near.words_shared(hit[0].text, hit[3], hit[4])


def _named_otherwise(hit: _Hit, name: str) -> bool:
    """Whether the line of ``hit`` gives ``name`` a value other than the one it shows at
    ``hit``: ``name = 1e-3``, ``name: 1e-3`` or ``1e-3 for name``. A line that names it with
    no value, or does not name it, says nothing."""
    text, a, b = hit[0].text, hit[3], hit[4]
    lo, hi = _line_bounds(text, a, b)
    line, word = text[lo:hi], re.escape(name)
    given = [m.start(1) for m in re.finditer(
        rf"\b{word}\b[`'\"]?\s*(?:=|:|\bis\b|\bof\b)\s*[`'\"]?({_FIGURE})", line)]
    given += [m.start(1) for m in re.finditer(
        rf"({_FIGURE})[`'\"]?\s+(?:for|as)\s+[`'\"]?{word}\b", line)]
    return bool(given) and a - lo not in given


def _telling(number: Number) -> bool:
    """A number specific enough that a line showing it too is telling: three significant
    digits or more (a ``20``, a ``0.5`` or a ``1e-6`` shows up everywhere)."""
    return significant(number) >= 3


def significant(number: Number) -> int:
    """The significant digits ``number`` shows: ``900.0`` four, ``0.0021`` two, ``1e-13``
    one, ``20 001`` five, ``2000`` one (an integer's trailing zeros show no precision)."""
    if number.integer:
        return len(_digits(number.text).strip("0"))
    ratio = number.value / number.quantum
    return math.floor(math.log10(ratio) + 1e-9) + 1 if ratio >= 1 else 0


class Near:
    """The answer around one of its numbers, as :meth:`SourceIndex.find` weighs a source
    line by it: the answer's telling numbers (:func:`_telling`, all but this one) as
    value windows, and which of them are this number's neighbours (its answer line,
    within :data:`SHARED_CHARS`). Built once per answer (:class:`_Claims`), so weighing a
    place costs a bisection per value its line shows, not a pass over the answer."""

    def __init__(self, claims: _Claims, own: int | None, local: frozenset[int]) -> None:
        self.claims, self.own, self.local = claims, own, local

    @property
    def negative(self) -> bool:
        """The answer writes this number with a minus ("-0.87 eV", "(-3.7)", a Unicode
        minus too; not the dash of a range "0.5-3")."""
        n, text = self.number, self.claims.answer
        if n is None or n.start < 1 or text[n.start - 1] not in _MINUS:
            return False
        return n.start < 2 or not (text[n.start - 2].isalnum() or text[n.start - 2] in ")]")

    @property
    def number(self) -> Number | None:
        """The answer's number this is around (``None`` for :meth:`alone`)."""
        return None if self.own is None else self.claims.claims[self.own]

    def named(self) -> str | None:
        """The name the answer gives this number as a setting (``rtol = 1e-6``), or ``None``."""
        n = self.number
        if n is None:
            return None
        m = _NAMED_BEFORE.search(self.claims.answer, max(0, n.start - 40), n.start)
        return m.group(1) if m else None

    @classmethod
    def alone(cls) -> Near:
        """No other numbers (an answer of one number)."""
        return cls(_Claims("", ()), None, frozenset())

    def words_shared(self, text: str, a: int, b: int) -> bool:
        """Whether the line around ``text[a:b]`` and the answer's line around this number
        have a word in common (:func:`_words`; one of four letters or more may be part of
        the other: ``corr`` and ``correlation``, ``steps`` and ``nsteps``)."""
        if self.own is None:
            return False
        mine = self.claims.words_near(self.own)
        theirs = self.claims.words_at(text, a, b)
        if mine & theirs:
            return True
        return any(w in t or t in w for w in mine if len(w) >= 4
                   for t in theirs if len(t) >= 4)

    def weigh(self, read: Read, text: str, at: int) -> tuple[int, int, _Line]:
        """(how many neighbours, how many other telling numbers of the answer the line at
        ``at`` shows, that line): the line within :data:`SHARED_CHARS` of ``at``, a
        progress bar's ``\\r`` ending a line too."""
        line = self.claims.on_line(read, text, at)
        if not line.claims:  # most lines show none of the answer's numbers
            return 0, 0, line
        hit = line.claims - {self.own}
        return len(hit & self.local), len(hit), line


class _Claims:
    """An answer's telling claims as sorted value windows, each naming its claim, so a
    source line's values are matched by bisection; a line's matches are kept per answer
    (the same summary line is weighed for many of its numbers), and so are its words."""

    def __init__(self, answer: str, claims: Sequence[Number]) -> None:
        self.claims = tuple(claims)
        telling = [i for i, n in enumerate(self.claims) if _telling(n)]
        spans = sorted((lo, hi, i) for i in telling
                       for lo, hi in (window(v, q, REL_TOL)
                                      for v, q in self.claims[i].readings()))
        self.los = [s[0] for s in spans]
        self.spans = spans
        merged: list[list[float]] = []  # the windows' union: most values fall in none
        for lo, hi, _i in spans:
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        self._union_los = [m[0] for m in merged]
        self._union_his = [m[1] for m in merged]
        self._telling = telling
        self.answer = answer
        self._lines: dict[tuple[int, int, int], _Line] = {}
        self._at: dict[tuple[int, int], _Line] = {}
        self._near_words: dict[int, frozenset[str]] = {}
        self._words: dict[tuple[int, int], frozenset[str]] = {}

    def near(self, i: int) -> Near:
        """The :class:`Near` of claim ``i``: its neighbours are the telling claims on its
        answer line within :data:`SHARED_CHARS` of it."""
        n, text = self.claims[i], self.answer
        lo, hi = _line_bounds(text, n.start, n.end)
        return Near(self, i, frozenset(j for j in self._telling
                                       if j != i and lo <= self.claims[j].start < hi))

    def words_near(self, i: int) -> frozenset[str]:
        """The words of claim ``i``'s answer line around it (:func:`_words`)."""
        if (got := self._near_words.get(i)) is None:
            n, text = self.claims[i], self.answer
            lo, hi = _line_bounds(text, n.start, n.end)
            got = self._near_words[i] = _words(text[lo:n.start] + " " + text[n.end:hi])
        return got

    def words_at(self, text: str, a: int, b: int) -> frozenset[str]:
        """The words of a source's line around ``text[a:b]``, kept per answer."""
        key = (id(text), a)
        if (got := self._words.get(key)) is None:
            lo, hi = _line_bounds(text, a, b)
            got = self._words[key] = _words(text[lo:a] + " " + text[b:hi])
        return got

    def matched(self, values: Sequence[float]) -> frozenset[int]:
        """The claims with a window holding one of ``values``."""
        hit: set[int] = set()
        union_los, union_his = self._union_los, self._union_his
        for v in values:
            u = bisect.bisect_right(union_los, v) - 1
            if u < 0 or v > union_his[u]:
                continue
            k = bisect.bisect_right(self.los, v)
            for lo, hi, i in self.spans[max(0, k - 8):k]:  # windows are narrow
                if lo <= v <= hi:
                    hit.add(i)
        return frozenset(hit)

    def on_line(self, read: Read, text: str, at: int) -> _Line:
        """The line at ``at`` with the claims it shows."""
        if (got := self._at.get((id(read), at))) is not None:
            return got
        start, end = _line_bounds(text, at, at)
        if (got := self._lines.get((id(read), start, end))) is None:
            i, j = bisect.bisect_left(read.starts, start), bisect.bisect_left(read.starts, end)
            got = self._lines[(id(read), start, end)] = _Line(
                self.matched(read.by_start[i:j]), read, text, i, j)
        self._at[(id(read), at)] = got
        return got


class _Line:
    """A source line as one answer weighs it: the answer's claims it shows, and how many
    numbers it shows (``crowd``, counted when first asked: few lines are)."""

    __slots__ = ("_crowd", "_read", "_span", "_text", "claims")

    def __init__(self, claims: frozenset[int], read: Read, text: str, i: int, j: int) -> None:
        self.claims, self._read, self._text, self._span = claims, read, text, (i, j)
        self._crowd: int | None = None

    @property
    def crowd(self) -> int:
        """How many numbers the line shows; an identifier's digits (y1, d2d_ESI2) make no
        row of numbers."""
        if self._crowd is None:
            text, (i, j) = self._text, self._span
            self._crowd = sum(1 for st in set(self._read.starts[i:j])
                              if not (st and (text[st - 1].isalpha() or text[st - 1] == "_")))
        return self._crowd


_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]+|\b[A-Z]\b")
#: Words too common to tie an answer's sentence to a source line.
_STOP = frozenset(re.findall(r"\w+", """
    the and for with from that this are was were is be been at of in on to by as or an it
    its per than then into over under about after before all each which what when where who
    not no so but if also only both between there these those their has have had can will
    would we you my our ll ve re none true false one two"""))


def _words(text: str) -> frozenset[str]:
    """The words of ``text`` that can name a quantity: a letter and letters or digits
    (``tau_ms`` is ``tau`` and ``ms``; ``y2``, ``h0`` and ``R0`` stay whole) or a capital
    alone (``T``, ``B``, ``K``), lower case, no common English word."""
    return frozenset(w for w in (m.lower() for m in _WORD.findall(text)) if w not in _STOP)


def _line_bounds(text: str, a: int, b: int) -> tuple[int, int]:
    """The line of ``text`` around ``text[a:b]``, cut to :data:`SHARED_CHARS` either side
    (a progress bar's ``\\r`` ends a line too)."""
    lo, hi = max(0, a - SHARED_CHARS), b + SHARED_CHARS
    start = max(text.rfind("\n", lo, a), text.rfind("\r", lo, a), lo - 1) + 1
    ends = [e for e in (text.find("\n", b, hi), text.find("\r", b, hi)) if e >= 0]
    return start, min([*ends, hi])


def _digits(text: str) -> str:
    """A number's written digits without sign, unit or grouping: ``-0.00500`` -> ``000500``."""
    return "".join(c for c in text if c.isdigit())


@dataclass(frozen=True)
class Read:
    """What one source text shows: its magnitudes sorted (``values``, each read from
    ``text[begins[k]:ends[k]]``), the same by position (``starts``, ``by_start``), its
    lines. Typed arrays, not lists: a 4.8 MB output shows half a million values, which as
    Python floats and tuples take several times the memory, and as arrays are saved and
    loaded as bytes (``read_cache``)."""

    values: array[float]
    begins: array[int]
    ends: array[int]
    starts: array[int]
    by_start: array[float]
    lines: int

    @property
    def nbytes(self) -> int:
        """The arrays' size in memory."""
        return sum(len(a) * a.itemsize for a in self.arrays())

    def arrays(self) -> tuple[array[Any], ...]:
        """The arrays, in the order ``read_cache`` saves them."""
        return self.values, self.begins, self.ends, self.starts, self.by_start


def read_text(text: str) -> Read:
    """The magnitudes ``text`` shows under every reading (``numbers.seen_readings``)."""
    found = [(abs(v), a, b) for v, a, b in seen_readings(text)]
    by_value = sorted(found)
    by_pos = sorted(found, key=lambda f: f[1])
    return Read(array("d", [f[0] for f in by_value]), array("q", [f[1] for f in by_value]),
                array("q", [f[2] for f in by_value]), array("q", [f[1] for f in by_pos]),
                array("d", [f[0] for f in by_pos]), text.count("\n") + 1)


@functools.lru_cache(maxsize=512)
def values_of(text: str) -> Read:
    """:func:`read_text`, cached by text (a string keeps its hash), so a text given again
    (a cell's code, a tool's result) is read once per process."""
    return read_text(text)


def locate(source: Source, start: int, end: int) -> Location:
    """The :class:`Location` of ``source.text[start:end]``: its line and an excerpt."""
    text = source.text
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    line_end = len(text) if line_end < 0 else line_end
    a, b = line_start, line_end
    if b - a > EXCERPT_CHARS:
        a = max(line_start, start - EXCERPT_CHARS // 2)
        b = min(line_end, a + EXCERPT_CHARS)
    excerpt = text[a:b].strip()
    excerpt = ("…" if a > line_start else "") + excerpt + ("…" if b < line_end else "")
    line = source.line_offset + text.count("\n", 0, start) + 1
    return Location(source.kind, source.execution, line, excerpt, source.label)


# --------------------------------------------------------------------------- tracing
def code_spans(text: str) -> list[tuple[int, int]]:
    """Fenced code blocks and inline code: what the answer quotes, not what it claims."""
    fences = [m.span() for m in _FENCE.finditer(text)]
    inline = [m.span() for m in _INLINE.finditer(text)
              if not any(a <= m.start() < b for a, b in fences)]
    return fences + inline


def claim_exclusion(number: Number, text: str, spans: Sequence[tuple[int, int]],
                    code: Sequence[tuple[int, int]]) -> str | None:
    """Why ``number`` is no claim to trace, or ``None``: ``numbers.ignore_reason``'s reasons
    (identifier, marker, date, small), and the answer's own: ``code`` (inside a code block
    or inline code), ``version`` ("version 2.1", "Python 3.11"), ``step`` ("Step 3"),
    ``year`` (1900-2099 after "in", "since", "by", a month...)."""
    if any(a <= number.start < b for a, b in code):
        return "code"
    before = text[max(0, number.start - 24):number.start]
    if not number.integer and _VERSION_BEFORE.search(before):
        return "version"
    if number.integer and _STEP_BEFORE.search(text[max(0, number.start - 24):number.start]):
        return "step"
    if reason := ignore_reason(number, text, spans, ()):
        return "year" if reason == "date" and len(number.text) == 4 \
            and number.text.isdigit() else reason
    if number.integer and number.text.isdigit() and 1900 <= number.value < 2100 \
            and _YEAR_NEAR.search(before):
        return "year"
    return None


def trace_answer(answer: str, index: SourceIndex) -> Provenance:
    """Every number of ``answer`` with its status (see the module docstring)."""
    spans, code = structure_spans(answer), code_spans(answer)
    found: list[tuple[Number, Traced]] = []
    numbers = extract(answer)
    reasons = [claim_exclusion(n, answer, spans, code) for n in numbers]
    claims = [n for n, r in zip(numbers, reasons, strict=True) if r is None]
    answer_claims = _Claims(answer, claims)
    near = {id(n): answer_claims.near(i) for i, n in enumerate(claims)}
    for n, reason in zip(numbers, reasons, strict=True):
        base = dict(text=n.text, value=n.value, start=n.start, end=n.end)
        if reason:
            found.append((n, Traced(**base, status=IGNORED, reason=reason)))
        elif (where := index.find_input(n)) is not None:
            found.append((n, Traced(**base, status="input", source=where, seen=n.value)))
        elif (hit := index.find(n, near[id(n)])) is not None:
            found.append((n, Traced(**base, status="sourced", source=hit[0], seen=hit[1])))
        else:
            found.append((n, Traced(**base, status="unsourced")))
    found = _lists_together(found, answer)
    found = [(n, _factor_source(n, t, answer, index, near[id(n)])) if t.status == "unsourced"
             else (n, t) for n, t in found]
    operands = [(n, t) for n, t in found if t.status in ("sourced", "input")]
    if len(operands) <= MAX_OPERANDS:
        found = [(n, _derive(n, t, operands)) if t.status == "unsourced" else (n, t)
                 for n, t in found]
    return Provenance(tuple(t for _n, t in found))


def answer_lists(numbers: Sequence[Number], answer: str) -> list[list[int]]:
    """The runs of ``numbers`` the answer writes as one list ("0.2C, 0.5C, 0.75C and 1C",
    "(100, 80, 60 %)"), :data:`LIST_MEMBERS` or more, as indices."""
    runs: list[list[int]] = []
    for k, n in enumerate(numbers):
        if k and _LIST_GAP.match(answer, numbers[k - 1].end, n.start):
            runs[-1].append(k)
        else:
            runs.append([k])
    return [r for r in runs if len(r) >= LIST_MEMBERS]


def _lists_together(found: list[tuple[Number, Traced]],
                    answer: str) -> list[tuple[Number, Traced]]:
    """``found`` with a list's chance matches unsourced: where fewer than half of a list's
    claims are sourced (a grid the model proposes: "swept over 0.2C, 0.5C, 0.75C, 1C and
    1.5C"), a member of one or two digits sourced by a line that shows no other member
    (a parameter listing's volume fraction 0.75) is shown there by chance. A list a cell
    printed, or one whose members the cells printed each, keeps its sources."""
    out = list(found)
    for run in answer_lists([n for n, _t in found], answer):
        claims = [k for k in run if out[k][1].status != IGNORED]
        sourced = [k for k in claims if out[k][1].status == "sourced"]
        if 2 * len(sourced) >= len(claims):
            continue
        for k in sourced:
            n, t = out[k]
            if _telling(n) or t.source is None:
                continue
            shows = values_of(t.source.excerpt).values
            others = [abs(v) for j in run if j != k for v, _q in out[j][0].readings()]
            # the members as written: a "1C" beside it is no 1.5 rounded
            if not any(math.isclose(s, v, rel_tol=REL_TOL) for s in shows for v in others):
                out[k] = (n, Traced(t.text, t.value, t.start, t.end, "unsourced"))
    return out


def change_factors(number: Number, answer: str) -> list[Number]:
    """The factors a percent change of ``answer`` stands for, read with its precision:
    "+25 %" or "25 % higher" is 1.25 (to 0.01), "-20 %" or "20 % lower" 0.80, "changed
    by 25 %" either; none for a number that is no percentage or no change."""
    if 0.01 not in number.scales:
        return []
    before = answer[max(0, number.start - 40):number.start]
    after = answer[number.end:number.end + 16]
    sign = _SIGN_BEFORE.search(before)
    up = bool((sign and sign["sign"] == "+") or _UP_BEFORE.search(before)
              or _UP_AFTER.match(after))
    down = bool((sign and sign["sign"] != "+") or _DOWN_BEFORE.search(before)
                or _DOWN_AFTER.match(after))
    if not (up or down) and _CHANGED_BY.search(before):
        up = down = True
    factors = [1 + number.value / 100] * up + [1 - number.value / 100] * down
    return [Number(number.text, f, number.quantum / 100, number.start, number.end,
                   integer=False) for f in factors if f > 0]


def _factor_source(number: Number, traced: Traced, answer: str, index: SourceIndex,
                   near: Near) -> Traced:
    """``traced`` as sourced where a source shows the factor of its percent change
    (:func:`change_factors`); else unchanged."""
    hit = next((h for f in change_factors(number, answer)
                if (h := index.find(f, near)) is not None), None)
    if hit is None:
        return traced
    return Traced(traced.text, traced.value, traced.start, traced.end, "sourced",
                  source=hit[0], seen=traced.value)


def trace(answer: str, sources: Sequence[Source]) -> Provenance:
    """:func:`trace_answer` against ``sources`` indexed for this one answer."""
    return trace_answer(answer, SourceIndex(sources))


def _derive(number: Number, traced: Traced,
            operands: Sequence[tuple[Number, Traced]]) -> Traced:
    """``traced`` as derived from two of ``operands`` if one simple operation on them gives
    it within its shown digits; else unchanged."""
    if significant(number) < MIN_DERIVED_DIGITS:
        return traced
    windows = [window(v, q, REL_TOL) for v, q in number.readings()]
    unit = _unit(number)
    for i, (na, ta) in enumerate(operands):
        for nb, tb in operands[i + 1:]:
            if _unit(na) != _unit(nb):
                continue  # eV against GPa: no operation a reader would do
            for op, value in _operations(na, ta, nb, tb):
                if unit != (_unit(na) if op in _SAME_UNIT else "") and not (
                        unit == "%" and (op not in _SAME_UNIT or not _unit(na))):
                    continue  # a percentage: a ratio or change, or of plain numbers
                if any(lo <= abs(value) <= hi for lo, hi in windows):
                    return Traced(traced.text, traced.value, traced.start, traced.end,
                                  "derived", derivation=Derivation(op, (ta.text, tb.text),
                                                                   value))
    return traced


#: Operations whose result is in the operands' unit; a ratio or percent change has none.
_SAME_UNIT = ("difference", "sum", "mean")
_UNIT_AT_END = re.compile(r"(?<=[\d\s])(%|[A-Za-zµμΩ]+(?:\.[A-Za-z]+)?)$")


def _unit(number: Number) -> str:
    """The unit written after a number (``GPa``, ``%``), or ``""``."""
    m = _UNIT_AT_END.search(number.text)
    unit = m.group(1) if m else ""
    return "%" if unit in ("percent", "cent") else unit


def _operations(na: Number, ta: Traced, nb: Number,
                tb: Traced) -> Iterator[tuple[str, float]]:
    """Each simple operation on two operands, on their source values and as written (in
    the written unit and the base unit alike: both read the same way, since "25 %" less
    "0.15" of "15 %" is no operation anyone did)."""
    pairs = [(ta.seen or na.value, tb.seen or nb.value), (na.value, nb.value)]
    pairs += zip([v for v, _q in na.readings()], [v for v, _q in nb.readings()],
                 strict=False)
    for a, b in dict.fromkeys(pairs):
        a, b = abs(a), abs(b)
        yield "difference", a - b
        yield "sum", a + b
        yield "mean", (a + b) / 2
        if b:
            yield "ratio", a / b
            yield "percent change", (a - b) / b
        if a:
            yield "ratio", b / a
            yield "percent change", (b - a) / a
