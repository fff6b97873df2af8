"""Answer the tool calls a killed process left open, when its session is resumed.

A process killed while a tool ran (``kill -9``, the OOM killer, a closed laptop lid)
leaves the last checkpoint ending in an ``AIMessage`` whose tool calls have no
``ToolMessage``: the checkpoint after the model node is committed, the tools node never
finished. What langgraph does with it on the next ``stream`` (verified with the real
graph, ``tests/test_data_safety.py``): new input starts a fresh run from START and the
pending ``tools`` task is dropped, so the killed cell is *not* run again; deepagents'
``PatchToolCallsMiddleware`` then answers the open calls with a generic "did not
complete" message before the first model call, so no provider sees an orphaned call.

A kill can also land after a task's writes were saved but before the checkpoint that
includes them: the default (live) ``get_state`` then shows those writes, and a new run
drops them (a finished model reply vanishes; see :func:`repair`).

That generic answer does not say why, and it lives only in the new run's state. This
module makes the repair explicit and durable at the moment of resuming: each open call
gets a marked ``ToolMessage`` that says the process was killed, written to the
checkpoint as if the tools node had answered (so the state is consistent even before
the next turn, e.g. for ``simagent context``), and a ``tool_result`` event in the trace,
so the transcript shows the call as interrupted rather than hanging.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, RemoveMessage, ToolMessage
from langgraph.graph.message import REMOVE_ALL_MESSAGES

#: ``additional_kwargs`` key on the answers this module writes.
MARK = "simagent_interrupted"
INTERRUPTED = ("interrupted: the process was killed while this tool call ran, so it has no "
               "result. Its effects are unknown (a file may be half written); the Python "
               "kernel was restarted, so its variables are gone. Check before relying on it.")
#: The answer to a call a cancelled turn left open with no recorded result.
CANCELLED = ("cancelled: the user stopped the turn before this call had a result. Its effects "
             "are unknown (it may have run in part); check before relying on it.")


def open_calls(messages: Sequence[BaseMessage]) -> list[tuple[int, dict[str, Any]]]:
    """``(message index, call)`` for every tool call no ``ToolMessage`` answers."""
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    found = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, AIMessage):
            continue
        for call in (*msg.tool_calls, *msg.invalid_tool_calls):
            if call.get("id") and call["id"] not in answered:
                found.append((i, call))
    return found


def interrupted_answer(call: dict[str, Any], text: str = INTERRUPTED) -> ToolMessage:
    return ToolMessage(content=text, name=call.get("name") or "unknown",
                       tool_call_id=call["id"], status="error",
                       additional_kwargs={MARK: True})


def repaired_messages(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """``messages`` with an interrupted answer right after each open call's message."""
    return _with_answers(messages, {c["id"]: interrupted_answer(c)
                                    for _, c in open_calls(messages)})


def repair(session: Any, graph: Any, *, recorded: dict[str, ToolMessage] | None = None,
           answer: str = INTERRUPTED) -> list[str]:
    """Answer the open tool calls of ``session``'s thread; the ids answered as
    interrupted (often none).

    ``recorded``: results the trace holds for calls whose stream was closed before their
    result was saved (a cancelled turn, ``cancel_account``); they answer their calls as
    they are. ``answer`` is the text for calls with no result at all.

    Call it once when a session is resumed, before its first turn. It works on the last
    *saved* checkpoint, which is what both ``update_state`` and the next run build on: a
    kill can also fall after a task's writes were saved and before the checkpoint that
    would include them, and langgraph's default (live) ``get_state`` shows those writes
    although a new run drops them. Repairing the live view appended an answer to a call
    that the saved state does not have: an orphaned tool result, found by the kill test.
    A tool call that did finish before the kill (its result among those saved writes)
    keeps its real result; the others get the interrupted answer.
    """
    config = session.thread_config
    live = graph.get_state(config)
    if live.interrupts or any(getattr(t, "interrupts", ()) for t in live.tasks or ()):
        return []  # calls waiting for approval are open by design (`run --approve`)
    saved_config = live.config or config
    saved = graph.get_state(saved_config) if saved_config is not config else live
    messages = list((saved.values or {}).get("messages") or [])
    found = open_calls(messages)
    if not found:
        if open_calls((live.values or {}).get("messages") or []):
            # a reply with calls among the unsealed writes: the next run drops it; seal
            # the saved state now so every reader sees what that run will see
            graph.update_state(config, {"messages": []}, as_node="tools")
        return []
    finished = {m.tool_call_id: m for m in (live.values or {}).get("messages") or []
                if isinstance(m, ToolMessage)}
    known = {**(recorded or {}), **finished}
    answers = {c["id"]: known.get(c["id"]) or interrupted_answer(c, answer) for _, c in found}
    if all(i == len(messages) - 1 for i, _ in found):
        update: list[BaseMessage] = list(answers.values())
    else:
        update = [RemoveMessage(id=REMOVE_ALL_MESSAGES),
                  *_with_answers(messages, answers)]
    graph.update_state(config, {"messages": update}, as_node="tools")
    killed = []
    for _, call in found:
        if answers[call["id"]].additional_kwargs.get(MARK):
            killed.append(call["id"])
            session.trace.append("tool_result", {
                "tool_call_id": call["id"], "name": call.get("name"), "content": answer,
                "status": "error", "elapsed_s": 0.0, "agent": "main", "interrupted": True,
                "outcome": "cancelled"})
    return killed


def _with_answers(messages: Sequence[BaseMessage],
                  answers: dict[str, ToolMessage]) -> list[BaseMessage]:
    out: list[BaseMessage] = []
    for msg in messages:
        out.append(msg)
        if isinstance(msg, AIMessage):
            out.extend(answers[c["id"]] for c in (*msg.tool_calls, *msg.invalid_tool_calls)
                       if c.get("id") in answers)
    return out
