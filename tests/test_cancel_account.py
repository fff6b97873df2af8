"""ctrl+C on a cell that ignores SIGINT (issue 30 item 3): the recovery ladder restarts
the kernel and replays; the person and the model must both be told so, in the same
words, instead of "the kernel kept its state" and "did not complete".

Real kernel, real graph, real trace, scripted model; the headless case is the real CLI
in a subprocess that gets a real SIGINT.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import cli_fork
import pytest
from langchain_core.messages import ToolMessage

from simagent.agent.builder import build_agent
from simagent.agent.cancel_account import account, assigned_names, lost_line
from simagent.agent.events import Notice, ToolFinished
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.session import Session

STUBBORN = ("keepme = 7\nimport signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "open({flag!r}, 'w').close()\ntime.sleep(60)")


def test_the_interrupted_cells_own_names_are_named_as_lost():
    code = "keepme = 7\nimport numpy as np\nfor i in range(3):\n    pass\ndef f(): pass"
    assert assigned_names(code) == ["keepme", "np", "i", "f"]
    line = lost_line(code, "interrupted", {"restarted": True, "names": ["np"]})
    assert "NOT back: keepme, i, f" in line  # np came back with an earlier cell
    assert lost_line(code, "interrupted", None) == ""  # no restart: nothing lost
    assert account("row\n[the kernel was restarted; names back: n]") == \
        "the kernel was restarted; names back: n"


def _wait_file(path: Path, limit_s: float = 60) -> None:
    deadline = time.monotonic() + limit_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("force", [False, True])
def test_a_restart_under_a_cancelled_cell_is_told_to_person_and_model(workspace, tmp_path,
                                                                      force):
    flag = tmp_path / "ignoring-sigint"
    steps = [{"tool": "run_python", "args": {"code": "n = 5"}}, {"final": "n set"},
             {"tool": "run_python", "args": {"code": STUBBORN.format(flag=str(flag))}},
             {"final": "told: {out[-1]|(NOT back: \\w+)}"}]  # the cancel ends the turn first
    session = Session.create(workspace, approval="auto")
    try:
        model = ScriptedChatModel.from_steps(steps)
        runner = TurnRunner(session, build_agent(session, model))
        session.start_kernel()
        assert runner.run("set n").status == "done"
        events: list = []
        out: dict = {}
        t = threading.Thread(target=lambda: out.setdefault("r", runner.run("sleep",
                                                                           events.append)))
        t.start()
        _wait_file(flag)  # SIGINT is ignored from here on
        runner.cancel()
        if force:
            deadline = time.monotonic() + 30
            while not any(isinstance(e, Notice) and "interrupt" in e.text for e in events) \
                    and session.kernel_state != "busy" and time.monotonic() < deadline:
                time.sleep(0.05)
            runner.cancel(force=True)
        t.join(120)
        assert not t.is_alive()
        result = out["r"]
        assert result.status == "cancelled"
        notes = [e.text for e in events if isinstance(e, Notice)]
        assert not any("kept its state" in n for n in notes), notes
        if force:
            assert any(n.startswith("Not waiting for the cell") for n in notes), notes
            assert not any("model call did not stop" in n for n in notes), notes
        else:
            (rec,) = result.recovery
            assert rec["outcome"] == "restarted"
            assert "names back: n" in rec["account"] and "NOT back: keepme" in rec["account"]
            closing = notes[-1]
            assert closing == f"Turn cancelled: {rec['account']}"
            assert "the kernel was restarted" in closing
            (card,) = [e for e in events if isinstance(e, ToolFinished)
                       and e.name == "run_python"]
            assert card.outcome == "restarted"
        # the model's next request holds the real result of the interrupted call
        nxt = runner.run("what happened?", events.append)
        assert nxt.status == "done" and nxt.final == "told: NOT back: keepme"
        answered = [m for m in model.requests[-1] if isinstance(m, ToolMessage)][-1]
        assert "the kernel was restarted" in answered.text
        assert "did not complete" not in answered.text
        if force:  # the person was told how the cell ended, too
            late = [e for e in events if isinstance(e, ToolFinished) and e.name == "run_python"]
            assert late and late[0].outcome == "restarted"
            assert any("The interrupted cell has stopped" in e.text or
                       "restarted" in e.text for e in events if isinstance(e, Notice))
    finally:
        session.close()


@pytest.mark.real
@pytest.mark.slow
def test_headless_ctrl_c_reports_the_restart_on_stderr_and_in_json(workspace, tmp_path,
                                                                   _state_home):
    flag = tmp_path / "ignoring-sigint"
    path = tmp_path / "s.json"
    path.write_text(json.dumps([
        {"tool": "run_python", "args": {"code": STUBBORN.format(flag=str(flag))}},
        {"final": "unreachable"}]))
    env = {**os.environ, "SIMAGENT_HOME": str(_state_home)}
    env.pop("SIMAGENT_MODEL", None)
    proc = cli_fork.popen([sys.executable, "-m", "simagent", "run", "--json", "--model",
                           f"scripted:{path}", "sleep"], cwd=workspace, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_file(flag, 120)
        proc.send_signal(signal.SIGINT)  # ctrl+C: the simagent process only
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    from simagent import exit_codes

    assert proc.returncode == exit_codes.CANCELLED, err
    report = json.loads(out.strip().splitlines()[-1])
    (rec,) = report["recovery"]
    assert rec["outcome"] == "restarted" and "NOT back: keepme" in rec["account"]
    assert f"! Turn cancelled: {rec['account']}" in err
    assert "the kernel was restarted" in err and "kept its state" not in err
    assert "↻ run_python kernel restarted" in err


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_tui_second_ctrl_c_on_a_stopping_cell_tells_the_truth_and_the_bar_follows(
        workspace, tmp_path, _state_home):
    """In a real terminal: the second ctrl+C names the cell, not the model; the account
    of the restart appears when the cell has stopped; the bar leaves `kernel busy` when
    the kernel does; and the model's next turn reads the same account."""
    from test_tui_terminal import Pane

    flag = tmp_path / "ignoring-sigint"
    path = tmp_path / "s.json"
    path.write_text(json.dumps([
        {"tool": "run_python", "args": {"code": "n = 5"}}, {"final": "n set"},
        {"tool": "run_python", "args": {"code": STUBBORN.format(flag=str(flag))}},
        {"final": "told: {out[-1]|(NOT back: \\w+)}"}]))
    pane = Pane(workspace, f"scripted:{path}", _state_home)

    def flat(screen: str) -> str:
        return " ".join(screen.split())

    try:
        pane.wait_for(lambda s: "kernel idle" in s and "›" in s)
        pane.type("set n")
        pane.wait_for(lambda s: "n set" in s)
        pane.type("sleep")
        _wait_file(flag, 120)
        pane.send("C-c")
        pane.wait_for(lambda s: "interrupting" in s, timeout=20)
        pane.send("C-c")
        pane.wait_for(lambda s: "Not waiting for the cell" in flat(s), timeout=20)
        assert "model call did not stop" not in flat(pane.screen())
        done = pane.wait_for(lambda s: "The interrupted cell has stopped" in flat(s)
                             and "kernel idle" in s.splitlines()[-1], timeout=120)
        told = flat(done)
        assert "the kernel was restarted" in told and "NOT back: keepme" in told
        assert "kept its state" not in told
        assert "↻ run_python" in done  # the card's mark: the kernel restarted under it
        pane.type("what happened?")
        pane.wait_for(lambda s: "told: NOT back: keepme" in s, timeout=60)
    finally:
        pane.close()
