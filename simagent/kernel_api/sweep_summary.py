"""What a sweep prints at the end: one summary line, then where the table is.

The model reads this text instead of the table (a 500-row table would flood its
context), so it carries the counts, the speed, the first failure and the paths; the
agent then asks the table the questions it has (``df.describe()``, a pivot). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class SweepStats:
    name: str
    cases: int
    ok: int
    failed: int
    cancelled: int
    cached: int
    #: Wall time of the cases run in this call (from submission to the last result).
    wall_s: float
    #: Sum of the run cases' own times, all attempts included.
    case_s: float
    workers: int
    engine: str
    interrupted: bool = False

    @property
    def speedup(self) -> float | None:
        """Sum of case times over wall time: how many cases effectively ran at once."""
        if self.wall_s <= 0 or self.case_s <= 0:
            return None
        return self.case_s / self.wall_s

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "speedup": None if self.speedup is None
                else round(self.speedup, 3)}


def stats_of(name: str, rows: Sequence[dict[str, Any]], wall_s: float, workers: int,
             engine: str, interrupted: bool = False) -> SweepStats:
    """Counts and times of a sweep from its table rows (``cases.table_rows``)."""
    status = [r["status"] for r in rows]
    run = [r for r in rows if not r["cached"] and r["status"] in ("ok", "error")]
    return SweepStats(
        name=name, cases=len(rows), ok=status.count("ok"), failed=status.count("error"),
        cancelled=status.count("cancelled"), cached=sum(bool(r["cached"]) for r in rows),
        wall_s=wall_s, case_s=sum(float(r["elapsed_s"] or 0.0) for r in run),
        workers=workers, engine=engine, interrupted=interrupted)


def _secs(s: float) -> str:
    return f"{s:.2f} s" if s < 10 else f"{s:.1f} s" if s < 600 else f"{s / 60:.1f} min"


def summary_line(st: SweepStats) -> str:
    """``ensemble 'x': 20 cases: 19 ok, 1 failed (5 from cache); wall 4.1 s on 2 workers ...``"""
    counts = f"{st.ok} ok, {st.failed} failed"
    if st.cancelled:
        counts += f", {st.cancelled} cancelled"
    if st.cached:
        counts += f" ({st.cached} from cache)"
    head = f"ensemble '{st.name}'{' INTERRUPTED' if st.interrupted else ''}: " \
           f"{st.cases} cases: {counts}"
    ran = st.cases - st.cached - st.cancelled
    if ran <= 0:
        return f"{head}; nothing to run"
    speed = f", speed-up {st.speedup:.2f}x" if st.speedup is not None else ""
    return (f"{head}; wall {_secs(st.wall_s)} on {st.workers} worker"
            f"{'s' * (st.workers != 1)} ({st.engine}); sum of case times "
            f"{_secs(st.case_s)}{speed}")


def _case_text(case: dict[str, Any], limit: int = 120) -> str:
    text = ", ".join(f"{k}={v!r}" for k, v in case.items())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def detail_lines(st: SweepStats, table_paths: Sequence[str], n_columns: int,
                 failures: Sequence[tuple[dict[str, Any], str]], errors_path: str | None,
                 note: str = "") -> list[str]:
    """Lines after the summary: the table's paths and shape, failures, how to resume."""
    if table_paths:
        first, *others = table_paths
        also = "".join(f" + {p.rsplit('/', 1)[-1]}" for p in others)
        lines = [f"table: {first}{also} ({st.cases} rows x {n_columns} columns)"]
    else:
        lines = [f"table: not saved; `ensemble.last` ({st.cases} rows x {n_columns} columns)"]
    if failures:
        case, error = failures[0]
        more = f" (+{len(failures) - 1} more)" if len(failures) > 1 else ""
        where = f"; tracebacks: {errors_path}" if errors_path else ""
        lines.append(f"first failure: {_case_text(case)} -> {error}{more}{where}")
    if st.interrupted:
        lines.append("finished cases are cached: run the same call again to resume; the "
                     "partial table is `ensemble.last`")
    if note:
        lines.append(note)
    return lines
