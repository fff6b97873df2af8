"""Chat Completions against an OpenAI-compatible server, as its servers really behave.

llama.cpp's server (``llama-cpp-python``), vLLM and LM Studio speak the Chat Completions
protocol with differences that matter to an agent (checked against the real llama.cpp
server in ``tests/test_local_server.py``):

- A streamed request whose prompt does not fit ``n_ctx`` gets HTTP 200 and an *empty*
  event stream: the error is raised after the headers went out, so langchain sees no
  chunk and raises a bare ``ValueError: No generation chunks were returned``. The cause
  is invisible, so :class:`CompatibleChatOpenAI` asks the server once more, not streamed
  and for one token: an overflow then comes back as the server's own 400
  ``context_length_exceeded`` (which the emergency compaction recognises), anything
  else as :class:`~simagent.provider_errors.EmptyReplyStream` (a retryable fault). The
  server drops the connection after such a stream, so the question is asked on a fresh
  connection.
- ``max_completion_tokens`` (what langchain sends for ``max_tokens``) is ignored there:
  the classic ``max_tokens`` is sent beside it.
- Streamed chunks never carry ``usage``; the trace then records simagent's own count
  (``source: estimated``), as for any provider that reports none.

:func:`server_window` reads the window a running server really loaded, where it says it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
from langchain_openai import ChatOpenAI

from simagent.provider_errors import EmptyReplyStream

#: How long resolving a model may wait for a server to say its window (seconds).
PROBE_TIMEOUT_S = 2.0


class CompatibleChatOpenAI(ChatOpenAI):
    """``ChatOpenAI`` for OpenAI-compatible servers (see the module docstring)."""

    def _get_request_payload(self, input_: Any, *, stop: list[str] | None = None,
                             **kwargs: Any) -> dict:
        payload = super()._get_request_payload(input_, stop=stop, **kwargs)
        if "max_completion_tokens" in payload:
            payload.setdefault("max_tokens", payload["max_completion_tokens"])
        return payload

    def _stream(self, messages: Any, stop: Any = None, run_manager: Any = None,
                **kwargs: Any) -> Iterator[Any]:
        empty = True
        for chunk in super()._stream(messages, stop, run_manager, **kwargs):
            empty = False
            yield chunk
        if empty:
            self._explain_empty(messages, stop, kwargs)

    async def _astream(self, messages: Any, stop: Any = None, run_manager: Any = None,
                       **kwargs: Any) -> AsyncIterator[Any]:
        empty = True
        async for chunk in super()._astream(messages, stop, run_manager, **kwargs):
            empty = False
            yield chunk
        if empty:
            self._explain_empty(messages, stop, kwargs)

    def _explain_empty(self, messages: Any, stop: Any, kwargs: dict[str, Any]) -> None:
        """Raise what the server would have said: ask again, not streamed, one token."""
        kwargs = {k: v for k, v in kwargs.items() if k not in ("stream_usage", "stream")}
        payload = self._get_request_payload(messages, stop=stop, **kwargs)
        payload.update(stream=False, max_tokens=1, max_completion_tokens=1)
        payload.pop("stream_options", None)
        # A fresh connection: the server drops the kept-alive one after such a stream.
        with httpx.Client(timeout=self.root_client.timeout) as http:
            self.root_client.copy(http_client=http, max_retries=0).chat.completions.create(
                **payload)
        raise EmptyReplyStream(str(self.openai_api_base or ""))


def server_window(base_url: str, model: str, timeout: float = PROBE_TIMEOUT_S) -> int | None:
    """The context window the server at ``base_url`` loaded for ``model``, where it says
    it: llama.cpp's ``/props`` (``n_ctx``, also what ``local:`` serves) or vLLM's
    ``/v1/models`` (``max_model_len``). None when it says nothing or cannot be reached."""
    base = base_url.rstrip("/")
    root = base.removesuffix("/v1")
    props = _get_json(root + "/props", timeout)
    if isinstance(props, dict):
        for found in (props.get("n_ctx"),
                      (props.get("default_generation_settings") or {}).get("n_ctx")):
            if isinstance(found, int) and found > 0:
                return found
    listed = _get_json(base + "/models", timeout)
    for entry in (listed or {}).get("data", []) if isinstance(listed, dict) else []:
        if isinstance(entry, dict) and entry.get("id") == model:
            size = entry.get("max_model_len")
            if isinstance(size, int) and size > 0:
                return size
    return None


def _get_json(url: str, timeout: float) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return json.loads(reply.read(1_000_000))
    except (OSError, ValueError, urllib.error.URLError):
        return None
