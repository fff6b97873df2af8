"""A real, local OpenAI-compatible HTTP server for tests.

Why a server and not a mock: the point of the ``openai-compatible:`` model path is the wire
protocol (Chat Completions, SSE streaming, usage accounting, tool-call deltas, HTTP errors).
Mocking the client would test our assumptions about langchain-openai instead of its behaviour,
so tests talk to this stub over a socket exactly as they would to llama.cpp or vLLM.

Usage::

    with OpenAIStub(["hello", Reply(tool_calls=[("add", '{"a": 1}')])]) as stub:
        ChatOpenAI(base_url=stub.base_url, ...)
        stub.requests[0].path   # "/v1/chat/completions"
        stub.requests[0].usage  # the usage the stub reported for it

Usage accounting: a Reply's ``prompt_tokens`` / ``completion_tokens`` are reported as given;
left ``None`` (the default) they are counted from what was actually received, with the real
o200k tokenizer (``simagent.context.tokens.encoding``: the offline tiktoken Encoding) and
deliberately *not* with simagent's ``counting.py``, so tests can compare the two. The rule
is OpenAI's cookbook recipe for chat requests (``num_tokens_from_messages``), extended to
tools:

* each message: 3 tokens, plus the tokens of every string it carries: ``role``,
  ``content`` (a string, or the ``text`` of each text part of a list), ``name`` (plus 1
  for the ``name`` key), ``tool_call_id``, and for each of ``tool_calls`` the function
  ``name`` and ``arguments`` string; a ``null`` content counts nothing;
* 3 tokens priming the reply (``<|start|>assistant<|message|>``);
* each tool in ``tools``: the tokens of ``json.dumps(tool, ensure_ascii=False)`` (the
  server sees decoded text, not ``\\u`` escapes) plus ``TOOL_FRAMING`` (7, the cookbook's
  per-function constant), and ``TOOLS_FRAMING`` (12) once when any tool is sent.

``completion_tokens`` is the tokens of the reply text plus each tool call's name and
arguments string (at least 1). Image parts are not counted (no test sends one).
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHAT_PATH = "/v1/chat/completions"
#: OpenAI cookbook framing (see the module docstring).
MESSAGE_FRAMING = 3
NAME_FRAMING = 1
REPLY_PRIMING = 3
TOOL_FRAMING = 7
TOOLS_FRAMING = 12


@dataclass
class Reply:
    """One scripted response. ``status`` >= 400 turns it into an HTTP error with ``error``."""

    text: str | None = None
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, JSON args string)
    prompt_tokens: int | None = None  # None: counted from the request received
    completion_tokens: int | None = None  # None: counted from this reply
    cached_tokens: int = 0
    status: int = 200
    error: str = "stub error"
    error_type: str = "invalid_request_error"
    error_code: str | None = None


def error_reply(status: int, message: str = "stub error", *, code: str | None = None) -> Reply:
    kind = {401: "invalid_request_error", 429: "rate_limit_error"}.get(status, "server_error")
    return Reply(status=status, error=message, error_type=kind, error_code=code)


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON, or the raw text if it was not JSON
    usage: dict[str, Any] | None = None  # what the stub reported for it (successful chats)


class OpenAIStub:
    """Threaded ``http.server`` on 127.0.0.1 serving replies from a FIFO queue."""

    model_name = "stub-model"

    def __init__(self, replies: Iterable[Reply | str] = ()) -> None:
        self.replies: deque[Reply] = deque(_as_reply(r) for r in replies)
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> OpenAIStub:
        stub = self

        class Handler(_Handler):
            owner = stub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> OpenAIStub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "stub not started"
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- scripting ---------------------------------------------------------------------------
    def push(self, *replies: Reply | str) -> None:
        with self._lock:
            self.replies.extend(_as_reply(r) for r in replies)

    def _next(self) -> Reply | None:
        with self._lock:
            return self.replies.popleft() if self.replies else None

    def _record(self, req: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(req)

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path == CHAT_PATH]


def _as_reply(r: Reply | str) -> Reply:
    return Reply(text=r) if isinstance(r, str) else r


def _tokens(text: Any) -> int:
    if not isinstance(text, str) or not text:
        return 0
    from simagent.context.tokens import encoding  # the offline o200k Encoding only

    # special-token text inside a message is ordinary text to a provider
    return len(encoding("o200k_base").encode(text, disallowed_special=()))


def _content_tokens(content: Any) -> int:
    if isinstance(content, list):
        return sum(_tokens(part.get("text")) for part in content
                   if isinstance(part, dict) and part.get("type") == "text")
    return _tokens(content)


def count_prompt_tokens(body: Any) -> int:
    """The prompt tokens of a Chat Completions request body (rule: module docstring)."""
    if not isinstance(body, dict):
        return 0
    total = REPLY_PRIMING
    for msg in body.get("messages") or []:
        if not isinstance(msg, dict):
            continue
        total += MESSAGE_FRAMING + _tokens(msg.get("role")) + _content_tokens(msg.get("content"))
        if "name" in msg:
            total += NAME_FRAMING + _tokens(msg.get("name"))
        total += _tokens(msg.get("tool_call_id"))
        for call in msg.get("tool_calls") or []:
            fn = (call or {}).get("function") or {}
            total += _tokens(fn.get("name")) + _tokens(fn.get("arguments"))
    tools = body.get("tools") or []
    for tool in tools:
        total += TOOL_FRAMING + _tokens(json.dumps(tool, ensure_ascii=False))
    return total + (TOOLS_FRAMING if tools else 0)


def count_completion_tokens(reply: Reply) -> int:
    """Tokens of what the reply says: its text and each tool call's name and arguments."""
    n = _tokens(reply.text) + sum(_tokens(name) + _tokens(args)
                                  for name, args in reply.tool_calls)
    return max(1, n)


def _usage(reply: Reply, body: Any) -> dict[str, Any]:
    prompt = reply.prompt_tokens if reply.prompt_tokens is not None else count_prompt_tokens(body)
    completion = (reply.completion_tokens if reply.completion_tokens is not None
                  else count_completion_tokens(reply))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": reply.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


def _pieces(s: str, n: int = 3) -> list[str]:
    """Split into up to n non-empty pieces so streaming really produces several deltas."""
    if not s:
        return []
    size = max(1, -(-len(s) // n))
    return [s[i : i + size] for i in range(0, len(s), size)]


class _Handler(BaseHTTPRequestHandler):
    owner: OpenAIStub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
        pass

    def do_GET(self) -> None:
        self._record(None)
        self._send_json(404, {"error": {"message": f"unknown path {self.path}"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length).decode("utf-8", "replace")
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw
        recorded = self._record(body)
        if self.path.split("?")[0] != CHAT_PATH:
            self._send_json(404, {"error": {"message": f"unknown path {self.path}"}})
            return
        reply = self.owner._next()
        if reply is None:
            self._send_json(500, {"error": {"message": "stub: no scripted reply left"}})
            return
        if reply.status >= 400:
            err = {"message": reply.error, "type": reply.error_type, "code": reply.error_code}
            self._send_json(reply.status, {"error": err})
            return
        body = body if isinstance(body, dict) else {}
        usage = recorded.usage = _usage(reply, body)
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self._send_stream(reply, usage if include_usage else None)
        else:
            self._send_json(200, self._completion(reply, usage))

    # -- responses ---------------------------------------------------------------------------
    def _record(self, body: Any) -> RecordedRequest:
        headers = {k.lower(): v for k, v in self.headers.items()}
        req = RecordedRequest(self.command, self.path, headers, body)
        self.owner._record(req)
        return req

    def _send_json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {"id": "chatcmpl-stub", "object": obj, "created": int(time.time()),
                "model": self.owner.model_name, "system_fingerprint": "stub"}

    def _completion(self, reply: Reply, usage: dict[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if reply.tool_calls:
            message["tool_calls"] = [
                {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
                for i, (n, a) in enumerate(reply.tool_calls)
            ]
        finish = "tool_calls" if reply.tool_calls else "stop"
        return {**self._envelope("chat.completion"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": usage}

    def _chunks(self, reply: Reply, usage: dict[str, Any] | None
                ) -> Iterator[dict[str, Any]]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {**self._envelope("chat.completion.chunk"),
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        yield chunk({"role": "assistant", "content": ""})
        for piece in _pieces(reply.text or ""):
            yield chunk({"content": piece})
        for i, (name, args) in enumerate(reply.tool_calls):
            head = {"index": i, "id": f"call_{i}", "type": "function",
                    "function": {"name": name, "arguments": ""}}
            yield chunk({"tool_calls": [head]})
            for piece in _pieces(args):
                yield chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
        yield chunk({}, "tool_calls" if reply.tool_calls else "stop")
        if usage is not None:
            yield {**self._envelope("chat.completion.chunk"), "choices": [], "usage": usage}

    def _send_stream(self, reply: Reply, usage: dict[str, Any] | None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        events = [f"data: {json.dumps(c)}\n\n" for c in self._chunks(reply, usage)]
        events.append("data: [DONE]\n\n")
        for event in events:
            data = event.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
