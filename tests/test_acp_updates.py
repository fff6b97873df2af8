"""``simagent acp``'s pure part: a turn's events as ACP session updates, the permission
request, modes and the turn's ``_meta`` (issue 39).

Each update is checked as it goes on the wire (``model_dump(by_alias=True,
exclude_none=True)``: ``sessionUpdate``, ``toolCallId``, ``content[].type`` ...), and one
turn runs through the real graph (scripted model, the in-memory kernel under
``SIMAGENT_TEST_KERNEL=memory``) so the figure's image block is the file the kernel saved.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from simagent.acp.updates import (
    MODES,
    OUTPUT_EVERY_S,
    TurnUpdates,
    decision_of,
    mode_state,
    mode_update,
    permission_request,
    tool_kind,
    turn_meta,
)
from simagent.agent.approval import MODE_HELP
from simagent.agent.builder import build_agent
from simagent.agent.events import (
    ContextEvent,
    Notice,
    ReasoningDelta,
    Retrying,
    TextDelta,
    ToolError,
    ToolFinished,
    ToolOutput,
    ToolRequested,
    ToolStarted,
)
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.session import Session


def wire(updates: list[Any]) -> list[dict[str, Any]]:
    return [u.model_dump(by_alias=True, exclude_none=True, mode="json") for u in updates]


def feed(turn: TurnUpdates, events: list[Any]) -> list[dict[str, Any]]:
    return [w for e in events for w in wire(turn.on_event(e))]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_text_thoughts_and_a_cell_from_pending_to_completed(tmp_path: Path) -> None:
    code = "print(1)\nprint(2)"
    out = feed(TurnUpdates(tmp_path), [
        ReasoningDelta("plan: print"), TextDelta("Running it."),
        ToolRequested("c1", "run_python", {"code": code}),
        ToolStarted("c1", "run_python", {"code": code}),
        ToolOutput("c1", "stdout", "1\n"),
        ToolFinished("c1", "run_python", "success", "1\n2", 0.25, outcome="ok",
                     raw_path="/x/outputs/0001.txt"),
        TextDelta("Done.")])
    assert [w["sessionUpdate"] for w in out] == [
        "agent_thought_chunk", "agent_message_chunk", "tool_call", "tool_call_update",
        "tool_call_update", "tool_call_update", "agent_message_chunk"]
    assert out[0]["content"] == {"type": "text", "text": "plan: print"}
    start = out[2]
    assert start == {"sessionUpdate": "tool_call", "toolCallId": "c1",
                     "title": "run_python: print(1)", "kind": "execute", "status": "pending",
                     "rawInput": {"code": code}}
    assert out[3]["status"] == "in_progress" and out[3]["toolCallId"] == "c1"
    assert out[4]["content"] == [{"type": "content", "content": {"type": "text", "text": "1"}}]
    end = out[5]
    assert end["status"] == "completed"
    assert end["content"] == [{"type": "content", "content": {"type": "text", "text": "1\n2"}}]
    assert end["rawOutput"] == {"outcome": "ok", "elapsed_s": 0.25,
                                "raw_path": "/x/outputs/0001.txt"}


@pytest.mark.parametrize(("status", "outcome", "want"), [
    ("success", "error", "failed"),  # the cell raised; the tool itself returned
    ("success", "interrupted", "failed"),
    ("error", None, "failed"),
    ("success", None, "completed"),
])
def test_status_follows_the_outcome_not_the_tool_return(tmp_path: Path, status: str,
                                                        outcome: str | None, want: str) -> None:
    turn = TurnUpdates(tmp_path)
    turn.on_event(ToolStarted("c", "run_python", {"code": "1/0"}))
    cls = ToolError if status == "error" else ToolFinished
    (end,) = wire(turn.on_event(cls("c", "run_python", status, "ZeroDivisionError", 0.1,
                                    outcome=outcome)))
    assert end["status"] == want


def test_an_edit_carries_a_diff_of_the_file_before_and_after(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text("k = 0.37\nn = 10\n")
    args = {"file_path": "model.py", "old_string": "k = 0.37", "new_string": "k = 0.41"}
    turn = TurnUpdates(tmp_path)
    out = feed(turn, [ToolRequested("e1", "edit_file", args),
                      ToolStarted("e1", "edit_file", args)])
    (tmp_path / "model.py").write_text("k = 0.41\nn = 10\n")  # the tool wrote it
    out += feed(turn, [ToolFinished("e1", "edit_file", "success", "Successfully replaced",
                                    0.01)])
    path = str((tmp_path / "model.py").resolve())
    diff = {"type": "diff", "path": path, "oldText": "k = 0.37\nn = 10\n",
            "newText": "k = 0.41\nn = 10\n"}
    assert out[0]["kind"] == "edit" and out[0]["title"] == "edit_file model.py"
    assert out[0]["locations"] == [{"path": path}]
    assert out[0]["content"] == [diff]
    assert out[-1]["status"] == "completed" and out[-1]["content"][0] == diff
    assert out[-1]["content"][1]["content"]["text"] == "Successfully replaced"


def test_a_new_file_write_diffs_from_nothing_and_reads_have_locations(tmp_path: Path) -> None:
    turn = TurnUpdates(tmp_path)
    (start,) = wire(turn.on_event(ToolStarted("w", "write_file", {
        "file_path": "notes/run.md", "content": "# run\n"})))
    assert start["content"] == [{"type": "diff", "path": str(tmp_path.resolve() / "notes/run.md"),
                                 "newText": "# run\n"}]  # no oldText: a new file
    (read,) = wire(turn.on_event(ToolRequested("r", "read_file", {
        "file_path": str(tmp_path / "a.txt"), "offset": 20, "limit": 10})))
    assert read["kind"] == "read"
    assert read["locations"] == [{"path": str(tmp_path.resolve() / "a.txt"), "line": 21}]
    (grep,) = wire(turn.on_event(ToolRequested("g", "grep", {"pattern": "solve"})))
    assert grep["kind"] == "search" and grep["locations"] == [{"path": str(tmp_path.resolve())}]


def test_tool_kinds() -> None:
    assert [tool_kind(n) for n in ("run_python", "execute", "read_file", "ls", "glob", "grep",
                                   "write_file", "edit_file", "delete", "task",
                                   "some_mcp_tool")] == [
        "execute", "execute", "read", "read", "search", "search", "edit", "edit", "delete",
        "think", "other"]


def test_the_todo_list_is_the_plan(tmp_path: Path) -> None:
    todos = [{"content": "load data", "status": "completed"},
             {"content": "fit k", "status": "in_progress"},
             {"content": "plot", "status": "pending"}]
    out = feed(TurnUpdates(tmp_path), [
        ToolRequested("t", "write_todos", {"todos": todos}),
        ToolStarted("t", "write_todos", {"todos": todos}),
        ToolFinished("t", "write_todos", "success", "Updated todo list", 0.0)])
    assert out == [{"sessionUpdate": "plan", "entries": [
        {"content": "load data", "priority": "medium", "status": "completed"},
        {"content": "fit k", "priority": "medium", "status": "in_progress"},
        {"content": "plot", "priority": "medium", "status": "pending"}]}]


def test_live_output_sends_a_paced_tail(tmp_path: Path) -> None:
    clock = Clock()
    turn = TurnUpdates(tmp_path, clock=clock)
    turn.on_event(ToolStarted("c", "run_python", {"code": "loop"}))
    first = wire(turn.on_event(ToolOutput("c", "stdout", "step 1\n")))
    assert first[0]["content"][0]["content"]["text"] == "step 1"
    clock.now += OUTPUT_EVERY_S / 3
    assert turn.on_event(ToolOutput("c", "stdout", "step 2\n")) == []  # too soon
    clock.now += OUTPUT_EVERY_S * 1.5
    lines = "".join(f"step {i}\n" for i in range(3, 500))
    (later,) = wire(turn.on_event(ToolOutput("c", "stdout", lines)))
    text = later["content"][0]["content"]["text"]
    assert text.endswith("step 499") and "step 1\n" not in text and len(text) <= 4_000
    assert turn.flush() == []  # everything printed was sent
    clock.now += OUTPUT_EVERY_S * 1.5
    (bar,) = wire(turn.on_event(ToolOutput("c", "stderr", "10%\r50%\r100%")))
    assert bar["content"][0]["content"]["text"].endswith("step 499\n100%")  # redrawn in place
    (human,) = wire(turn.on_event(ToolOutput("c", "human", "dashboard: http://127.0.0.1:8787\n")))
    assert human["sessionUpdate"] == "agent_message_chunk"
    assert "dashboard: http://127.0.0.1:8787" in human["content"]["text"]


def test_notices_guards_retries_and_subagents(tmp_path: Path) -> None:
    turn = TurnUpdates(tmp_path)
    out = feed(turn, [
        TextDelta("Working"),
        ContextEvent("context_clear", {"cleared": 3, "tokens_before": 9000,
                                       "tokens_after": 4000}),
        ContextEvent("watchdog_alert", {"tool": "run_python", "repeats": 4}),
        Notice("watchdog: run_python repeated"),  # said by the guard's line already
        Notice("kernel restarted; x is gone", "warning"),
        Retrying(1, 5, 2.0, "503", "Service Unavailable"),
        TextDelta("reading", agent="explorer"),
        TextDelta(" more", agent="explorer"),
        ToolStarted("s1", "read_file", {"file_path": "a.py"}, agent="explorer")])
    kinds = [(w["sessionUpdate"], w.get("content", {}).get("text")) for w in out]
    assert kinds[0] == ("agent_message_chunk", "Working")
    assert kinds[1] == ("agent_thought_chunk",
                        "~ context: cleared 3 old tool results (9,000 → 4,000 tokens)\n")
    assert kinds[2][0] == "agent_message_chunk" and kinds[2][1].startswith("\n\n> ! watchdog:")
    assert kinds[3] == ("agent_message_chunk", "> kernel restarted; x is gone\n\n")
    assert kinds[4] == ("agent_thought_chunk",
                        "provider 503 — retry 1/5 in 2s: Service Unavailable\n")
    assert kinds[5] == ("agent_thought_chunk", "\n[explorer] reading")
    assert kinds[6] == ("agent_thought_chunk", " more")
    assert out[7]["title"] == "[explorer] read_file a.py"
    assert len(out) == 8


def test_permission_request_shows_what_it_would_do(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    request = {"name": "write_file", "args": {"file_path": "a.py", "content": "x = 2\n"},
               "description": f"changes {tmp_path / 'a.py'}"}
    update, options = permission_request(request, "c7", tmp_path)
    w = update.model_dump(by_alias=True, exclude_none=True)
    assert w["toolCallId"] == "c7" and w["kind"] == "edit" and w["status"] == "pending"
    assert w["content"][0] == {"type": "diff", "path": str((tmp_path / "a.py").resolve()),
                               "oldText": "x = 1\n", "newText": "x = 2\n"}
    assert w["content"][1]["content"]["text"] == f"changes {tmp_path / 'a.py'}"
    assert [(o.option_id, o.kind) for o in options] == [
        ("allow_once", "allow_once"), ("allow_always", "allow_always"),
        ("reject_once", "reject_once")]
    assert "session" in options[1].name.lower()
    code = "import shutil\nshutil.rmtree('runs')"
    cell, _ = permission_request({"name": "run_python", "args": {"code": code}}, "c8", tmp_path)
    assert cell.content[0].content.text == code  # the whole cell, as it will run
    assert cell.kind == "execute" and cell.raw_input == {"code": code}


def test_decisions() -> None:
    assert decision_of("allow_once") == ({"type": "approve"}, False)
    assert decision_of("allow_always") == ({"type": "approve"}, True)
    assert decision_of("reject_once") == ({"type": "reject"}, False)
    assert decision_of(None) == ({"type": "reject"}, False)  # cancelled
    assert decision_of("bogus") == ({"type": "reject"}, False)


def test_modes_are_the_approval_modes() -> None:
    state = mode_state("workspace").model_dump(by_alias=True, exclude_none=True)
    assert state["currentModeId"] == "workspace"
    assert [(m["id"], m["description"]) for m in state["availableModes"]] == list(
        MODE_HELP.items())
    assert len(MODES) == 3
    assert mode_update("auto").model_dump(by_alias=True) == {
        "sessionUpdate": "current_mode_update", "currentModeId": "auto", "_meta": None}


PLOT = ("import matplotlib.pyplot as plt\nk = 0.37\n"
        "plt.plot([0, 1, 2], [1, 0.69, 0.48]); plt.title('decay'); plt.show()")


def test_a_real_turn_streams_a_figure_as_an_image_and_meta(workspace: Path) -> None:
    session = Session.create(workspace, approval="auto")
    try:
        model = ScriptedChatModel.from_steps([
            {"tool": "run_python", "args": {"code": PLOT}},
            {"final": "Plotted; k = 0.37."}])
        runner = TurnRunner(session, build_agent(session, model))
        turn = TurnUpdates(workspace)
        out: list[dict[str, Any]] = []
        result = runner.run("plot the decay", lambda e: out.extend(wire(turn.on_event(e))))
        assert result.status == "done"
        calls = [w for w in out if w["sessionUpdate"] in ("tool_call", "tool_call_update")]
        assert calls[0]["sessionUpdate"] == "tool_call" and calls[0]["status"] == "pending"
        assert calls[-1]["status"] == "completed"
        png = next(session.paths.artifacts.glob("fig-*.png"))
        text, image = calls[-1]["content"]
        assert f"[figure {png.stem} " in text["content"]["text"]
        assert 'axes "decay"' in text["content"]["text"]  # the summary rides along
        assert image == {"type": "content", "content": {
            "type": "image", "mimeType": "image/png", "uri": png.as_uri(),
            "data": base64.b64encode(png.read_bytes()).decode()}}
        said = "".join(w["content"]["text"] for w in out
                       if w["sessionUpdate"] == "agent_message_chunk")
        assert said == "Plotted; k = 0.37."
        assert turn.open_ids() == []

        meta = turn_meta(session, result, runner.agent)["simagent"]
        assert meta["input_tokens"] == result.usage.input_tokens > 0
        assert meta["output_tokens"] == result.usage.output_tokens
        assert meta["window"] == runner.agent.window
        assert 0 <= meta["ctx_pct"] <= 100 and meta["ctx_label"] == f"ctx {meta['ctx_pct']}%"
        assert "cost_usd" in meta  # None: the scripted model has no price
        (k,) = meta["numbers"]  # the answer's k, where the cell's code set it
        assert (k["text"], k["status"], k["source"]["kind"], k["source"]["excerpt"]) == \
            ("0.37", "sourced", "code", "k = 0.37")
    finally:
        session.close()


def test_flush_sends_output_held_back_by_the_pace(tmp_path: Path) -> None:
    """A cell that prints twice quickly and then computes quietly shows its last line
    while it computes, not only when it ends."""
    clock = Clock()
    turn = TurnUpdates(tmp_path, clock=clock)
    turn.on_event(ToolStarted("c", "run_python", {"code": "fit()"}))
    assert len(turn.on_event(ToolOutput("c", "stdout", "loading\n"))) == 1
    assert turn.on_event(ToolOutput("c", "stdout", "fitting 120 curves\n")) == []
    assert turn.flush() == []  # too soon still
    clock.now += OUTPUT_EVERY_S * 1.5
    (held,) = wire(turn.flush())
    assert held["toolCallId"] == "c" and held["status"] == "in_progress"
    assert held["content"][0]["content"]["text"] == "loading\nfitting 120 curves"
    clock.now += OUTPUT_EVERY_S * 1.5
    assert turn.flush() == []  # nothing new


def test_a_rejected_call_ends_failed_and_an_approved_one_runs(tmp_path: Path) -> None:
    turn = TurnUpdates(tmp_path)
    turn.on_event(ToolRequested("a", "run_python", {"code": "rm()"}))
    turn.on_event(ToolRequested("b", "run_python", {"code": "ok()"}))
    assert turn.pending_id("run_python", {"code": "rm()"}) == "a"
    (rejected,) = wire(turn.decided("a", {"type": "reject"}))
    assert rejected["status"] == "failed" and rejected["rawOutput"] == {"outcome": "rejected"}
    assert turn.decided("b", {"type": "approve"}) == []
    assert turn.open_ids() == ["b"]
    turn.on_event(ToolStarted("b", "run_python", {"code": "ok()"}))
    assert turn.pending_id("run_python", {"code": "ok()"}) is None  # running, not waiting
