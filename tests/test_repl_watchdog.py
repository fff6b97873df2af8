"""The REPL watchdog (``simagent.context.repl_watch``): pure core, then the real graph.

The pure tests pin the normalisation and each signal, including the cases that must
*not* alert (a fix in between, a different error, a changed file). The graph tests run
the scripted model against a real kernel, so the failing cells really fail and their
status comes from the kernel; "no orphaned call" is read from the checkpointed state,
and the counts from the session's own trace and ``/context`` stats.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import cli_fork
import pytest
from conftest import write_config
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from simagent.agent.builder import build_agent
from simagent.agent.events import ContextEvent, Notice
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.bench.policies import POLICIES
from simagent.context.guards import MARK
from simagent.context.panel import render_context
from simagent.context.repl_watch import (
    NUDGE_SOURCE,
    Cell,
    ReplWatchMiddleware,
    cells_of,
    error_signature,
    fired,
    normalise,
    same_code,
    scan,
)
from simagent.context.settings import ContextConfigError, ContextSettings
from simagent.context.stats import stats_from_trace
from simagent.context.thresholds import repl_watchdog_mode
from simagent.presentation.notices import context_line
from simagent.session import Session

VALUE_ERROR = """ValueError                                Traceback (most recent call last)
Cell In[3], line 2
      1 x = {n}
----> 2 raise ValueError(f"bad value {{x}}")

ValueError: bad value {n}"""


_codes = itertools.count()


def failed(sig: str, code: str | None = None, call_id: str | None = None) -> Cell:
    """A failed cell; each gets code of its own unless given (no accidental rerun)."""
    return Cell(code or f"f({next(_codes)})", "error", f"Traceback ...\n{sig}", call_id)


def ok(code: str = "g()") -> Cell:
    return Cell(code, "ok", "Out[1]: 1")


# ------------------------------------------------------------------ normalisation
def test_normalise_hides_addresses_numbers_and_quoted_paths():
    assert normalise("<Foo object at 0x7f3a9c1b2d10> is not <Foo object at 0x55d2>") == \
        "<Foo object at 0xADDR> is not <Foo object at 0xADDR>"
    assert normalise("step 12.5 of 42, tol 1e-06, dt=-3") == "step N of N, tol N, dt=N"
    assert normalise('File "/tmp/ws/model.py", line 88, in solve') == \
        'File "PATH", line N, in solve'
    assert normalise("can't open '/data/run_7/out.h5'") == "can't open 'PATH'"
    # digits inside names are part of the name
    assert normalise("float64 Chen2020 h5py x1") == "float64 Chen2020 h5py x1"


def test_signature_is_the_final_exception_line_normalised():
    text = VALUE_ERROR.format(n=1) + "\n[elapsed 0.1 s]"
    assert error_signature(text) == "ValueError: bad value N"
    assert error_signature(VALUE_ERROR.format(n=2)) == error_signature(text)
    # a message over several lines, a dotted type, printed output before the error
    multi = ("some printed line\nTraceback...\npybamm.SolverError: Could not find "
             "consistent states\n  at t=0.25 s")
    assert error_signature(multi) == "pybamm.SolverError: Could not find consistent " \
                                     "states at t=N s"
    assert error_signature("KeyError: 'voltage'") == "KeyError: 'voltage'"
    assert error_signature("...\nAssertionError") == "AssertionError"
    assert error_signature("interrupted after 30 s", "timeout") == "[timeout]"
    assert error_signature("no exception line here 42") == "no exception line here N"


def test_same_code_ignores_whitespace_but_not_indentation():
    assert same_code("x=f(1,2)\nprint(x)", "  x = f(1, 2)\n\n  print( x )  \n")
    assert same_code("for i in r:\n    f(i)", "for i in r:\n\tf(i)")
    assert not same_code("for i in r:\n    f(i)\ng()", "for i in r:\n    f(i)\n    g()")
    assert not same_code("x = f(1)", "x = f(2)")


# ------------------------------------------------------------------------ signals
def test_same_error_three_times_alerts_once_per_run():
    cells = [failed(f"ValueError: bad value {n}", f"v={n}") for n in (1, 2, 3, 4, 5)]
    [alert] = scan(cells)
    assert (alert.index, alert.signal, alert.signature, alert.count) == (
        2, "same_error", "ValueError: bad value N", 3)
    assert scan(cells[:2]) == []
    assert scan(cells, same_error=4, failed_run=0)[0].index == 3


def test_three_different_failures_in_a_row_alert():
    cells = [failed("KeyError: 'a'"), failed("TypeError: bad operand"),
             failed("NameError: name 'y' is not defined")]
    [alert] = scan(cells)
    assert (alert.index, alert.signal, alert.count) == (2, "failed_run", 3)
    assert alert.signature == "NameError: name 'y' is not defined"
    assert scan(cells, failed_run=0) == []


def test_a_success_resets_and_a_fix_between_errors_is_no_alarm():
    a, b = "ValueError: bad value 1", "IndexError: index 3 is out of bounds"
    # error -> fix -> error with a different signature -> still only 2 in a row
    assert scan([failed(a), ok(), failed(b), failed(a)]) == []
    # error -> fix -> the same error twice: the fix ended the run
    assert scan([failed(a), failed(a), ok(), failed(a), failed(a)]) == []
    # an interrupted cell (the user stepping in) or one with no kernel status ends a run
    assert scan([failed(a), failed(a), Cell("g()", "interrupted"), failed(a), failed(a)]) == []
    assert scan([failed(a), failed(a), Cell("g()", "unknown"), failed(a)]) == []
    # a new run after a success alerts again
    alerts = scan([failed(a) for _ in range(3)] + [ok()] + [failed(b) for _ in range(3)])
    assert [(x.index, x.signal) for x in alerts] == [(2, "same_error"), (6, "same_error")]


def test_whitespace_rerun_of_a_failed_cell_fires_before_it_runs():
    bad = failed("NameError: name 'undefined_thing' is not defined", "x = undefined_thing")
    pending = Cell("x  =  undefined_thing\n", None, call_id="c2")
    [alert] = scan([bad, pending])
    assert (alert.index, alert.signal, alert.call_id, alert.count) == (
        1, "whitespace_rerun", "c2", 1)
    assert alert.signature == "NameError: name 'undefined_thing' is not defined"
    # the same cell, run: the same alert at the same index (so it fires once)
    ran = Cell(pending.code, "error", bad.text, "c2")
    assert scan([bad, ran]) == [alert]
    # not after a success, not after a tool that may have changed files or the kernel,
    # not when the code really changed, and not when switched off
    assert scan([ok("x = 1"), Cell("x = 1", None)]) == []
    assert scan([bad, Cell(pending.code, None, changed=True)]) == []
    assert scan([bad, Cell("x = defined_thing", None)]) == []
    assert scan([bad, pending], whitespace=False) == []


# -------------------------------------------------------------- reading the thread
def _call(cid: str, code: str, name: str = "run_python") -> AIMessage:
    return AIMessage("", tool_calls=[{"name": name, "args": {"code": code}, "id": cid}])


def _result(cid: str, status: str | None, text: str = "") -> ToolMessage:
    return ToolMessage(text, tool_call_id=cid, name="run_python",
                       artifact={"raw_path": None, "status": status} if status else None)


def test_cells_come_from_the_current_turn_with_the_kernel_status():
    messages = [HumanMessage("first"), _call("a", "1/0"),
                _result("a", "error", "ZeroDivisionError"), HumanMessage("second"),
                _call("b", "f()"), _result("b", "error", "ValueError: bad value 1"),
                HumanMessage("[watchdog] ...", additional_kwargs={"lc_source": NUDGE_SOURCE,
                                                                   "call_ids": ["b"]}),
                AIMessage("", tool_calls=[{"name": "write_file", "args": {}, "id": "w"}]),
                ToolMessage("ok", tool_call_id="w", name="write_file"),
                _call("c", "f()"), _result("c", None, "Error: tool failed"),
                _call("d", "f( )")]
    cells = cells_of(messages)
    assert [(c.call_id, c.status, c.changed) for c in cells] == [
        ("b", "error", False), ("c", "unknown", True), ("d", None, False)]
    assert cells[0].signature == "ValueError: bad value N"
    assert fired(messages) == {"b"}


def test_settings_modes_and_front_end_defaults():
    assert repl_watchdog_mode(ContextSettings(), "tui") == "warn"
    assert repl_watchdog_mode(ContextSettings(), "headless") == "enforce"
    assert repl_watchdog_mode(ContextSettings(repl_watchdog="off"), "headless") == "off"
    # a small model does not act on a warning: it is stopped at the TUI too, unless set
    assert repl_watchdog_mode(ContextSettings(), "tui", small=True) == "enforce"
    assert repl_watchdog_mode(ContextSettings(repl_watchdog="warn"), "tui", small=True) == "warn"
    s = ContextSettings.from_mapping({"repl_watchdog": "enforce", "repl_same_error": 4,
                                      "repl_failed_run": 0, "repl_whitespace_rerun": False})
    assert (s.repl_watchdog, s.repl_same_error, s.repl_failed_run) == ("enforce", 4, 0)
    with pytest.raises(ContextConfigError, match="repl_watchdog"):
        ContextSettings.from_mapping({"repl_watchdog": "loud"})
    with pytest.raises(ContextConfigError, match="repl_failed_run"):
        ContextSettings.from_mapping({"repl_failed_run": -1})
    # the bench: simagent runs as headless does; baselines have no REPL watchdog
    assert repl_watchdog_mode(POLICIES["simagent"].settings, "tui") == "enforce"
    # the bounds run with simagent's prompt, tools and guards; only its clearing differs
    bounds = {"oracle", "oracle-cached"}
    assert all(repl_watchdog_mode(POLICIES[n].settings) == "enforce" for n in bounds)
    assert all(repl_watchdog_mode(p.settings) == "off" for n, p in POLICIES.items()
               if n != "simagent" and n not in bounds)


def test_headless_line():
    line = context_line(ContextEvent("repl_watchdog", {
        "signal": "same_error", "signature": "ValueError: bad value N", "count": 3,
        "mode": "enforce", "stopped": True, "agent": "main"}))
    assert line == "! repl watchdog: same error 3 times in a row: ValueError: bad value N; " \
                   "turn stopped"
    line = context_line(ContextEvent("repl_watchdog", {"signal": "whitespace_rerun",
                                                       "signature": "", "mode": "warn"}))
    assert line == "! repl watchdog: failed cell re-run with only whitespace changes"


# ----------------------------------------------------------------------- the graph
def bad_value(n: int) -> dict:
    code = f"x = {n}\nraise ValueError(f'bad value {{x}}')"
    return {"tool": "run_python", "args": {"code": code}}


@pytest.fixture
def opened(workspace):
    sessions = []

    def _open(steps, settings=None, front_end="tui"):
        session = Session.create(workspace, approval="auto")
        sessions.append(session)
        model = ScriptedChatModel.from_steps(steps)
        agent = build_agent(session, model, context_settings=settings or ContextSettings(),
                            front_end=front_end)
        return session, model, TurnRunner(session, agent)

    yield _open
    for s in sessions:
        s.close()


def _state(session: Session, runner: TurnRunner) -> list:
    return runner.agent.graph.get_state(session.thread_config).values["messages"]


def _no_orphans(messages: list) -> None:
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    calls = [c["id"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    assert set(calls) <= answered


def test_headless_enforce_ends_the_turn_after_the_same_error_three_times(opened):
    fourth = {"tool": "run_python", "args": {"code": "print('never runs')"}}
    session, model, runner = opened([bad_value(1), bad_value(2), bad_value(3), fourth,
                                     {"final": "unreachable"}], front_end="headless")
    events = []
    result = runner.run("go", events.append)
    assert result.status == "done"
    assert result.final.startswith("[watchdog] Turn stopped: the last 3 run_python cells "
                                   "failed with the same error (ValueError: bad value N)")
    results = session.trace.events(["tool_result"])
    assert [r.payload["status"] for r in results] == ["success"] * 3  # the tool ran fine
    assert all("ValueError: bad value" in r.payload["content"] for r in results)
    assert model.remaining == 1  # asked once more, its call stripped, never asked again
    messages = _state(session, runner)
    _no_orphans(messages)
    last = messages[-1]
    assert isinstance(last, AIMessage) and not last.tool_calls
    assert last.additional_kwargs[MARK]["guard"] == "repl_watchdog"
    [alert] = [e.payload for e in session.trace.events(["repl_watchdog"])]
    assert alert == {"signal": "same_error", "signature": "ValueError: bad value N",
                     "count": 3, "mode": "enforce", "stopped": True,
                     "tool_call_id": alert["tool_call_id"], "agent": "main"}
    assert [e.kind for e in events if isinstance(e, ContextEvent)] == ["repl_watchdog"]
    assert any(isinstance(e, Notice) and e.text.startswith("repl watchdog: the last 3")
               for e in events)
    # a rebuilt middleware reading the same checkpoint finds nothing new to raise
    again = ReplWatchMiddleware(session.trace, ContextSettings(), front_end="headless")
    assert again._new_alerts(messages) == []
    stats = stats_from_trace(session.paths.trace, ContextSettings())
    assert stats.repl_alerts.count == 1 and stats.watchdog_alerts.count == 0
    assert "REPL alerts" in render_context(stats, width=80)


def test_tui_warn_nudges_once_and_the_turn_goes_on(opened):
    fix = {"tool": "run_python", "args": {"code": "x = 4\nx"}}
    session, model, runner = opened([bad_value(1), bad_value(2), bad_value(3), bad_value(4),
                                     fix, {"final": "{out[-1]}"}])
    events = []
    result = runner.run("go", events.append)
    assert result.status == "done" and result.final.endswith(": 4")
    assert len(session.trace.events(["tool_result"])) == 5
    [alert] = [e.payload for e in session.trace.events(["repl_watchdog"])]
    assert (alert["signal"], alert["mode"], alert["stopped"]) == ("same_error", "warn", False)
    messages = _state(session, runner)
    nudges = [m for m in messages if isinstance(m, HumanMessage)
              and m.additional_kwargs.get("lc_source") == NUDGE_SOURCE]
    assert len(nudges) == 1 and nudges[0].text.startswith("[watchdog] The last 3 run_python")
    # it sits right after the third failure's result, and the model saw it next
    at = messages.index(nudges[0])
    assert isinstance(messages[at - 1], ToolMessage) and "bad value 3" in messages[at - 1].text
    assert nudges[0].text in [m.text for m in model.requests[3]]
    assert not any(nudges[0].text in m.text for m in model.requests[2])
    _no_orphans(messages)
    assert sum(isinstance(e, Notice) and e.text.startswith("repl watchdog:")
               for e in events) == 1
    assert stats_from_trace(session.paths.trace, ContextSettings()).repl_alerts.count == 1


def test_whitespace_rerun_is_stopped_before_it_runs(opened):
    first = {"tool": "run_python", "args": {"code": "y = undefined_thing + 1"}}
    rerun = {"tool": "run_python", "args": {"code": "  y  =  undefined_thing+1\n\n"}}
    session, model, runner = opened([first, rerun, {"final": "unreachable"}],
                                    ContextSettings(repl_watchdog="enforce"))
    result = runner.run("go")
    assert "re-run with only whitespace changes" in result.final
    assert len(session.trace.events(["tool_result"])) == 1  # the rerun never ran
    assert model.remaining == 1
    [alert] = [e.payload for e in session.trace.events(["repl_watchdog"])]
    assert alert["signal"] == "whitespace_rerun" and alert["stopped"] is True
    assert alert["signature"] == "NameError: name 'undefined_thing' is not defined"
    _no_orphans(_state(session, runner))


@pytest.mark.slow
def test_off_and_a_new_user_turn_start_afresh(opened):
    session, _model, runner = opened([bad_value(1), bad_value(2), {"final": "two failed"},
                                      bad_value(3), {"final": "one more failed"}],
                                     front_end="headless")
    assert runner.run("first").final == "two failed"
    # the user's next message is the intervention: the earlier failures do not count
    assert runner.run("second").final == "one more failed"
    assert not session.trace.events(["repl_watchdog"])
    session2, _model, runner2 = opened([bad_value(1), bad_value(2), bad_value(3),
                                        {"final": "ok"}], ContextSettings(repl_watchdog="off"),
                                       front_end="headless")
    assert runner2.run("go").final == "ok"
    assert not session2.trace.events(["repl_watchdog"])


def _simagent_run(workspace, tmp_path, steps) -> subprocess.CompletedProcess[str]:
    """``simagent run`` as a user runs it: a new process, the headless front end."""
    path = tmp_path / "script.json"
    path.write_text(json.dumps(steps))
    env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_MODEL"}
    return cli_fork.run([sys.executable, "-m", "simagent", "run", "--model",
                         f"scripted:{path}", "go"], cwd=workspace, env=env, text=True,
                        capture_output=True, timeout=180)


@pytest.mark.slow
def test_simagent_run_enforces_unless_config_says_otherwise(workspace, tmp_path):
    steps = [bad_value(1), bad_value(2), bad_value(3),
             {"tool": "run_python", "args": {"code": "print('fourth')"}},
             {"final": "went on"}]
    proc = _simagent_run(workspace, tmp_path, steps)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("[watchdog] Turn stopped: the last 3 run_python cells")
    assert ("! repl watchdog: same error 3 times in a row: ValueError: bad value N; turn "
            "stopped") in proc.stderr
    assert "! repl watchdog: the last 3" not in proc.stderr  # the notice is not repeated
    assert "fourth" not in proc.stderr
    # [context] repl_watchdog overrides the front end's default
    (workspace / ".simagent").mkdir(exist_ok=True)
    write_config(workspace, '[context]\nrepl_watchdog = "warn"\n')
    proc = _simagent_run(workspace, tmp_path, steps)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "went on"
    assert "! repl watchdog: same error 3 times in a row: ValueError: bad value N\n" in \
        proc.stderr
