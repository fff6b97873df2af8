"""Bounded, visible, cancellable retries of a model call that hit a provider fault.

Providers fail transiently: 429 rate limits (often with ``Retry-After``), 500/502/503 and
Anthropic's 529 "overloaded", connections reset or dropped mid-stream, read timeouts, and
streams that end politely but early (no finish reason, no ``[DONE]``). One such fault
must not end a long turn, and a provider that stays down must not hold it forever.

``ProviderRetryMiddleware`` wraps the model call (innermost: the request it repeats is
exactly the one the layers above built, and the recorder above it sees one outcome per
logical call). On a retryable fault it waits an exponential backoff with jitter, or what
``Retry-After`` asks (seconds or an HTTP date, capped), then calls again, at most
``max_retries`` times. Each retry is a ``provider_retry`` trace event and a stream item
that ``TurnRunner`` turns into a ``Retrying`` event (the TUI counts it down in the status
bar; ``simagent run`` prints one stderr line). A cancel during the wait ends it at once.
Past the bound the last error goes up, marked with the retry count, and the turn ends
as a provider error (``simagent run`` exit 4); a failed call writes nothing to the
checkpoint, so the next turn starts from the last completed step.

Everything else passes straight through: 401/403/404/400 would fail the same way again,
so would a connection refused by a loopback address (no server on that local port), and
a context overflow belongs to the emergency compaction above (``ContextMiddleware``).

The SDKs' own retries are switched off in ``simagent.models`` (``max_retries=0``) so the
two layers do not multiply; a ``max_retries`` in the model config turns them back on
inside each of our attempts. The bound (``RetryPolicy`` and its defaults :data:`MAX_RETRIES`,
:data:`BASE_S`, :data:`CAP_S`, :data:`RETRY_AFTER_CAP_S`, :data:`JITTER`) lives beside the
models in :mod:`simagent.provider_errors`, so resolving a model's config needs no agent
layer; the model config (``[model]`` table) may override it (``RetryPolicy.from_settings``).
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage

from simagent.context.overflow import is_context_overflow
from simagent.context.reporting import write_stream
from simagent.models import finish_reason_key
from simagent.provider_errors import (  # the policy's bound is re-exported for callers here
    BASE_S,
    CAP_S,
    CONNECTION_ERRORS,
    JITTER,
    MAX_RETRIES,
    RETRIES_ATTR,
    RETRY_AFTER_CAP_S,
    TIMEOUT_ERRORS,
    EmptyReplyStream,
    RetryPolicy,
    TruncatedReply,
    describe_provider_error,
    exception_chain,
    refused_locally,
)
from simagent.trace.log import TraceLog

__all__ = [
    "BASE_S",
    "CAP_S",
    "JITTER",
    "MAX_RETRIES",
    "RETRY_AFTER_CAP_S",
    "ProviderRetryMiddleware",
    "RetryPolicy",
    "backoff_delay",
    "classify",
    "parse_retry_after",
]

DEFAULT_POLICY = RetryPolicy()
#: How often an async wait looks at the cancel flag (seconds).
CANCEL_POLL_S = 0.05

#: Status codes worth another try: request timeout, rate limit, server-side trouble.
RETRY_STATUSES = frozenset({408, 429}) | frozenset(range(500, 600))
_TIMEOUT_NAMES = TIMEOUT_ERRORS | {"TimeoutError", "ReadTimeout", "ConnectTimeout",
                                   "WriteTimeout", "PoolTimeout"}
_CONNECTION_NAMES = CONNECTION_ERRORS | {"WriteError", "ConnectionError"}


# ------------------------------------------------------------------ pure parts
def backoff_delay(retry: int, policy: RetryPolicy = DEFAULT_POLICY, *,
                  retry_after: float | None = None,
                  rand: Callable[[], float] = random.random) -> float:
    """Seconds to wait before retry number ``retry`` (1-based).

    The server's ``retry_after`` wins, capped at ``retry_after_cap_s``; otherwise
    ``base x 2^(retry-1)`` capped at ``cap``, minus up to ``jitter`` of it at random.
    """
    if retry_after is not None:
        return min(max(0.0, retry_after), policy.retry_after_cap_s)
    full = min(policy.retry_cap_s, policy.retry_base_s * 2 ** (max(1, retry) - 1))
    return full * (1 - policy.retry_jitter * rand())


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """A ``Retry-After`` value in seconds: delta-seconds or an HTTP date (RFC 9110).

    A date in the past means now (0); anything unreadable is None (then the backoff
    applies).
    """
    if value is None:
        return None
    text = str(value).strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:  # an HTTP date is GMT
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def retry_after_of(exc: BaseException) -> float | None:
    """The wait the server asked for in the error's response headers (``retry-after-ms``,
    which OpenAI sends, or ``retry-after``), in seconds; None when it asked none."""
    for e in exception_chain(exc):
        headers = getattr(getattr(e, "response", None), "headers", None)
        if headers is None:
            continue
        try:
            ms = headers.get("retry-after-ms")
            if ms is not None and (seconds := parse_retry_after(ms)) is not None:
                return seconds / 1000
            return parse_retry_after(headers.get("retry-after"))
        except Exception:  # an odd headers object: no ask
            return None
    return None


def _status(chain: list[BaseException]) -> int | None:
    for e in chain:
        for status in (getattr(e, "status_code", None),
                       getattr(getattr(e, "response", None), "status_code", None)):
            if isinstance(status, int) and not isinstance(status, bool):
                return status
    return None


@dataclass(frozen=True)
class Fault:
    """A retryable provider fault: a short ``cause`` for the status bar ("503",
    "connection reset", "timed out", "reply cut off") and the server's ``retry_after``."""

    cause: str
    retry_after: float | None = None


def classify(exc: BaseException) -> Fault | None:
    """The fault when another try may succeed, else None (the error goes straight up).

    A context overflow is never retried here (emergency compaction handles it); an HTTP
    status decides when there is one (408/429/5xx retry, other 4xx do not); then
    timeouts, lost connections and cut-off replies; then langchain's ``is_retryable``.
    """
    if not isinstance(exc, Exception) or is_context_overflow(exc):
        return None
    chain = exception_chain(exc)
    if any(isinstance(e, TruncatedReply) for e in chain):
        return Fault("reply cut off")
    if any(isinstance(e, EmptyReplyStream) for e in chain):
        return Fault("empty reply")
    status = _status(chain)
    if status is not None:
        return Fault(str(status), retry_after_of(exc)) if status in RETRY_STATUSES else None
    names = {c.__name__ for e in chain for c in type(e).__mro__}
    if names & _TIMEOUT_NAMES:
        return Fault("timed out")
    if names & _CONNECTION_NAMES:
        if refused_locally(exc):  # nothing listens on this machine's port: not transient
            return None
        text = " ".join(str(e).lower() for e in chain)
        if any(isinstance(e, ConnectionResetError) for e in chain) or "reset" in text:
            return Fault("connection reset")
        if any(isinstance(e, ConnectionRefusedError) for e in chain) or "refused" in text:
            return Fault("connection refused")
        if "RemoteProtocolError" in names or "ReadError" in names:
            return Fault("connection dropped")
        return Fault("connection error")
    if any(getattr(e, "is_retryable", None) is True for e in chain):
        return Fault("provider error")
    return None


def check_finished(model: Any, response: Any) -> None:
    """Raise ``TruncatedReply`` when ``model`` reports finish reasons and this reply's
    AIMessage has none (a stream that ended early without an error)."""
    key = finish_reason_key(model)
    if key is None:
        return
    messages = getattr(response, "result", None)
    messages = [response] if isinstance(response, AIMessage) else list(messages or ())
    for msg in messages:
        if isinstance(msg, AIMessage) and not (msg.response_metadata or {}).get(key):
            raise TruncatedReply(key, len(msg.text))


def _reason(exc: BaseException) -> str:
    """The one-line provider error (``describe_provider_error``), else the exception."""
    return " ".join((describe_provider_error(exc) or f"{type(exc).__name__}: {exc}").split())


# ------------------------------------------------------------------ the middleware
class ProviderRetryMiddleware(AgentMiddleware):
    """Retries a model call after a provider fault, within ``policy``'s bound.

    ``cancel`` (the session's ``cancel_requested``) ends a backoff wait at once; the
    last error then goes up and the runner reports the turn as cancelled.
    """

    def __init__(self, trace: TraceLog | None = None, *, agent: str = "main",
                 policy: RetryPolicy | None = None,
                 cancel: threading.Event | None = None,
                 rand: Callable[[], float] = random.random,
                 revive: Callable[[], str | None] | None = None) -> None:
        super().__init__()
        self.revive = revive  # the model's own server, brought back (ResolvedModel.reviver)
        self.trace = trace
        self.agent = agent
        self.policy = policy or RetryPolicy()
        self.cancel = cancel
        self.rand = rand

    @property
    def name(self) -> str:
        return f"ProviderRetryMiddleware[{self.agent}]"

    # The two shells differ only in how they call the model and wait; what a failure
    # means (retry after a delay, or give up) is decided once, in ``_next``.
    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        done = 0  # retries made (a revived server's second call is not one)
        while True:
            try:
                return self._checked(request, handler(request))
            except Exception as exc:
                if self._revived(exc):
                    continue
                delay = self._next(exc, done)
                if delay is None or self._stopped(exc, done, self._cancelled(delay)):
                    raise
                done += 1

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        done = 0
        while True:
            try:
                return self._checked(request, await handler(request))
            except Exception as exc:
                if await asyncio.to_thread(self._revived, exc):
                    continue
                delay = self._next(exc, done)
                if delay is None or self._stopped(exc, done, await self._acancelled(delay)):
                    raise
                done += 1

    # ---------------------------------------------------------------- internals
    def _revived(self, exc: Exception) -> bool:
        """True when the call failed because the model's own server had stopped and it
        now runs again (said once, as a notice and a trace event): call again at once,
        not counted as a retry. A server that still runs, or a model without one: False.
        Past the kind's bound its ``ModelError`` goes up and ends the turn."""
        if self.revive is None or not (
                {c.__name__ for e in exception_chain(exc) for c in type(e).__mro__}
                & _CONNECTION_NAMES):
            return False
        line = self.revive()
        if line is None:
            return False
        if self.trace is not None:
            self.trace.append("model_server_restart", {"agent": self.agent, "notice": line})
        write_stream({"type": "notice", "text": line, "level": "warning"})
        return True

    def _next(self, exc: Exception, done: int) -> float | None:
        """The wait before the next retry (announced), or None: give up / not ours."""
        fault = classify(exc)
        if fault is None:
            return None
        cancelled = self.cancel is not None and self.cancel.is_set()
        if done >= self.policy.retries or cancelled:
            self._give_up(exc, done, fault, cancelled=cancelled)
            return None
        retry = done + 1
        delay = backoff_delay(retry, self.policy, retry_after=fault.retry_after,
                              rand=self.rand)
        payload = {"retry": retry, "max_retries": self.policy.retries,
                   "delay_s": round(delay, 3), "retry_after": fault.retry_after,
                   "cause": fault.cause, "reason": _reason(exc)}
        self._trace(payload)
        write_stream({"type": "provider_retry", "agent": self.agent, **payload})
        return delay

    def _checked(self, request: Any, response: Any) -> Any:
        """``response``; a cut-off one raises when the policy checks finish reasons."""
        if self.policy.check_finish_reason:
            check_finished(request.model, response)
        return response

    def _stopped(self, exc: Exception, done: int, cancelled: bool) -> bool:
        """After a backoff wait: True, the end traced, when a cancel ended the wait."""
        if cancelled:
            self._give_up(exc, done, cancelled=True)
        return cancelled

    def _give_up(self, exc: Exception, retries: int, fault: Fault | None = None, *,
                  cancelled: bool = False) -> None:
        """Mark ``exc`` with the retries made (the error line says so) and trace the end."""
        fault = fault or classify(exc) or Fault("?")
        if retries and not cancelled:
            try:
                setattr(exc, RETRIES_ATTR, retries)
            except AttributeError:  # an exception type that takes no attributes
                pass
        self._trace({"gave_up": True, "retries": retries, "max_retries": self.policy.retries,
                     "cause": fault.cause, "reason": _reason(exc), "cancelled": cancelled})

    def _trace(self, payload: dict[str, Any]) -> None:
        if self.trace is not None:
            self.trace.append("provider_retry", {**payload, "agent": self.agent})

    def _cancelled(self, delay: float) -> bool:
        """Wait ``delay`` seconds; True when a cancel ended the wait."""
        if self.cancel is None:
            time.sleep(delay)
            return False
        return self.cancel.wait(delay)

    async def _acancelled(self, delay: float) -> bool:
        deadline = time.monotonic() + delay
        while (left := deadline - time.monotonic()) > 0:
            if self.cancel is not None and self.cancel.is_set():
                return True
            await asyncio.sleep(min(CANCEL_POLL_S, left))
        return self.cancel is not None and self.cancel.is_set()
