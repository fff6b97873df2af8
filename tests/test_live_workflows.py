"""The live bench's workflows and their scoring (issue 29).

A live model writes its own sentences, so the live workflows are graded by ``value``:
the expected number stated anywhere in the answer. These tests check that scorer as a
pure function, that each live workflow's expected constant is what its data really give
(computed here from the fixture or the closed form, never from a script's printout), and
that every live workflow passes when its own scripted trajectory plays it through the
real graph and a real kernel, under both policies the live bench compares.

The ten workflows added for issue 41 were written before any live run and are frozen:
their contents are pinned by a hash, so a live result cannot quietly come from a
workflow reworded after watching a model fail on it.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simagent.bench.policies import POLICIES
from simagent.bench.scorers import RunView, value
from simagent.bench.workflow import fixture_path, resolve_workflows
from simagent.bench.workflow_runs import BenchPlan, run_bench
from simagent.paths import content_dir

LIVE = [w for w in resolve_workflows(None) if "live" in w.tags]


def answer(text: str) -> RunView:
    return RunView(final=text, events=[], step_texts={}, workspace=Path("."))


def test_value_finds_the_number_in_any_phrasing() -> None:
    sc = {"kind": "value", "expected": 6.25254, "rel_tol": 1e-3}
    for text in ("The mean reading is 6.2525 mV.", "mean(y_mV) = 6.25 mV",
                 "Result: **6.253**", "It comes to 6.25254e0 millivolts over 20 samples"):
        assert value(sc, answer(text)).ok, text
    for text in ("The mean is 6.3 mV.", "about six millivolts", "", "20 samples, 9.9 mV max"):
        verdict = value(sc, answer(text))
        assert not verdict.ok, text
    assert "within tolerance of 6.25254" in value(sc, answer("6.3")).detail


def test_value_reads_signs_thousands_and_absolute_tolerance() -> None:
    assert value({"expected": -0.3, "rel_tol": 1e-6}, answer("k = -0.3 /s")).ok
    assert not value({"expected": -0.3, "rel_tol": 1e-6}, answer("k = 0.3 /s")).ok
    assert value({"expected": 47377}, answer("47,377 cases in all")).ok
    assert value({"expected": 0.0, "abs_tol": 1e-3}, answer("the offset is 0.0004 V")).ok


def test_value_near_counts_only_numbers_beside_the_keyword() -> None:
    sc = {"expected": 1.6717, "rel_tol": 1e-4, "near": r"root"}
    assert value(sc, answer("The root is x = 1.6717.")).ok
    far = "x = 1.6717 is where I started. " + "Then a long digression. " * 5 + "The root: 2."
    assert not value(sc, answer(far)).ok
    assert not value(sc, answer("x = 1.6717")).ok  # no 'root' anywhere


def test_thirteen_live_workflows_across_the_simulators_graded_by_value_and_a_tool() -> None:
    assert len(LIVE) >= 13
    assert {"scipy", "simpy", "cantera", "pybamm"} <= {wf.simulator for wf in LIVE}
    for wf in LIVE:
        kinds = {sc["kind"] for sc in wf.scorers}
        assert {"value", "tool_used"} <= kinds, wf.id
        assert 3 <= len(wf.steps) <= 8, wf.id
        assert wf.path.name.startswith("live-"), wf.id


#: sha256 of the ``live-*.toml`` files, sorted by name (``frozen_hash``). Update it only
#: with a line in bench/README.md saying what changed and why.
LIVE_HASH = "0b1f997f5f95228e547d1334257b19fb604adee7cc14155defb0f81d13e0d00f"


def frozen_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.glob("live-*.toml")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def test_the_live_workflows_are_frozen() -> None:
    folder = content_dir("bench") / "workflows"
    assert frozen_hash(folder) == LIVE_HASH, (
        "the live workflows are frozen: a change must be stated in the README "
        "(bench/README.md, 'Live workflows'), then LIVE_HASH updated here")


def expected_of(wf_id: str) -> float:
    wf = next(w for w in LIVE if w.id == wf_id)
    return float(next(sc["expected"] for sc in wf.scorers if sc["kind"] == "value"))


def test_the_expected_constants_are_what_the_data_give() -> None:
    wf = next(w for w in LIVE if w.id == "live-mean")
    csv = fixture_path(wf.fixtures["data/readings.csv"]["path"], wf.path)
    data = np.genfromtxt(csv, delimiter=",", names=True)
    assert math.isclose(expected_of("live-mean"), data["y_mV"].mean(), rel_tol=1e-6)
    assert math.isclose(expected_of("live-decay"), 2 * math.exp(-0.3 * 5), rel_tol=1e-5)
    from scipy.optimize import brentq

    root = brentq(lambda x: x**3 - x - 3, 1, 2)
    assert math.isclose(expected_of("live-root"), root, rel_tol=1e-5)


def fixture_of(wf_id: str) -> pd.DataFrame:
    wf = next(w for w in LIVE if w.id == wf_id)
    (spec,) = wf.fixtures.values()
    return pd.read_csv(fixture_path(spec["path"], wf.path))


def test_the_new_expected_constants_are_what_the_data_or_the_closed_form_give() -> None:
    from scipy.optimize import curve_fit
    from scipy.special import erf, lambertw

    assert math.isclose(expected_of("live-integral"), math.sqrt(math.pi) / 2 * erf(2),
                        rel_tol=1e-6)
    assert math.isclose(expected_of("live-logistic"), 100 / (1 + 19 * math.exp(-5)),
                        rel_tol=1e-6)
    assert math.isclose(expected_of("live-minimum"), lambertw(5).real, rel_tol=1e-6)
    cool = fixture_of("live-cooling-fit")
    popt, _ = curve_fit(lambda t, a, b, k: a + b * np.exp(-k * t), cool["t_s"], cool["T_C"],
                        p0=(25, 50, 0.003))
    assert math.isclose(expected_of("live-cooling-fit"), popt[2], rel_tol=1e-4)
    batches = fixture_of("live-group-mean")
    b_mean = batches.loc[batches["catalyst"] == "B", "yield_pct"].mean()
    assert math.isclose(expected_of("live-group-mean"), b_mean, rel_tol=1e-6)
    log = fixture_of("live-peak-time")
    assert expected_of("live-peak-time") == log["time_min"][log["T_C"].idxmax()]
    power = fixture_of("live-energy")
    t, w = power["t_s"].to_numpy(), power["P_W"].to_numpy()
    trapezoid = float(np.sum((w[1:] + w[:-1]) / 2 * np.diff(t)))
    assert math.isclose(expected_of("live-energy"), trapezoid, rel_tol=1e-6)
    lam, mu = 0.6, 1.0  # M/M/1: Wq = rho / (mu - lam)
    assert math.isclose(expected_of("live-queue-wait"), lam / mu / (mu - lam), rel_tol=1e-9)


def test_cantera_gives_the_flame_temperature() -> None:
    ct = pytest.importorskip("cantera")
    gas = ct.Solution("gri30.yaml")
    gas.TPX = 300.0, ct.one_atm, {"CH4": 0.8 / 2, "O2": 1.0, "N2": 3.76}  # phi = 0.8
    gas.equilibrate("HP")
    assert math.isclose(expected_of("live-flame-temp"), gas.T, rel_tol=1e-5)


@pytest.mark.slow
def test_pybamm_gives_the_half_c_capacity() -> None:
    """By a current and a cut-off, not the workflow's own ``Experiment``: two routes agree."""
    pybamm = pytest.importorskip("pybamm")
    pv = pybamm.ParameterValues("Chen2020")
    pv.update({"Current function [A]": 2.5, "Lower voltage cut-off [V]": 3.0})
    sol = pybamm.Simulation(pybamm.lithium_ion.SPM(), parameter_values=pv).solve(
        [0, 9000], initial_soc=1)
    assert sol.termination.startswith("event")
    capacity = sol["Discharge capacity [A.h]"].entries[-1]
    assert math.isclose(expected_of("live-discharge"), capacity, rel_tol=1e-4)


#: Answers a careless run would give, each named in its workflow's comment: the
#: tolerance must fail them (and pass the expected value itself).
NEAR_MISSES = {
    "live-integral": [math.sqrt(math.pi) / 2],
    "live-cooling-fit": [1 / 0.0041861],
    "live-group-mean": [61.96, 60.98, 54.5, 71.0],
    "live-peak-time": [22.5, 23.5, 185.79],
    "live-energy": [6787.76, 6848.42],
    "live-queue-wait": [2.5, 1.0, 0.6],
    "live-flame-temp": [2225.0, 300.0],
    "live-discharge": [4.792, 4.820, 5.0],
}


@pytest.mark.parametrize("wf_id", sorted(NEAR_MISSES))
def test_each_tolerance_fails_the_near_misses(wf_id: str) -> None:
    wf = next(w for w in LIVE if w.id == wf_id)
    sc = next(sc for sc in wf.scorers if sc["kind"] == "value")
    assert value(sc, answer(f"It is {sc['expected']}.")).ok
    for miss in NEAR_MISSES[wf_id]:
        assert not value(sc, answer(f"It is {miss:.6g}.")).ok, (wf_id, miss)


def mm1_mean_wait(seed: int, customers: int = 50_000) -> float:
    """The workflow's M/M/1 queue (0.6 arrivals per minute, 1 minute mean service) with
    its random numbers from ``random.Random(seed)``."""
    import random

    import simpy

    rng, env = random.Random(seed), simpy.Environment()
    server, waits = simpy.Resource(env, capacity=1), []

    def customer(env: simpy.Environment) -> object:
        arrive = env.now
        with server.request() as req:
            yield req
            waits.append(env.now - arrive)
            yield env.timeout(rng.expovariate(1.0))

    def source(env: simpy.Environment) -> object:
        for _ in range(customers):
            env.process(customer(env))
            yield env.timeout(rng.expovariate(0.6))

    env.process(source(env))
    env.run()
    return sum(waits) / len(waits)


@pytest.mark.slow
def test_seeded_queue_runs_fall_inside_the_queue_tolerance() -> None:
    """The prompt fixes seed 42 but not the order of draws, so any correct run must pass:
    50,000-customer runs with other seeds land within rel_tol of theory."""
    pytest.importorskip("simpy")
    sc = next(sc for sc in next(w for w in LIVE if w.id == "live-queue-wait").scorers
              if sc["kind"] == "value")
    for seed in (1, 7, 42):
        assert value(sc, answer(f"{mm1_mean_wait(seed):.4f}")).ok, seed


@pytest.mark.slow
def test_every_live_workflow_passes_its_scripted_trajectory(tmp_path: Path) -> None:
    plan = BenchPlan(LIVE, [POLICIES["simagent"], POLICIES["stock"]])
    rows = run_bench(plan, tmp_path / "out")
    assert len(rows) == 2 * len(LIVE)
    for row in rows:
        assert row["verdict"] == "pass", (row["workflow"], row["policy"],
                                          row["failed_scorers"])
