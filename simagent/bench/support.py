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

The number rules (reading, rounding windows, units, what is ignored) are the provenance
engine's (``simagent/context/provenance/numbers.py``): the product and the bench read
numbers one way. This module is the bench's policy on them: which sources back a number
(:data:`KINDS`) and the report. The core (:class:`Corpus`, :func:`check`) is pure; the
shell that reads the trace and its raw output files, bounded, is ``support_sources``.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from simagent.context.provenance.numbers import (
    REL_TOL,
    Number,
    extract,
    ignore_reason,
    seen_values,
    structure_spans,
    window,
)

#: A raw output file is read up to this many bytes from its head and as many from its
#: tail: results are printed last, and progress bars in the middle carry no claims.
RAW_HEAD_TAIL_BYTES = 8 * 1024 * 1024
#: ``unsupported_numbers`` in a record lists at most this many.
RECORD_CAP = 20

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
    spans = structure_spans(final)
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
