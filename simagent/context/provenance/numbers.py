"""Numbers as people write them, and when one backs another: the rules the provenance
engine (``engine``) and the bench's support scorer (``bench/support.py``) share, so the
two cannot disagree.

A number is read with the precision it claims (its last shown digit), its unit's SI
prefix and a percent sign as extra readings, and a seen value backs it when it rounds to
it at that digit (:func:`window`). What needs no source (a list marker, a date, a version,
a small count, an identifier's digits) is named by :func:`ignore_reason`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

#: Relative difference granted on top of rounding: float noise (``0.30000000000000004``)
#: and an answer with a digit more than the output printed but the same value (a
#: literature value the run reproduced). Far under 1 %, so a number nudged by a fraction
#: of a percent is never backed by its neighbour.
REL_TOL = 1e-4
#: Integers written without a decimal point up to this value are not checked (see
#: :func:`ignore_reason`).
SMALL_INT = 10
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
        try:
            value, quantum, integer = 10.0 ** exp, 10.0 ** exp, False
        except OverflowError:  # "10^400" in an output: no value a float holds
            return None
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
    """Every magnitude ``text`` shows, under every reading, for the corpus side
    (:func:`seen_readings` without where each stands)."""
    for v, _a, _b in seen_readings(text):
        yield v


def seen_readings(text: str) -> Iterator[tuple[float, int, int]]:
    """Every magnitude ``text`` shows, under every reading, with the span it was read from.

    Permissive on purpose: a number inside an identifier (``fcc111``, ``N200``) still
    counts as seen, and ``1,234`` is also read as 1 and 234 (an array printed without
    spaces), because the cost of a missed source is a false alarm. A unit in the name
    before it (``tau_ms=12.3``, ``tau [ms]: 12.3``, ``share_pct=4.1``) reads like a unit
    after it, as scientific code prints that way.
    """
    after_unit, name_unit = _AFTER.match, _NAME_UNIT.search
    for m in _NUM.finditer(text):
        mant, start = m.group("m"), m.start()
        grouped = "," in mant or " " in mant or (
            not mant.isascii() and any(sp in mant for sp in _SPACES))
        if m.lastindex in (1, 2) and not grouped:  # most of a long output: as _parse reads
            try:  # it: a plain figure, or one with an e-exponent (1.2e-3)
                value = float(mant) * 10.0 ** (_exp(m.group("e")) or 0)
            except OverflowError:
                continue
            if not math.isfinite(value):
                continue
            end, scale = m.end(), None
            if after := after_unit(text, end):
                if after.group("pct"):
                    scale, end = 0.01, after.end()
                elif (f := unit_factor(after.group("unit"))) is not None:
                    scale, end = (f if f != 1.0 else None), after.end()
            yield value, start, end
            if scale is not None:
                yield value * scale, start, end
        else:
            n = _parse(m, text)
            if n is None:
                continue
            value, end = n.value, n.end
            for v, _q in n.readings():
                yield v, start, end
        if _assigned(text, start) and (named := name_unit(text, max(0, start - 24), start)):
            token = named.group(1)
            f = 0.01 if token in ("pct", "percent") else unit_factor(token)
            if f is not None and f != 1.0:
                yield value * f, start, end
        if grouped:
            for piece in re.split(r"[, \u00a0\u202f\u2009]", mant):
                if piece:
                    yield float(piece), start, end


def _assigned(text: str, at: int) -> bool:
    """Whether ``=`` or ``:`` ends what comes before ``at`` (spaces aside): the one place
    :data:`_NAME_UNIT` can match, checked before that costlier search."""
    j = at - 1
    while j >= 0 and text[j].isspace():
        j -= 1
    return j >= 0 and text[j] in "=:"


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


def structure_spans(text: str) -> list[tuple[int, int]]:
    """Where ``text`` writes dates, times, versions and list markers (see
    :func:`ignore_reason`)."""
    return [m.span() for m in _DATE.finditer(text)] + [m.span() for m in _MARKER.finditer(text)]


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


