"""Manual compaction: ``/compact [focus]``, ``/done [note]`` and the ``mark_task_done`` tool.

``/compact`` and ``/done`` run between turns, outside the graph: they read the checkpointed
thread, write a boundary with the same ``Compactor`` the middleware uses, and store it
with ``update_state``; the raw messages are untouched. ``mark_task_done`` runs inside a
turn, so it only files the task's typed record (validated; a bad one goes back to the
model as a tool error it can fix) and leaves it pending; the middleware writes the
checkpoint with that record when the next user turn starts (a task that is done cannot
be sliced while it is still running). ``/done`` builds its record from the task's messages
(``task_records.derive``) and merges one the model filed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from langchain.tools import ToolRuntime
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool, tool
from langgraph.types import Command
from pydantic import Field

from simagent.context.compaction import Compaction, cutoff_of
from simagent.context.counting import count_messages
from simagent.context.reporting import emit
from simagent.context.state import (
    BOUNDARY_KEY,
    CLEARED_INPUTS_KEY,
    CLEARED_KEY,
    PENDING_CHECKPOINT_KEY,
    STATE_CARD_KEY,
)
from simagent.context.state_card import card_event
from simagent.context.task_records import (
    FROM_COMMAND,
    MARK_TASK_DONE,
    close_task,
    filed_record,
    pending_record,
)
from simagent.context.tokens import using
from simagent.records import KeyValueArgs

if TYPE_CHECKING:
    from simagent.context.middleware import ContextMiddleware


def make_mark_task_done() -> BaseTool:
    @tool(MARK_TASK_DONE)
    def mark_task_done(
        answer: Annotated[str, Field(description="The outcome, in a few sentences.")],
        runtime: ToolRuntime,
        key_values: Annotated[list[KeyValueArgs], Field(
            default_factory=list, description="The numbers that matter, with units.")],
        files_read: Annotated[list[str], Field(default_factory=list,
                                               description="Input files used.")],
        files_written: Annotated[list[str], Field(default_factory=list,
                                                  description="Files written.")],
        assumptions: Annotated[list[str], Field(
            default_factory=list,
            description="Assumptions, incl. simulator defaults left unchanged.")],
        open_questions: Annotated[list[str], Field(default_factory=list,
                                                   description="What is still unsettled.")],
    ) -> Command | ToolMessage:
        """Close the finished, verified task with a typed record, before an unrelated one.

        At the next request the task's messages leave the context; this record, a
        summary and the path of the full history replace them. Returns a confirmation,
        or what to fix.
        """
        record, wrong = filed_record({
            "answer": answer, "key_values": list(key_values), "files_read": list(files_read),
            "files_written": list(files_written), "assumptions": list(assumptions),
            "open_questions": list(open_questions)})
        if record is None:
            return ToolMessage(content="mark_task_done: the record was not filed; fix it and "
                                       "call again:\n" + "\n".join(f"- {w}" for w in wrong),
                               tool_call_id=runtime.tool_call_id, name=MARK_TASK_DONE,
                               status="error")
        at = len(runtime.state.get("messages") or [])
        note = ToolMessage(content="Task record filed; the task is closed with it when the "
                                   "next request starts.", tool_call_id=runtime.tool_call_id,
                           name=MARK_TASK_DONE)
        return Command(update={PENDING_CHECKPOINT_KEY: {"record": record.model_dump(),
                                                        "at": at},
                               "messages": [note]})

    return mark_task_done


@dataclass
class ManualResult:
    """What a manual compaction did; ``message`` is one line for the user."""

    done: bool
    message: str
    path: str | None = None
    dropped: int = 0
    tokens_before: int = 0
    tokens_after: int = 0


def _thread(graph: Any, config: dict[str, Any]) -> tuple[list[Any], dict[str, Any], str | None]:
    state = graph.get_state(config)
    if any(getattr(task, "interrupts", ()) for task in state.tasks or ()):
        return [], {}, "the turn is paused (approval pending); answer it first"
    values = dict(state.values or {})
    return list(values.get("messages") or []), values, None


def _tokens(context: ContextMiddleware, values: dict[str, Any], messages: list[Any],
            boundary: dict[str, Any] | None, card: dict[str, Any] | None) -> int:
    """Estimated request size for a boundary: last measured fixed part + the new view."""
    view = context.view(messages, boundary, values.get(CLEARED_KEY) or (), card,
                        values.get(CLEARED_INPUTS_KEY) or ())
    return _last_fixed(context) + count_messages(view, context.ruler)


def _commit(graph: Any, config: dict[str, Any], context: ContextMiddleware,
            values: dict[str, Any], messages: list[Any], done: Compaction, kind: str,
            card_reason: str, update: dict[str, Any], **extra: Any) -> tuple[int, int]:
    """Store a manual boundary (with a fresh kernel state card) and trace both; returns
    the estimated request size (before, after)."""
    old_card = values.get(STATE_CARD_KEY)
    card = context.make_card(messages, old_card, card_reason)
    before = _tokens(context, values, messages, values.get(BOUNDARY_KEY), old_card)
    after = _tokens(context, values, messages, done.boundary, card or old_card)
    if card is not None:
        update = {**update, STATE_CARD_KEY: card}
        extra["state_card_tokens"] = card["tokens"]
    graph.update_state(config, {BOUNDARY_KEY: done.boundary, **update})
    context.record(kind, done, before, after, **extra)
    if card is not None:
        emit(context.trace, "context_state_card", card_event(card, context.agent))
    return before, after


def _last_fixed(context: ContextMiddleware) -> int:
    for event in reversed(context.trace.events(["model_usage"])):
        req = event.payload.get("request") or {}
        if event.payload.get("agent", "main") == context.agent and req:
            return sum(int(req.get(k) or 0) for k in ("system_prompt", "tool_schemas",
                                                       "skills_index", "memory_index"))
    return 0


def compact_now(graph: Any, config: dict[str, Any], context: ContextMiddleware,
                focus: str | None = None) -> ManualResult:
    """``/compact [focus]``: summarize now, keeping a little of the newest verbatim."""
    messages, values, refused = _thread(graph, config)
    if refused:
        return ManualResult(False, f"cannot compact: {refused}")
    boundary = values.get(BOUNDARY_KEY)
    tail = messages[cutoff_of(messages, boundary):]
    keep = min(context.thresholds.summary_keep, count_messages(tail, context.ruler) // 4)
    with using(context.ruler):  # the kept tail is measured as the middleware measures it
        done = context.compactor.summarize(messages, boundary, keep, focus=focus)
    if done is None:
        return ManualResult(False, "nothing to compact: the conversation since the last "
                                   "boundary is already minimal")
    before, after = _commit(graph, config, context, values, messages, done,
                            "context_summary", "compact", {}, reason="manual", focus=focus,
                            summarizer=context.compactor.summarizer.name)
    return ManualResult(True, f"compacted {_messages(done.dropped)} (~{before:,} → ~{after:,} "
                              f"tokens); full history in {done.path}", str(done.path),
                        done.dropped, before, after)


def checkpoint_now(graph: Any, config: dict[str, Any], context: ContextMiddleware,
                   note: str | None = None) -> ManualResult:
    """``/done [note]``: close the finished task; the next request starts clean.

    Its record is derived from the task's messages, merged with the one the model filed
    with ``mark_task_done`` if it did (that pending checkpoint is this one now).
    """
    messages, values, refused = _thread(graph, config)
    if refused:
        return ManualResult(False, f"cannot checkpoint: {refused}")
    boundary = values.get(BOUNDARY_KEY)
    with using(context.ruler):
        done = close_task(context.compactor, messages, boundary, len(messages),
                          source=FROM_COMMAND, note=note,
                          filed=pending_record(values.get(PENDING_CHECKPOINT_KEY)),
                          store=context.task_records)
    if done is None:
        return ManualResult(False, "nothing to checkpoint since the last boundary")
    before, after = _commit(graph, config, context, values, messages, done,
                            "context_checkpoint", "checkpoint", {PENDING_CHECKPOINT_KEY: None},
                            note=note, source="command", record=done.boundary["record"])
    n = len(done.boundary["record"]["key_values"])
    return ManualResult(True, f"task checkpoint written ({_messages(done.dropped)} → record with "
                              f"{n} key value{'s' if n != 1 else ''}); full history in "
                              f"{done.path}", str(done.path), done.dropped, before, after)


def _messages(n: int) -> str:
    return "1 message" if n == 1 else f"{n:,} messages"
