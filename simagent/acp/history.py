"""A loaded session's conversation as ACP updates, for ``session/load`` (pure).

The client rebuilds its chat from what it is sent: each person's message as a
``user_message_chunk``, each reply as an ``agent_message_chunk``, each tool call as one
finished ``tool_call`` (completed or failed by its outcome, with the text the model got,
its figures and files), and the todo list as a ``plan``, in the order they happened. Read
from the thread's checkpointed messages, the conversation the model holds: what the
harness wrote into it (state cards, nudges, the summaries a compaction left; each marked
with an ``lc_source``) is no one's message, so it is left out, a summary as one
context line.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from acp import (
    start_tool_call,
    text_block,
    tool_content,
    update_agent_message_text,
    update_agent_thought_text,
    update_user_message_text,
)
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from simagent.acp.updates import (
    Update,
    figure_blocks,
    locations,
    plan_update,
    title,
    tool_kind,
)
from simagent.context.counting import SUMMARY_SOURCES
from simagent.outcomes import outcome_of
from simagent.tool_names import WRITE_TODOS

#: Said where a compaction's summary stands in for the turns before it.
SUMMARY_LINE = "~ context: earlier turns are summarized here (the model holds the summary)\n"


def _text(message: BaseMessage) -> str:
    """The words of a message: its text blocks (an image or a reasoning block is not)."""
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(str(b.get("text") or "") if isinstance(b, dict) and b.get("type") == "text"
                   else b if isinstance(b, str) else "" for b in content)


def replay_updates(messages: Sequence[BaseMessage], workspace: Path) -> list[Update]:
    """The updates that show ``messages`` again (see the module doc)."""
    workspace = Path(workspace)
    updates: list[Update] = []
    asked: dict[str, dict[str, Any]] = {}  # call id -> the call, until its answer
    for msg in messages:
        if isinstance(msg, HumanMessage):
            source = msg.additional_kwargs.get("lc_source")
            if source in SUMMARY_SOURCES:
                updates.append(update_agent_thought_text(SUMMARY_LINE))
            elif not source and (text := _text(msg)):
                updates.append(update_user_message_text(text))
        elif isinstance(msg, AIMessage):
            if (text := _text(msg).strip()):
                updates.append(update_agent_message_text(text + "\n"))
            for call in msg.tool_calls:
                if call.get("id"):
                    asked[call["id"]] = call
        elif isinstance(msg, ToolMessage):
            call = asked.pop(msg.tool_call_id, None) or {"name": msg.name or "?", "args": {}}
            updates += _finished(call, msg, workspace)
    for call_id, call in asked.items():  # no answer: the turn ended first
        updates.append(start_tool_call(
            call_id, title(call["name"], call.get("args") or {}), kind=tool_kind(call["name"]),
            status="failed", raw_input=call.get("args") or {},
            content=[tool_content(text_block("(no result: the turn ended before this call "
                                             "finished)"))]))
    return updates


def _finished(call: dict[str, Any], msg: ToolMessage, workspace: Path) -> list[Update]:
    name, args = str(call.get("name") or msg.name or "?"), dict(call.get("args") or {})
    if name == WRITE_TODOS:
        plan = plan_update(args)
        return [plan] if plan is not None else []
    artifact = msg.artifact if isinstance(msg.artifact, dict) else {}
    outcome = outcome_of(msg.status, artifact.get("status"), artifact.get("recovery"))
    text = _text(msg)
    raw_output: dict[str, Any] = {"outcome": outcome}
    if artifact.get("raw_path"):
        raw_output["raw_path"] = artifact["raw_path"]
    return [start_tool_call(
        msg.tool_call_id, title(name, args), kind=tool_kind(name),
        status="completed" if outcome == "ok" else "failed",
        content=[tool_content(text_block(text)), *figure_blocks(text, workspace)],
        locations=locations(name, args, workspace) or None, raw_input=args,
        raw_output=raw_output)]
