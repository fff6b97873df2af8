"""Model specs, context windows and provider errors: the one place that knows about providers.

Everything else in simagent deals in a spec string (``--model``) and a :class:`ResolvedModel`.
Keeping the parsing, API-key checks, window lookup and error wording here means the CLI, the
TUI and the bench all report the same one-line errors and agree on the context window that
summarization and the ``/context`` meter are computed against.

Only the standard library is imported at module level: ``simagent --help`` imports this module
and must stay fast, so langchain and the provider SDKs are imported inside functions.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simagent.exit_codes import PROVIDER as PROVIDER_ERROR  # keys, packages, HTTP
from simagent.exit_codes import USAGE as USAGE_ERROR  # malformed spec or bad model config

EXPECTED_FORMS = (
    "expected provider:model (e.g. anthropic:claude-sonnet-4-5, ollama:qwen3:8b), "
    "openai-compatible:MODEL@BASE_URL, scripted:PATH or replay:WORKFLOW_ID"
)

# Checked before constructing the model: langchain's own missing-key errors are multi-line
# pydantic dumps, and some providers only fail on the first request.
KEY_VARS: dict[str, tuple[str, ...]] = {
    "anthropic": ("ANTHROPIC_API_KEY",), "openai": ("OPENAI_API_KEY",),
    "google_genai": ("GOOGLE_API_KEY", "GEMINI_API_KEY"), "mistralai": ("MISTRAL_API_KEY",),
    "groq": ("GROQ_API_KEY",), "fireworks": ("FIREWORKS_API_KEY",),
    "together": ("TOGETHER_API_KEY",), "deepseek": ("DEEPSEEK_API_KEY",), "xai": ("XAI_API_KEY",),
}
# Partner packages that simagent ships as an optional extra (pip install 'simagent[extra]').
EXTRAS = {"ollama": "ollama"}
COMPATIBLE_KEY_VAR = "OPENAI_COMPATIBLE_API_KEY"
DEFAULT_NUM_CTX = 32768  # Ollama's loaded window; its own default (2-4k) is too small for agents
DEFAULT_SCRIPTED_WINDOW = 128000
# Generic constructor options a config may set; passed through unchanged.
PASSTHROUGH = ("temperature", "max_retries", "timeout")
# Providers whose SDK retries on its own (``max_retries``, 2 to 6 by default). simagent's
# ``ProviderRetryMiddleware`` retries instead (bounded, traced, shown, cancellable), so
# these get ``max_retries=0`` unless the model config sets it; a configured value makes
# the SDK retry inside each of our attempts (at most (N+1) x (retries+1) requests in all).
SDK_RETRIES = {"openai", "azure_openai", "anthropic", "google_genai", "groq", "mistralai",
               "fireworks", "together", "deepseek", "xai"}
# Model-config keys of the provider retry policy (``[model]`` table; see RetryPolicy).
RETRY_KEYS = ("retries", "retry_base_s", "retry_cap_s", "retry_after_cap_s",
              "retry_jitter", "check_finish_reason")
#: Attribute set on a provider error the retry layer gave up on: how many retries it made.
RETRIES_ATTR = "simagent_retries"
# ``response_metadata`` key in which a provider says why a reply ended; a reply without
# it was cut off (chat classes by name, so no SDK is imported here).
FINISH_KEYS = {"ChatOpenAI": "finish_reason", "AzureChatOpenAI": "finish_reason",
               "ChatAnthropic": "stop_reason"}

_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


class ModelError(Exception):
    """A user-facing, single-line model problem; ``code`` is the CLI exit status."""

    def __init__(self, message: str, *, code: int = PROVIDER_ERROR, env_var: str | None = None):
        super().__init__(" ".join(str(message).split()))
        self.code = code
        self.env_var = env_var


@dataclass(frozen=True)
class ModelSpec:
    raw: str
    kind: str  # "provider" | "openai-compatible" | "scripted" | "replay"
    provider: str
    name: str
    base_url: str | None = None


@dataclass
class ResolvedModel:
    spec: ModelSpec
    chat_model: Any  # langchain BaseChatModel
    window: int | None  # context window actually loaded, in tokens
    max_output: int | None
    #: For ``replay:WORKFLOW``: the bench workflow whose trajectory the model plays (its
    #: prompt, simulator and fixtures make the zero-key demo).
    workflow: Any = None
    #: The provider retry policy (``simagent.agent.provider_retry.RetryPolicy``) from the
    #: model config's ``retries``/``retry_*`` keys; None: the defaults.
    retry: Any = None

    @property
    def id(self) -> str:
        return self.spec.raw

    @property
    def default_simulator(self) -> str | None:
        """The simulator a new session gets when none is asked for: a replay workflow's."""
        return self.workflow.simulator if self.workflow is not None else None

    def prepare_workspace(self, workspace: Path) -> None:
        """A replay workflow's input files, written where the study runs (never over the
        user's own files); other models need nothing."""
        if self.workflow is not None:
            self.workflow.write_fixtures(workspace, keep_existing=True)


def parse_model_spec(spec: str) -> ModelSpec:
    """Split a ``--model`` string into its parts without importing anything heavy."""
    raw = (spec or "").strip()

    def bad(why: str) -> ModelError:
        return ModelError(f"invalid model {raw!r} ({why}); {EXPECTED_FORMS}", code=USAGE_ERROR)

    if not raw:
        raise bad("empty")
    prefix, sep, rest = raw.partition(":")
    rest = rest.strip()
    if not sep or not _PREFIX.match(prefix):
        raise bad("no provider prefix")
    if not rest or rest.startswith("//"):
        raise bad("nothing after the prefix" if not rest else "looks like a bare URL")
    kind = prefix.lower()
    if kind == "openai-compatible":
        model, at, url = rest.rpartition("@")
        if not at or not model.strip():
            raise bad("openai-compatible needs MODEL@BASE_URL")
        url = url.strip()
        if not re.match(r"^https?://[^/\s]+", url):
            raise bad("BASE_URL must start with http:// or https://")
        return ModelSpec(raw, kind, kind, model.strip(), url)
    if kind in ("scripted", "replay"):
        return ModelSpec(raw, kind, kind, rest)
    return ModelSpec(raw, "provider", kind, rest)


def resolve_model(
    spec: str,
    *,
    model_config: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ResolvedModel:
    """Build the chat model for ``spec``; construction never touches the network."""
    parsed = parse_model_spec(spec)
    cfg = dict(model_config or {})
    env = os.environ if environ is None else environ
    for key in ("window", "num_ctx", "max_output"):
        if key in cfg and not _positive_int(cfg[key]):
            raise ModelError(f"model config {key!r} must be a positive integer, got {cfg[key]!r}",
                             code=USAGE_ERROR)
    if "images" in cfg and not isinstance(cfg["images"], bool):
        raise ModelError(f"model config 'images' must be true or false, got {cfg['images']!r}",
                         code=USAGE_ERROR)
    retry = _retry_policy(cfg)
    workflow = None
    if parsed.kind == "replay":
        workflow, chat = _replay(parsed, cfg)
    elif parsed.kind == "scripted":
        chat = _scripted(parsed, cfg)
    elif parsed.kind == "openai-compatible":
        chat = _openai_compatible(parsed, cfg, env)
    else:
        chat = _provider(parsed, cfg, env)
    window = context_window(chat, cfg)
    _pin_window(chat, window)
    _pin_images(chat, cfg)
    return ResolvedModel(parsed, chat, window, max_output_tokens(chat, cfg), workflow, retry)


def _retry_policy(cfg: Mapping[str, Any]) -> Any:
    """The retry policy the config's retry keys describe (None: none set, the defaults)."""
    settings = {k: cfg[k] for k in RETRY_KEYS if k in cfg}
    if not settings:
        return None
    from simagent.agent.provider_retry import RetryPolicy

    try:
        return RetryPolicy.from_settings(settings)
    except ValueError as exc:
        raise ModelError(f"model config: {exc}", code=USAGE_ERROR) from exc


def _no_sdk_retries(provider: str, cfg: Mapping[str, Any], kwargs: dict[str, Any]) -> None:
    """``max_retries=0`` for SDKs that retry on their own, unless the config set it."""
    if provider in SDK_RETRIES and "max_retries" not in cfg:
        kwargs["max_retries"] = 0


def _replay(spec: ModelSpec, cfg: dict[str, Any]) -> tuple[Any, Any]:
    """A bench workflow's scripted trajectory as a model (its kernel steps run for real)."""
    from simagent.agent.scripted import ScriptedChatModel
    from simagent.bench.workflow import WorkflowError, resolve_workflows

    try:
        (workflow,) = resolve_workflows([spec.name])
    except WorkflowError as exc:
        raise ModelError(f"replay: {exc}; 'simagent bench list' shows the workflows",
                         code=USAGE_ERROR) from exc
    window = cfg.get("window") or workflow.window
    return workflow, ScriptedChatModel.from_steps(workflow.steps, window=window,
                                                  name=f"replay:{workflow.id}")


def _provider(spec: ModelSpec, cfg: dict[str, Any], env: Mapping[str, str]) -> Any:
    from langchain.chat_models import init_chat_model

    kwargs = {k: cfg[k] for k in PASSTHROUGH if k in cfg}
    if spec.provider in KEY_VARS:
        names = KEY_VARS[spec.provider]
        key = next((env[n] for n in names if env.get(n)), None)
        if key is None:
            raise ModelError(f"{spec.raw} needs an API key: set {names[0]} "
                             "(or choose another model with --model)", env_var=names[0],
                             code=USAGE_ERROR)
        kwargs["api_key"] = key  # explicit, so an injected environ is honoured
    _no_sdk_retries(spec.provider, cfg, kwargs)
    if spec.provider == "ollama":
        # Ollama loads num_ctx tokens whatever the model was trained on; report that window.
        num_ctx = cfg.get("num_ctx") or cfg.get("window") or DEFAULT_NUM_CTX
        kwargs.update(num_ctx=num_ctx, profile={"max_input_tokens": num_ctx})
    try:
        # model_provider is explicit so a name containing ':' (ollama:qwen3:8b) stays whole.
        return init_chat_model(spec.name, model_provider=spec.provider, **kwargs)
    except ImportError as exc:
        raise _missing_package(spec, exc) from exc
    except ValueError as exc:
        if str(exc).startswith("Unsupported provider"):
            raise ModelError(f"unknown model provider {spec.provider!r} in {spec.raw!r}; "
                             f"{EXPECTED_FORMS}", code=USAGE_ERROR) from exc
        raise ModelError(f"cannot create {spec.raw}: {_first_line(exc)}") from exc


def _missing_package(spec: ModelSpec, exc: ImportError) -> ModelError:
    found = re.search(r"pip install ([\w.\-\[\]]+)", str(exc))
    pkg = found.group(1) if found else "langchain-" + spec.provider.replace("_", "-")
    extra = EXTRAS.get(spec.provider)
    how = f"pip install 'simagent[{extra}]' (package {pkg})" if extra else f"pip install {pkg}"
    return ModelError(f"{spec.raw} needs the {pkg} package: {how}")


def _openai_compatible(spec: ModelSpec, cfg: dict[str, Any], env: Mapping[str, str]) -> Any:
    """llama.cpp / vLLM / LM Studio: Chat Completions, since few of them speak Responses."""
    from langchain_openai import ChatOpenAI

    var = cfg.get("api_key_env")
    if var:
        if not env.get(var):
            raise ModelError(f"{spec.raw} is configured to read its API key from {var}, "
                             f"which is not set: set {var}", env_var=var, code=USAGE_ERROR)
        key = env[var]
    else:
        key = env.get(COMPATIBLE_KEY_VAR) or "not-needed"  # local servers ignore the key
    kwargs: dict[str, Any] = {k: cfg[k] for k in PASSTHROUGH if k in cfg}
    _no_sdk_retries("openai", cfg, kwargs)
    if cfg.get("window"):
        kwargs["profile"] = {"max_input_tokens": cfg["window"]}
    return ChatOpenAI(model=spec.name, base_url=spec.base_url, api_key=key,
                      use_responses_api=False, stream_usage=True, **kwargs)


def _scripted(spec: ModelSpec, cfg: dict[str, Any]) -> Any:
    path = Path(spec.name).expanduser()
    if not path.is_file():
        raise ModelError(f"scripted model file not found: {path}", code=USAGE_ERROR)
    from simagent.agent.scripted import ScriptedChatModel

    try:
        window = cfg.get("window") or DEFAULT_SCRIPTED_WINDOW
        return ScriptedChatModel.from_file(path, window=window)
    except (OSError, ValueError) as exc:
        raise ModelError(f"invalid scripted model: {exc}", code=USAGE_ERROR) from exc


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _profile(chat_model: Any) -> Mapping[str, Any]:
    model = getattr(chat_model, "bound", chat_model)  # see through bind_tools() bindings
    profile = getattr(model, "profile", None)
    return profile if isinstance(profile, Mapping) else {}


def context_window(chat_model: Any, model_config: Mapping[str, Any] | None = None) -> int | None:
    """The input window in tokens: config, then the model profile, then Ollama's num_ctx."""
    configured = (model_config or {}).get("window")
    if _positive_int(configured):
        return configured
    from_profile = _profile(chat_model).get("max_input_tokens")
    if _positive_int(from_profile):
        return from_profile
    num_ctx = getattr(getattr(chat_model, "bound", chat_model), "num_ctx", None)
    return num_ctx if _positive_int(num_ctx) else None


def max_output_tokens(chat_model: Any, model_config: Mapping[str, Any] | None = None) -> int | None:
    configured = (model_config or {}).get("max_output")
    if _positive_int(configured):
        return configured
    from_profile = _profile(chat_model).get("max_output_tokens")
    return from_profile if _positive_int(from_profile) else None


def _pin_window(chat_model: Any, window: int | None) -> None:
    """deepagents sizes summarization from profile["max_input_tokens"]; make it agree with us."""
    profile = _profile(chat_model)
    if window is None or profile.get("max_input_tokens") == window:
        return
    # A model without a settable profile keeps its own; our window still governs the meter.
    with contextlib.suppress(AttributeError, TypeError, ValueError):
        chat_model.profile = {**profile, "max_input_tokens": window}


def _pin_images(chat_model: Any, cfg: Mapping[str, Any]) -> None:
    """``images = true|false`` in the model's config overrides its profile (a local vision
    model the profile tables do not know, or a model to keep text-only)."""
    if "images" not in cfg:
        return
    flag = bool(cfg["images"])
    with contextlib.suppress(AttributeError, TypeError, ValueError):
        chat_model.profile = {**_profile(chat_model), "image_inputs": flag,
                              "image_tool_message": flag}


def image_support(chat_model: Any) -> tuple[bool, str]:
    """Whether a tool result may carry an image for this model, and why (one phrase).

    Read from the model profile (``image_inputs`` and ``image_tool_message``, set by the
    partner packages' tables or by ``images`` in the model config); a model whose profile
    does not say is treated as text-only, since an image it cannot take fails the request.
    OpenAI's Chat Completions endpoint refuses images in tool messages whatever the model.
    """
    profile = _profile(chat_model)
    if profile.get("image_inputs") is not True:
        why = ("its profile says it takes no image input" if profile.get("image_inputs")
               is False else "it is not known to take image input")
        return False, f"{why}; set images = true in the [model] config if it does"
    if profile.get("image_tool_message") is False:
        return False, "it takes no images in tool results"
    model = getattr(chat_model, "bound", chat_model)
    if type(model).__name__ in ("ChatOpenAI", "AzureChatOpenAI") and not _uses_responses(model):
        base = str(getattr(model, "openai_api_base", None) or "")
        if not base or "api.openai.com" in base or type(model).__name__ == "AzureChatOpenAI":
            return False, ("OpenAI's Chat Completions API accepts images only in user "
                           "messages (the Responses API takes them in tool results)")
    return True, "its profile accepts images in tool results"


def finish_reason_key(chat_model: Any) -> str | None:
    """Where ``chat_model``'s replies say why they ended, or None when it does not say.

    Chat Completions (OpenAI and every compatible server) and Anthropic's Messages API
    always report it, streamed or not, so a reply without one ended early; the Responses
    API and other providers are not checked.
    """
    model = getattr(chat_model, "bound", chat_model)
    key = FINISH_KEYS.get(type(model).__name__)
    if key == "finish_reason" and _uses_responses(model):
        return None
    return key


def _uses_responses(model: Any) -> bool:
    flag = getattr(model, "use_responses_api", None)
    if isinstance(flag, bool):
        return flag
    try:
        return bool(model._use_responses_api({}))  # ChatOpenAI's own auto choice
    except Exception:
        return False


# ---- provider errors -------------------------------------------------------------------------
_PROVIDER_ROOTS = {"openai", "anthropic", "httpx", "httpcore", "ollama", "google",
                   "langchain_core", "langchain_openai", "langchain_anthropic", "langchain_ollama",
                   "langchain_google_genai"}
_ENDPOINTS = ("/chat/completions", "/completions", "/responses", "/messages", "/api/chat")


def _first_line(text: object, limit: int = 240) -> str:
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
    import ipaddress
    from urllib.parse import urlsplit

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
        return _first_line(inner["message"])
    return _first_line(getattr(exc, "message", None) or exc) or type(exc).__name__


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
    return _first_line(exception_chain(exc)[-1], 120)


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
    mro = type(exc).__mro__
    if any(c.__module__.split(".")[0] in _PROVIDER_ROOTS for c in mro):
        names = {c.__name__ for c in mro}
    else:
        if isinstance(exc, ConnectionError) and "ollama" in str(exc).lower():
            return f"cannot reach Ollama ({_first_line(exc, 160)})"  # ollama's own client
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
