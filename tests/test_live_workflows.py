"""The live bench's workflows and their scoring (issue 29).

A live model writes its own sentences, so the live workflows are graded by ``value``:
the expected number stated anywhere in the answer. These tests check that scorer as a
pure function, that each live workflow's expected constant is what its data really give
(computed here from the fixture or the closed form, never from a script's printout), and
that every live workflow passes when its own scripted trajectory plays it through the
real graph and a real kernel, under both policies the live bench compares.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from simagent.bench.policies import POLICIES
from simagent.bench.scorers import RunView, value
from simagent.bench.workflow import fixture_path, resolve_workflows
from simagent.bench.workflow_runs import BenchPlan, run_bench

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


def test_there_are_three_live_workflows_graded_by_value_and_a_tool() -> None:
    assert len(LIVE) >= 3
    for wf in LIVE:
        kinds = {sc["kind"] for sc in wf.scorers}
        assert {"value", "tool_used"} <= kinds, wf.id
        assert 3 <= len(wf.steps) <= 8 and wf.simulator == "scipy", wf.id


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


@pytest.mark.slow
def test_every_live_workflow_passes_its_scripted_trajectory(tmp_path: Path) -> None:
    plan = BenchPlan(LIVE, [POLICIES["simagent"], POLICIES["stock"]])
    rows = run_bench(plan, tmp_path / "out")
    assert len(rows) == 2 * len(LIVE)
    for row in rows:
        assert row["verdict"] == "pass", (row["workflow"], row["policy"],
                                          row["failed_scorers"])
