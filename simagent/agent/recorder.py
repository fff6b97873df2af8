"""``TraceRecorder``: the middleware that writes model calls and tool calls to the trace.

It sits innermost in simagent's middleware list (after skills and memory are added), so
the request it sees is the request the model gets: when a provider reports no usage it
estimates tokens on exactly that request and marks the figure ``estimated``. Around tool
calls it records the call and its result, emits ``tool_started``/``tool_finished``
stream records for ``TurnRunner``, and turns a tool's exception into an error result so
one broken tool never kills the turn. langgraph control flow (interrupts, parent
commands) passes through untouched.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.errors import GraphBubbleUp
from langgraph.types import Command

from simagent.context.counting import RequestSize, ai_message_of, count_text, measure
from simagent.context.tokens import Ruler, resolve_ruler
from simagent.outcomes import outcome_of
from simagent.trace.log import TraceLog
from simagent.trace.usage import UsageTotals, usage_record
from simagent.turns import TurnAbandoned, TurnRegistry

TASK_TOOL = "task"  # deepagents' subagent tool


def reasoning_text(msg: AIMessage) -> str:
    parts = []
    try:
        for block in msg.content_blocks:
            if block.get("type") == "reasoning" and block.get("reasoning"):
                parts.append(str(block["reasoning"]))
    except Exception:  # odd provider blocks must not break recording
        pass
    if not parts and msg.additional_kwargs.get("reasoning_content"):
        parts.append(str(msg.additional_kwargs["reasoning_content"]))
    return "\n".join(parts)


def tool_message_of(result: Any) -> ToolMessage | None:
    if isinstance(result, ToolMessage):
        return result
    if isinstance(result, Command) and isinstance(result.update, dict):
        for msg in reversed(result.update.get("messages", []) or []):
            if isinstance(msg, ToolMessage):
                return msg
    return None


def _report_of(content: str) -> dict[str, Any] | None:
    """A subagent's typed record, when its result is one (see ``agent.subagents``)."""
    if not content.startswith("{"):
        return None
    try:
        data = json.loads(content)
    except ValueError:
        return None
    return data if isinstance(data, dict) and "answer" in data else None


class TraceRecorder(AgentMiddleware):
    """Records one agent's model and tool calls (``agent`` = main or a subagent name)."""

    def __init__(self, trace: TraceLog, usage: UsageTotals, *, agent: str = "main",
                 model_id: str = "?", window: int | None = None,
                 turns: TurnRegistry | None = None, ruler: Ruler | None = None) -> None:
        super().__init__()
        # an abandoned turn's late reply is paid, not said; alone, nothing is abandoned
        self.turns = turns if turns is not None else TurnRegistry()
        self.trace = trace
        self.usage = usage
        self.agent = agent
        self.model_id = model_id
        self.window = window
        #: the agent's context layer's ruler, so the split it records is what acted
        self.ruler = ruler or resolve_ruler(model_id)

    @property
    def name(self) -> str:  # unique per agent so subagent stacks may hold their own
        return f"TraceRecorder[{self.agent}]"

    # ------------------------------------------------------------ model calls
    def _measure(self, request: Any) -> RequestSize:
        try:
            return measure(request.system_message, list(request.messages), request.tools,
                           self.ruler)
        except Exception:  # never let accounting break a model call
            return RequestSize()

    def _record_response(self, request: Any, response: Any) -> None:
        msg = ai_message_of(response)
        if msg is None:
            return
        dropped = self.turns.current_abandoned()
        if (thinking := reasoning_text(msg)) and not dropped:
            self.trace.append("message_reasoning", {"content": thinking, "agent": self.agent})
        if msg.text and not dropped:
            self.trace.append("message_assistant", {"content": msg.text, "agent": self.agent})
        record: dict[str, Any] = usage_record(msg.usage_metadata)
        size = self._measure(request)
        if record["input_tokens"] or record["output_tokens"]:
            record["source"] = "provider"
        else:
            record["input_tokens"] = size.total
            record["output_tokens"] = max(1, count_text(msg.text, self.ruler))
            record["total_tokens"] = record["input_tokens"] + record["output_tokens"]
            record["source"] = "estimated"
        model = (msg.response_metadata or {}).get("model_name") or self.model_id
        self.usage.record(self.agent, self.model_id, record)
        self.trace.append("model_usage", {"agent": self.agent, "model": self.model_id,
                                          "provider_model": model, **record,
                                          "request": size.as_dict(), "window": self.window,
                                          "ruler": self.ruler.name,
                                          **({"dropped": True} if dropped else {})})

    # the innermost check (``turns.check``): layers between the guard and here (a
    # summary) take time. A reply stream the client closed when its turn was
    # abandoned (``compatible_chat``) raises here; the request was sent and read, so it
    # is counted as a dropped call with no reply, as a late reply would have been.
    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        self.turns.check()
        try:
            response = handler(request)
        except TurnAbandoned:
            self._record_response(request, AIMessage(content=""))  # sent, and read: counted
            raise
        self._record_response(request, response)
        return response

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        self.turns.check()
        try:
            response = await handler(request)
        except TurnAbandoned:
            self._record_response(request, AIMessage(content=""))  # sent, and read: counted
            raise
        self._record_response(request, response)
        return response

    # ------------------------------------------------------------- tool calls
    def _before_tool(self, request: Any) -> tuple[dict[str, Any], float]:
        call = request.tool_call
        self.trace.append("tool_call", {"id": call.get("id"), "name": call.get("name"),
                                        "args": call.get("args"), "agent": self.agent})
        if call.get("name") == TASK_TOOL:
            args = call.get("args") or {}
            self.trace.append("subagent_start", {"name": args.get("subagent_type"),
                                                 "description": args.get("description"),
                                                 "tool_call_id": call.get("id")})
        self._emit(request, {"type": "tool_started", "tool_call_id": call.get("id"),
                             "name": call.get("name"), "args": call.get("args"),
                             "agent": self.agent})
        return call, time.monotonic()

    def _error_result(self, call: dict[str, Any], exc: BaseException) -> ToolMessage:
        """A broken tool becomes an error result, not a dead turn; a graph interrupt
        (an approval, a subagent's) is no failure and goes on up."""
        if isinstance(exc, GraphBubbleUp):
            raise exc
        self.trace.append("error", {"message": f"{type(exc).__name__}: {exc}",
                                    "where": f"tool {call.get('name')}"})
        text = str(exc).strip() or "(no message)"
        return ToolMessage(content=f"Error: tool `{call.get('name')}` failed: "
                                   f"{type(exc).__name__}: {text}",
                           tool_call_id=call.get("id") or "", name=call.get("name"),
                           status="error")

    def _after_tool(self, request: Any, call: dict[str, Any], t0: float, result: Any) -> Any:
        """Trace and stream the finished call; ``result`` goes back unchanged."""
        elapsed = round(time.monotonic() - t0, 3)
        msg = tool_message_of(result)
        content = msg.text if msg is not None else ""
        status = getattr(msg, "status", "success") or "success"
        artifact = getattr(msg, "artifact", None)
        artifact = artifact if isinstance(artifact, dict) else {}
        # run_python returns normally for a failed cell: its kernel status is the truth
        outcome = outcome_of(status, artifact.get("status"), artifact.get("recovery"))
        dropped = self.turns.current_abandoned()
        self.trace.append("tool_result", {"tool_call_id": call.get("id"),
                                          "name": call.get("name"), "content": content,
                                          "status": status, "elapsed_s": elapsed,
                                          "agent": self.agent, "outcome": outcome,
                                          **({"dropped": True} if dropped else {})})
        if call.get("name") == TASK_TOOL:
            end = {"name": (call.get("args") or {}).get("subagent_type"),
                   "tool_call_id": call.get("id"), "status": status}
            if report := _report_of(content):
                end["report"] = report
            self.trace.append("subagent_end", end)
        self._emit(request, {"type": "tool_finished", "tool_call_id": call.get("id"),
                             "name": call.get("name"), "status": status, "content": content,
                             "elapsed_s": elapsed, "agent": self.agent,
                             "raw_path": artifact.get("raw_path"), "outcome": outcome,
                             "recovery": artifact.get("recovery")})
        return result

    @staticmethod
    def _emit(request: Any, item: dict[str, Any]) -> None:
        writer = getattr(getattr(request, "runtime", None), "stream_writer", None)
        if callable(writer):
            try:
                writer(item)
            except Exception:  # no stream consumer (plain invoke)
                pass

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        call, t0 = self._before_tool(request)
        try:
            result = handler(request)
        except Exception as exc:
            result = self._error_result(call, exc)
        return self._after_tool(request, call, t0, result)

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        call, t0 = self._before_tool(request)
        try:
            result = await handler(request)
        except Exception as exc:
            result = self._error_result(call, exc)
        return self._after_tool(request, call, t0, result)
