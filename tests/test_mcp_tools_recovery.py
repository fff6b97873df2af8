"""MCP tools, continued (issue 28, part 2): a server down when the session opens joins
once it can start; an HTTP server that dies mid-call; progress notifications on the tool
card; images in results.

Real parts throughout: the SDK test server (``tests/mcp_servers/forty_tools.py``), the
deepagents graph with the scripted model, the session and its trace, the real CLI.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import cli_fork
import conftest
import pytest
import test_mcp_tools as base
from langchain_core.messages import ToolMessage
from test_mcp_tools import server_pids, tool_messages, write_config

from simagent.agent.events import ContextEvent, ToolFinished, ToolOutput
from simagent.agent.mcp_hubs import open_notices
from simagent.context.deferral_policy import FIND_TOOLS
from simagent.context.settings import ContextSettings
from simagent.context.stats import stats_from_trace

NO_DEFER = ContextSettings(defer_tools=False)
opened, http_server = base.opened, base.http_server  # the fixtures, shared


def _mcp_notices(events) -> list[ContextEvent]:
    return [e for e in events if isinstance(e, ContextEvent) and e.kind == "mcp_server"]


# ------------------------------------------------------------------ down at open
@pytest.mark.slow
def test_a_server_down_at_open_is_said_at_open_and_its_tools_join_once_it_starts(
        opened, workspace, tmp_path):
    """The server refuses to start while a marker exists. The person is told at open,
    in one line with the server's log; the first model call repeats nothing. Once the
    marker is gone, ``find_tools`` retries the server, its 40 schemas are deferred by the
    same rule as at open, the match loads, and the call runs on the real server."""
    marker = tmp_path / "down"
    marker.touch()
    write_config(workspace, extra_args=("--fail-start-if", str(marker)))
    session, runner, built = opened([
        {"tool": FIND_TOOLS, "args": {"query": "molar mass"}},
        {"tool": "run_python", "args": {"code": f"import os; os.remove({str(marker)!r})"}},
        {"tool": FIND_TOOLS, "args": {"query": "molar mass of a species"}},
        {"tool": "lab__molar_mass", "args": {"subject": "H2O"}},
        {"final": "{out[-1]}"}])
    assert not [t for t in built.tools if t.name.startswith("lab__")]
    lines = open_notices(session)
    assert len(lines) == 1 and "MCP server 'lab' could not be started" in lines[0]
    log = Path(lines[0].rsplit("its log: ", 1)[1])
    assert log.is_file() and "refusing to start" in log.read_text()
    events: list = []
    result = runner.run("What is the molar mass of water?", on_event=events.append)
    assert result.status == "done", result
    assert "molar_mass(H2O, T=298.15 K, nist) = " in result.final
    first = next(m for m in tool_messages(built, session) if m.name == FIND_TOOLS)
    assert "MCP server 'lab' is not running" in first.text and "No tool matches" in first.text
    shown = [e.detail["notice"] for e in _mcp_notices(events)]
    assert len(shown) == 1 and "started on a retry: its 40 tools" in shown[0], shown
    view = stats_from_trace(session.paths.trace, session.context_settings).tools
    assert view is not None and view.deferred and "lab__molar_mass" in view.loaded
    assert [(s.name, s.tools, s.status) for s in view.servers] == [("lab", 40, "ok")]
    assert view.deferred_tokens > view.limit


@pytest.mark.slow
def test_a_late_tool_waits_for_approval_like_one_present_at_open(opened, workspace, tmp_path):
    """In ``workspace`` mode an MCP call waits for the person; a tool whose server came
    up after the graph was built waits too, and runs once approved."""
    marker = tmp_path / "down"
    marker.touch()
    write_config(workspace, extra_args=("--fail-start-if", str(marker)))
    session, runner, built = opened([
        {"tool": "run_python", "args": {"code": f"import os; os.remove({str(marker)!r})"}},
        {"tool": FIND_TOOLS, "args": {"query": "lab.band_gap"}},
        {"tool": "lab__band_gap", "args": {"subject": "Si"}},
        {"final": "{out[-1]}"}], approval="workspace", context_settings=NO_DEFER)
    paused = runner.run("go")
    assert paused.status == "paused", paused
    req = paused.interrupts[0].action_requests[0]
    assert req["name"] == "lab__band_gap" and req["args"] == {"subject": "Si"}
    assert not [m for m in tool_messages(built, session) if m.name == "lab__band_gap"]
    done = runner.resume([{"type": "approve"}])
    assert done.status == "done" and "band_gap(Si" in done.final, done


@pytest.mark.slow
def test_simagent_run_says_a_failed_server_once_at_open(workspace, tmp_path):
    """``simagent run``: the failed server is one line on stderr before the turn, with
    the log's path; the turn goes on."""
    write_config(workspace, extra_args=("--fail-start",))
    steps = tmp_path / "steps.json"
    steps.write_text('[{"final": "still here"}]')
    run = cli_fork.run([sys.executable, "-m", "simagent", "run", "--model",
                        f"scripted:{steps}", "hi"], cwd=workspace, capture_output=True,
                       text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "still here"
    said = [ln for ln in run.stderr.splitlines() if "'lab'" in ln]
    assert len(said) == 1, run.stderr
    assert said[0].startswith("! MCP server 'lab' could not be started (")
    assert Path(said[0].rsplit("its log: ", 1)[1]).is_file()


# ------------------------------------------------------------------ HTTP dying mid-call
@pytest.mark.slow
def test_an_http_server_dying_mid_call_is_one_error_and_the_session_goes_on(
        opened, workspace, http_server):
    """The HTTP server exits during ``crash_now``: one error naming it; the next call
    (the server still gone) says it cannot be started; the turn ends normally."""
    (workspace / ".simagent").mkdir()
    conftest.write_config(
        workspace,
        f'[mcp.servers.web]\nurl = "{http_server}"\ntimeout_s = 60\n'
        'headers = { Authorization = "Bearer s3cret" }\n')
    session, runner, built = opened([{"tool": "web__crash_now", "args": {}},
                                     {"tool": "web__band_gap", "args": {"subject": "Si"}},
                                     {"final": "done"}], context_settings=NO_DEFER)
    result = runner.run("go")
    assert result.status == "done", result
    msgs = {m.name: m for m in tool_messages(built, session)}
    crash, after = msgs["web__crash_now"], msgs["web__band_gap"]
    assert crash.status == "error" and crash.text.count("MCP server 'web'") == 1
    assert "web.crash_now did not complete" in crash.text
    assert "gave no answer" not in crash.text, crash.text  # seen, not waited out
    assert after.status == "error" and "MCP server 'web' could not be started" in after.text
    kinds = [e.payload["what"] for e in session.trace.events(["mcp_server"])]
    assert kinds[0] == "started" and kinds[-1] == "failed" and len(kinds) == 3, kinds


# ------------------------------------------------------------------ progress
@pytest.mark.slow
def test_progress_notifications_reach_the_tool_card_while_the_call_runs(
        opened, workspace, tmp_path):
    """Each step of ``slow_steps`` waits until the test has seen the previous step's
    progress as the card's live output (the server reads a gate file the event handler
    writes), so the output arrives during the call, in order, before it finishes."""
    gate = tmp_path / "gate"
    gate.write_text("1")
    write_config(workspace, extra_args=("--extras",), timeout_s=60)
    session, runner, built = opened([
        {"tool": "lab__slow_steps", "args": {"steps": 3, "gate": str(gate)}},
        {"final": "{out[-1]}"}], context_settings=NO_DEFER)
    seen: list = []

    def on_event(event):
        seen.append(event)
        if isinstance(event, ToolOutput) and event.text.endswith(("step 1", "step 2")):
            gate.write_text(str(int(event.text[-1]) + 1))

    result = runner.run("count", on_event=on_event)
    assert result.status == "done" and "counted 3 steps" in result.final, result
    call_id = next(m for m in tool_messages(built, session)
                   if m.name == "lab__slow_steps").tool_call_id
    out = [e for e in seen if isinstance(e, ToolOutput) and e.id == call_id]
    assert [e.text for e in out] == ["\r1/3 (33%) step 1", "\r2/3 (67%) step 2",
                                     "\r3/3 (100%) step 3"]
    assert {e.kind for e in out} == {"stderr"}  # redrawn in place, as a tqdm bar is
    done = next(i for i, e in enumerate(seen) if isinstance(e, ToolFinished)
                and e.id == call_id)
    assert seen.index(out[-1]) < done


# ------------------------------------------------------------------ images
@pytest.mark.slow
@pytest.mark.parametrize("takes_images", [True, False])
def test_an_image_result_is_sent_as_an_image_or_saved_and_named(workspace, takes_images):
    """A model that takes images in tool results gets the image block; one that does
    not gets a line naming the file it was saved to; both ways the PNG is in the
    session's artifacts, byte for byte, and never as base64 text."""
    from simagent.agent.builder import build_agent
    from simagent.agent.runner import TurnRunner
    from simagent.agent.scripted import ScriptedChatModel
    from simagent.session import Session

    write_config(workspace, extra_args=("--extras",))
    session = Session.create(workspace, approval="auto")
    try:
        model = ScriptedChatModel.from_steps([
            {"tool": "lab__spectrum_plot", "args": {"subject": "CO2"}}, {"final": "ok"}])
        if takes_images:
            model.profile = {**model.profile, "image_inputs": True,
                             "image_tool_message": True}
        built = build_agent(session, model, context_settings=NO_DEFER)
        assert TurnRunner(session, built).run("plot").status == "done"
        msg: ToolMessage = next(m for m in tool_messages(built, session)
                                if m.name == "lab__spectrum_plot")
        saved = sorted(session.paths.artifacts.glob("fig-*.png"))
        assert len(saved) == 1 and saved[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        meta = json.loads(saved[0].with_suffix(".json").read_text())
        assert meta["source"] == "lab.spectrum_plot"
        assert "spectrum of CO2" in msg.text and str(saved[0]) in msg.text
        if takes_images:
            images = [b for b in msg.content if isinstance(b, dict) and b["type"] == "image"]
            assert len(images) == 1 and images[0]["mime_type"] == "image/png"
            assert base64.b64decode(images[0]["base64"]) == saved[0].read_bytes()
        else:
            assert isinstance(msg.content, str) and "not shown (" in msg.content
            assert "saved as" in msg.content and "base64" not in msg.content
    finally:
        session.close()
    assert server_pids() == set()


# ------------------------------------------------------------------ cancel, stray stdout
@pytest.mark.slow
def test_cancelling_the_turn_stops_waiting_for_an_mcp_call_and_says_so(
        opened, workspace, tmp_path):
    """ctrl+C (``TurnRunner.cancel``) during a call that would wait forever: the turn
    ends cancelled, the result says simagent stopped waiting and asked the server to
    cancel, and the server (told so) answers the next call in a new turn."""
    import threading

    write_config(workspace, extra_args=("--extras",), timeout_s=30)
    session, runner, built = opened([
        {"tool": "lab__slow_steps", "args": {"steps": 2, "gate": str(tmp_path / "never")}},
        {"tool": "lab__band_gap", "args": {"subject": "Si"}}, {"final": "{out[-1]}"}],
        context_settings=NO_DEFER)

    def on_event(event):
        if type(event).__name__ == "ToolStarted" and event.name == "lab__slow_steps":
            threading.Thread(target=runner.cancel, daemon=True).start()

    result = runner.run("count forever", on_event=on_event)
    assert result.status == "cancelled", result
    msg = next(m for m in tool_messages(built, session) if m.name == "lab__slow_steps")
    assert msg.status == "error"
    assert msg.text.startswith("cancelled: simagent stopped waiting for lab.slow_steps and "
                               "asked the server to cancel it")
    again = runner.run("next")
    assert again.status == "done" and "band_gap(Si" in again.final, again


@pytest.mark.slow
def test_a_server_that_prints_garbage_is_one_true_line_and_no_traceback(workspace, tmp_path):
    """A 'server' that writes a line that is not MCP and then says nothing: ``simagent
    run`` tells the person once, quoting the line and the server's own start timeout; the
    SDK's traceback for it and the start's unread future never reach the terminal."""
    (workspace / ".simagent").mkdir()
    script = "import sys, time; print('hello-not-mcp', flush=True); time.sleep(120)"
    conftest.write_config(
        workspace,
        f"[mcp.servers.noisy]\ncommand = {json.dumps(sys.executable)}\n"
        f"args = ['-c', {json.dumps(script)}]\nstart_timeout_s = 3\n")
    steps = tmp_path / "steps.json"
    steps.write_text('[{"final": "still here"}]')
    run = cli_fork.run([sys.executable, "-m", "simagent", "run", "--model",
                        f"scripted:{steps}", "hi"], cwd=workspace, capture_output=True,
                       text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "still here", run.stderr
    said = [ln for ln in run.stderr.splitlines() if "noisy" in ln]
    assert len(said) == 1, run.stderr
    assert "no answer within 3 s; it wrote this on stdout, which is " \
           "not MCP: 'hello-not-mcp'" in said[0]
    assert "Traceback" not in run.stderr and "never retrieved" not in run.stderr, run.stderr


@pytest.mark.slow
def test_a_missing_relative_command_says_where_it_was_looked_for(workspace, tmp_path):
    """``command = ".venv/bin/simagent"`` runs from the workspace: a person whose file is
    elsewhere reads where it was looked for; no log is named when the server wrote none."""
    from simagent.agent.mcp_tools import McpHub
    from simagent.config import parse_mcp_servers

    hub = McpHub(parse_mcp_servers({"sim": {"command": ".venv/bin/simagent"}}),
                 cwd=workspace, log_dir=tmp_path)
    try:
        hub.start_all()
    finally:
        hub.close()
    [line] = hub.start_notices()
    assert "No such file or directory: '.venv/bin/simagent'" in line
    assert f"a relative command is run from the workspace, {workspace}" in line
    assert "its log" not in line
