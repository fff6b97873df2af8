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
  the classic ``max_tokens`` is sent beside it. A request with neither makes the server
  write until the model ends its reply or ``n_ctx`` is full (minutes for a small model on
  a few cores, and a random one may never end), so every request carries a limit: the
  configured ``max_output``, else :func:`reply_limit` of the window.
- A system message whose content is a list of text blocks (simagent's prompt is built
  of blocks) fails validation there with an HTTP 500: text-only content goes as a string.
  So does an assistant message whose content is null (what langchain sends for a reply
  that is only tool calls, i.e. every turn after a tool call): it goes as ``""``.
- Each streamed tool-call delta repeats the call's name and id, which langchain would
  concatenate (``set_unitset_unit…``): only the first delta keeps them; arguments cut
  off at the output limit are flagged (:class:`StreamedCalls`).
- Small models behind a template that lists tools in the prompt often write the call
  as the reply's text (fenced JSON, ``<tool_call>`` tags): a reply that is exactly one
  call of an offered tool is read as that call (:mod:`simagent.text_tool_calls`).
- llama-cpp-python's server ignores ``stream_options`` and streams no ``usage``; the
  server simagent starts for ``local:`` ends each stream with the usage it counted
  (``local_model/serve.py``), recorded as the provider's. A server that reports none
  gets simagent's own count (``source: estimated``), as any provider does.
- The server generates a streamed reply for as long as its connection is open, and
  looks only between chunks: a reply the user abandoned (ctrl+C, ``simagent.turns``)
  would run to its token limit, holding the one model every later request waits for.
  The stream raises ``TurnAbandoned`` at its next chunk and closes the response, so the
  server stops generating there.

:func:`server_window` reads the window a running server really loaded, where it says it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Collection, Iterator
from typing import Any

import httpx
from langchain_core.messages import AIMessageChunk
from langchain_core.outputs import ChatGenerationChunk
from langchain_openai import ChatOpenAI

from simagent.provider_errors import INCOMPLETE_CALLS_KEY, EmptyReplyStream
from simagent.text_tool_calls import offered_tools, text_tool_call
from simagent.turns import check_abandoned

#: ``response_metadata`` key on a reply whose tool call was read from its text.
TEXT_CALL_KEY = "simagent_text_tool_call"

#: How long resolving a model may wait for a server to say its window (seconds).
PROBE_TIMEOUT_S = 2.0
#: The longest reply asked of a server when no ``max_output`` is configured (tokens);
#: smaller windows get a quarter of theirs (:func:`reply_limit`).
DEFAULT_REPLY_TOKENS = 2048


def reply_limit(window: int | None) -> int:
    """The reply limit sent when none is configured: a quarter of the window, at most
    :data:`DEFAULT_REPLY_TOKENS` (the whole of it when the window is unknown)."""
    if not window:
        return DEFAULT_REPLY_TOKENS
    return max(1, min(DEFAULT_REPLY_TOKENS, window // 4))


class CompatibleChatOpenAI(ChatOpenAI):
    """``ChatOpenAI`` for OpenAI-compatible servers (see the module docstring)."""

    def _get_request_payload(self, input_: Any, *, stop: list[str] | None = None,
                             **kwargs: Any) -> dict:
        payload = super()._get_request_payload(input_, stop=stop, **kwargs)
        limit = (payload.get("max_completion_tokens") or payload.get("max_tokens")
                 or self.reply_tokens())
        payload["max_tokens"] = payload["max_completion_tokens"] = limit
        for message in payload.get("messages") or ():
            message["content"] = flat_text(message.get("content"))
            if message["content"] is None:  # a call without text: the server wants a string
                message["content"] = ""
        return payload

    def reply_tokens(self) -> int:
        """The limit a request without one gets: the profile's ``max_output_tokens`` (the
        configured ``max_output``, which simagent also reserves in its budget), else
        :func:`reply_limit` of the profile's window."""
        profile = self.profile if isinstance(self.profile, dict) else {}
        configured = profile.get("max_output_tokens")
        if isinstance(configured, int) and configured > 0:
            return configured
        return reply_limit(profile.get("max_input_tokens"))

    def _stream(self, messages: Any, stop: Any = None, run_manager: Any = None,
                **kwargs: Any) -> Iterator[Any]:
        calls = StreamedCalls()
        stream = super()._stream(messages, stop, run_manager, **kwargs)
        try:
            for chunk in stream:
                check_abandoned()  # closing the stream (below) stops the server generating
                yield calls.see(chunk)
        finally:
            stream.close()
        yield from self._after_stream(calls, messages, stop, kwargs)

    async def _astream(self, messages: Any, stop: Any = None, run_manager: Any = None,
                       **kwargs: Any) -> AsyncIterator[Any]:
        calls = StreamedCalls()
        stream = super()._astream(messages, stop, run_manager, **kwargs)
        try:
            async for chunk in stream:
                check_abandoned()
                yield calls.see(chunk)
        finally:
            await stream.aclose()
        for chunk in self._after_stream(calls, messages, stop, kwargs):
            yield chunk

    def _after_stream(self, calls: Any, messages: Any, stop: Any,
                      kwargs: dict[str, Any]) -> list[Any]:
        """What follows a finished stream, sync or async: the server's real error behind an
        empty reply, a flag for a cut-off call, a call the model wrote as text."""
        if calls.empty:
            self._explain_empty(messages, stop, kwargs)
        tail = [calls.incomplete(), calls.written_as_text(offered_tools(kwargs.get("tools")))]
        return [chunk for chunk in tail if chunk is not None]

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


class StreamedCalls:
    """What one reply stream said about its tool calls, fixing two things on the way.

    llama.cpp repeats a call's name and id (and a legacy ``function_call``) in every
    argument delta, and langchain joins deltas by concatenating strings (the call would
    be named ``set_unitset_unit…``): only the first delta keeps them. And langchain parses
    streamed arguments leniently, so arguments cut off at the output limit still make a
    "valid" call (``{"unit": "kel`` runs as ``{"unit": "kel"}``; llama.cpp even reports
    ``finish_reason: tool_calls`` then): calls whose arguments are not complete JSON are
    named in a last chunk's ``response_metadata[INCOMPLETE_CALLS_KEY]``, for the
    recovery nudge."""

    def __init__(self) -> None:
        self.empty = True
        self.names: dict[int, str] = {}
        self.args: dict[int, str] = {}
        self.text = ""

    def see(self, chunk: Any) -> Any:
        self.empty = False
        message = chunk.message
        self.text += message.text if isinstance(message.content, str) else ""
        calls = getattr(message, "tool_call_chunks", None) or []
        for call in calls:
            index = call.get("index") or 0
            if index in self.names:
                call["name"] = call["id"] = None
            elif call.get("name"):
                self.names[index] = call["name"]
            self.args[index] = self.args.get(index, "") + (call.get("args") or "")
        if calls:
            message.additional_kwargs.pop("function_call", None)
        return chunk

    def written_as_text(self, tools: Collection[str]) -> Any:
        """A last chunk carrying the call the reply wrote as its whole text, or None
        (:mod:`simagent.text_tool_calls`)."""
        found = None if self.names else text_tool_call(self.text, tools)
        if found is None:
            return None

        name, args = found
        return ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=[{
            "name": name, "args": json.dumps(args), "id": f"call_text_{name}", "index": 0,
            "type": "tool_call_chunk"}], response_metadata={TEXT_CALL_KEY: True}))

    def incomplete(self) -> Any:
        """A last chunk naming the calls whose arguments are not complete JSON, or None."""
        bad = []
        for index, name in self.names.items():
            try:
                json.loads(self.args.get(index) or "{}")
            except ValueError:
                bad.append({"index": index, "name": name})
        if not bad:
            return None

        return ChatGenerationChunk(message=AIMessageChunk(
            content="", response_metadata={INCOMPLETE_CALLS_KEY: bad}))


def flat_text(content: Any) -> Any:
    """Content made only of text blocks as one string (llama.cpp's server takes a system
    message's content only as a string: a list gets an HTTP 500); anything else as is."""
    if isinstance(content, list) and content and all(
            isinstance(b, dict) and b.get("type") == "text" for b in content):
        return "".join(str(b.get("text") or "") for b in content)
    return content


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
