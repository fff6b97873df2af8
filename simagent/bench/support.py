"""Unsupported numbers: is every number in a final answer backed by something the agent saw?

LLM agents fabricate numbers: a plausible R0 that no cell printed, a literature value
quoted as a result, a derived ratio never computed. This module checks each number of a
final answer against what the trace shows the run saw (tool results, read files included,
the code it ran, subagent reports; kernel raw outputs only to name a number the model
never saw, see :data:`KINDS`), with the tolerance a careful reader would grant:

- **Rounding.** ``0.32`` is backed by a seen ``0.3165``: the seen value rounded to the
  answer's shown precision (its last written digit) equals the answer. The converse is
  not granted: ``0.3165`` is not backed by a seen ``0.32``, since those extra digits came
  from nowhere. A relative difference up to :data:`REL_TOL` also counts (float noise, a
  literature value the run reproduced to more digits than it printed). An integer's
  trailing zeros are shown precision unless a hedge precedes it ("about 2000").
- **Unit prefixes.** ``350 mV`` == ``0.35 V``: a number with an SI-prefixed unit is also
  read in the base unit, on both sides.
- **Percent.** ``12.5 %`` == ``0.125``: a percentage is also read as a fraction.
- **Sign.** Magnitudes are compared: prose says "drops by 3.2 K" for a printed ``-3.2``,
  and "900-1400 K" is a range, not a negative number.

A bag of numbers cannot tell a true figure from a fabricated one that happens to occur
in a long log, so each report also measures its own :func:`power`: the share of nearby
wrong values the run's sources would have flagged.

The core (:func:`extract`, :class:`Corpus`, :func:`check`) is pure; the shell that reads
the trace and its raw output files, bounded, is ``support_sources``.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Relative difference granted on top of rounding: float noise (``0.30000000000000004``)
#: and an answer with a digit more than the output printed but the same value (a
#: literature value the run reproduced). Far under 1 %, so a number nudged by a fraction
#: of a percent is never backed by its neighbour.
REL_TOL = 1e-4
#: Integers written without a decimal point up to this value are not checked (see
#: :func:`ignore_reason`).
SMALL_INT = 10
#: A raw output file is read up to this many bytes from its head and as many from its
#: tail: results are printed last, and progress bars in the middle carry no claims.
RAW_HEAD_TAIL_BYTES = 8 * 1024 * 1024
#: ``unsupported_numbers`` in a record lists at most this many.
RECORD_CAP = 20

# ---------------------------------------------------------------------------- units
SI_PREFIXES = {"P": 1e15, "T": 1e12, "G": 1e9, "M": 1e6, "k": 1e3, "c": 1e-2, "m": 1e-3,
               "µ": 1e-6, "μ": 1e-6, "u": 1e-6, "n": 1e-9, "p": 1e-12, "f": 1e-15}
#: Base units a prefix may precede. Deliberately SI-ish symbols only: ``min`` or ``mol``
#: must not read as milli-``in``/milli-``ol``, which the table makes impossible because a
#: whole-token match is tried first and ``in``/``ol`` are not units.
BASE_UNITS = {"s", "m", "g", "V", "A", "W", "Hz", "Pa", "J", "eV", "K", "mol", "L", "l", "F",
              "Ω", "ohm", "bar", "N", "C", "S", "T", "Wh", "Ah", "A.h", "W.h", "M", "Wb", "H",
              "cal", "B"}


def unit_factor(token: str) -> float | None:
    """Base-unit factor of a unit token (``mV`` -> 1e-3, ``GPa`` -> 1e9, ``K`` -> 1),
    ``None`` if the token is not a unit (a word that follows the number)."""
    if token in BASE_UNITS:
        return 1.0
    if len(token) > 1 and token[0] in SI_PREFIXES and token[1:] in BASE_UNITS:
        return SI_PREFIXES[token[0]]
    return None


# ---------------------------------------------------------------------- extraction
_SUP = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺", "0123456789-+")
_SPACES = " \u00a0\u202f\u2009"
_NUM = re.compile(
    r"(?P<m>\d{1,3}(?:,\d{3})+(?![\d,])(?:\.\d+)?"          # 12,345(.6)
    r"|\d{1,3}(?:[ \u00a0\u202f\u2009]\d{3})+(?![\d.,])"    # 50 000 (integers only)
    r"|\d+\.\d+|\.\d+|\d+)"                                # a final "." ends a sentence
    r"(?:[eE](?P<e>[-+\u2212]?\d+)"                              # 1.2e-3
    r"|\s?[×x·*]\s?10(?:\^\{?(?P<x>[-+\u2212]?\d+)\}?"           # 1.2 × 10^-3, 1.2x10^{-3}
    r"|\*\*\(?(?P<xx>[-+\u2212]?\d+)\)?|(?P<xs>[⁻⁺]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+))"  # 1.2*10**-3, 1.2×10⁻³
    r"|\^\{?(?P<p>[-+\u2212]?\d+)\}?|(?P<ps>[⁻⁺]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+))?"  # 10^-3, 10⁻³ (bare powers)
)
_AFTER = re.compile(r"[ \u00a0\u202f\u2009]?(?:(?P<pct>%|percent\b|per cent\b)"
                    r"|(?P<unit>[A-Za-zµμΩ]+(?:\.[A-Za-z]+)?))")
_NAME_UNIT = re.compile(r"[_\[(/ ]([A-Za-zµμΩ]+)[\])]?\s*[=:]\s*$")
_RANGE_GAP = re.compile(r"\s*(?:-|–|—|to|\.\.|and)\s*")
#: Words that make a round integer approximate: "about 2000" is backed by 1987, a bare
#: "2000" (a count, a setting) only by 2000 itself.
_HEDGE = re.compile(r"(?:\babout|\baround|\broughly|\bnearly|\balmost|\bapprox\.?"
                    r"|\bapproximately|\bsome|\border of|[~≈\u223c])\s*$")


@dataclass(frozen=True)
class Number:
    """One number as written: ``value`` is its magnitude in the written unit; ``quantum``
    the place value of its last shown digit (the precision it claims); ``scales`` the
    other readings it stands for (an SI prefix's factor, 0.01 for a percentage)."""

    text: str
    value: float
    quantum: float
    start: int
    end: int
    integer: bool  # written without a decimal point or an exponent
    scales: tuple[float, ...] = ()
    glued: bool = False  # touches a letter, underscore or dot: part of an identifier

    def readings(self) -> Iterator[tuple[float, float]]:
        """(value, quantum) under every reading: as written, then each scale."""
        yield self.value, self.quantum
        for f in self.scales:
            yield self.value * f, self.quantum * f


def _exp(s: str | None) -> int | None:
    if s is None:
        return None
    return int(s.translate(_SUP).replace("\u2212", "-"))


def _parse(m: re.Match[str], text: str, hedged: bool = False) -> Number | None:
    mant = m.group("m")
    digits = mant.replace(",", "")
    for sp in _SPACES:
        digits = digits.replace(sp, "")
    power = next((g for g in ("p", "ps") if m.group(g)), None)
    if power and digits != "10":
        return None  # 2³: arithmetic, not a written value
    exp = next((_exp(m.group(g)) for g in ("e", "x", "xx", "xs", "p", "ps") if m.group(g)),
               None)
    if power:
        value, quantum, integer = 10.0 ** exp, 10.0 ** exp, False
    else:
        if "." in digits:
            decimals = len(digits.split(".", 1)[1])
            step = -decimals
        else:
            step = 0
            if hedged and (stripped := digits.rstrip("0")):
                # "about 2000": the trailing zeros are not shown precision
                step = len(digits) - len(stripped)
        shift = exp or 0
        try:
            value = float(digits) * 10.0 ** shift
        except OverflowError:
            return None
        quantum = 10.0 ** (step + shift)
        integer = exp is None and "." not in digits
    if not math.isfinite(value):
        return None
    end = m.end()
    scales: list[float] = []
    after = _AFTER.match(text, end)
    if after and after.group("pct"):
        scales.append(0.01)
        end = after.end()
    elif after and (f := unit_factor(after.group("unit"))) is not None:
        if f != 1.0:
            scales.append(f)
        end = after.end()
    start = m.start()
    left = text[start - 1] if start else " "
    right = text[end] if end < len(text) else " "
    glued = (left.isalnum() or left in "_." or right.isalnum() or right == "_"
             or (right == "." and end + 1 < len(text) and text[end + 1].isdigit()))
    return Number(text[start:end], value, quantum, start, end, integer, tuple(scales),
                  glued)


def extract(text: str) -> list[Number]:
    """The numbers written in ``text``, in order, each with its precision and readings.

    A bare number before a range dash or "to" takes the unit of the number after it
    (``0.5–10 %`` reads 0.5 as a percentage too); the extra reading only ever widens
    what can back it.
    """
    out = [n for m in _NUM.finditer(text)
           if (n := _parse(m, text, bool(_HEDGE.search(text, max(0, m.start() - 16),
                                                         m.start())))) is not None]
    for i in range(len(out) - 1, 0, -1):
        a, b = out[i - 1], out[i]
        if not a.scales and b.scales and _RANGE_GAP.fullmatch(text, a.end, b.start):
            out[i - 1] = Number(a.text, a.value, a.quantum, a.start, a.end, a.integer,
                                b.scales, a.glued)
    return out


def seen_values(text: str) -> Iterator[float]:
    """Every magnitude ``text`` shows, under every reading, for the corpus side.

    Permissive on purpose: a number inside an identifier (``fcc111``, ``N200``) still
    counts as seen, and ``1,234`` is also read as 1 and 234 (an array printed without
    spaces), because the cost of a missed source is a false alarm. A unit in the name
    before it (``tau_ms=12.3``, ``tau [ms]: 12.3``, ``share_pct=4.1``) reads like a unit
    after it, as scientific code prints that way.
    """
    for m in _NUM.finditer(text):
        n = _parse(m, text)
        if n is None:
            continue
        for v, _q in n.readings():
            yield v
        if named := _NAME_UNIT.search(text, max(0, m.start() - 24), m.start()):
            token = named.group(1)
            f = 0.01 if token in ("pct", "percent") else unit_factor(token)
            if f is not None and f != 1.0:
                yield n.value * f
        if "," in m.group("m") or any(sp in m.group("m") for sp in _SPACES):
            for piece in re.split(r"[, \u00a0\u202f\u2009]", m.group("m")):
                if piece:
                    yield float(piece)


# --------------------------------------------------------------------------- corpus
#: Source kinds in the order they are tried. ``raw`` (a kernel's full raw output file) is
#: last and read only for numbers nothing else backs. It does not count as backing: the
#: model sees a cell's output only through its tool result (or a later read, also a tool
#: result), so a number found only in the raw file is one it never saw, and per-step logs
#: make raw files dense enough that most numbers of a plausible size appear there by
#: chance (on the bundled long workflows they back 2-4x more of the wrong values
#: :func:`power` tries). A raw-only number is flagged, and named apart because it may
#: also mean a digest cut what the answer needed.
KINDS = ("output", "report", "code", "raw")
BACKING = KINDS[:-1]


@dataclass
class Corpus:
    """Magnitudes a run saw, by source kind (:data:`KINDS`), sorted on first use; a kind
    may be added lazily (a factory called the first time a number needs it)."""

    _values: dict[str, set[float]] = field(default_factory=dict)
    _sorted: dict[str, list[float]] = field(default_factory=dict)
    _pending: dict[str, list[Callable[[], Iterable[float]]]] = field(default_factory=dict)

    def add(self, kind: str, text: str) -> None:
        self.add_values(kind, seen_values(text))

    def add_values(self, kind: str, values: Iterable[float]) -> None:
        self._values.setdefault(kind, set()).update(abs(v) for v in values)
        self._sorted.pop(kind, None)

    def add_lazy(self, kind: str, factory: Callable[[], Iterable[float]]) -> None:
        self._pending.setdefault(kind, []).append(factory)

    def __len__(self) -> int:
        return sum(len(v) for v in self._values.values())

    def _kind(self, kind: str) -> list[float]:
        for factory in self._pending.pop(kind, []):
            self.add_values(kind, factory())
        if kind not in self._sorted:
            self._sorted[kind] = sorted(self._values.get(kind, ()))
        return self._sorted[kind]

    def backing(self, number: Number, rel_tol: float = REL_TOL,
                kinds: Sequence[str] | None = None) -> str | None:
        """The first source kind (of ``kinds``, default all) holding a value that backs
        ``number`` under any reading."""
        for kind in sorted({*self._values, *self._pending}, key=_kind_rank):
            if kinds is not None and kind not in kinds:
                continue
            values = self._kind(kind)
            for v, q in number.readings():
                lo, hi = window(v, q, rel_tol)
                i = bisect.bisect_left(values, lo)
                if i < len(values) and values[i] <= hi:
                    return kind
        return None


def _kind_rank(kind: str) -> int:
    return KINDS.index(kind) if kind in KINDS else len(KINDS)


def window(value: float, quantum: float, rel_tol: float = REL_TOL) -> tuple[float, float]:
    """The seen magnitudes that back ``value`` written to ``quantum``: those that round
    to it at that digit, or lie within ``rel_tol`` of it.

    Below a power of ten the last digit is one place further right (``0.996`` rounds to
    ``1.00`` at three significant digits, ``0.9``-something never rounds to ``1``), so
    the lower half-width shrinks tenfold when the written digits are a 1 and zeros.
    """
    v = abs(value)
    half = quantum / 2 * (1 + 1e-9)  # ties round either way
    lower = half
    if v > 0 and math.isclose(v / quantum, 10.0 ** round(math.log10(v / quantum)),
                              rel_tol=1e-9):
        lower = half / 10
    return min(v - lower, v * (1 - rel_tol)), max(v + half, v * (1 + rel_tol))


# -------------------------------------------------------------------------- checking
_YEAR = (1900, 2100)
#: A bare 1900-2099 is a year only where prose puts years ("in 2019", "(2020)"): "2000
#: steps" is a count and is checked.
_YEAR_BEFORE = re.compile(r"(?:\bin|\bsince|\buntil|\byear|\bet al\.?,?)\s*$")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}|\d{1,2}:\d{2}(?::\d{2})?|\d+(?:\.\d+){2,}")
_MARKER = re.compile(r"^[ \t]*(?:[-*+][ \t]+)?\d+[.)](?=\s)|(?:^|(?<=\s))\(\d{1,2}\)", re.M)


def ignore_reason(number: Number, text: str, spans: Sequence[tuple[int, int]],
                  prompt: Sequence[Number]) -> str | None:
    """Why ``number`` is not checked, or ``None`` when it is. Each exclusion is noise that
    no source could back or that needs no backing:

    - ``identifier``: digits glued to letters or underscores (``H2O2``, ``y2_max``,
      ``md_300K.log``, ``Cu_a0``) name things; they are not quantities.
    - ``marker``: list markers and enumerations (``1.`` at a line start, ``(2)``, ``#3``)
      count the answer's own structure.
    - ``date``: dates, clock times (``00:00-08:00``), version strings (``3.2.0``) and
      years ("in 2019", "(2020)") are calendar or release facts, not results.
    - ``small``: integers up to :data:`SMALL_INT` written without a decimal point are
      counts and settings of the prose ("3 restarts", "5 layers", "2 fs"); every output
      prints such integers, so checking them would inflate ``checked`` while being unable
      to catch anything.
    - ``prompt``: numbers the user gave (:func:`in_prompt`) are the task's inputs;
      the scorer asks where the answer's *own* numbers came from.
    """
    for a, b in spans:
        if a <= number.start < b:
            return "date" if _DATE.fullmatch(text, a, b) else "marker"
    if number.glued:
        return "identifier"
    if number.start and text[number.start - 1] == "#":
        return "marker"
    if number.integer and number.value <= SMALL_INT:
        return "small"
    if number.integer and number.text.isdigit() and _YEAR[0] <= number.value < _YEAR[1] \
            and (_YEAR_BEFORE.search(text, max(0, number.start - 12), number.start)
                 or (text[number.start - 1:number.start] == "("
                     and text.startswith(")", number.end))):
        return "date"
    if in_prompt(number, prompt):
        return "prompt"
    return None


def in_prompt(number: Number, prompt: Sequence[Number]) -> bool:
    """``number`` is one the prompt wrote: the same value (as written or in the base unit),
    and a percentage only for a percentage. Exact, with no rounding tolerance: "about
    30 %" of an answer is its own claim even when the prompt said "30 seconds"."""
    pct = 0.01 in number.scales
    mine = [v for v, _q in number.readings()]
    return any((0.01 in p.scales) == pct and any(math.isclose(a, b, rel_tol=1e-9)
                                                for a in mine for b, _q in p.readings())
               for p in prompt)


@dataclass(frozen=True)
class Finding:
    text: str  # the number as written, with its unit
    status: str  # supported | raw_only | unsupported | ignored (raw_only is flagged too)
    why: str | None = None  # the backing source kind, or the reason it was ignored
    context: str = ""


@dataclass(frozen=True)
class SupportReport:
    findings: tuple[Finding, ...]
    #: Share of plausible wrong values the sources would have flagged (:func:`power`);
    #: ``None`` when no checked number has such neighbours.
    power: float | None = None

    @property
    def checked(self) -> list[Finding]:
        return [f for f in self.findings if f.status != "ignored"]

    @property
    def unsupported(self) -> list[Finding]:
        return [f for f in self.findings if f.status == "unsupported"]

    @property
    def raw_only(self) -> list[Finding]:
        return [f for f in self.findings if f.status == "raw_only"]

    @property
    def flagged(self) -> list[Finding]:
        """Numbers nothing the model saw backs: unsupported, then raw-only."""
        return self.unsupported + self.raw_only

    def record_fields(self) -> dict[str, Any]:
        """What a bench record carries: counts, and the unsupported and raw-only numbers
        as written (capped at :data:`RECORD_CAP`)."""
        bad, raw = self.unsupported, self.raw_only
        return {"numbers_checked": len(self.checked), "numbers_unsupported": len(bad),
                "unsupported_numbers": [f.text for f in bad[:RECORD_CAP]],
                "numbers_raw_only": len(raw),
                "raw_only_numbers": [f.text for f in raw[:RECORD_CAP]],
                "support_power": None if self.power is None else round(self.power, 3)}


def check(final: str, seen: Corpus, prompt: Sequence[Number] = ()) -> SupportReport:
    """Every number of ``final``: ignored (with the reason), supported (with the source
    kind that backs it), raw-only (backed by nothing but a raw output file) or
    unsupported."""
    spans = [m.span() for m in _DATE.finditer(final)] + \
        [m.span() for m in _MARKER.finditer(final)]
    findings, checked = [], []
    for n in extract(final):
        ctx = final[max(0, n.start - 40):n.end + 20].replace("\n", " ")
        if reason := ignore_reason(n, final, spans, prompt):
            findings.append(Finding(n.text, "ignored", reason, ctx))
        elif kind := seen.backing(n):
            findings.append(Finding(n.text, "raw_only" if kind == "raw" else "supported",
                                    kind, ctx))
        else:
            findings.append(Finding(n.text, "unsupported", None, ctx))
        if findings[-1].status != "ignored":
            checked.append(n)
    return SupportReport(tuple(findings), power(checked, seen))


#: How far the wrong values :func:`power` tries lie from the answer's: the size of a
#: plausible fabrication (a misremembered or invented figure of the right magnitude).
NUDGES = (0.95, 0.97, 0.98, 0.99, 1.01, 1.02, 1.03, 1.05)


def power(numbers: Sequence[Number], seen: Corpus) -> float | None:
    """The share of wrong values near the answer's numbers that ``seen`` would flag (no
    :data:`BACKING` source backs them): how much "supported" means for this run.

    Each checked number is nudged by :data:`NUDGES` and written at its own precision
    (nudges that round back to it are skipped). A run whose outputs hold long per-step
    logs backs many such neighbours by chance, so its fabrications could pass unseen;
    a power near 1 says a fabricated figure would have been flagged.
    """
    tried = caught = 0
    for n in numbers:
        for f in NUDGES:
            w = round(n.value * f / n.quantum) * n.quantum
            if abs(w - n.value) < n.quantum / 2:
                continue
            tried += 1
            caught += seen.backing(Number(n.text, w, n.quantum, n.start, n.end, n.integer,
                                          n.scales), kinds=BACKING) is None
    return caught / tried if tried else None
