"""A real, local OpenAI-compatible HTTP server, for tests and the fault bench.

Why a server and not a mock: the point of the ``openai-compatible:`` model path is the wire
protocol (Chat Completions, SSE streaming, usage accounting, tool-call deltas, HTTP errors).
Mocking the client would test our assumptions about langchain-openai instead of its behaviour,
so tests talk to this stub over a socket exactly as they would to llama.cpp or vLLM. It lives
in the package (standard library only) so the product's provider-fault bench can drive the
same faults the tests do; ``tests/openai_stub.py`` re-exports it.

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

Provider faults, each produced on the wire (what a real provider or proxy does), never by
raising inside the client:

* ``Reply(status=429, retry_after=2)``: an HTTP error; ``retry_after`` (seconds, or an HTTP
  date string) becomes the ``Retry-After`` header. Any status works (500, 502, 503, 529 ...);
  :func:`error_reply` fills the error body's type the way providers do.
* ``fault="reset"``: the connection is closed with an RST (``SO_LINGER`` 0) and no response.
* ``fault="hang"``: nothing is sent for ``hang_s`` seconds (past the client's read timeout);
  stopping the stub ends the wait.
* ``fault="cut"``: a streamed reply sends ``cut_after`` SSE events (default: about half),
  then the connection drops mid-message (no terminating chunk: an incomplete body).
  A non-streamed reply sends half of its JSON body, then drops.
* ``fault="no_finish"``: the stream ends cleanly but early: content deltas with no
  ``finish_reason``, no usage chunk and no ``data: [DONE]`` (a proxy that cut the
  upstream off and closed politely). Non-streamed: ``finish_reason`` is null.

Invalid tool-call JSON is ``Reply(tool_calls=[("name", "{not json")])`` (the arguments
string goes out verbatim) and an empty reply is ``Reply()`` (null content, no calls).
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHAT_PATH = "/v1/chat/completions"
#: OpenAI cookbook framing (see the module docstring).
MESSAGE_FRAMING = 3
NAME_FRAMING = 1
REPLY_PRIMING = 3
TOOL_FRAMING = 7
TOOLS_FRAMING = 12
FAULTS = ("reset", "hang", "cut", "no_finish")
#: Error body ``type`` by status, as OpenAI (and Anthropic, for 529) name them.
ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error",
               429: "rate_limit_error", 529: "overloaded_error"}


@dataclass
class Reply:
    """One scripted response. ``status`` >= 400 turns it into an HTTP error with ``error``;
    ``fault`` (one of :data:`FAULTS`) breaks it on the wire (module docstring)."""

    text: str | None = None
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, JSON args string)
    prompt_tokens: int | None = None  # None: counted from the request received
    completion_tokens: int | None = None  # None: counted from this reply
    cached_tokens: int = 0
    status: int = 200
    error: str = "stub error"
    error_type: str = "invalid_request_error"
    error_code: str | None = None
    retry_after: float | str | None = None  # the Retry-After header of an error reply
    fault: str | None = None  # reset | hang | cut | no_finish
    hang_s: float = 30.0  # how long "hang" stays silent
    cut_after: int | None = None  # SSE events "cut" sends before dropping (None: half)
    call_ids: list[str] = field(default_factory=list)  # set when served (OpenAIStub._next)

    def __post_init__(self) -> None:
        if self.fault is not None and self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; one of {', '.join(FAULTS)}")


def error_reply(status: int, message: str = "stub error", *, code: str | None = None,
                retry_after: float | str | None = None) -> Reply:
    kind = ERROR_TYPES.get(status, "server_error")
    return Reply(status=status, error=message, error_type=kind, error_code=code,
                 retry_after=retry_after)


def fault_reply(fault: str, text: str = "a reply the connection loses", **kw: Any) -> Reply:
    """A reply broken by ``fault`` (``cut`` and ``no_finish`` stream part of ``text``)."""
    return Reply(text=text, fault=fault, **kw)


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON, or the raw text if it was not JSON
    usage: dict[str, Any] | None = None  # what the stub reported for it (successful chats)
    status: int | None = None  # the HTTP status it got (None: no response at all)
    fault: str | None = None  # the fault it was served, if any


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up (its read timeout, a retry racing a dropped reply) is part
    of the faults this server plays: no traceback on stderr for it."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            super().handle_error(request, client_address)


class OpenAIStub:
    """Threaded ``http.server`` on 127.0.0.1 serving replies from a FIFO queue."""

    model_name = "stub-model"

    def __init__(self, replies: Iterable[Reply | str] = ()) -> None:
        self.replies: deque[Reply] = deque(_as_reply(r) for r in replies)
        self._calls = 0  # tool calls served so far (their ids)
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()  # ends "hang" waits

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> OpenAIStub:
        stub = self

        class Handler(_Handler):
            owner = stub

        self._stopping.clear()
        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
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
        """The next reply, its tool calls numbered across the server's life (``call_0``,
        ``call_1``, ...): ids are unique within a conversation, as a provider's are."""
        with self._lock:
            if not self.replies:
                return None
            reply = self.replies.popleft()
            ids = [f"call_{self._calls + i}" for i in range(len(reply.tool_calls))]
            self._calls += len(ids)
            return replace(reply, call_ids=ids)

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
        recorded.fault = reply.fault
        if reply.fault == "reset":
            self._reset()
            return
        if reply.fault == "hang":
            self.owner._stopping.wait(reply.hang_s)
            self.close_connection = True
            return  # the client gave up long ago; close without a word
        if reply.status >= 400:
            recorded.status = reply.status
            err = {"message": reply.error, "type": reply.error_type, "code": reply.error_code}
            extra = {} if reply.retry_after is None else {"Retry-After": str(reply.retry_after)}
            self._send_json(reply.status, {"error": err}, extra)
            return
        recorded.status = 200
        body = body if isinstance(body, dict) else {}
        usage = recorded.usage = _usage(reply, body)
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self._send_stream(reply, usage if include_usage else None)
        elif reply.fault == "cut":
            data = json.dumps(self._completion(reply, usage)).encode()
            self._send_head(200, "application/json", {"Content-Length": str(len(data))})
            self.wfile.write(data[: len(data) // 2])
            self._drop()
        else:
            self._send_json(200, self._completion(reply, usage))

    # -- responses ---------------------------------------------------------------------------
    def _record(self, body: Any) -> RecordedRequest:
        headers = {k.lower(): v for k, v in self.headers.items()}
        req = RecordedRequest(self.command, self.path, headers, body)
        self.owner._record(req)
        return req

    def _send_head(self, status: int, content_type: str, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def _send_json(self, status: int, payload: dict[str, Any],
                   headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self._send_head(status, "application/json",
                        {"Content-Length": str(len(data)), **(headers or {})})
        self.wfile.write(data)

    def _drop(self, *, rst: bool = False) -> None:
        """Close the connection now, mid-whatever: FIN, or RST with ``rst``.

        The reader holds the socket open (it counts as a reference), so it is closed
        first; the writer holds none and stays open for ``http.server``'s final flush,
        which then has nothing to send. The server's own cleanup finds the socket closed.
        """
        self.close_connection = True
        sock = self.connection
        if rst:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        try:
            self.rfile.close()
        except OSError:
            pass
        try:
            sock.close()
        except OSError:
            pass

    def _reset(self) -> None:
        self._drop(rst=True)

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {"id": "chatcmpl-stub", "object": obj, "created": int(time.time()),
                "model": self.owner.model_name, "system_fingerprint": "stub"}

    def _completion(self, reply: Reply, usage: dict[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if reply.tool_calls:
            message["tool_calls"] = [
                {"id": reply.call_ids[i], "type": "function",
                 "function": {"name": n, "arguments": a}}
                for i, (n, a) in enumerate(reply.tool_calls)
            ]
        finish = "tool_calls" if reply.tool_calls else "stop"
        if reply.fault == "no_finish":
            finish = None
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
            head = {"index": i, "id": reply.call_ids[i], "type": "function",
                    "function": {"name": name, "arguments": ""}}
            yield chunk({"tool_calls": [head]})
            for piece in _pieces(args):
                yield chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
        if reply.fault == "no_finish":
            return  # ends early: no finish_reason, no usage (and no [DONE], below)
        yield chunk({}, "tool_calls" if reply.tool_calls else "stop")
        if usage is not None:
            yield {**self._envelope("chat.completion.chunk"), "choices": [], "usage": usage}

    def _send_stream(self, reply: Reply, usage: dict[str, Any] | None) -> None:
        self._send_head(200, "text/event-stream",
                        {"Cache-Control": "no-cache", "Transfer-Encoding": "chunked"})
        chunks = list(self._chunks(reply, usage))
        events = [f"data: {json.dumps(c)}\n\n" for c in chunks]
        if reply.fault != "no_finish":
            events.append("data: [DONE]\n\n")
        if reply.fault == "cut":  # always before the finish chunk: the message is unfinished
            unfinished = next(i for i, c in enumerate(chunks) if c["choices"]
                              and c["choices"][0]["finish_reason"])
            keep = reply.cut_after if reply.cut_after is not None else (unfinished + 1) // 2
            events = events[: max(1, min(keep, unfinished))]
        for event in events:
            data = event.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        if reply.fault == "cut":
            time.sleep(0.05)  # the client has the partial message before the drop
            self._drop()
            return
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
