"""The check before final (``agent/number_check.py``, ``[answers] check_numbers``): a final
answer with a number no source shows gets one nudge per turn, what stays unsourced is
marked, and a bad config value is named with its file. Real graph, session and kernel
seam; the model is scripted (so each test sets the mode: a script's default is off)."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import cli_fork
import pytest
from conftest import write_config
from langchain_core.messages import HumanMessage

from simagent import exit_codes
from simagent.agent.builder import build_agent, numbers_mode
from simagent.agent.number_check import is_nudge
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.config import Config, ConfigError
from simagent.headless import RunOptions, run_headless
from simagent.session import Session

PRINT_K = {"tool": "run_python", "args": {"code": "print('k =', 0.31647)"}}
FIRST = {"final": "k is 0.316 and R0 is 3.9."}


def _run(workspace: Path, steps: list[dict],
         mode: str | None = "nudge") -> tuple[Session, TurnRunner, object]:
    """A turn of a scripted model; ``mode`` is written to the config (a scripted model's
    check is off unless the config sets it: ``builder.numbers_mode``)."""
    if mode is not None:
        write_config(workspace, f'[answers]\ncheck_numbers = "{mode}"\n')
    session = Session.create(workspace, approval="auto")
    runner = TurnRunner(session, build_agent(session, ScriptedChatModel.from_steps(steps)))
    return session, runner, runner.run("fit k and R0")


def _messages(runner: TurnRunner) -> list:
    state = runner.agent.graph.get_state(runner.session.thread_config)
    return state.values["messages"]


def test_an_unsourced_number_gets_one_nudge_and_the_computed_answer_stands(workspace):
    session, runner, result = _run(workspace, [
        PRINT_K, FIRST,
        {"tool": "run_python", "args": {"code": "print('R0 =', 3.912)"}},
        {"final": "k is 0.316 and R0 is 3.91."}])
    try:
        assert result.status == "done"
        assert result.final == "k is 0.316 and R0 is 3.91."
        nudges = [m for m in _messages(runner) if is_nudge(m)]
        assert len(nudges) == 1 and "3.9" in nudges[0].content
        assert nudges[0].additional_kwargs["unsourced"] == ["3.9"]
        # the nudge's call is counted like any other: four model calls in the turn
        assert len(session.trace.events(["model_usage"])) == 4
    finally:
        session.close()


def test_a_kept_number_is_nudged_once_then_marked(workspace):
    session, runner, result = _run(workspace, [PRINT_K, FIRST, FIRST])
    try:
        assert [is_nudge(m) for m in _messages(runner)].count(True) == 1
        assert result.final.startswith("k is 0.316 and R0 is 3.9.")
        assert result.final.endswith("[unsourced: 3.9: no cell output, tool result or message "
                                     "of yours shows this number]")
        # a later turn is a new turn: its unsourced final is nudged again
        runner.agent = build_agent(session, ScriptedChatModel.from_steps(
            [{"final": "R0 is 4.2."}, {"final": "R0 is 4.2."}]))
        runner.run("and now?")
        assert [is_nudge(m) for m in _messages(runner)].count(True) == 2
    finally:
        session.close()


@pytest.mark.parametrize(("mode", "calls"), [("mark", 2), ("off", 2)])
def test_mark_and_off_ask_nothing(workspace, mode, calls):
    session, runner, result = _run(workspace, [PRINT_K, FIRST], mode)
    try:
        assert not any(is_nudge(m) for m in _messages(runner))
        assert len(session.trace.events(["model_usage"])) == calls
        assert ("[unsourced: 3.9" in result.final) == (mode == "mark")
    finally:
        session.close()


def test_a_sourced_answer_is_left_alone(workspace):
    session, runner, result = _run(workspace, [PRINT_K, {"final": "k is 0.316."}])
    try:
        assert result.final == "k is 0.316."
        assert not [m for m in _messages(runner) if isinstance(m, HumanMessage)
                    and is_nudge(m)]
    finally:
        session.close()


def test_the_default_is_nudge_and_off_for_a_script_that_cannot_answer(workspace):
    session = Session.create(workspace, approval="auto")
    try:
        assert numbers_mode(session, object()) == "nudge"
        assert numbers_mode(session, ScriptedChatModel.from_steps([])) == "off"
    finally:
        session.close()
    session, _runner, result = _run(workspace, [PRINT_K, FIRST], mode=None)
    try:
        assert result.final == "k is 0.316 and R0 is 3.9."
    finally:
        session.close()


def test_a_bad_value_names_the_file(workspace):
    path = write_config(workspace, '[answers]\ncheck_numbers = "loud"\n')
    with pytest.raises(ConfigError) as info:
        Config.load(workspace).check_numbers()
    assert str(info.value) == (f"{path}: [answers] check_numbers = 'loud' is not one of "
                               "'nudge', 'mark', 'off'")


def test_run_json_marks_the_kept_number_unsourced(workspace, tmp_path):
    write_config(workspace, '[answers]\ncheck_numbers = "nudge"\n')
    script = tmp_path / "script.json"
    script.write_text(json.dumps([PRINT_K, FIRST, FIRST]))
    out, err = io.StringIO(), io.StringIO()
    code = run_headless(RunOptions(workspace=workspace, model=f"scripted:{script}",
                                   prompt="fit k and R0", json=True, approval="auto"),
                        out, err)
    assert code == exit_codes.OK, err.getvalue()
    data = json.loads(out.getvalue())
    assert {n["text"]: n["status"] for n in data["numbers"]} == \
        {"0.316": "sourced", "3.9": "unsourced"}
    assert "simagent: numbers: 1 sourced, 0 derived, 0 input, 1 unsourced" in err.getvalue()


@pytest.mark.real
def test_run_json_nudges_once_on_a_kernel_process(workspace, tmp_path):
    write_config(workspace, '[answers]\ncheck_numbers = "nudge"\n')
    script = tmp_path / "script.json"
    script.write_text(json.dumps([PRINT_K, FIRST, FIRST]))
    env = {k: v for k, v in os.environ.items()
           if k not in ("SIMAGENT_MODEL", "SIMAGENT_TEST_KERNEL")}
    proc = cli_fork.run([sys.executable, "-m", "simagent", "run", "--json", "--approval",
                         "auto", "--model", f"scripted:{script}", "fit k and R0"],
                        cwd=workspace, env=env, text=True, capture_output=True, timeout=180)
    assert proc.returncode == exit_codes.OK, proc.stderr
    data = json.loads(proc.stdout)
    assert proc.stderr.count("numbers: asked the model about 3.9") == 1
    assert data["final"].endswith("shows this number]")
    assert {n["text"]: n["status"] for n in data["numbers"]} == \
        {"0.316": "sourced", "3.9": "unsourced"}
