"""The kernel state card (issue 15, item 2): probe, snapshot, renderer, middleware, replay."""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from simagent.agent.builder import build_agent
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.bench.kernel_recording import Recording, ReplaySession
from simagent.bench.workflow import resolve_workflows
from simagent.context.counting import count_message, is_state_card, measure
from simagent.context.manual import compact_now
from simagent.context.panel import render_context
from simagent.context.settings import ContextConfigError, ContextSettings
from simagent.context.state import STATE_CARD_KEY
from simagent.context.state_card import render_card, with_card
from simagent.context.stats import stats_from_trace
from simagent.context.tokens import resolve_ruler
from simagent.kernel import Kernel
from simagent.kernel.snapshot import workspace_files
from simagent.paths import SessionPaths
from simagent.session import Session

RULER = resolve_ruler(None)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    root = tmp_path_factory.mktemp("card")
    k = Kernel(SessionPaths(root / "s"), cwd=root)
    k.start()
    yield k
    k.shutdown()


SETUP = """
import numpy as np, pandas as pd
from math import sqrt
grid = np.zeros((400, 300))
table = pd.DataFrame({"T_K": np.linspace(900, 1400, 6), "tau_ms": np.arange(6.0)})
capacity_Ah = 4.955
label = "Chen2020 1C"
runs = {"1C": 1, "2C": 2}
def helper(x):
    return x
"""


# ---------------------------------------------------------------- probe (real kernel)
def test_probe_reads_names_types_and_shapes_without_touching_the_session(kernel):
    assert kernel.execute(SETUP).status == "ok"
    before = kernel.execute("n_in = len(In); print(n_in, sorted(get_ipython().user_ns)[:0])")
    state = kernel.probe_state()
    after = kernel.execute("print(len(In) - n_in)")
    assert after.stdout.strip() == "1"  # only the cell itself was added to the history
    assert before.execution_count + 1 == after.execution_count  # the probe took no count
    by_name = {e["name"]: e for e in state["names"]}
    assert by_name["grid"]["desc"] == "(400, 300) float64"
    assert by_name["grid"]["bytes"] == 400 * 300 * 8
    assert by_name["table"]["desc"].startswith("(6, 2) columns [T_K, tau_ms]")
    assert by_name["capacity_Ah"]["desc"] == "= 4.955"
    assert by_name["label"]["desc"] == "= 'Chen2020 1C'"
    assert by_name["runs"]["desc"].startswith("len 2 keys")
    assert state["names"][0]["name"] == "grid"  # largest first
    assert "np=numpy" in state["imports"] and "sqrt" in state["imports"]
    assert state["functions"] == ["helper"]
    assert not any(n.startswith("_") for n in by_name)  # _out and IPython's _i1... hidden
    leaked = kernel.execute("print([k for k in globals() if 'probe' in k])")
    assert leaked.stdout.strip() == "[]"


def test_probe_reads_a_simulators_registry_fields(kernel):
    code = ("from ase.build import bulk\nfrom ase.calculators.emt import EMT\n"
            "cu = bulk('Cu', 'fcc', a=3.6) * (2, 2, 2)\ncu.calc = EMT()\n"
            "e_cu = cu.get_potential_energy()\nprint(round(e_cu, 6))")
    out = kernel.execute(code)
    assert out.status == "ok", out.model_text(4000)
    from simagent.simulators import get_simulator

    registry = list(get_simulator("ase").state_registry)
    state = kernel.probe_state(registry)
    cu = next(e for e in state["names"] if e["name"] == "cu")
    fields = dict(cu["fields"])
    assert cu["registry"] == "ASE atoms" and fields["formula"] == "Cu8"
    assert fields["atoms"] == "8" and fields["calculator"] == "EMT"
    assert abs(float(fields["energy [eV]"]) - float(out.stdout)) < 1e-5


def test_the_shipped_pybamm_and_cantera_registries_read_their_objects(kernel):
    code = ("import pybamm\nimport cantera as ct\n"
            "pv = pybamm.ParameterValues('Chen2020')\n"
            "sim = pybamm.Simulation(pybamm.lithium_ion.SPM(), parameter_values=pv)\n"
            "sol = sim.solve([0, 3600])\n"
            "gas = ct.Solution('h2o2.yaml')\ngas.TPX = 1100, ct.one_atm, 'H2:2,O2:1,N2:3.76'\n"
            "reactor = ct.IdealGasConstPressureReactor(gas)\n"
            "net = ct.ReactorNet([reactor])\nnet.advance(1e-4)\n"
            "print(sol['Discharge capacity [A.h]'].entries[-1], net.time)")
    out = kernel.execute(code)
    assert out.status == "ok", out.model_text(4000)
    from simagent.simulators import get_simulator

    registry = [*get_simulator("pybamm").state_registry, *get_simulator("cantera").state_registry]
    state = kernel.probe_state(registry)
    by_name = {e["name"]: e for e in state["names"]}
    sol = dict(by_name["sol"]["fields"])
    assert sol["termination"] == "event: Minimum voltage [V]"
    assert float(sol["discharge capacity [A.h]"]) == pytest.approx(
        float(out.stdout.split()[0]), rel=1e-5)
    assert dict(by_name["pv"]["fields"])["nominal capacity [A.h]"] == "5"
    assert dict(by_name["sim"]["fields"])["solved"] == "True"
    assert dict(by_name["gas"]["fields"])["mechanism"] == "h2o2.yaml"
    assert dict(by_name["net"]["fields"])["time [s]"] == "0.0001"
    assert by_name["reactor"]["registry"] == "Cantera reactor"
    # the simulator's objects lead, whatever their size in bytes
    assert all("registry" in e for e in state["names"][:6])


@pytest.mark.slow
def test_probe_does_not_wait_on_a_running_cell(kernel):
    worker = threading.Thread(target=kernel.execute, args=("import time; time.sleep(4)",))
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while kernel.state != "busy" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert kernel.state == "busy"
        assert kernel.probe_state(wait_s=0.1) is None
    finally:
        worker.join(60)
    assert not worker.is_alive()
    assert kernel.probe_state() is not None  # idle again: readable


# ---------------------------------------------------------------- renderer (pure)
def _snapshot(n_names: int, generation: int = 1, names=None) -> dict:
    entries = names if names is not None else [
        {"name": f"arr_{i:03d}", "type": "numpy.ndarray", "desc": f"({1000 - i}, 3) float64",
         "bytes": (1000 - i) * 24} for i in range(n_names)]
    return {"kernel": {"status": "idle", "generation": generation, "executions": 12},
            "probe": {"names": entries, "more_names": 0, "imports": ["np=numpy"],
                      "functions": ["solve"]},
            "figures": [{"path": f"/s/artifacts/000{i}-1.png"} for i in range(3)],
            "files": [{"path": "results/map.csv", "bytes": 3100}], "files_more": 0}


def test_card_is_deterministic_and_lists_everything_when_it_fits():
    snap = _snapshot(5)
    card = render_card(snap, reason="summary", budget=1500, ruler=RULER)
    assert card == render_card(snap, reason="summary", budget=1500, ruler=RULER)
    text = card["text"]
    assert text.startswith('<kernel_state after="summary">') and text.endswith("</kernel_state>")
    for i in range(5):
        assert f"arr_{i:03d}: numpy.ndarray ({1000 - i}, 3) float64" in text
    assert "imports: np=numpy" in text and "functions/classes: solve" in text
    assert "results/map.csv (3.0 kB)" in text and "figures (3):" in text
    assert card["tokens"] == RULER.count(text) and card["shown"] == 5


def test_card_stays_within_its_budget_dropping_the_smallest_names_first():
    snap = _snapshot(200)
    for budget in (300, 800, 1500):
        card = render_card(snap, reason="clear", budget=budget, ruler=RULER)
        assert card["tokens"] <= budget
        shown = [ln for ln in card["text"].splitlines() if ln.startswith("- arr_")]
        assert shown and shown == [f"- arr_{i:03d}: numpy.ndarray ({1000 - i}, 3) float64, "
                                   f"{(1000 - i) * 24 / 1024:.1f} kB"
                                   for i in range(len(shown))]
        assert f"names ({len(shown)} of 200" in card["text"]
        assert len(card["names"]) == 200  # every name is kept for the next card's diff


def test_card_after_a_replayed_restart_says_the_names_are_back():
    first = render_card(_snapshot(3), reason="summary", budget=1500, ruler=RULER)
    replayed = _snapshot(3, generation=2)
    replayed["kernel"]["replayed"] = {"cells": 4, "restored": True}
    card = render_card(replayed, reason="clear", budget=1500, previous=first, ruler=RULER)
    assert card["restarted"] and card["lost"] == []
    assert "replayed (4 cells): every listed name is back" in card["text"]
    assert "RESTARTED" not in card["text"] and "gone" not in card["text"]
    partial = _snapshot(2, generation=2)
    partial["kernel"]["replayed"] = {"cells": 1, "restored": False}
    card = render_card(partial, reason="clear", budget=1500, previous=first, ruler=RULER)
    assert card["lost"] == ["arr_002"] and "1 cells were replayed" in card["text"]
    assert "gone: arr_002" in card["text"]


def test_registry_objects_come_first_with_their_fields():
    names = [{"name": "big", "type": "numpy.ndarray", "desc": "(9999,) float64", "bytes": 80000},
             {"name": "sol", "type": "pybamm.Solution", "desc": "", "bytes": 56,
              "registry": "PyBaMM solution", "fields": [["t_end [s]", "3568.2"]]}]
    text = render_card(_snapshot(0, names=names), reason="summary", budget=1500,
                       ruler=RULER)["text"]
    assert text.index("- sol: pybamm.Solution [PyBaMM solution] — t_end [s]=3568.2") < \
        text.index("- big:")


def test_card_after_a_restart_names_what_was_lost():
    first = render_card(_snapshot(3), reason="summary", budget=1500, ruler=RULER)
    keep = [e for e in _snapshot(3)["probe"]["names"] if e["name"] == "arr_002"]
    second = render_card(_snapshot(0, generation=2, names=keep), reason="clear",
                         budget=1500, previous=first, ruler=RULER)
    assert second["restarted"] and second["lost"] == ["arr_000", "arr_001"]
    assert "THE KERNEL WAS RESTARTED" in second["text"]
    assert "lost: arr_000, arr_001" in second["text"]
    calm = render_card(_snapshot(3), reason="clear", budget=1500, previous=first, ruler=RULER)
    assert not calm["restarted"] and "RESTARTED" not in calm["text"]


def test_card_goes_after_its_message_or_after_the_boundary():
    msgs = [HumanMessage("q", id="h1"), AIMessage("a", id="a1"), HumanMessage("q2", id="h2")]
    card = {**render_card(_snapshot(1), reason="clear", budget=500, ruler=RULER),
            "after_id": "a1", "n": 1}
    view = with_card(msgs, card, boundary=False)
    assert [m.id for m in view] == ["h1", "a1", "simagent-state-card-1", "h2"]
    assert is_state_card(view[2])
    # its message went behind a boundary: the card follows the boundary's message
    boundary_view = [HumanMessage("summary", id="b"), msgs[2]]
    assert [m.id for m in with_card(boundary_view, card, boundary=True)] == [
        "b", "simagent-state-card-1", "h2"]
    assert with_card(msgs, None, boundary=False) == msgs


def test_the_card_is_its_own_category():
    card = render_card(_snapshot(4), reason="clear", budget=800, ruler=RULER)
    view = with_card([HumanMessage("go", id="h")], {**card, "after_id": "h"}, boundary=False)
    size = measure(None, view, [], RULER)
    assert size.state_card > card["tokens"] and size.conversation < 20
    assert size.total == size.state_card + size.conversation


# ---------------------------------------------------------------- snapshot
def test_workspace_files_lists_what_the_session_wrote_newest_first(tmp_path):
    since = time.time()
    old = tmp_path / "old.csv"
    old.write_text("x")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "a.csv").write_text("a" * 10)
    (tmp_path / ".simagent").mkdir()
    (tmp_path / ".simagent" / "state.db").write_text("hidden")
    (tmp_path / "b.png").write_bytes(b"b" * 2048)
    # modification times set, not slept for: before the session, then in writing order
    for path, age in ((old, -60), (tmp_path / "results" / "a.csv", 1),
                      (tmp_path / ".simagent" / "state.db", 2), (tmp_path / "b.png", 3)):
        os.utime(path, (since + age, since + age))
    files, more = workspace_files(tmp_path, since)
    assert [f["path"] for f in files] == ["b.png", "results/a.csv"] and more == 0
    assert files[0]["bytes"] == 2048


# ---------------------------------------------------------------- the real graph
def _make(workspace: Path, steps, settings, window):
    session = Session.create(workspace, approval="auto")
    model = ScriptedChatModel.from_steps(steps, window=window, enforce_window=True)
    agent = build_agent(session, model, context_settings=settings)
    return session, model, agent, TurnRunner(session, agent)


@pytest.mark.slow
def test_a_clearing_epoch_of_kernel_results_brings_a_card_from_the_live_kernel(workspace):
    steps = ([{"tool": "run_python", "args": {"code": "import numpy as np\n"
                                                       "field = np.ones((50, 40))"}}]
             + [{"tool": "run_python", "args": {"code": f"print('R{i}', 'v' * 3000)"}}
                for i in range(20)] + [{"final": "done"}])
    settings = ContextSettings(summarize=False, budget_check=False,
                               state_card_updates=False)  # every card in full
    session, model, agent, runner = _make(workspace, steps, settings, 30_000)
    try:
        assert runner.run("go").status == "done"
        cards = session.trace.events(["context_state_card"])
        clears = session.trace.events(["context_clear"])
        errors = [e.payload for e in session.trace.events(["error"])]
        assert cards and len(cards) == len(clears), (clears, errors)  # each cleared kernel output
        assert cards[0].payload["reason"] == "clear"
        last = model.requests[-1]
        shown = [m for m in last if is_state_card(m)]
        assert len(shown) == 1  # only the newest card is in view
        assert "- field: numpy.ndarray (50, 40) float64" in shown[0].text
        # the request's split, as the trace recorded it, counts the card on its own
        usage = session.trace.events(["model_usage"])[-1].payload["request"]
        assert usage["state_card"] == count_message(shown[0], RULER)
        stats = stats_from_trace(session.paths.trace, settings)
        assert stats.state_cards.count == len(cards)
        assert stats.categories.state_card == usage["state_card"]
        panel = render_context(stats, width=100)
        assert "state card" in panel and "state cards" in panel
        state = agent.graph.get_state(session.thread_config).values
        assert state[STATE_CARD_KEY]["n"] == len(cards)
    finally:
        session.close()


def test_compact_brings_a_card_and_a_restart_is_reported(workspace):
    steps = [{"tool": "run_python", "args": {"code": "alpha = [1, 2, 3]\nbeta = 2.5"}},
             {"final": "one"}, {"final": "two"}, {"final": "three"}]
    session, model, agent, runner = _make(workspace, steps, ContextSettings(), 128_000)
    try:
        runner.run("one")
        assert compact_now(agent.graph, session.thread_config, agent.context).done
        runner.run("two")
        card = next(m for m in model.requests[-1] if is_state_card(m))
        assert 'after="compact"' in card.text and "- beta = 2.5 (float)" in card.text
        session.restart_kernel()
        assert compact_now(agent.graph, session.thread_config, agent.context).done
        runner.run("three")
        card = next(m for m in model.requests[-1] if is_state_card(m))
        assert "THE KERNEL WAS RESTARTED" in card.text and "lost: alpha, beta" in card.text
        events = session.trace.events(["context_state_card"])
        assert [e.payload["reason"] for e in events] == ["compact", "compact"]
        assert events[-1].payload["restarted"] and events[-1].payload["lost"] == [
            "alpha", "beta"]
    finally:
        session.close()


def test_no_card_when_switched_off(workspace):
    steps = [{"tool": "run_python", "args": {"code": "x = 1"}}, {"final": "one"},
             {"final": "two"}]
    session, model, agent, runner = _make(workspace, steps,
                                          ContextSettings(state_card_tokens=0), 128_000)
    try:
        runner.run("one")
        assert compact_now(agent.graph, session.thread_config, agent.context).done
        runner.run("two")
        assert not any(is_state_card(m) for m in model.requests[-1])
        assert not session.trace.events(["context_state_card"])
    finally:
        session.close()


def test_the_card_event_is_one_line_and_a_restart_stands_out():
    from simagent.agent.events import ContextEvent
    from simagent.presentation.notices import context_line

    calm = context_line(ContextEvent("context_state_card", {
        "reason": "summary", "names": 12, "tokens": 340, "restarted": False, "lost": []}))
    assert calm == "~ context: kernel state card after the summary (12 names, 340 tokens)"
    loud = context_line(ContextEvent("context_state_card", {
        "reason": "clear", "names": 1, "tokens": 90, "restarted": True, "lost": ["sol", "pv"]}))
    assert loud.startswith("! context:") and "lost: sol, pv" in loud


def test_a_bad_state_registry_in_simulator_toml_is_one_clear_error(tmp_path):
    from simagent.simulators import SimulatorError, get_simulator, parse_simulator

    for sim in ("pybamm", "cantera", "ase"):
        assert all(e["type"].count(".") >= 1 and e["fields"]
                   for e in get_simulator(sim).state_registry)
    head = 'name = "x"\ndisplay_name = "X"\ndescription = "d"\n'
    (tmp_path / "simulator.toml").write_text(
        head + '[[state.registry]]\ntype = "Solution"\nfields = {}\n')
    with pytest.raises(SimulatorError, match=r"\[\[state.registry\]\] needs type"):
        parse_simulator(tmp_path)
    (tmp_path / "simulator.toml").write_text(
        head + '[[state.registry]]\ntype = "pkg.Solution"\nfields = { t = 3 }\n')
    with pytest.raises(SimulatorError, match="expression of obj"):
        parse_simulator(tmp_path)


def test_state_card_tokens_setting_is_validated():
    assert ContextSettings.from_mapping({"state_card_tokens": 800}).state_card_tokens == 800
    for bad in (-1, 1.5, "many", True):
        with pytest.raises(ContextConfigError, match="state_card_tokens"):
            ContextSettings.from_mapping({"state_card_tokens": bad})


# ---------------------------------------------------------------- replay
def test_replay_serves_the_recorded_snapshot_of_the_last_served_step(tmp_path):
    wf = resolve_workflows(["canary"])[0]
    rec = Recording(wf.id, tmp_path, tmp_path / "s")
    from simagent.kernel import ExecResult

    rec.results = [("a = 1", ExecResult(status="ok")), ("b = 2", ExecResult(status="ok"))]
    rec.snapshots = [{"probe": {"names": [{"name": "a"}]}},
                     {"probe": {"names": [{"name": "a"}, {"name": "b"}]}}]
    ws = tmp_path / "ws"
    ws.mkdir()
    session = ReplaySession(ws, rec, wf)
    try:
        assert session.state_snapshot()["probe"] is None  # nothing served yet
        # the recorded results name the recording's figures: view_figure finds them
        assert session.artifact_dirs == [session.paths.artifacts, tmp_path / "s" / "artifacts"]
        session.execute("b = 2")
        assert session.state_snapshot() == rec.snapshots[1]
        session.execute("a = 1")
        assert session.state_snapshot() == rec.snapshots[0]
    finally:
        session.close()


def test_cleared_results_are_found_by_their_raw_output():
    from simagent.context.middleware import _has_kernel_results

    kernel_result = ToolMessage("out", tool_call_id="k", artifact={"raw_path": "/x/0001.txt"})
    other = ToolMessage("out", tool_call_id="o")
    assert _has_kernel_results([kernel_result, other], {"k"})
    assert not _has_kernel_results([kernel_result, other], {"o"})


def test_later_epochs_send_updates_and_the_card_before_them_stays_byte_for_byte(workspace):
    """Each clearing epoch after the first sends what changed in the live kernel, after
    the newest result it cleared; the full card and earlier updates stay in place, so
    the provider reads them from its cache (issue 31 §2)."""
    steps = ([{"tool": "run_python", "args": {"code": "import numpy as np\n"
                                                       "field = np.ones((50, 40))"}}]
             + [{"tool": "run_python", "args": {"code": f"v{i} = {i}\nprint('R{i}', 'v' * 3000)"}}
                for i in range(20)] + [{"final": "done"}])
    settings = ContextSettings(summarize=False, budget_check=False)  # updates: default
    session, model, _agent, runner = _make(workspace, steps, settings, 30_000)
    try:
        assert runner.run("go").status == "done"
        cards = [e.payload for e in session.trace.events(["context_state_card"])]
        assert len(cards) >= 3 and cards[0]["reason"] == "clear"
        assert [c["update"] for c in cards] == [False] + [True] * (len(cards) - 1)
        last = model.requests[-1]
        parts = [m for m in last if is_state_card(m)]
        assert len(parts) == len(cards)  # the card and one update per later epoch
        assert parts[0].text.startswith("<kernel_state ")
        assert all(p.text.startswith('<kernel_state_update after="clear">') for p in parts[1:])
        assert "- field: numpy.ndarray (50, 40) float64" in parts[0].text
        assert not any("field:" in p.text for p in parts[1:])  # unchanged: not said again
        said = [int(m.group(1)) for p in parts[1:] for m in re.finditer(r"- v(\d+) = ", p.text)]
        assert said == sorted(said) and len(set(said)) == len(said)  # each name once
        assert "- v19 = 19 (int)" in parts[-1].text and "executions so far" in parts[-1].text
        # each part follows a cleared result, never a call or the newest result
        for p in parts:
            before = last[last.index(p) - 1]
            assert isinstance(before, ToolMessage) and "result cleared" in before.text
        # the first card is the same message in every request from its epoch on
        first = [next(m for m in req if is_state_card(m)) for req in model.requests
                 if any(is_state_card(m) for m in req)]
        assert {(m.id, m.text) for m in first} == {(parts[0].id, parts[0].text)}
        usage = session.trace.events(["model_usage"])[-1].payload["request"]
        assert usage["state_card"] == sum(count_message(p, RULER) for p in parts)
    finally:
        session.close()
