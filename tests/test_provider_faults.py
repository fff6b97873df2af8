"""Provider faults over real HTTP: the turn survives, or ends as one clear provider error.

The model is the real ``openai-compatible:`` path (langchain-openai, its real HTTP client)
talking to ``openai_stub``, a real server on 127.0.0.1 that produces each fault on the
wire: HTTP 429 (with and without ``Retry-After``), 500/502/503/529, a connection reset
(RST), a read that never answers, a stream dropped mid-message, and a stream that ends
cleanly with no finish reason. The graph is the real deepagents graph built by
``build_agent``; the retry layer runs with tiny backoff constants from the model config,
so the delays asserted are the computed ones (from the trace), not wall time.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import cli_fork
import httpx
import openai
import pytest
from conftest import write_config
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from openai_stub import OpenAIStub, Reply, error_reply, fault_reply

from simagent.agent.events import Retrying, TextDelta
from simagent.agent.provider_retry import (
    BASE_S,
    CAP_S,
    MAX_RETRIES,
    RETRY_AFTER_CAP_S,
    Fault,
    RetryPolicy,
    backoff_delay,
    classify,
    parse_retry_after,
    retry_after_of,
)
from simagent.models import ModelError, TruncatedReply, describe_provider_error, resolve_model

#: Tiny constants: every backoff is 10-40 ms, so the waits are real but short.
FAST = {"retries": 3, "retry_base_s": 0.01, "retry_cap_s": 0.04, "retry_jitter": 0.0}
ANSWER = "recovered: the answer"


class Turns:
    """A real session + graph + runner against one stub; records events and the trace."""

    def __init__(self, workspace: Path, stub: OpenAIStub, **cfg: Any) -> None:
        from simagent.agent.builder import build_agent
        from simagent.agent.runner import TurnRunner
        from simagent.config import Config
        from simagent.session import Session

        self.stub = stub
        self.resolved = resolve_model(f"openai-compatible:stub-model@{stub.base_url}",
                                      model_config={**FAST, **cfg}, environ={})
        self.session = Session.create(workspace, approval="auto", model=self.resolved.id,
                                      config=Config())
        self.agent = build_agent(self.session, self.resolved)
        self.runner = TurnRunner(self.session, self.agent)
        self.events: list[Any] = []

    def run(self, prompt: str = "hello") -> Any:
        return self.runner.run(prompt, self.events.append)

    def retries(self) -> list[dict[str, Any]]:
        return [e.payload for e in self.session.trace.events(["provider_retry"])]

    def of(self, cls: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, cls)]

    def messages(self) -> list[Any]:
        return self.agent.graph.get_state(self.session.thread_config).values["messages"]


@pytest.fixture
def turns(workspace):
    opened: list[Turns] = []

    def _open(stub: OpenAIStub, **cfg: Any) -> Turns:
        t = Turns(workspace, stub, **cfg)
        opened.append(t)
        return t

    yield _open
    for t in opened:
        t.session.close()


def assert_clean(messages: list[Any]) -> None:
    """No partial assistant message was kept, and every tool call has its result."""
    results = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    for m in messages:
        if isinstance(m, AIMessage):
            assert m.response_metadata.get("finish_reason"), m  # a whole reply only
            assert all(c["id"] in results for c in m.tool_calls), m


# ----------------------------------------------------------------- each fault, survived
@pytest.mark.parametrize(("fault", "cause"), [
    (error_reply(429, "slow down"), "429"),
    (error_reply(500, "boom"), "500"),
    (error_reply(502, "bad gateway"), "502"),
    (error_reply(503, "unavailable"), "503"),
    (error_reply(529, "overloaded"), "529"),
    (fault_reply("reset"), "connection reset"),
    (fault_reply("cut"), "connection dropped"),
    (fault_reply("no_finish"), "reply cut off"),
], ids=["429", "500", "502", "503", "529", "reset", "cut", "no_finish"])
def test_the_turn_survives_one_fault(turns, fault, cause):
    with OpenAIStub([fault, Reply(text=ANSWER)]) as stub:
        t = turns(stub)
        result = t.run()
    assert result.status == "done" and result.final == ANSWER
    assert [r.fault or r.status for r in stub.chat_requests][1:] == [200]  # N + 1 requests
    (traced,) = t.retries()
    assert traced["cause"] == cause and traced["retry"] == 1 and traced["agent"] == "main"
    assert traced["delay_s"] == FAST["retry_base_s"]  # no jitter: base x 2^0
    assert traced["max_retries"] == FAST["retries"]
    assert traced["reason"].startswith("provider error: ") and "\n" not in traced["reason"]
    (event,) = t.of(Retrying)
    assert (event.retry, event.max_retries, event.cause) == (1, FAST["retries"], cause)
    assert event.label(2.2) == f"provider {cause} — retry 1/{FAST['retries']} in 3s"
    streamed = "".join(e.text for e in t.of(TextDelta))
    if fault.fault in ("cut", "no_finish"):  # shown before the fault, then superseded
        assert 0 < event.discarded < len(fault.text) + 1
        assert streamed == fault.text[: event.discarded] + ANSWER
    else:
        assert event.discarded == 0 and streamed == ANSWER
    messages = t.messages()
    assert [type(m) for m in messages] == [HumanMessage, AIMessage]
    assert messages[-1].text == ANSWER  # the cut-off text was never persisted
    assert_clean(messages)


def test_retry_after_seconds_and_http_date_are_honoured_and_capped(turns):
    asked = time.monotonic()
    soon = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    replies = [error_reply(429, "slow down", retry_after=0.15),
               error_reply(429, "slow down", retry_after=soon),
               error_reply(503, "no header"), Reply(text=ANSWER)]
    with OpenAIStub(replies) as stub:
        t = turns(stub, retry_after_cap_s=0.2)
        t0 = time.monotonic()
        result = t.run()
        elapsed = time.monotonic() - t0
    parsed_by = time.monotonic() - asked  # the date was read at most this long after
    assert result.status == "done" and len(stub.chat_requests) == 4
    first, second, third = t.retries()
    assert (first["retry_after"], first["delay_s"]) == (0.15, 0.15)  # the server's ask
    # the date, less the time until it was read (and its whole-second rounding), capped
    assert 29 - parsed_by <= second["retry_after"] <= 30 and second["delay_s"] == 0.2
    assert third["retry_after"] is None and third["delay_s"] == 0.04  # 0.01 x 2^2
    assert elapsed >= 0.15 + 0.2 + 0.04  # the waits really happened


def test_a_read_timeout_is_retried(turns):
    with OpenAIStub([fault_reply("hang", hang_s=10), Reply(text=ANSWER)]) as stub:
        t = turns(stub, timeout=0.5)  # the client's read timeout
        result = t.run()
    assert result.status == "done" and result.final == ANSWER
    # "timed out", not a dropped connection: the client gave up before the hang ended
    assert [r["cause"] for r in t.retries()] == ["timed out"]
    assert "timed out" in t.of(Retrying)[0].reason


def test_invalid_tool_json_and_empty_replies_are_nudged_over_http(turns):
    """recovery.py, fed by the openai-compatible path: a call whose arguments are not
    JSON, and a reply with no text and no call, each get one marked nudge."""
    replies = [Reply(tool_calls=[("ls", '{"path": "/",, }')]), Reply(),
               Reply(text=ANSWER)]
    with OpenAIStub(replies) as stub:
        t = turns(stub)
        result = t.run()
    assert result.status == "done" and result.final == ANSWER
    recovery = [e.payload["reason"] for e in t.session.trace.events(["recovery"])]
    assert recovery == ["invalid_tool_call", "empty"]
    assert not t.retries()  # a bad reply is not a provider fault
    sent = [m["content"] for m in stub.chat_requests[1].body["messages"]
            if m["role"] == "user"]
    assert sent[-1].startswith("[harness]") and "valid JSON" in sent[-1]
    third = stub.chat_requests[2].body["messages"]
    assert third[-1]["role"] == "user" and "empty" in third[-1]["content"]


# ----------------------------------------------------------------- past the bound
def test_past_the_bound_one_clear_error_a_clean_checkpoint_and_the_next_turn_works(turns):
    """A tool round trip, then the provider fails every retry (a cut stream included):
    one error naming the fault and the retries; the state keeps the completed steps
    only; the next turn runs normally on the same thread."""
    replies = [Reply(tool_calls=[("ls", json.dumps({"path": "/"}))]),
               fault_reply("cut"), error_reply(503), fault_reply("cut"), error_reply(503)]
    with OpenAIStub(replies) as stub:
        t = turns(stub)
        result = t.run("list and explain")
        assert len(stub.chat_requests) == 1 + 1 + FAST["retries"]
        assert result.status == "error" and result.provider_error
        assert result.error == ("provider error: HTTP 503: stub error "
                                f"(gave up after {FAST['retries']} retries)")
        *retried, gave_up = t.retries()
        assert [r["retry"] for r in retried] == [1, 2, 3]
        assert gave_up["gave_up"] and gave_up["retries"] == FAST["retries"]
        messages = t.messages()
        assert [type(m) for m in messages] == [HumanMessage, AIMessage, ToolMessage]
        assert_clean(messages)
        stub.push(Reply(text=ANSWER))
        again = t.run("try again")
    assert again.status == "done" and again.final == ANSWER
    sent = stub.chat_requests[-1].body["messages"]
    assert [m["role"] for m in sent[1:]] == ["user", "assistant", "tool", "user"]
    assert not any(m["role"] == "assistant" and m.get("content") and "loses" in m["content"]
                   for m in sent)


def test_client_errors_pass_straight_through(turns):
    with OpenAIStub([error_reply(401, "invalid api key")]) as stub:
        t = turns(stub)
        result = t.run()
    assert result.status == "error" and "authentication" in result.error
    assert len(stub.chat_requests) == 1 and not t.retries() and not t.of(Retrying)


def test_a_context_overflow_is_left_to_emergency_compaction(turns):
    overflow = error_reply(400, "This model's maximum context length is 4096 tokens",
                           code="context_length_exceeded")
    with OpenAIStub([overflow, overflow, overflow]) as stub:
        t = turns(stub)
        result = t.run()
    assert result.status == "error" and "context overflow" in result.error
    assert not t.retries()  # never ours: at most the compaction's own second try
    assert len(stub.chat_requests) <= 2


def test_cancel_during_a_backoff_ends_the_turn_at_once(turns):
    # the server asks for an hour: only the cancel can end the turn within the join's bound
    with OpenAIStub([error_reply(429, "slow down", retry_after=3600)]) as stub:
        t = turns(stub, retry_after_cap_s=3600)
        waiting = threading.Event()
        box: dict = {}

        def on_event(event: Any) -> None:
            if isinstance(event, Retrying):
                waiting.set()

        turn = threading.Thread(target=lambda: box.update(r=t.runner.run("hello", on_event)),
                                daemon=True)
        turn.start()
        assert waiting.wait(60), "no retry began"
        t.runner.cancel()
        turn.join(60)
        assert not turn.is_alive(), "the cancel did not end the backoff"
        result = box["r"]
    assert result.status == "cancelled"
    assert len(stub.chat_requests) == 1
    assert t.retries()[-1]["gave_up"] and t.retries()[-1]["cancelled"]


@pytest.mark.slow
def test_simagent_run_exits_4_with_one_error_line_and_resumes_clean(workspace):
    """The real CLI: every retry fails, so exit 4 with one ``simagent: error`` line; a
    resumed run sends the model no trace of the failed turn's reply."""
    write_config(
        workspace, "[model]\nretries = 1\nretry_base_s = 0.01\nretry_jitter = 0.0\n")
    env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_MODEL"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return cli_fork.run([sys.executable, "-m", "simagent", "run", *args], cwd=workspace,
                            env=env, text=True, capture_output=True, timeout=120)

    with OpenAIStub([fault_reply("cut"), error_reply(503, "unavailable")]) as stub:
        model = f"openai-compatible:stub-model@{stub.base_url}"
        proc = cli("--model", model, "--json", "hi")
        assert proc.returncode == 4, proc.stderr
        data = json.loads(proc.stdout)
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("simagent: error")]
        assert errors == ["simagent: error: provider error: HTTP 503: unavailable "
                          "(gave up after 1 retry)"]
        notes = [ln for ln in proc.stderr.splitlines() if "— retry 1/1 in" in ln]
        assert len(notes) == 1 and "dropped" in notes[0]
        assert "Traceback" not in proc.stderr and len(stub.chat_requests) == 2
        db = sqlite3.connect(Path(data["state_dir"]) / "trace.sqlite")
        try:
            kinds = [k for (k,) in db.execute("SELECT kind FROM events ORDER BY id")]
        finally:
            db.close()
        assert kinds.count("provider_retry") == 2 and "message_assistant" not in kinds
        stub.push(Reply(text=ANSWER))
        again = cli("--resume", data["session_id"], "--model", model, "--json", "again")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["final"] == ANSWER
    sent = stub.chat_requests[-1].body["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "user"]  # no partial reply


# ----------------------------------------------------------------- pure parts
def test_backoff_doubles_to_the_cap_with_bounded_jitter():
    policy = RetryPolicy(retry_base_s=1.0, retry_cap_s=8.0, retry_jitter=0.5)
    assert [backoff_delay(n, policy, rand=lambda: 0.0) for n in range(1, 6)] == \
        [1.0, 2.0, 4.0, 8.0, 8.0]
    assert [backoff_delay(n, policy, rand=lambda: 1.0) for n in range(1, 6)] == \
        [0.5, 1.0, 2.0, 4.0, 4.0]
    assert backoff_delay(3, policy, retry_after=2.5) == 2.5  # the server's ask wins
    assert backoff_delay(3, policy, retry_after=1e6) == RETRY_AFTER_CAP_S
    assert backoff_delay(1, policy, retry_after=-3) == 0.0
    default = RetryPolicy()
    assert (default.retries, default.retry_base_s, default.retry_cap_s) == \
        (MAX_RETRIES, BASE_S, CAP_S)


def test_retry_after_parsing():
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert parse_retry_after("2", now) == 2.0
    assert parse_retry_after(" 1.5 ", now) == 1.5
    assert parse_retry_after("Fri, 02 Jan 2026 03:04:35 GMT", now) == 30.0
    assert parse_retry_after("Fri, 02 Jan 2026 03:00:00 GMT", now) == 0.0  # past: now
    assert parse_retry_after("-4", now) == 0.0
    for bad in (None, "", "soon", "nan", "Fri, 99 Foo"):
        assert parse_retry_after(bad, now) is None
    request = httpx.Request("POST", "http://x/v1/chat/completions")
    ms = httpx.Response(429, headers={"retry-after-ms": "1500", "retry-after": "9"},
                        request=request)
    exc = openai.RateLimitError("slow", response=ms, body=None)
    assert retry_after_of(exc) == 1.5  # the finer header wins
    plain = httpx.Response(429, headers={"Retry-After": "7"}, request=request)
    assert retry_after_of(openai.RateLimitError("slow", response=plain, body=None)) == 7.0
    assert retry_after_of(ValueError("x")) is None


def _status_error(cls: type, status: int, message: str, headers: dict | None = None):
    request = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")
    response = httpx.Response(status, headers=headers or {}, request=request)
    return cls(message, response=response, body={"error": {"message": message}})


def test_classifier_retries_transient_faults_only():
    request = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")
    assert classify(_status_error(openai.RateLimitError, 429, "slow",
                                  {"retry-after": "3"})) == Fault("429", 3.0)
    assert classify(_status_error(openai.InternalServerError, 529, "overloaded")) == \
        Fault("529")
    assert classify(_status_error(openai.APIStatusError, 408, "timeout")) == Fault("408")
    for status, cls in ((400, openai.BadRequestError), (401, openai.AuthenticationError),
                        (403, openai.PermissionDeniedError), (404, openai.NotFoundError)):
        assert classify(_status_error(cls, status, "no")) is None
    overflow = _status_error(openai.BadRequestError, 400,
                             "This model's maximum context length is 4096 tokens")
    assert classify(overflow) is None
    try:
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except ConnectionResetError as inner:
            raise openai.APIConnectionError(request=request) from inner
    except openai.APIConnectionError as reset:
        assert classify(reset) == Fault("connection reset")
    assert classify(openai.APITimeoutError(request=request)) == Fault("timed out")
    assert classify(httpx.RemoteProtocolError("peer closed connection")) == \
        Fault("connection dropped")
    assert classify(TruncatedReply("finish_reason", 12)) == Fault("reply cut off")
    assert classify(ValueError("a bug, not a provider")) is None
    assert classify(KeyboardInterrupt()) is None
    line = describe_provider_error(TruncatedReply("finish_reason", 12))
    assert line == ("provider error: reply cut off: the reply stream ended without a "
                    "finish_reason after 12 chars")


def test_retry_settings_come_from_the_model_config_and_sdk_retries_are_off():
    url = "openai-compatible:m@http://127.0.0.1:1/v1"
    plain = resolve_model(url, environ={})
    assert plain.retry is None and plain.chat_model.max_retries == 0  # ours, not the SDK's
    own = resolve_model(url, model_config={"max_retries": 2, "retries": 1}, environ={})
    assert own.chat_model.max_retries == 2 and own.retry == RetryPolicy(retries=1)
    for bad in ({"retries": -1}, {"retries": 1.5}, {"retry_base_s": "1"},
                {"retry_jitter": 2}, {"check_finish_reason": "yes"}):
        with pytest.raises(ModelError) as info:
            resolve_model(url, model_config=bad, environ={})
        assert info.value.code == 2 and next(iter(bad)) in str(info.value)
    off = resolve_model(url, model_config={"check_finish_reason": False}, environ={})
    assert off.retry.check_finish_reason is False and off.retry.retries == MAX_RETRIES
    with pytest.raises(ValueError, match="unknown retry setting"):
        RetryPolicy.from_settings({"retry_forever": True})
    anthropic = resolve_model("anthropic:claude-sonnet-4-5",
                              environ={"ANTHROPIC_API_KEY": "k"}).chat_model
    assert anthropic.max_retries == 0


# ----------------------------------------------------------------- the status bar
def test_status_bar_counts_a_retry_down_and_drops_the_cut_text(workspace):
    from simagent.config import SessionOptions
    from simagent.tui.controller import TuiController
    from simagent.tui.entries import AssistantEntry
    from simagent.tui.status import RETRY_STYLE, StatusSnapshot, status_fragments

    draws: list[float] = []
    ctl = TuiController(SessionOptions(workspace), invalidate=lambda: draws.append(0))
    ctl._active = True  # a turn is running
    ctl.conversation.add(AssistantEntry("kept. partial"))
    event = Retrying(2, 5, 0.6, "503", "provider error: HTTP 503: x", discarded=len(" partial"))
    ctl._on_event(event)
    assert ctl.conversation.entries[-1].text == "kept."
    now = time.monotonic()
    assert ctl.retry_label(now) == "provider 503 — retry 2/5 in 1s"
    assert ctl.retry_label(now + 0.7) == "provider 503 — retry 2/5 now"
    snap = StatusSnapshot("sim", "m", "sid", "auto", "idle", 0.0, "ctx 5%", "dim", busy=True,
                          retry=ctl.retry_label(now + 0.7))
    frags = dict((t, s) for s, t in status_fragments(snap, 200))
    assert frags["↻ provider 503 — retry 2/5 now"] == RETRY_STYLE
    assert "● working" not in frags
    # redrawn while it counts down, not only once: a minute's wait, so the redraws come
    # before its end however slow the machine (a bounded wait, not a timing)
    draws.clear()
    ctl._on_event(Retrying(3, 5, 60.0, "503", "provider error: HTTP 503: x"))
    deadline = time.monotonic() + 60
    while len(draws) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(draws) >= 3
    ctl._on_event(TextDelta("again"))  # the retry answers: the countdown goes
    assert ctl.retry_label() is None


def test_the_async_path_retries_and_a_cancel_ends_its_wait():
    """``awrap_model_call`` (async graphs): same bound and trace-free retries; a set
    cancel flag ends a long backoff within a poll."""
    import asyncio
    from types import SimpleNamespace

    from simagent.agent.provider_retry import ProviderRetryMiddleware

    calls: list[int] = []

    async def flaky(_request: Any) -> AIMessage:
        calls.append(1)
        if len(calls) < 3:
            raise _status_error(openai.InternalServerError, 502, "bad gateway")
        return AIMessage("ok")

    request = SimpleNamespace(model=SimpleNamespace())
    fast = ProviderRetryMiddleware(policy=RetryPolicy(retries=2, retry_base_s=0.001))
    assert asyncio.run(fast.awrap_model_call(request, flaky)).text == "ok"
    assert len(calls) == 3

    cancel = threading.Event()
    slow = ProviderRetryMiddleware(policy=RetryPolicy(retry_base_s=3600, retry_cap_s=3600),
                                  cancel=cancel)
    calls.clear()
    box: dict = {}

    def call() -> None:
        try:
            asyncio.run(slow.awrap_model_call(request, flaky))
        except openai.InternalServerError as exc:
            box["raised"] = exc

    th = threading.Thread(target=call, daemon=True)
    th.start()
    deadline = time.monotonic() + 60
    while not calls and time.monotonic() < deadline:  # the call failed: its backoff began
        time.sleep(0.01)
    cancel.set()
    th.join(60)  # an hour's backoff, unless the cancel ends it
    assert not th.is_alive(), "the cancel did not end the backoff"
    info = SimpleNamespace(value=box["raised"])
    assert len(calls) == 1
    assert not hasattr(info.value, "simagent_retries")  # cancelled: no "gave up" claim
