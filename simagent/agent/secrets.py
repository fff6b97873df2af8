"""The one redaction (``simagent.trace.redact``) at the two langgraph choke points.

* **Checkpoints**: the checkpointer's serializer (``trace/checkpoint_redaction.py``).
* **Tool results.** :class:`ToolResultRedaction` sits innermost in every agent's
  middleware (main and subagents), so no tool's output (``execute``, ``read_file``,
  ``grep``, ``task``, MCP tools ...) reaches the model, the context layers or the
  offload files with a secret in it, the same as ``run_python``'s output.
"""

from __future__ import annotations

from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage
from langgraph.types import Command

from simagent.trace.redact import redact, redact_data


def _redact_message(message: Any) -> Any:
    if not isinstance(message, ToolMessage):
        return message
    content = message.content
    if isinstance(content, str):
        clean: Any = redact(content)
    else:  # content blocks: text is redacted, images pass
        clean = [redact_data(block) if isinstance(block, str | dict) else block
                 for block in content]
    if clean == content:
        return message
    return message.model_copy(update={"content": clean})


def redact_tool_result(result: Any) -> Any:
    """A tool's result (a ``ToolMessage`` or a ``Command`` carrying messages), redacted."""
    if isinstance(result, ToolMessage):
        return _redact_message(result)
    if isinstance(result, Command) and isinstance(result.update, dict) \
            and "messages" in result.update:
        messages = [_redact_message(m) for m in result.update["messages"]]
        return Command(graph=result.graph, update={**result.update, "messages": messages},
                       resume=result.resume, goto=result.goto)
    return result


class ToolResultRedaction(AgentMiddleware):
    """Redacts every tool result before anything else sees it (listed last: innermost)."""

    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        return redact_tool_result(handler(request))

    async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
        return redact_tool_result(await handler(request))
