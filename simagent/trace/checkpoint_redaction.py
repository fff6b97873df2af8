"""Checkpoints kept with every secret redacted: langgraph's serializer, one choke point.

Everything the conversation holds (the user's words, the model's replies and tool-call
arguments, tool results, subagent state, pending writes) reaches ``checkpoints.sqlite``
through the checkpointer's serializer, so redacting there covers every channel and every
writer at once, present and future. Redacting messages one by one before they are saved
would have to find each path a secret can take (a user's prompt, a model's reply, a tool's
arguments, a summary) and would change the live run: a tool would execute with redacted
arguments. At the serializer the live run keeps what it has; only what is kept on disk, and
so what a resumed thread reloads, is redacted. The session opens its checkpointer here;
tool results are redacted by ``agent/secrets.ToolResultRedaction``.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import ormsgpack
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver

from simagent.trace.redact import Redactor

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
    return SqliteSaver(conn, serde=RedactingSerializer())
