"""The one redaction (``simagent.trace.redact``) at the two langgraph choke points.

* **Checkpoints.** Everything the conversation holds (the user's words, the model's
  replies and tool-call arguments, tool results, subagent state, pending writes) reaches
  ``checkpoints.sqlite`` through the checkpointer's serializer, so redacting there covers
  every channel and every writer at once, present and future. Redacting messages one by
  one before they are saved would have to find each path a secret can take (a user's
  prompt, a model's reply, a tool's arguments, a summary) and would change the live run:
  a tool would execute with redacted arguments. At the serializer the live run keeps
  what it has; only what is kept on disk, and so what a resumed thread reloads, is
  redacted.
* **Tool results.** :class:`ToolResultRedaction` sits innermost in every agent's
  middleware (main and subagents), so no tool's output (``execute``, ``read_file``,
  ``grep``, ``task``, MCP tools ...) reaches the model, the context layers or the
  offload files with a secret in it, the same as ``run_python``'s output.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import ormsgpack
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.types import Command

from simagent.trace.redact import Redactor, redact, redact_data

#: langgraph's msgpack extension codes whose payload is itself msgpack (constructor
#: args, pydantic fields, delta snapshots). Code 6 (a numpy array) holds a raw buffer,
#: which is left alone: replacing bytes inside it would change its shape.
_NESTED_EXT = {0, 1, 2, 3, 4, 5, 7}
_OPTS = ormsgpack.OPT_NON_STR_KEYS


class RedactingSerializer(JsonPlusSerializer):
    """langgraph's serializer, with every secret value replaced before it is stored.

    A subclass (not a wrapper) so langgraph's ``with_msgpack_allowlist`` (a
    ``copy.copy``) keeps redacting. The msgpack bytes are re-walked, not the Python
    objects: the walk needs no knowledge of message classes, and a secret that is not
    in the bytes (the usual case) costs one substring search per secret.
    """

    def __init__(self, *args: Any, redactor: Redactor | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._redactor = redactor

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        kind, data = super().dumps_typed(obj)
        redactor = self._redactor or _DEFAULT
        forms = [value.encode("utf-8", "surrogatepass") for value, _ in redactor.forms()]
        if not forms or not any(f in data for f in forms):
            return kind, data
        if kind == "msgpack":
            return kind, _scrub_packed(bytes(data), redactor)
        if kind == "json":
            return kind, redactor(data.decode("utf-8")).encode("utf-8")
        if kind in ("bytes", "bytearray"):
            return kind, _scrub_bytes(bytes(data), redactor)
        return kind, data  # pickle (off by default): opaque


_DEFAULT = Redactor()


def _scrub_bytes(data: bytes, redactor: Redactor) -> bytes:
    for value, name in redactor.forms():
        data = data.replace(value.encode("utf-8", "surrogatepass"),
                            f"[redacted:{name}]".encode())
    return data


def _scrub_packed(data: bytes, redactor: Redactor) -> bytes:
    def hook(code: int, payload: bytes) -> Any:
        if code in _NESTED_EXT:
            payload = _scrub_packed(payload, redactor)
        return ormsgpack.Ext(code, payload)

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return redactor(value)
        if isinstance(value, bytes):
            return _scrub_bytes(value, redactor)
        if isinstance(value, list | tuple):
            return [walk(v) for v in value]
        if isinstance(value, dict):
            return {walk(k): walk(v) for k, v in value.items()}
        return value

    tree = ormsgpack.unpackb(data, ext_hook=hook, option=_OPTS)
    return ormsgpack.packb(walk(tree), option=_OPTS)


def redacting_sqlite_saver(conn: sqlite3.Connection) -> Any:
    """A ``SqliteSaver`` on ``conn`` whose serializer redacts (see the module docstring)."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    return SqliteSaver(conn, serde=RedactingSerializer())


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
