"""``simagent bench ensemble``: a serial loop vs ``ensemble()`` for the same cases, one run.

Both halves run in one real simagent kernel (with ``$SIMAGENT_DASK_SCHEDULER`` emptied, so
it always measures the kernel's own LocalCluster), the way a session runs a sweep: the case
function is defined in the kernel (so it travels to the workers by value), the serial
loop calls it in the kernel process, then ``ensemble`` runs the same cases on the
kernel's LocalCluster (worker processes, one thread each). Each case is a CPU-bound
pure-Python loop calibrated in the kernel to take about ``seconds``.

Figures (JSON keys):

* ``speedup`` = ``serial_wall_s / ensemble_wall_s``. The serial loop and the ensemble
  alternate for ``rounds`` rounds (default 2) and both walls are sums over the rounds,
  so load that drifts during the run (a shared VM) weighs on both sides alike.
* ``overhead_s`` per case = ``(ensemble_wall_s * workers - sum_case_s) / (cases *
  rounds)``: worker time not spent inside the case function (submission, scheduling,
  transfer, result collection, idle workers at the end), where ``sum_case_s`` is the sum
  of the cases' own times measured on the workers.
* ``cluster_start_s``: starting the LocalCluster, paid once per session and therefore
  not part of ``ensemble_wall_s``; a warm-up sweep of one tiny case per worker runs
  before the timed one, as earlier sweeps of a session would have.
* ``results_match``: the ensemble's results equal the serial loop's.

Nothing here is asserted by tests on timing; they check that it runs and reports.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from simagent.config import SCHEDULER_ENV
from simagent.kernel import Kernel
from simagent.kernel_api.cluster import default_workers as cluster_workers
from simagent.paths import SessionPaths

DEFAULT_SECONDS = 1.0
#: Serial/ensemble pairs, interleaved; the figures are sums over the rounds.
DEFAULT_ROUNDS = 2
#: Goal from the ensembles issue (2 cores, ~1 s CPU-bound cases).
GOAL_SPEEDUP = 1.6
_MARK = "SIMAGENT_ENSEMBLE_BENCH "

_SETUP = r'''
import json, os, time
from simagent.kernel_api import ensemble
from simagent.kernel_api.cluster import local_engine

def busy_case(i, n):
    """CPU-bound pure Python: an integer recurrence of n steps (seeded by i)."""
    x = i + 1
    for k in range(n):
        x = (x * 1103515245 + k) % 2147483647
    return {"x": x}

def _calibrate(seconds):
    n = 200_000
    while True:
        t0 = time.perf_counter()
        busy_case(0, n)
        dt = time.perf_counter() - t0
        if dt > 0.2:
            return max(1, int(n * seconds / dt))
        n *= 2
'''

_RUN = r'''
_n = _calibrate({seconds})
_cases = [{{"i": i, "n": _n}} for i in range({cases})]
_t0 = time.perf_counter()
local_engine({workers})
_start = time.perf_counter() - _t0
ensemble(busy_case, [{{"i": i, "n": 1000}} for i in range({workers})], workers={workers},
         cache=False, name="bench-warmup", progress=False)
_serial_walls, _walls, _sums, _match = [], [], [], True
for _round in range({rounds}):  # interleaved, so drifting machine load hits both alike
    _t0 = time.perf_counter()
    _serial = [busy_case(**c)["x"] for c in _cases]
    _serial_walls.append(time.perf_counter() - _t0)
    _t0 = time.perf_counter()
    _df = ensemble(busy_case, _cases, workers={workers}, cache=False, name="bench",
                   progress=False)
    _walls.append(time.perf_counter() - _t0)
    _sums.append(float(_df.elapsed_s.sum()))
    _match = _match and list(_df.x) == _serial and bool((_df.status == "ok").all())
print("{mark}" + json.dumps({{
    "serial_wall_s": sum(_serial_walls), "ensemble_wall_s": sum(_walls),
    "cluster_start_s": _start, "sum_case_s": sum(_sums), "n_iter": _n,
    "results_match": _match}}))
'''


def default_workers() -> int:
    return cluster_workers()


def run_ensemble_bench(cases: int | None = None, seconds: float = DEFAULT_SECONDS,
                       workers: int | None = None, rounds: int = DEFAULT_ROUNDS,
                       progress: Callable[[str], None] | None = None) -> dict:
    """Run the bench in a fresh kernel; returns the JSON figures (see the module doc)."""
    say = progress or (lambda _m: None)
    workers = workers or default_workers()
    cases = cases or 4 * workers
    if cases < 1 or seconds <= 0 or rounds < 1:
        raise ValueError("cases and rounds must be >= 1 and seconds > 0")
    with tempfile.TemporaryDirectory(prefix="simagent-bench-") as tmp:
        # always the local engine: a developer's $SIMAGENT_DASK_SCHEDULER would make the
        # figures those of a foreign cluster (and could fail or wait on it)
        kernel = Kernel(SessionPaths(Path(tmp) / "session"), cwd=tmp, env={SCHEDULER_ENV: ""})
        say("starting the kernel")
        kernel.start()
        try:
            setup = kernel.execute(_SETUP)
            if not setup.ok:
                raise RuntimeError(f"ensemble bench setup failed: {setup.model_text()[-500:]}")
            say(f"{rounds} x ({cases} cases of ~{seconds:g} s as a serial loop, then with "
                f"ensemble on {workers} workers)")
            res = kernel.execute(_RUN.format(seconds=seconds, cases=cases, workers=workers,
                                             rounds=rounds, mark=_MARK),
                                 timeout=rounds * cases * seconds * 20 + 120)
        finally:
            kernel.shutdown()
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith(_MARK)), None)
    if not res.ok or line is None:
        raise RuntimeError(f"ensemble bench failed ({res.status}): {res.model_text()[-800:]}")
    raw = json.loads(line[len(_MARK):])
    wall = raw["ensemble_wall_s"]
    return {
        "speedup": round(raw["serial_wall_s"] / wall, 3),
        "overhead_s": round((wall * workers - raw["sum_case_s"]) / (cases * rounds), 4),
        "serial_wall_s": round(raw["serial_wall_s"], 3),
        "ensemble_wall_s": round(wall, 3),
        "sum_case_s": round(raw["sum_case_s"], 3),
        "cluster_start_s": round(raw["cluster_start_s"], 3),
        "cases": cases,
        "workers": workers,
        "rounds": rounds,
        "case_s": round(raw["serial_wall_s"] / (cases * rounds), 3),
        "results_match": raw["results_match"],
    }


def format_table(results: dict) -> str:
    mark = "ok" if results["speedup"] >= GOAL_SPEEDUP else "MISSED"
    rows = [
        ("speedup (serial wall / ensemble wall)", f"{results['speedup']:g}",
         f">= {GOAL_SPEEDUP:g}  {mark}"),
        ("overhead per case [s]", f"{results['overhead_s']:g}", ""),
        ("serial wall [s]", f"{results['serial_wall_s']:g}", ""),
        ("ensemble wall [s]", f"{results['ensemble_wall_s']:g}", ""),
        ("sum of case times on workers [s]", f"{results['sum_case_s']:g}", ""),
        ("cluster start, once per session [s]", f"{results['cluster_start_s']:g}", ""),
        ("results equal the serial loop", str(results["results_match"]), ""),
    ]
    w = max(len(r[0]) for r in rows)
    head = (f"{results['cases']} CPU-bound cases of ~{results['case_s']:g} s, "
            f"{results['workers']} workers, {results['rounds']} rounds")
    return "\n".join([head, "-" * (w + 24)] + [f"{n:<{w}}  {v:>9}  {g}" for n, v, g in rows])


__all__ = ["format_table", "run_ensemble_bench"]
