"""``session/load``'s replay: a thread's messages as ACP updates, in order, without the
messages the harness wrote (issue 39)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from simagent.acp.history import SUMMARY_LINE, replay_updates
from simagent.agent.builder import build_agent
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.session import Session


def wire(updates: list[Any]) -> list[dict[str, Any]]:
    return [u.model_dump(by_alias=True, exclude_none=True, mode="json") for u in updates]


def test_a_real_scripted_session_replays_user_tool_and_answer_in_order(workspace: Path) -> None:
    session = Session.create(workspace, approval="auto")
    try:
        model = ScriptedChatModel.from_steps([
            {"tool": "run_python", "args": {"code": "k = 0.37\nprint(round(0.6931 / k, 4))"}},
            {"tool": "run_python", "args": {"code": "1 / 0"}},
            {"final": "The half-life is {out[-2]|(\\d+\\.\\d+)}."},
            {"tool": "write_todos", "args": {"todos": [
                {"content": "report", "status": "in_progress"}]}},
            {"final": "Noted."}])
        runner = TurnRunner(session, build_agent(session, model))
        assert runner.run("half-life?").status == "done"
        assert runner.run("plan the report").status == "done"
        messages = runner.agent.graph.get_state(session.thread_config).values["messages"]
        out = wire(replay_updates(messages, workspace))
    finally:
        session.close()
    shape = [(w["sessionUpdate"], w.get("status")) for w in out]
    assert shape == [("user_message_chunk", None), ("tool_call", "completed"),
                     ("tool_call", "failed"), ("agent_message_chunk", None),
                     ("user_message_chunk", None), ("plan", None),
                     ("agent_message_chunk", None)]
    assert out[0]["content"] == {"type": "text", "text": "half-life?"}
    ok, failed = out[1], out[2]
    assert ok["kind"] == "execute" and ok["title"] == "run_python: k = 0.37"
    assert ok["rawInput"] == {"code": "k = 0.37\nprint(round(0.6931 / k, 4))"}
    assert ok["content"][0]["content"]["text"].startswith("1.8732")
    assert ok["rawOutput"]["outcome"] == "ok" and ok["rawOutput"]["raw_path"]
    assert failed["rawOutput"]["outcome"] == "error"  # the cell raised; the tool returned
    assert "ZeroDivisionError" in failed["content"][0]["content"]["text"]
    assert out[3]["content"]["text"] == "The half-life is 1.8732.\n"
    assert out[5]["entries"] == [{"content": "report", "priority": "medium",
                                  "status": "in_progress"}]
    assert len({w["toolCallId"] for w in out if "toolCallId" in w}) == 2


def test_harness_messages_are_left_out_and_open_calls_fail(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("data\n")
    messages = [
        SystemMessage("you are simagent"),
        HumanMessage("read a.txt"),
        HumanMessage("<kernel state card>", additional_kwargs={"lc_source":
                                                               "simagent_state_card"}),
        HumanMessage("summary of earlier turns", additional_kwargs={"lc_source":
                                                                    "simagent_summary"}),
        AIMessage(content=[{"type": "reasoning", "reasoning": "hmm"},
                           {"type": "text", "text": "Reading."}],
                  tool_calls=[{"id": "r1", "name": "read_file", "args": {"file_path": "a.txt"}},
                              {"id": "r2", "name": "run_python", "args": {"code": "x"}}]),
        ToolMessage("     1\tdata", tool_call_id="r1", name="read_file"),
        HumanMessage("your reply was empty", additional_kwargs={"lc_source":
                                                                "simagent_recovery"}),
    ]
    out = wire(replay_updates(messages, tmp_path))
    assert [w["sessionUpdate"] for w in out] == [
        "user_message_chunk", "agent_thought_chunk", "agent_message_chunk", "tool_call",
        "tool_call"]
    assert out[1]["content"]["text"] == SUMMARY_LINE
    assert out[2]["content"]["text"] == "Reading.\n"
    assert out[3]["kind"] == "read" and out[3]["status"] == "completed"
    assert out[3]["locations"] == [{"path": str((tmp_path / "a.txt").resolve())}]
    assert out[4]["toolCallId"] == "r2" and out[4]["status"] == "failed"  # never answered
