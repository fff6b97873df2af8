"""``simagent run`` / ``sessions`` / ``transcript`` as a user runs them: real processes.

Each test starts the real CLI (new Python process, real kernel, real SQLite). Provider
code is exercised against a local OpenAI-compatible HTTP server (``openai_stub``), with
the real langchain-openai client on the other end.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import cli_fork
import pytest
from conftest import write_config
from openai_stub import OpenAIStub, Reply, error_reply

SIMAGENT = [sys.executable, "-m", "simagent"]


def cli(workspace: Path, *args: str, env: dict[str, str] | None = None,
        timeout: float = 180) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_MODEL"}
    full_env.update(env or {})
    return cli_fork.run([*SIMAGENT, *args], cwd=workspace, env=full_env, text=True,
                        capture_output=True, timeout=timeout)


def script(path: Path, steps: list[dict]) -> str:
    path.write_text(json.dumps(steps))
    return f"scripted:{path}"


def trace_kinds(state_dir: str) -> list[str]:
    db = sqlite3.connect(Path(state_dir) / "trace.sqlite")
    try:
        return [k for (k,) in db.execute("SELECT kind FROM events ORDER BY id")]
    except sqlite3.OperationalError:  # polled before the writer created its table
        return []
    finally:
        db.close()


@pytest.mark.real
def test_run_json_reports_the_contract_fields(workspace, tmp_path):
    model = script(tmp_path / "a.json", [
        {"tool": "run_python", "args": {"code": "import statistics\n"
                                        "print(statistics.mean([3, 5, 10]))"}},
        {"final": "mean = {out[-1]}"}])
    proc = cli(workspace, "run", "--model", model, "--json", "average 3, 5, 10")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) >= {"session_id", "final", "tool_calls", "usage", "trace_path",
                         "state_dir"}
    assert data["final"] == "mean = 6"
    assert data["tool_calls"] == 1
    assert set(data["usage"]) == {"input_tokens", "output_tokens", "cache_read"}
    assert data["usage"]["input_tokens"] > 1000  # system prompt + tool schemas, counted
    assert Path(data["trace_path"]).is_file()
    assert Path(data["state_dir"], "checkpoints.sqlite").is_file()
    # the kernel starts (and the default simulator warms up) before the turn
    assert trace_kinds(data["state_dir"])[:3] == ["session_start", "kernel_exec",
                                                  "message_user"]


@pytest.mark.slow
def test_plain_run_streams_the_answer_to_stdout_and_activity_to_stderr(workspace, tmp_path):
    model = script(tmp_path / "a.json", [
        {"tool": "run_python", "args": {"code": "print(2 ** 10)"}},
        {"final": "It is {out[-1]}."}])
    proc = cli(workspace, "run", "--model", model, "power")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "It is 1024.\n"
    assert "run_python: print(2 ** 10)" in proc.stderr
    assert "[session " in proc.stderr


@pytest.mark.slow
def test_resume_in_a_new_process_with_another_model(workspace, tmp_path):
    first = script(tmp_path / "first.json", [
        {"tool": "run_python", "args": {"code": "secret_number = 31337\nprint('set')"}},
        {"final": "stored"}])
    p1 = cli(workspace, "run", "--model", first, "--json", "store a number")
    assert p1.returncode == 0, p1.stderr
    sid = json.loads(p1.stdout)["session_id"]

    # Model B: the earlier tool result must be in its request (history carried over),
    # and the kernel must be fresh (state is not carried across processes).
    second = script(tmp_path / "second.json", [
        {"tool": "run_python", "args": {"code": "secret_number"}},
        {"final": "earlier: {out[0]}; now: {out[-1]|(NameError)}"}])
    p2 = cli(workspace, "run", "--model", second, "--resume", sid[:15], "--json",
             "what was it?")
    assert p2.returncode == 0, p2.stderr
    data = json.loads(p2.stdout)
    assert data["session_id"] == sid
    assert data["final"] == "earlier: set; now: NameError"
    kinds = trace_kinds(data["state_dir"])
    assert kinds.count("message_user") == 2
    assert "session_resume" in kinds and "model_switch" in kinds
    db = sqlite3.connect(data["trace_path"])
    (payload,) = db.execute("SELECT payload FROM events WHERE kind='session_resume'").fetchone()
    (switch,) = db.execute("SELECT payload FROM events WHERE kind='model_switch'").fetchone()
    db.close()
    assert json.loads(payload)["kernel_restarted"] is True
    assert json.loads(switch) == {"from_model": first, "to_model": second}

    # --continue picks the same session, and `sessions` lists it with both turns.
    third = script(tmp_path / "third.json", [{"final": "third turn"}])
    p3 = cli(workspace, "run", "--model", third, "--continue", "--json", "again")
    assert json.loads(p3.stdout)["session_id"] == sid
    listing = cli(workspace, "sessions", "--json")
    rows = json.loads(listing.stdout)
    assert rows[0]["id"] == sid and rows[0]["turns"] == 3


@pytest.mark.slow
def test_resumed_prompt_says_the_kernel_restarted(workspace, tmp_path):
    from simagent.agent.builder import build_agent
    from simagent.agent.scripted import ScriptedChatModel
    from simagent.session import Session

    p1 = cli(workspace, "run", "--model", script(tmp_path / "a.json", [{"final": "hi"}]),
             "--json", "hello")
    sid = json.loads(p1.stdout)["session_id"]
    session = Session.resume(workspace, sid)
    try:
        model = ScriptedChatModel.from_steps([{"final": "ok"}])
        agent = build_agent(session, model)
        from simagent.agent.runner import TurnRunner

        TurnRunner(session, agent).run("again")
        system = model.requests[0][0].text
        assert "kernel was restarted" in system and "are gone" in system
        assert [m.type for m in model.requests[0]] == ["system", "human", "ai", "human"]
    finally:
        session.close()


@pytest.mark.slow
def test_approval_ask_pauses_execute_exits_3_and_approve_continues(workspace, tmp_path):
    (workspace / "input.txt").write_text("one\ntwo\nthree\n")
    model = script(tmp_path / "a.json", [
        {"tool": "execute", "args": {"command": "wc -l input.txt"}},
        {"final": "{out[-1]|(\\d+) input.txt} lines"}])
    p1 = cli(workspace, "run", "--model", model, "--approval", "ask", "--json", "count")
    assert p1.returncode == 3, p1.stderr
    data = json.loads(p1.stdout)
    assert data["status"] == "paused"
    assert "waiting for approval: execute wc -l input.txt" in p1.stderr
    assert trace_kinds(data["state_dir"])[-2:] == ["hitl_request", "session_end"]

    # The script restarts in the new process; skip the already-made call.
    resume_model = script(tmp_path / "b.json", [{"final": "{out[-1]|(\\d+) input.txt} lines"}])
    p2 = cli(workspace, "run", "--model", resume_model, "--resume", data["session_id"],
             "--approve", "--json")
    assert p2.returncode == 0, p2.stderr
    assert json.loads(p2.stdout)["final"] == "3 lines"
    assert "hitl_response" in trace_kinds(data["state_dir"])


@pytest.mark.slow
def test_openai_compatible_model_end_to_end_over_http(workspace):
    replies = [Reply(tool_calls=[("run_python", json.dumps({"code": "print(6 * 7)"}))],
                     prompt_tokens=1200, completion_tokens=30, cached_tokens=1000),
               Reply(text="The kernel says 42.", prompt_tokens=1300, completion_tokens=8,
                     cached_tokens=1100)]
    with OpenAIStub(replies) as stub:
        proc = cli(workspace, "run", "--model", f"openai-compatible:local-model@{stub.base_url}",
                   "--json", "what is 6*7?")
        bodies = [r.body for r in stub.chat_requests]
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["final"] == "The kernel says 42."
    assert data["usage"] == {"input_tokens": 2500, "output_tokens": 38, "cache_read": 2100}
    assert len(bodies) == 2
    assert {t["function"]["name"] for t in bodies[0]["tools"]} >= {"run_python", "read_file"}
    tool_msgs = [m for m in bodies[1]["messages"] if m["role"] == "tool"]
    assert tool_msgs and tool_msgs[-1]["content"] == "42"
    assert bodies[0]["messages"][0]["role"] == "system"


@pytest.mark.slow
def test_provider_error_is_one_line_and_exit_4(workspace):
    with OpenAIStub([error_reply(401, "invalid api key")]) as stub:
        proc = cli(workspace, "run", "--model", f"openai-compatible:m@{stub.base_url}", "hi",
                   env={"SIMAGENT_HOME": os.environ["SIMAGENT_HOME"]})
    assert proc.returncode == 4, proc.stderr
    err_lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("simagent: error")]
    assert len(err_lines) == 1 and "authentication" in err_lines[0].lower()
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_missing_key_names_the_variable(workspace):
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    proc = cli_fork.run([*SIMAGENT, "run", "--model", "anthropic:claude-sonnet-4-5", "hi"],
                        cwd=workspace, env=env, text=True, capture_output=True, timeout=60)
    assert proc.returncode == 2  # a configuration error (README: exit codes)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "ANTHROPIC_API_KEY" in lines[0]


def test_no_model_configured_is_a_usage_error(workspace):
    proc = cli(workspace, "run", "hi")
    assert proc.returncode == 2
    assert "no model configured" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_model_from_workspace_config(workspace, tmp_path):
    model = script(tmp_path / "a.json", [{"final": "configured"}])
    (workspace / ".simagent").mkdir()
    write_config(workspace, f'model = "{model}"\n')
    proc = cli(workspace, "run", "hello")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "configured"


@pytest.mark.real
def test_transcript_markdown_and_html_with_an_embedded_figure(workspace, tmp_path):
    model = script(tmp_path / "a.json", [
        {"tool": "run_python", "args": {"code": "import matplotlib.pyplot as plt\n"
                                        "plt.plot([1, 2, 3], [1, 4, 9]); plt.show()"}},
        {"final": "plotted"}])
    p = cli(workspace, "run", "--model", model, "--json", "plot squares")
    assert p.returncode == 0, p.stderr
    md = cli(workspace, "transcript")
    assert md.returncode == 0, md.stderr
    assert "plot squares" in md.stdout and "plt.plot([1, 2, 3], [1, 4, 9])" in md.stdout
    out = tmp_path / "t.html"
    html = cli(workspace, "transcript", "-o", str(out))
    assert html.returncode == 0, html.stderr
    text = out.read_text()
    assert "data:image/png;base64," in text and "plotted" in text
    bad = cli(workspace, "transcript", "nope")
    assert bad.returncode == 2 and "no session matches" in bad.stderr


@pytest.mark.parametrize("args", [["run", "--approve"], ["run", "x", "--approve"]])
def test_approve_needs_a_session(workspace, args):
    proc = cli(workspace, *args)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.real
def test_a_killed_process_leaves_trace_and_checkpoints_resumable(workspace, tmp_path):
    import signal
    import time

    model = script(tmp_path / "a.json", [
        {"tool": "run_python", "args": {"code": "import time\nprint('working', flush=True)\n"
                                        "time.sleep(60)"}},
        {"final": "never"}])
    env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_MODEL"}
    proc = cli_fork.popen([*SIMAGENT, "run", "--model", model, "--json", "long job"],
                          cwd=workspace, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        traces: list[Path] = []
        while time.monotonic() < deadline:
            traces = list(Path(os.environ["SIMAGENT_HOME"]).glob("workspaces/*/sessions/*/"
                                                                  "trace.sqlite"))
            if traces and "tool_call" in trace_kinds(str(traces[0].parent)):
                break
            time.sleep(0.2)
        assert traces, "the run never started its tool call"
        outputs = traces[0].parent / "outputs"
        while time.monotonic() < deadline:  # killed mid-cell: once the cell has printed
            if any("working" in p.read_text() for p in outputs.glob("*.txt")):
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    state_dir = traces[0].parent
    for name in ("trace.sqlite", "checkpoints.sqlite"):
        db = sqlite3.connect(state_dir / name)
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        db.close()
    assert trace_kinds(str(state_dir))[-1] == "tool_call"  # written before the kill

    again = script(tmp_path / "b.json", [{"final": "resumed fine"}])
    p2 = cli(workspace, "run", "--model", again, "--resume", state_dir.name, "--json",
             "are you there?")
    assert p2.returncode == 0, p2.stderr
    assert json.loads(p2.stdout)["final"] == "resumed fine"


@pytest.mark.slow
def test_run_with_a_replay_model_uses_the_workflow_simulator(workspace):
    """``--model replay:WORKFLOW`` is the zero-key demo: the workflow's simulator and
    inputs come with it, as they do in the TUI."""
    proc = cli(workspace, "run", "--model", "replay:simpy-call-center", "--json", "go")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    db = sqlite3.connect(Path(data["state_dir"]) / "trace.sqlite")
    try:
        (payload,) = db.execute("SELECT payload FROM events WHERE kind = 'session_start'"
                                ).fetchone()
    finally:
        db.close()
    assert json.loads(payload)["simulator"] == "simpy"
    assert data["tool_calls"] >= 5 and "agents" in data["final"]


@pytest.mark.slow
@pytest.mark.parametrize("signals", [1, 2])
def test_ctrl_c_while_the_model_is_silent_ends_the_run_and_keeps_the_session(workspace,
                                                                             tmp_path,
                                                                             signals):
    """SIGINT while the provider has not sent a token: the run ends as cancelled now
    (not when the model answers), and the session resumes. A second ctrl+C while the
    first is being handled changes nothing."""
    import signal
    import time

    model = script(tmp_path / "a.json", [{"final": "never shown", "wait": 60}])
    env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_MODEL"}
    proc = cli_fork.popen([*SIMAGENT, "run", "--model", model, "--json", "think"],
                          cwd=workspace, env=env, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
    try:
        from simagent.paths import workspace_state_dir

        sessions = workspace_state_dir(workspace) / "sessions"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the turn (and so the model call) has begun
            traces = list(sessions.glob("*/trace.sqlite")) if sessions.is_dir() else []
            if traces and "message_user" in trace_kinds(str(traces[0].parent)):
                break
            time.sleep(0.1)
        time.sleep(1.0)
        for _ in range(signals):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.5)
        out, err = proc.communicate(timeout=30)  # well before the model's 60 s
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    data = json.loads(out)
    assert data["status"] == "cancelled" and "Traceback" not in err
    again = cli(workspace, "run", "--resume", data["session_id"], "--model",
                script(tmp_path / "b.json", [{"final": "resumed fine"}]), "--json", "go on")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["final"] == "resumed fine"
