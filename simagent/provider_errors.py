"""Provider failures: what one means in a line, and how often to try again.

Beside :mod:`simagent.models` (the base layer): the CLI's error line, the retry layer
(``simagent.agent.provider_retry``), the turn runner and the emergency compaction all
read a provider exception the same way, and the model config's ``retries``/``retry_*``
keys become a :class:`RetryPolicy` while the model is resolved, without that resolution
reaching up into the agent layer. Standard library only (SDK classes are matched by
name), so ``simagent --help`` stays fast.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

COMPATIBLE_KEY_VAR = "OPENAI_COMPATIBLE_API_KEY"
# Model-config keys of the provider retry policy (``[model]`` table; see RetryPolicy).
RETRY_KEYS = ("retries", "retry_base_s", "retry_cap_s", "retry_after_cap_s",
              "retry_jitter", "check_finish_reason")
#: ``response_metadata`` key naming streamed tool calls whose arguments did not end as
#: complete JSON (set by ``compatible_chat``, read by the recovery nudge).
INCOMPLETE_CALLS_KEY = "simagent_incomplete_tool_calls"
#: Attribute set on a provider error the retry layer gave up on: how many retries it made.
RETRIES_ATTR = "simagent_retries"

#: Retries after the first attempt (so at most MAX_RETRIES + 1 requests per model call).
MAX_RETRIES = 5
#: The first backoff (seconds); each further retry doubles it, up to CAP_S.
BASE_S = 1.0
CAP_S = 30.0
#: The longest ``Retry-After`` honoured; a longer ask is waited for this long.
RETRY_AFTER_CAP_S = 60.0
#: Backoff jitter: the wait is drawn from [(1 - JITTER) x backoff, backoff], so clients
#: that failed together do not come back together.
JITTER = 0.5

@dataclass(frozen=True)
class RetryPolicy:
    """The bound: how often and how long to retry (defaults: the module constants)."""

    retries: int = MAX_RETRIES
    retry_base_s: float = BASE_S
    retry_cap_s: float = CAP_S
    retry_after_cap_s: float = RETRY_AFTER_CAP_S
    retry_jitter: float = JITTER
    #: Treat a reply without its provider's finish reason as cut off (and retry it).
    check_finish_reason: bool = True

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> RetryPolicy:
        """From model-config keys (the field names); ``ValueError`` names a bad one."""
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in settings.items():
            if key not in known:
                raise ValueError(f"unknown retry setting {key!r}")
            if key == "check_finish_reason":
                if not isinstance(value, bool):
                    raise ValueError(f"{key} must be true or false, got {value!r}")
            elif key == "retries":
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"retries must be a whole number >= 0, got {value!r}")
            elif key == "retry_jitter":
                if not _number(value) or not 0 <= value <= 1:
                    raise ValueError(f"retry_jitter must be in [0, 1], got {value!r}")
            elif not _number(value) or value < 0:
                raise ValueError(f"{key} must be seconds >= 0, got {value!r}")
            values[key] = value
        return cls(**values)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


_PROVIDER_ROOTS = {"openai", "anthropic", "httpx", "httpcore", "ollama", "google",
                   "langchain_core", "langchain_openai", "langchain_anthropic", "langchain_ollama",
                   "langchain_google_genai"}
_ENDPOINTS = ("/chat/completions", "/completions", "/responses", "/messages", "/api/chat")


def first_line(text: object, limit: int = 240) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


#: Exception class names (SDKs, langchain wrappers, httpx) of a request that timed out,
#: and of a connection that could not be made or was lost; provider_retry widens them.
TIMEOUT_ERRORS = frozenset({"APITimeoutError", "ModelTimeoutError", "TimeoutException"})
CONNECTION_ERRORS = frozenset({"APIConnectionError", "ModelConnectionError", "ConnectError",
                               "NetworkError", "RemoteProtocolError", "ReadError"})


def exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes, outermost first (at most 8; cycles stop it)."""
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen and len(seen) < 8:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def _url(exc: BaseException) -> str | None:
    """The endpoint's base URL, from the httpx request attached to SDK exceptions."""
    for e in exception_chain(exc):
        for getter in (lambda e: e.request.url, lambda e: e.response.request.url):
            try:
                url = str(getter(e))
            except Exception:  # httpx raises RuntimeError when no request is attached
                continue
            for end in _ENDPOINTS:
                url = url.removesuffix(end)
            return url
    return None


def refused_locally(exc: BaseException) -> bool:
    """A connection refused by a loopback address: nothing listens on that port of this
    machine. Unlike a remote refusal (a balancer between instances), no retry within a
    turn changes that, so the retry layer fails at once and the line says what to do."""
    import ipaddress  # not at import: `simagent --help` loads this module
    from urllib.parse import urlsplit  # likewise

    chain = exception_chain(exc)
    if not any(isinstance(e, ConnectionRefusedError) or "refused" in str(e).lower()
               for e in chain):
        return False
    try:
        host = urlsplit(_url(exc) or "").hostname
    except ValueError:
        return False
    if not host:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_unspecified


def _api_message(exc: BaseException) -> str:
    """The server's own message (openai/anthropic bodies), not the SDK's repr of the body."""
    body = getattr(exc, "body", None)
    inner = body.get("error", body) if isinstance(body, Mapping) else None
    if isinstance(inner, Mapping) and inner.get("message"):
        return first_line(inner["message"])
    return first_line(getattr(exc, "message", None) or exc) or type(exc).__name__


def _key_hint(exc: BaseException) -> str:
    roots = {c.__module__.split(".")[0] for c in type(exc).__mro__}
    if "anthropic" in roots:
        return "ANTHROPIC_API_KEY"
    if roots & {"google", "langchain_google_genai"}:
        return "GOOGLE_API_KEY"
    url = _url(exc) or ""
    return "OPENAI_API_KEY" if not url or "api.openai.com" in url else COMPATIBLE_KEY_VAR


def _reason(exc: BaseException) -> str:
    for e in reversed(exception_chain(exc)):  # the innermost cause says what happened
        text = str(e).lower()
        if isinstance(e, ConnectionRefusedError) or "refused" in text:
            return "connection refused"
        if isinstance(e, TimeoutError) or "timed out" in text:
            return "timed out"
        if "name or service not known" in text or "getaddrinfo" in text:
            return "host name not resolved"
        if isinstance(e, ConnectionResetError) or "reset by peer" in text:
            return "connection reset"
        if "complete message body" in text or "incomplete chunked read" in text:
            return "closed mid-reply"
        if "without sending a response" in text:
            return "closed without a response"
    return first_line(exception_chain(exc)[-1], 120)


class EmptyReplyStream(Exception):
    """A streamed reply with no data at all that was not a context overflow (llama.cpp's
    server sends HTTP 200 and nothing when it fails after the headers; its log says why)."""

    def __init__(self, url: str) -> None:
        super().__init__(f"{url or 'the server'} sent an empty reply stream")
        self.url = url


class TruncatedReply(Exception):
    """A reply that ended without the finish reason its provider always sends: the
    stream stopped early (a proxy or server closed it politely mid-message)."""

    def __init__(self, key: str, chars: int) -> None:
        super().__init__(f"the reply stream ended without a {key} after {chars} chars")
        self.key = key
        self.chars = chars


def describe_provider_error(exc: BaseException) -> str | None:
    """One line for a provider failure, or None when ``exc`` did not come from a provider.

    When the retry layer gave up on it, the line says after how many retries.
    """
    for e in exception_chain(exc):
        line = _describe_one(e)
        if line:
            retries = next((getattr(c, RETRIES_ATTR) for c in exception_chain(exc)
                            if isinstance(getattr(c, RETRIES_ATTR, None), int)), None)
            tail = (f" (gave up after {retries} {'retry' if retries == 1 else 'retries'})"
                    if retries else "")
            return "provider error: " + line + tail
    return None


def _dropped(exc: BaseException) -> bool:
    """A connection that was reached and then lost (reset, or closed mid-reply)."""
    for e in exception_chain(exc):
        names = {c.__name__ for c in type(e).__mro__}
        if isinstance(e, ConnectionResetError) or names & {"RemoteProtocolError", "ReadError"}:
            return True
    return False


def _describe_one(exc: BaseException) -> str | None:
    # Class names across the MRO, so the SDKs never need importing here; langchain's wrappers
    # (e.g. OpenAIAuthenticationError) subclass both the SDK error and langchain_core's.
    if isinstance(exc, TruncatedReply):
        return f"reply cut off: {exc}"
    if isinstance(exc, EmptyReplyStream):
        return f"{exc} (HTTP 200, no data; the server's log says why)"
    mro = type(exc).__mro__
    if any(c.__module__.split(".")[0] in _PROVIDER_ROOTS for c in mro):
        names = {c.__name__ for c in mro}
    else:
        if isinstance(exc, ConnectionError) and "ollama" in str(exc).lower():
            return f"cannot reach Ollama ({first_line(exc, 160)})"  # ollama's own client
        return None
    msg = _api_message(exc)
    status = getattr(exc, "status_code", None)
    context_words = ("context", "too long", "maximum", "token limit")
    if "ContextOverflowError" in names or (
        "BadRequestError" in names and any(w in msg.lower() for w in context_words)
    ):
        return f"context overflow — the request exceeds the model's window: {msg}"
    if names & {"AuthenticationError", "ModelAuthenticationError"}:
        return f"authentication failed ({status or 401}) — check {_key_hint(exc)}"
    if names & {"PermissionDeniedError", "ModelPermissionDeniedError"}:
        return f"permission denied ({status or 403}): {msg}"
    if names & {"RateLimitError", "ModelRateLimitError"}:
        return f"rate limited ({status or 429}): {msg}"
    if names & TIMEOUT_ERRORS:
        return f"timed out talking to {_url(exc) or 'the provider'}"
    if names & CONNECTION_ERRORS and _dropped(exc):
        return f"connection to {_url(exc) or 'the provider'} dropped ({_reason(exc)})"
    if names & CONNECTION_ERRORS and refused_locally(exc):
        return (f"cannot reach {_url(exc)} (connection refused: nothing is listening on "
                "that port of this machine; start the model server or fix the URL)")
    if names & CONNECTION_ERRORS:
        return f"cannot reach {_url(exc) or 'the provider'} ({_reason(exc)})"
    if "NotFoundError" in names:
        return f"not found ({status or 404}) — check the model name and base URL: {msg}"
    if isinstance(status, int):
        return f"HTTP {status}: {msg}"
    if "ResponseError" in names:  # ollama
        return f"ollama: {msg}"
    return None
