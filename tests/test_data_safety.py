"""Data safety at fixed points: kills at exact instants, a full disk, secrets in sinks.

The random-kill property lives in ``test_kill_property.py``; these tests pin the cases a
timer rarely hits or that need a particular setup. All with real parts: a real SIGKILL
(the child kills itself inside the checkpointer), real SQLite, the real graph and
kernel, writes that really fail (``/dev/full``), and a real grep of every file written.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from conftest import write_config

from simagent.agent.builder import build_agent
from simagent.agent.resume_repair import INTERRUPTED, repair
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.bench.kill_child import (
    ChildSpec,
    alive,
    integrity,
    kill_context,
    request_problems,
    run_child,
    shape,
    state_problems,
)
from simagent.kernel_api.outputs import raw_name
from simagent.paths import SessionPaths
from simagent.session import Session
from simagent.trace import redact as redact_mod

#: the kernel process is what these tests are about (make test-real)
pytestmark = pytest.mark.real


def _write(workspace: Path, call_id: str) -> dict:
    return {"tool": "write_file", "id": call_id,
            "args": {"file_path": str(workspace / f"{call_id}.txt"), "content": "x"}}


@pytest.mark.parametrize("node", ["model", "tools"])
def test_a_kill_between_a_tasks_writes_and_its_checkpoint_resumes_consistently(
        workspace, node):
    """The kill falls after the checkpointer saved a task's writes and before the
    checkpoint that includes them. langgraph's live ``get_state`` shows those writes, a
    new run drops them: the resume repair must work on the saved state (repairing the
    live view once wrote a tool result whose call the saved state lacks)."""
    ctx = kill_context()
    home = os.environ["SIMAGENT_HOME"]
    turns = [[{"final": "one"}], [_write(workspace, "killme"), {"final": "two"}]]
    report = run_child(ctx, ChildSpec(str(workspace), home, turns, start_kernel=False,
                                      warm_up=False, die_after_writes_of=node))
    assert report.killed is False and report.exitcode == -9 and report.turns == ["done"]
    paths = SessionPaths.for_session(workspace, report.session_id)
    assert integrity(paths.trace) == "ok" and integrity(paths.checkpoints) == "ok"

    after = run_child(ctx, ChildSpec(str(workspace), home, [[{"final": "three"}]],
                                     session_id=report.session_id, start_kernel=False,
                                     warm_up=False))
    assert after.done, after.error
    assert state_problems(after.state_before or [], allow_open=True) == []
    assert state_problems(after.state_after or [], allow_open=False) == []
    assert all(request_problems(r) == [] for r in after.requests)
    if node == "tools":  # the finished write kept its real result, nothing was re-run
        assert ("tool", [], "killme") in after.state_after
        assert after.repaired == []


def test_killed_mid_cell_the_resume_answers_the_call_as_interrupted(workspace):
    """What the next stream would do unaided (verified): new input starts from START, the
    pending tools task is dropped (the killed cell is not run again) and deepagents'
    PatchToolCallsMiddleware answers the call generically. The repair says why, in the
    checkpoint and in the trace, before any turn."""
    ctx = kill_context()
    home = os.environ["SIMAGENT_HOME"]
    marker = workspace / "ran.txt"
    code = f"open({str(marker)!r}, 'a').write('x')\nimport time\ntime.sleep(60)"
    turns = [[{"tool": "run_python", "id": "slow", "args": {"code": code}}, {"final": "no"}]]
    report = run_child(ctx, ChildSpec(str(workspace), home, turns, warm_up=False),
                       kill_after_ready=1.5)
    assert report.killed and report.kernel_pids
    deadline = time.monotonic() + 3
    while alive(report.kernel_pids[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(report.kernel_pids[0]), "the kernel outlived its killed parent"

    session = Session.resume(workspace, report.session_id, approval="auto")
    try:
        model = ScriptedChatModel.from_steps([{"final": "seen: {out[-1]}"}])
        agent = build_agent(session, model)
        assert repair(session, agent.graph) == ["slow"]
        assert repair(session, agent.graph) == []  # idempotent
        messages = agent.graph.get_state(session.thread_config).values["messages"]
        assert state_problems(shape(messages), allow_open=False) == []
        assert messages[-1].content == INTERRUPTED and messages[-1].status == "error"
        result = TurnRunner(session, agent).run("what happened?")
        assert result.final == f"seen: {INTERRUPTED}"
        assert all(request_problems(shape(r)) == [] for r in model.requests)
        assert marker.read_text() == "x"  # the killed cell did not run a second time
        results = session.trace.events(["tool_result"])
        assert any(e.payload.get("interrupted") and e.payload["tool_call_id"] == "slow"
                   for e in results)
    finally:
        session.close()


def test_kernel_and_what_its_cells_started_die_with_a_killed_simagent(workspace):
    """ipykernel's own poller would end the kernel within a second, but alone: a process
    a cell started lives on. The launcher's watcher kills the kernel's process group
    the moment its parent dies."""
    ctx = kill_context()
    home = os.environ["SIMAGENT_HOME"]
    pidfile = workspace / "child.pid"
    code = (f"import subprocess\np = subprocess.Popen(['sleep', '300'])\n"
            f"open({str(pidfile)!r}, 'w').write(str(p.pid))\nimport time\ntime.sleep(60)")
    turns = [[{"tool": "run_python", "id": "spawn", "args": {"code": code}}, {"final": "no"}]]
    report = run_child(ctx, ChildSpec(str(workspace), home, turns, warm_up=False),
                       kill_after_ready=2.0)
    assert report.killed and report.kernel_pids
    sleeper = int(pidfile.read_text())
    # ipykernel's own poller ends the kernel but not the sleeper in its group: the
    # sleeper's death is what proves the launcher's watcher (the bound is not a timing)
    deadline = time.monotonic() + 30
    while (alive(sleeper) or alive(report.kernel_pids[0])) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(report.kernel_pids[0])
    assert not alive(sleeper), "a process started by a cell outlived simagent"


def test_a_full_disk_loses_the_raw_output_not_the_execution(workspace):
    """``outputs/NNNN.txt`` is a link to ``/dev/full``: every write of the raw output
    fails with ENOSPC, through the real write path (Capture, the real kernel, the real
    graph). The cell still returns the text the model would have got, with one line
    saying what was lost, and the session goes on."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    session = Session.create(workspace, approval="auto")
    try:
        session._warmed = True  # no simulator warm-up: the next execution is the cell
        n = session.kernel._seq + 1
        (session.paths.outputs / raw_name(n)).symlink_to("/dev/full")
        code = "for i in range(20000):\n    print(f'row {i}: value {i * 3}')"
        model = ScriptedChatModel.from_steps([
            {"tool": "run_python", "id": "big", "args": {"code": code}},
            {"tool": "run_python", "id": "after", "args": {"code": "print('still here')"}},
            {"final": "done"}])
        result = TurnRunner(session, build_agent(session, model)).run("print a lot")
        assert result.status == "done", result.error
        # big as the request after it showed it (the cost rule may clear it later)
        big = next(m for m in model.requests[1] if m.type == "tool").text
        after = [m for m in model.requests[-1] if m.type == "tool"][-1].text
        assert "row 19999: value 59997" in big  # the capped tail the model gets
        assert (f"disk full: raw output of execution {n} not saved (" in big
                and "bytes lost); the model got the capped text" in big)
        assert after.strip().startswith("still here") and "disk full" not in after
        execs = session.trace.events(["kernel_exec"])
        assert execs[0].payload["raw_path"] is None and execs[0].payload["status"] == "ok"
        assert Path(execs[1].payload["raw_path"]).read_text() == "still here\n"
    finally:
        session.close()


SECRET = "sk-test-0123456789abcdefSECRET"
CONFIG_SECRET = "cfg-token-9876543210zyxwv"


def _hits(roots: list[Path], needles: list[str]) -> list[str]:
    found = []
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                found += [f"{path}: {n}" for n in needles if n.encode() in data]
    return found


def test_secrets_reach_no_file_simagent_writes(workspace, tmp_path, monkeypatch):
    """A key from the environment and one from the config, printed by a cell, echoed by
    the model (quoting the tool result, and once verbatim), typed into the TUI's input
    history, and carried into a bench record: zero hits in any file under the state
    home, the workspace's state and the bench output, the conversation
    (``checkpoints.sqlite``) included, even after the model says the key itself: its
    serializer redacts (``agent/secrets.py``), so the turn's final answer, read back
    from the saved state, is redacted too."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("MY_LLM_KEY", CONFIG_SECRET)  # named by api_key_env only
    (workspace / ".simagent").mkdir()
    write_config(workspace,
        '[model]\nname = "scripted"\napi_key_env = "MY_LLM_KEY"\n')
    from simagent.config import Config

    # the registry is process-wide: this test's config secrets must not outlive it
    monkeypatch.setattr(redact_mod, "_registered", {})
    monkeypatch.setattr(redact_mod, "_named_vars", set())
    redact_mod.register_config(Config.load(workspace))
    session = Session.create(workspace, approval="auto")
    home = Path(os.environ["SIMAGENT_HOME"])
    try:
        session._warmed = True
        code = ("import os\nprint('key', os.environ['OPENAI_API_KEY'])\n"
                "print('cfg', os.environ['MY_LLM_KEY'])\nos.environ['OPENAI_API_KEY']")
        model = ScriptedChatModel.from_steps([
            {"tool": "run_python", "id": "leak", "args": {"code": code}},
            {"final": "the output was: {out[-1]}"}])
        runner = TurnRunner(session, build_agent(session, model))
        first = runner.run("show me the key")
        assert first.status == "done" and "[redacted:OPENAI_API_KEY]" in first.final
        assert _hits([home, workspace], [SECRET, CONFIG_SECRET]) == []  # incl. checkpoints

        model.cursor.steps.append({"final": f"verbatim: {SECRET} and {CONFIG_SECRET}"})
        second = runner.run(f"repeat it: {SECRET}")
        assert "verbatim: [redacted:OPENAI_API_KEY]" in second.final  # as saved
        from simagent.presentation.transcript import render_html, render_markdown

        events = session.trace.events()
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "t.md").write_text(render_markdown(events))
        (tmp_path / "out" / "t.html").write_text(render_html(events))
        from simagent.tui.history import redacting_file_history

        history = redacting_file_history(str(home / "input_history"))
        history.store_string(f"repeat it: {SECRET}")
        from simagent.bench import workflow_runs as bench_runner

        bench_runner.append_record(tmp_path / "out" / "records.jsonl", {"final": second.final})
    finally:
        session.close()
    assert _hits([home, workspace, tmp_path / "out"], [SECRET, CONFIG_SECRET]) == []
