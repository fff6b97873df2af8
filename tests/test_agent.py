"""The agent core end to end: the real deepagents graph, a real kernel, real SQLite.

The only stand-in is the model (the ``scripted`` model, design.md §9.2), whose final
answers quote tool results from the request it received, so a right answer proves the
harness carried the kernel's output to the model.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from simagent.agent.builder import build_agent
from simagent.agent.events import (
    Notice,
    TextDelta,
    ToolError,
    ToolFinished,
    ToolOutput,
    ToolRequested,
    ToolStarted,
)
from simagent.agent.recovery import MARK, NUDGE_SOURCE, give_up_notice
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel, call_id
from simagent.paths import content_dir
from simagent.session import Session


def make(workspace: Path, steps: list[dict], *, approval: str = "auto", **kw):
    session = Session.create(workspace, approval=approval)
    model = ScriptedChatModel.from_steps(steps)
    runner = TurnRunner(session, build_agent(session, model, **kw))
    return session, model, runner


@pytest.fixture
def opened(workspace):
    sessions = []

    def _open(steps, **kw):
        session, model, runner = make(workspace, steps, **kw)
        sessions.append(session)
        return session, model, runner

    yield _open
    for s in sessions:
        s.close()


@pytest.mark.real
def test_two_kernel_calls_then_an_answer_computed_by_the_kernel(opened):
    session, model, runner = opened([
        {"tool": "run_python", "args": {"code": "import hashlib\n"
                                        "h = int(hashlib.sha256(b'simagent').hexdigest()[:8], 16)\n"
                                        "print('h =', h)"}},
        {"tool": "run_python", "args": {"code": "h % 9973"}},
        {"final": "h is {out[-2]|h = (\\d+)}; h mod 9973 is {out[-1]|Out\\[\\d+\\]: (\\d+)}"}])
    events = []
    result = runner.run("compute h", events.append)
    import hashlib

    h = int(hashlib.sha256(b"simagent").hexdigest()[:8], 16)
    assert result.status == "done"
    assert result.final == f"h is {h}; h mod 9973 is {h % 9973}"
    assert result.tool_calls == 2
    # usage is what the scripted model counted on the requests it received
    assert result.usage.calls == 3
    assert result.usage.input_tokens == sum(model.cursor.request_tokens)
    # ... which includes the tool schemas, not only the messages
    assert model.cursor.request_tokens[0] > model.count_request(model.requests[0]) + 1000

    kinds = [type(e) for e in events]
    first_id = call_id(model.cursor.tag, 0, 0)
    first_call = [e for e in events if getattr(e, "id", None) == first_id]
    assert [type(e) for e in first_call] == [ToolRequested, ToolStarted, ToolOutput, ToolFinished]
    assert any(isinstance(e, ToolOutput) and f"h = {h}" in e.text for e in events)
    assert kinds.index(TextDelta) > max(i for i, k in enumerate(kinds) if k is ToolFinished)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == result.final

    # trace: user, then usage/tool events in order, then the assistant's answer
    trace = [(e.kind, e.payload) for e in session.trace.events()]
    # (the default simulator's warm-up runs first, in the same kernel)
    assert [p["warmup"] for k, p in trace if k == "kernel_exec"] == [True, False, False]
    trace = [(k, p) for k, p in trace if not (k == "kernel_exec" and p["warmup"])]
    # (context_clear_cost: the cost rule's figures per call once results exist, issue 31)
    kinds = [k for k, _ in trace if k not in ("artifact", "context_clear_cost")]
    assert kinds == ["session_start", "message_user", "model_usage", "tool_call", "kernel_exec",
                     "tool_result", "model_usage", "tool_call", "kernel_exec", "tool_result",
                     "message_assistant", "model_usage"]
    results = [p for k, p in trace if k == "tool_result"]
    assert results[1]["content"] == f"Out[3]: {h % 9973}"
    assert next(p for k, p in trace if k == "message_assistant")["content"] == result.final
    usage = [p for k, p in trace if k == "model_usage"]
    assert all(u["agent"] == "main" and u["source"] == "provider" for u in usage)


def test_system_prompt_has_rules_simulator_runtime_and_indexes(opened, workspace):
    session, model, runner = opened([{"final": "ok"}])
    runner.run("hi")
    system = model.requests[0][0].text
    assert system.startswith("You are simagent")
    assert f"Workspace (kernel working directory): {workspace.resolve()}" in system
    assert str(session.paths.artifacts) in system
    assert "Plotting: matplotlib" in system
    assert "<workspace_memory>" in system and "MEMORY.md" in system
    assert "**python-and-kernel**" in system and "SKILL.md" in system
    assert "resumed" not in system  # a fresh session says nothing about a restart


def test_skill_body_is_read_on_demand_only(opened):
    skill = content_dir("skills").resolve() / "python-and-kernel" / "SKILL.md"
    body_line = "Native code that never returns to Python cannot be interrupted"
    assert body_line in skill.read_text()
    _session, model, runner = opened([
        {"tool": "read_file", "args": {"file_path": str(skill), "limit": 1000}},
        {"final": "read it"}])
    runner.run("how do interrupts work?")
    first, second = model.requests
    assert "python-and-kernel" in first[0].text  # the index is there
    assert all(body_line not in m.text for m in first)  # the body is not
    assert any(isinstance(m, ToolMessage) and body_line in m.text for m in second)


def test_offered_tools_are_ours_plus_stock_file_shell_and_task(opened):
    _session, model, runner = opened([{"final": "ok"}])
    runner.run("hi")
    offered = set(model.cursor.request_tools[0])
    assert {"run_python", "reset_kernel", "remember", "record_attempt", "read_file",
            "write_file", "edit_file", "ls", "glob", "grep", "execute", "task"} <= offered


def test_remember_and_record_attempt_persist_and_reach_the_next_turn(opened):
    session, model, runner = opened([
        {"tool": "remember", "args": {"title": "Cell capacity", "content":
                                      "Chen2020 cell: 5.0 Ah nominal, validated.",
                                      "kind": "simulator"}},
        {"tool": "record_attempt", "args": {"rationale": "baseline",
                                            "parameters": {"c_rate": 1.0},
                                            "metrics": {"capacity_Ah": 4.87},
                                            "outcome": "accepted"}},
        {"final": "saved"},
        {"final": "second turn"}])
    assert runner.run("save it").final == "saved"
    note = session.memory_dir / "cell-capacity.md"
    assert "5.0 Ah nominal" in note.read_text()
    index = (session.memory_dir / "MEMORY.md").read_text()
    assert "[Cell capacity](cell-capacity.md)" in index
    attempts = session.attempts.all()
    assert attempts[0]["index"] == 1 and attempts[0]["metrics"] == {"capacity_Ah": 4.87}
    assert [e.payload["parameters"] for e in session.trace.events(["attempt"])] == [
        {"c_rate": 1.0}]
    runner.run("next")
    assert "[Cell capacity](cell-capacity.md)" in model.requests[-1][0].text


def test_tool_exception_becomes_an_error_result_and_the_turn_goes_on(opened):
    @tool
    def flaky(n: int) -> str:
        """Always fails."""
        raise RuntimeError(f"sensor {n} offline")

    session, _model, runner = opened([
        {"tool": "flaky", "args": {"n": 3}},
        {"final": "saw: {out[-1]}"}], extra_tools=[flaky])
    events = []
    result = runner.run("try", events.append)
    assert result.status == "done"
    assert "RuntimeError: sensor 3 offline" in result.final
    errors = [e for e in events if isinstance(e, ToolError)]
    assert errors and errors[0].name == "flaky"
    statuses = [e.payload["status"] for e in session.trace.events(["tool_result"])]
    assert statuses == ["error"]


def test_invalid_tool_call_gets_a_marked_nudge_and_recovers(opened):
    session, model, runner = opened([
        {"invalid_tool_call": {"name": "run_python", "args": "{code: print(1)}"}},
        {"tool": "run_python", "args": {"code": "print(7 * 6)"}},
        {"final": "answer {out[-1]}"}])
    result = runner.run("go")
    assert result.final == "answer 42"
    nudge_request = model.requests[1]
    assert isinstance(nudge_request[-1], HumanMessage)
    assert nudge_request[-1].additional_kwargs["lc_source"] == NUDGE_SOURCE
    # the malformed call never reaches the provider again
    bad = [m for m in nudge_request if isinstance(m, AIMessage) and MARK in m.additional_kwargs]
    assert bad and not bad[0].invalid_tool_calls and not bad[0].tool_calls
    rec = session.trace.events(["recovery"])
    assert [(e.payload["reason"], e.payload["attempt"]) for e in rec] == [
        ("invalid_tool_call", 1)]
    # the marks are in the checkpoint, so an agent rebuilt on the thread (a resumed
    # process, a model switch) sees them and keeps counting
    rebuilt = build_agent(session, ScriptedChatModel.from_steps([]))
    state = rebuilt.graph.get_state(session.thread_config).values["messages"]
    assert any(m.additional_kwargs.get("lc_source") == NUDGE_SOURCE for m in state)
    assert any(MARK in m.additional_kwargs for m in state if isinstance(m, AIMessage))


def test_empty_replies_are_nudged_at_most_twice_in_a_row(opened):
    session, model, runner = opened([{"empty": True}, {"empty": True}, {"empty": True},
                                     {"final": "never reached"}])
    events = []
    result = runner.run("go", events.append)
    assert len(model.requests) == 3  # the reply, and two nudged retries
    assert result.final == "(no response)"
    # the person is told why the turn ended without an answer
    notices = [e.text for e in events if isinstance(e, Notice)]
    assert notices == [give_up_notice("empty", 3)]
    assert "last 3 replies could not be used (empty replies)" in notices[0]
    rec = [(e.payload["attempt"], e.payload["gave_up"]) for e in
           session.trace.events(["recovery"])]
    assert rec == [(1, False), (2, False), (3, True)]
    assert model.remaining == 1


@pytest.mark.slow
def test_approval_ask_pauses_execute_then_approve_runs_it(opened, workspace):
    (workspace / "data.csv").write_text("a,b\n1,2\n")
    session, _model, runner = opened([
        {"tool": "execute", "args": {"command": "wc -l data.csv"}},
        {"final": "lines: {out[-1]|(\\d+) data.csv}"}], approval="ask")
    result = runner.run("count lines")
    assert result.status == "paused"
    assert result.interrupts[0].action_requests[0]["name"] == "execute"
    assert [e.kind for e in session.trace.events(["hitl_request"])] == ["hitl_request"]
    assert runner.pending_interrupts()
    result = runner.resume([{"type": "approve"}])
    assert result.status == "done" and result.final == "lines: 2"
    assert session.trace.events(["hitl_response"])[0].payload["decisions"] == [
        {"type": "approve"}]


def test_workspace_mode_writes_inside_freely_and_asks_outside(opened, workspace, tmp_path):
    outside = tmp_path / "elsewhere.txt"
    _session, _model, runner = opened([
        {"tool": "write_file", "args": {"file_path": str(workspace / "notes.txt"),
                                        "content": "hello"}},
        {"tool": "write_file", "args": {"file_path": str(outside), "content": "x"}},
        {"final": "done"}], approval="workspace")
    result = runner.run("write")
    assert (workspace / "notes.txt").read_text() == "hello"
    assert result.status == "paused"
    assert result.interrupts[0].action_requests[0]["args"]["file_path"] == str(outside)
    assert runner.resume([{"type": "reject", "message": "not there"}]).status == "done"
    assert not outside.exists()


def test_installed_source_and_bundled_content_are_read_only(opened):
    target = content_dir("skills").resolve() / "python-and-kernel" / "SKILL.md"
    before = target.read_text()
    _session, _model, runner = opened([
        {"tool": "edit_file", "args": {"file_path": str(target), "old_string": "kernel",
                                       "new_string": "KERNEL"}},
        {"final": "{out[-1]}"}], approval="auto")
    result = runner.run("edit")
    assert "read-only" in result.final
    assert target.read_text() == before


@pytest.mark.real
def test_cancel_interrupts_the_kernel_and_keeps_state(opened):
    session, model, runner = opened([
        {"tool": "run_python", "args": {"code": "kept = 123\nimport time\n"
                                        "print('sleeping', flush=True)\ntime.sleep(60)"}},
        {"final": "unreachable"},
        {"tool": "run_python", "args": {"code": "print(kept)"}},
        {"final": "kept={out[-1]}"}])
    session.start_kernel()  # as interfaces do at session start (the warm-up runs here)
    started = threading.Event()

    def on_event(e):  # the cell runs (it printed): the cancel must interrupt it
        if isinstance(e, ToolOutput) and "sleeping" in e.text:
            started.set()

    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", runner.run("sleep", on_event)))
    t.start()
    assert started.wait(60)
    runner.cancel()
    t.join(30)
    assert out["r"].status == "cancelled"
    # the next turn sees state kept, and the graph is consistent after the cancel
    model.cursor.pos = 2
    assert runner.run("again").final == "kept=123"


@pytest.mark.slow
def test_a_model_call_that_ignores_the_cancel_is_abandoned_and_its_reply_dropped(opened):
    """ctrl+C while the provider has not sent a token: the turn ends without waiting for
    it, the next turn runs meanwhile, and the late reply never reaches the state."""
    from langchain_core.messages import AIMessage

    session, model, runner = opened([{"final": "late reply", "wait": 4},
                                     {"final": "second answer"}])
    out: dict = {}
    before = set(threading.enumerate())  # threads left by earlier tests do not count
    t = threading.Thread(target=lambda: out.setdefault("r", runner.run("think hard")))
    t.start()
    deadline = time.monotonic() + 30
    while model.cursor.pos < 1 and time.monotonic() < deadline:
        time.sleep(0.02)  # the model call has begun (and now waits)
    runner.cancel()
    t.join(30)
    assert out["r"].status == "cancelled"
    pumps = [th for th in threading.enumerate()
             if th.name.startswith("simagent-turn-") and th not in before]
    assert pumps, "the turn returned only after the model answered"
    second = runner.run("next")  # while the abandoned call still waits
    assert second.status == "done" and second.final == "second answer"
    for th in pumps:
        th.join(30)
    assert not any(th.is_alive() for th in pumps)
    texts = [m.text for m in runner.agent.graph.get_state(session.thread_config)
             .values["messages"] if isinstance(m, AIMessage)]
    assert texts == ["second answer"]
    errors = [e.payload["message"] for e in session.trace.events(["error"])]
    assert any(m.startswith("turn abandoned") for m in errors)
    usage = [e.payload for e in session.trace.events(["model_usage"])]
    assert len(usage) == 2 and sum(bool(u.get("dropped")) for u in usage) == 1  # still paid
    said = [e.payload["content"] for e in session.trace.events(["message_assistant"])]
    assert said == ["second answer"]  # the transcript never shows the late reply
    assert runner.run("third").status == "done"  # the thread goes on


def test_a_cancel_asks_the_models_own_server_to_stop_the_reply(workspace):
    """A ``local:`` model's server would evaluate the prompt to its end after the
    connection closed; the cancel calls the model's ``reply_stopper`` (tested against the
    real server in test_local_server), once, while the call is still running."""
    from simagent.models import ResolvedModel, parse_model_spec

    stopped = threading.Event()
    model = ScriptedChatModel.from_steps([{"final": "late", "wait": 4}, {"final": "next"}])
    resolved = ResolvedModel(parse_model_spec("local:own.gguf"), model, None, None,
                             reply_stopper=stopped.set)
    session = Session.create(workspace, approval="auto")
    try:
        runner = TurnRunner(session, build_agent(session, resolved))
        out: dict = {}
        t = threading.Thread(target=lambda: out.setdefault("r", runner.run("think")))
        t.start()
        deadline = time.monotonic() + 30
        while model.cursor.pos < 1 and time.monotonic() < deadline:
            time.sleep(0.02)  # the model call has begun (and now waits)
        assert not stopped.is_set()
        runner.cancel()
        assert stopped.wait(10)
        t.join(30)
        assert out["r"].status == "cancelled"
        for th in threading.enumerate():  # the abandoned call ends with its wait
            if th.name.startswith("simagent-turn-"):
                th.join(30)
    finally:
        session.close()


@pytest.mark.real
@pytest.mark.parametrize("force", [False, True])
def test_a_cell_that_ignores_the_interrupt_is_waited_for_unless_forced(opened, force):
    """Silence after a cancel is not always the model: a running cell has its own bounded
    way out (interrupt, then a restart after the grace period), and its outcome is real.
    A second ctrl+C (``force``) stops waiting; the cell's late result is marked dropped."""
    session, _model, runner = opened([
        {"tool": "run_python", "args": {"code": "import signal, time\n"
                                        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                                        "print('ignoring', flush=True)\ntime.sleep(60)"}},
        {"final": "unreachable"}])
    session.start_kernel()
    started = threading.Event()
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("r", runner.run(  # SIGINT ignored now
        "stubborn", lambda e: isinstance(e, ToolOutput) and "ignoring" in e.text
        and started.set())))
    t.start()
    assert started.wait(60)
    runner.cancel()
    if force:
        time.sleep(0.3)
        runner.cancel(force=True)
        t.join(10)
        assert not t.is_alive(), "a forced cancel waited for the cell"
    t.join(60)
    assert out["r"].status == "cancelled"
    errors = [e.payload["message"] for e in session.trace.events(["error"])]
    assert any(m.startswith("turn abandoned") for m in errors) == force
    deadline = time.monotonic() + 60
    while not session.trace.events(["tool_result"]) and time.monotonic() < deadline:
        time.sleep(0.1)  # forced: the kernel restarts on its own schedule
    results = [e.payload for e in session.trace.events(["tool_result"])]
    assert results and bool(results[-1].get("dropped")) == force
    assert "restart" in results[-1]["content"].lower()


@pytest.mark.slow
def test_the_callers_context_reaches_the_graph(opened):
    """The graph runs on a pump thread; context variables of the caller (usage callbacks,
    tracing) still see its model calls."""
    from langchain_core.callbacks import get_usage_metadata_callback

    _session, _model, runner = opened([{"final": "counted"}])
    with get_usage_metadata_callback() as cb:
        assert runner.run("hi").final == "counted"
    assert cb.usage_metadata and sum(u["input_tokens"] for u in
                                     cb.usage_metadata.values()) > 1000


def test_the_innermost_check_stops_a_call_after_a_slow_layer():
    """Between the guard and the model sit layers that take time (a summary call); the
    recorder checks again right before the model, so an abandoned run calls nothing."""
    import contextvars

    from simagent.agent.recorder import TraceRecorder
    from simagent.trace.usage import UsageTotals
    from simagent.turns import TurnAbandoned, TurnRegistry

    turns = TurnRegistry()
    turn = turns.begin()
    calls = []

    class Trace:
        def append(self, *a, **k):
            calls.append(("trace", a))

    rec = TraceRecorder(Trace(), UsageTotals(), turns=turns)

    def run() -> None:
        turns.bind(turn)
        turns.abandon(turn)
        rec.wrap_model_call(object(), lambda _r: calls.append("model"))

    with pytest.raises(TurnAbandoned):
        contextvars.copy_context().run(run)
    assert calls == []
    other = turns.begin()
    assert not turns.is_abandoned(other) and not turns.is_abandoned(None)


def test_reset_kernel_loses_state(opened):
    _session, _model, runner = opened([
        {"tool": "run_python", "args": {"code": "y = 5"}},
        {"tool": "reset_kernel", "args": {}},
        {"tool": "run_python", "args": {"code": "y"}},
        {"final": "{out[-2]} / {out[-1]|(NameError)}"}])
    final = runner.run("go").final
    assert final.startswith("Kernel restarted in") and final.endswith("/ NameError")


def test_resume_in_process_with_live_kernel_keeps_state(workspace):
    s1 = Session.create(workspace, approval="auto")
    m1 = ScriptedChatModel.from_steps([{"tool": "run_python", "args": {"code": "z = 9"}},
                                       {"final": "set"}])
    TurnRunner(s1, build_agent(s1, m1)).run("set z")
    kernel = s1.kernel
    s1.close(keep_kernel=True)
    s2 = Session.resume(workspace, s1.id, kernel=kernel)
    try:
        m2 = ScriptedChatModel.from_steps([{"tool": "run_python", "args": {"code": "z * 2"}},
                                           {"final": "{out[-1]}"}])
        result = TurnRunner(s2, build_agent(s2, m2)).run("double z")
        assert result.final == "Out[3]: 18"  # warm-up, z = 9, z * 2: no second warm-up
        assert "the kernel kept running" in m2.requests[0][0].text
        assert s2.trace.events(["session_resume"])[0].payload["kernel_restarted"] is False
    finally:
        s2.close()


def test_secrets_in_the_environment_never_reach_the_trace(opened, monkeypatch):
    secret = "sk-test-9f8e7d6c5b4a39281706"
    monkeypatch.setenv("ACME_API_KEY", secret)
    session, _model, runner = opened([
        {"tool": "run_python", "args": {"code": "import os\nprint(os.environ['ACME_API_KEY'])"}},
        {"final": "the key is {out[-1]}"}])
    result = runner.run(f"print my key {secret}")
    # kernel output is redacted before the model gets it: the provider never sees it
    assert "[redacted:ACME_API_KEY]" in result.final and secret not in result.final
    session.trace.close()
    raw = b"".join(p.read_bytes() for p in session.paths.root.glob("trace.sqlite*"))
    assert secret.encode() not in raw
    assert b"[redacted:ACME_API_KEY]" in raw
    session.trace = type(session.trace)(session.paths.trace)


def test_scripted_usage_counts_the_request_not_the_script():
    short = ScriptedChatModel.from_steps([{"final": "a"}])
    long = ScriptedChatModel.from_steps([{"final": "a"}])
    r1 = short.invoke([HumanMessage("hi")])
    r2 = long.invoke([HumanMessage("hi " * 4000)])
    assert r2.usage_metadata["input_tokens"] > r1.usage_metadata["input_tokens"] + 2500


def test_switching_model_mid_session_keeps_the_thread(opened):
    session, _model, runner = opened([
        {"tool": "run_python", "args": {"code": "print('from A')"}}, {"final": "A done"}])
    runner.run("first")
    other = ScriptedChatModel.from_steps([{"final": "B sees: {out[-1]}"}], name="model-b")
    runner.switch_agent(build_agent(session, other))
    assert runner.run("second").final == "B sees: from A"
    assert [m.type for m in other.requests[0]] == ["system", "human", "ai", "tool", "ai",
                                                   "human"]
    switch = session.trace.events(["model_switch"])[0].payload
    assert switch == {"from_model": "scripted", "to_model": "model-b"}


def test_subagent_calls_are_traced_under_their_own_name(opened):
    session, model, runner = opened([
        {"tool": "task", "args": {"description": "Compute 17 * 23 in the kernel and report it.",
                                  "subagent_type": "general-purpose"},
         "steps": [{"tool": "run_python", "args": {"code": "print(17 * 23)"}},
                   {"final": "digest: 17*23 = {out[-1]}"}]},
        {"final": "The helper found {out[-1]|= (\\d+)}."}])
    result = runner.run("delegate it")
    assert result.final == "The helper found 391."
    usage = session.trace.events(["model_usage"])
    agents = [u.payload["agent"] for u in usage]
    assert agents == ["main", "general-purpose", "general-purpose", "main"]
    assert session.usage.by_agent["general-purpose"].calls == 2
    assert result.usage.calls == 4  # the turn's totals include the subagent
    sub_tools = [e.payload for e in session.trace.events(["tool_call"])
                 if e.payload["agent"] == "general-purpose"]
    assert [t["name"] for t in sub_tools] == ["run_python"]
    kinds = [e.kind for e in session.trace.events(["subagent_start", "subagent_end"])]
    assert kinds == ["subagent_start", "subagent_end"]
    # the subagent worked in its own context: the parent never saw its run_python output
    parent_tools = [m for m in model.requests[-1] if isinstance(m, ToolMessage)]
    assert [m.name for m in parent_tools] == ["task"]


def test_relative_file_paths_mean_the_workspace(opened, workspace):
    (workspace / "params.txt").write_text("dt = 0.01\n")
    _session, _model, runner = opened([
        {"tool": "read_file", "args": {"file_path": "params.txt"}},
        {"tool": "write_file", "args": {"file_path": "out/result.txt", "content": "ok"}},
        {"final": "{out[-2]|dt = ([\\d.]+)}"}])
    assert runner.run("read").final == "0.01"
    assert (workspace / "out" / "result.txt").read_text() == "ok"
    assert not Path("/out/result.txt").exists()


def test_control_flow_raised_inside_a_tool_is_not_turned_into_an_error(opened):
    from langgraph.types import interrupt

    @tool
    def ask_user(question: str) -> str:
        """Ask the user a question and wait for the answer."""
        return str(interrupt({"question": question}))

    session, _model, runner = opened([
        {"tool": "ask_user", "args": {"question": "which cell?"}},
        {"final": "user said {out[-1]}"}], extra_tools=[ask_user])
    paused = runner.run("go")
    assert paused.status == "paused"
    assert not session.trace.events(["error"])
    assert not session.trace.events(["tool_result"])
    done = runner.resume([{"type": "respond", "message": "cell 3"}])
    assert done.status == "done" and "cell 3" in done.final
