"""Model specs and context windows: the one place that knows how a ``--model`` is built.

Everything else in simagent deals in a spec string (``--model``) and a :class:`ResolvedModel`.
Keeping the parsing, API-key checks, window lookup and error wording here means the CLI, the
TUI and the bench all report the same one-line errors and agree on the context window that
summarization and the ``/context`` meter are computed against.

Model kinds come from plugins (the ``register_model_kinds`` hook of
:mod:`simagent.hookspecs`), the built-ins as any other: the provider kinds and
``openai-compatible:`` here, ``scripted:`` in the agent layer, ``replay:`` in the bench,
``local:`` in :mod:`simagent.local_model`. They are gathered on the first lookup
(:func:`model_kinds`), so no caller imports a kind for its side effect and this module
imports no layer above it. Provider failures and the retry policy live beside it, in
:mod:`simagent.provider_errors`.

Only the standard library is imported at module level: ``simagent --help`` imports this module
and must stay fast, so langchain and the provider SDKs are imported inside functions.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simagent import plugins
from simagent.exit_codes import PROVIDER as PROVIDER_ERROR  # keys, packages, HTTP
from simagent.exit_codes import USAGE as USAGE_ERROR  # malformed spec or bad model config
from simagent.hookspecs import hookimpl
from simagent.provider_errors import (  # re-exported: callers name them from here
    COMPATIBLE_KEY_VAR,
    CONNECTION_ERRORS,
    RETRIES_ATTR,
    RETRY_KEYS,
    TIMEOUT_ERRORS,
    RetryPolicy,
    TruncatedReply,
    describe_provider_error,
    exception_chain,
    first_line,
    refused_locally,
)

__all__ = [
    "CONNECTION_ERRORS", "RETRIES_ATTR", "TIMEOUT_ERRORS", "KindModel", "ModelError",
    "ModelKind", "ModelSpec", "ResolvedModel", "TruncatedReply", "check_model_spec",
    "context_window",
    "describe_provider_error", "exception_chain", "expected_forms", "finish_reason_key",
    "image_support", "max_output_tokens", "model_kinds", "parse_model_spec",
    "refused_locally", "resolve_model", "say_progress",
]

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
DEFAULT_NUM_CTX = 32768  # Ollama's loaded window; its own default (2-4k) is too small for agents
# Generic constructor options a config may set; passed through unchanged.
PASSTHROUGH = ("temperature", "max_retries", "timeout")
# Providers whose SDK retries on its own (``max_retries``, 2 to 6 by default). simagent's
# ``ProviderRetryMiddleware`` retries instead (bounded, traced, shown, cancellable), so
# these get ``max_retries=0`` unless the model config sets it; a configured value makes
# the SDK retry inside each of our attempts (at most (N+1) x (retries+1) requests in all).
SDK_RETRIES = {"openai", "azure_openai", "anthropic", "google_genai", "groq", "mistralai",
               "fireworks", "together", "deepseek", "xai"}
# ``response_metadata`` key in which a provider says why a reply ended; a reply without
# it was cut off (chat classes by name, so no SDK is imported here).
FINISH_KEYS = {"ChatOpenAI": "finish_reason", "AzureChatOpenAI": "finish_reason",
               "CompatibleChatOpenAI": "finish_reason", "ChatAnthropic": "stop_reason"}
#: The kind a prefix no kind registered falls to: a langchain provider (``init_chat_model``).
PROVIDER_KIND = "provider"

_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
#: Where :func:`say_progress` lines go while :func:`resolve_model` builds (its ``progress``).
_PROGRESS: ContextVar[Callable[[str], None] | None] = ContextVar("model_progress",
                                                                default=None)


class ModelError(Exception):
    """A user-facing, single-line model problem; ``code`` is the CLI exit status.
    ``setting``: the model-config key whose value it is about (a kind raises it so), for
    :func:`resolve_model` to name the file that set it."""

    def __init__(self, message: str, *, code: int = PROVIDER_ERROR, env_var: str | None = None,
                 setting: str | None = None):
        super().__init__(" ".join(str(message).split()))
        self.code = code
        self.env_var = env_var
        self.setting = setting


@dataclass(frozen=True)
class ModelSpec:
    raw: str
    kind: str  # a registered kind's prefix ("scripted", "local", ...) or "provider"
    provider: str
    name: str
    base_url: str | None = None


@dataclass
class KindModel:
    """What a kind builds: the chat model, and what else the session needs of it."""

    chat_model: Any
    #: For ``replay:WORKFLOW``: the bench workflow whose trajectory the model plays.
    workflow: Any = None
    #: Stops what the kind started (a local server); None: nothing to stop.
    close: Callable[[], None] | None = None
    #: Facts a person may want (a local server's URL and log).
    info: Mapping[str, Any] | None = None
    #: The window the server itself loaded (llama.cpp rounds ``n_ctx`` up to a multiple
    #: of 256); it wins over the configured one. None: the usual lookup.
    window: int | None = None
    #: Moves what the kind logs (a local server's log) into a folder, returning its path.
    move_log: Callable[[Path], Path] | None = None
    #: Brings back a server the kind started that stopped by itself: None when it runs
    #: (or there is none to bring back), else a notice saying what happened; raises
    #: ``ModelError`` past its bound. None: the kind starts no server.
    revive: Callable[[], str | None] | None = None
    #: Stops the reply the kind's server is computing, for a cancelled turn (a local
    #: server evaluates a prompt to its end otherwise). None: closing the connection is
    #: enough (a provider's API).
    stop_reply: Callable[[], Any] | None = None


@dataclass(frozen=True)
class ModelKind:
    """A ``--model`` prefix: ``build(spec, model_config, environ) -> KindModel``.

    ``split`` turns what follows the prefix into ``(name, base_url)`` or raises
    ``ValueError`` saying why it is malformed; ``form`` is how the error line names it;
    ``suggest`` lists ``(spec, note)`` examples a front end offers (``/model``'s Tab);
    ``check`` raises the kind's ``ModelError`` for a spec that cannot work (a missing
    file) without importing anything heavy, so the CLI says so before it loads langchain.
    """

    prefix: str
    build: Callable[[ModelSpec, dict[str, Any], Mapping[str, str]], KindModel]
    form: str
    split: Callable[[str], tuple[str, str | None]] | None = None
    suggest: Callable[[], list[tuple[str, str]]] | None = None
    check: Callable[[ModelSpec], object] | None = None


_kinds: dict[str, ModelKind] | None = None


def model_kinds() -> dict[str, ModelKind]:
    """Every ``--model`` kind by prefix, from the plugins' ``register_model_kinds`` hooks,
    gathered on the first call (a later registration of a prefix replaces an earlier one:
    a third-party plugin's replaces a built-in's)."""
    global _kinds
    if _kinds is None:
        found: dict[str, ModelKind] = {}
        for entry in plugins.collect("register_model_kinds"):
            if isinstance(entry.item, ModelKind):
                found[entry.item.prefix.lower()] = entry.item
            else:
                plugins.refuse(entry, "register_model_kinds", "a simagent.models.ModelKind")
        _kinds = found
    return _kinds


def kind_suggestions() -> list[tuple[str, str]]:
    """``(spec, note)`` examples from every registered kind that offers some."""
    return [s for _, k in sorted(model_kinds().items()) if k.suggest for s in k.suggest()]


def expected_forms() -> str:
    """The spec forms the registered kinds accept, for error lines."""
    forms = [k.form for p, k in sorted(model_kinds().items()) if p != PROVIDER_KIND]
    return ("expected provider:model (e.g. anthropic:claude-sonnet-4-5, ollama:qwen3:8b)"
            + "".join(", " + f for f in forms))


@dataclass
class ResolvedModel:
    spec: ModelSpec
    chat_model: Any  # langchain BaseChatModel
    window: int | None  # context window actually loaded, in tokens
    max_output: int | None
    #: For ``replay:WORKFLOW``: the bench workflow whose trajectory the model plays (its
    #: prompt, simulator and fixtures make the zero-key demo).
    workflow: Any = None
    #: The provider retry policy (:class:`simagent.provider_errors.RetryPolicy`) from the
    #: model config's ``retries``/``retry_*`` keys; None: the defaults.
    retry: Any = None
    #: Stops what the kind started (a local model server); idempotent; None: nothing.
    closer: Callable[[], None] | None = None
    info: Mapping[str, Any] | None = None
    log_mover: Callable[[Path], Path] | None = None
    #: ``KindModel.revive``: the provider-retry layer calls it when a call cannot connect.
    reviver: Callable[[], str | None] | None = None
    #: ``KindModel.stop_reply``: the runner calls it when the person cancels a turn.
    reply_stopper: Callable[[], Any] | None = None

    @property
    def id(self) -> str:
        return self.spec.raw

    @property
    def default_simulator(self) -> str | None:
        """The simulator a new session gets when none is asked for: a replay workflow's."""
        return self.workflow.simulator if self.workflow is not None else None

    def prepare_workspace(self, workspace: Any) -> None:
        """A replay workflow's input files, written where the study runs (never over the
        user's own files); other models need nothing."""
        if self.workflow is not None:
            self.workflow.write_fixtures(workspace, keep_existing=True)

    def keep_logs_in(self, folder: Path) -> None:
        """Move the kind's log (a local server's) beside the session's files in
        ``folder``; resolving happens before a session exists, so it starts elsewhere."""
        if self.log_mover is not None:
            self.info = {**(self.info or {}), "log": str(self.log_mover(folder))}

    def close(self) -> None:
        """Stop what resolving started (a local server); a no-op for remote models."""
        if self.closer is not None:
            self.closer()


def parse_model_spec(spec: str) -> ModelSpec:
    """Split a ``--model`` string into its parts without importing anything heavy."""
    raw = (spec or "").strip()

    def bad(why: str) -> ModelError:
        return ModelError(f"invalid model {raw!r} ({why}); {expected_forms()}",
                          code=USAGE_ERROR)

    if not raw:
        raise bad("empty")
    prefix, sep, rest = raw.partition(":")
    rest = rest.strip()
    if not sep or not _PREFIX.match(prefix):
        raise bad("no provider prefix")
    if not rest or rest.startswith("//"):
        raise bad("nothing after the prefix" if not rest else "looks like a bare URL")
    kind = model_kinds().get(prefix.lower())
    if kind is None:
        return ModelSpec(raw, PROVIDER_KIND, prefix.lower(), rest)
    name, url = rest, None
    if kind.split is not None:
        try:
            name, url = kind.split(rest)
        except ValueError as exc:
            raise bad(str(exc)) from exc
    return ModelSpec(raw, kind.prefix, kind.prefix, name, url)


def check_model_spec(spec: str) -> ModelSpec:
    """``parse_model_spec``, then the kind's own light check (``ModelKind.check``): what
    the CLI runs before any heavy import."""
    parsed = parse_model_spec(spec)
    kind = model_kinds().get(parsed.kind)
    if kind is not None and kind.check is not None:
        kind.check(parsed)
    return parsed


def say_progress(line: str) -> None:
    """Say ``line``, a slow step of building a model (a local server loading its model),
    to the front end that is waiting for it (``resolve_model(progress=...)``): the words
    live with the step, in the kind; where they show is the front end's. Without one,
    nowhere: a bench or ``/model`` that asked for no lines gets none."""
    if (say := _PROGRESS.get()) is not None:
        say(line)


def resolve_model(
    spec: str,
    *,
    model_config: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    settings_at: Callable[[str], str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> ResolvedModel:
    """Build the chat model for ``spec``; construction never touches the network, except
    for kinds that start their own server (``local:``), which wait for it to answer.
    ``settings_at``: how a line about a bad ``model_config`` key starts (a config's
    ``where``: the file that set it and the table), else ``model config:``. ``progress``
    gets the kind's lines about slow steps (:func:`say_progress`) while it builds."""
    said = _PROGRESS.set(progress)
    try:
        return _resolve(spec, model_config, environ, settings_at)
    finally:
        _PROGRESS.reset(said)


def _resolve(spec: str, model_config: Mapping[str, Any] | None,
             environ: Mapping[str, str] | None,
             settings_at: Callable[[str], str] | None) -> ResolvedModel:
    parsed = parse_model_spec(spec)
    cfg = dict(model_config or {})
    env = os.environ if environ is None else environ
    try:
        for key in ("window", "num_ctx", "max_output"):
            if key in cfg and not _positive_int(cfg[key]):
                raise ModelError(f"{key} must be a positive integer, got {cfg[key]!r}",
                                 code=USAGE_ERROR, setting=key)
        if "images" in cfg and not isinstance(cfg["images"], bool):
            raise ModelError(f"images must be true or false, got {cfg['images']!r}",
                             code=USAGE_ERROR, setting="images")
        retry = _retry_policy(cfg)
        kinds = model_kinds()
        built = kinds.get(parsed.kind, kinds[PROVIDER_KIND]).build(parsed, cfg, env)
    except ModelError as exc:
        if exc.setting is None:
            raise
        at = settings_at(exc.setting) if settings_at else "model config:"
        raise ModelError(f"{at} {exc}", code=exc.code, env_var=exc.env_var,
                         setting=exc.setting) from exc
    chat = built.chat_model
    try:
        window = built.window or context_window(chat, cfg)
        _pin_window(chat, window)
        _pin_images(chat, cfg)
        return ResolvedModel(parsed, chat, window, max_output_tokens(chat, cfg),
                             built.workflow, retry, built.close, built.info, built.move_log,
                             built.revive, built.stop_reply)
    except BaseException:
        if built.close is not None:
            built.close()
        raise


def _retry_policy(cfg: Mapping[str, Any]) -> RetryPolicy | None:
    """The retry policy the config's retry keys describe (None: none set, the defaults)."""
    settings = {k: cfg[k] for k in RETRY_KEYS if k in cfg}
    if not settings:
        return None
    for key, value in settings.items():  # one by one: the error says which key is bad
        try:
            RetryPolicy.from_settings({key: value})
        except ValueError as exc:
            raise ModelError(str(exc), code=USAGE_ERROR, setting=key) from exc
    return RetryPolicy.from_settings(settings)


def _no_sdk_retries(provider: str, cfg: Mapping[str, Any], kwargs: dict[str, Any]) -> None:
    """``max_retries=0`` for SDKs that retry on their own, unless the config set it."""
    if provider in SDK_RETRIES and "max_retries" not in cfg:
        kwargs["max_retries"] = 0


def _provider(spec: ModelSpec, cfg: dict[str, Any], env: Mapping[str, str]) -> KindModel:
    from langchain.chat_models import init_chat_model  # heavy: `simagent --help` loads models

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
        return KindModel(init_chat_model(spec.name, model_provider=spec.provider, **kwargs))
    except ImportError as exc:
        raise _missing_package(spec, exc) from exc
    except ValueError as exc:
        if str(exc).startswith("Unsupported provider"):
            raise ModelError(f"unknown model provider {spec.provider!r} in {spec.raw!r}; "
                             f"{expected_forms()}", code=USAGE_ERROR) from exc
        raise ModelError(f"cannot create {spec.raw}: {first_line(exc)}") from exc


def _missing_package(spec: ModelSpec, exc: ImportError) -> ModelError:
    found = re.search(r"pip install ([\w.\-\[\]]+)", str(exc))
    pkg = found.group(1) if found else "langchain-" + spec.provider.replace("_", "-")
    extra = EXTRAS.get(spec.provider)
    how = f"pip install 'simagent[{extra}]' (package {pkg})" if extra else f"pip install {pkg}"
    return ModelError(f"{spec.raw} needs the {pkg} package: {how}")


def _split_compatible(rest: str) -> tuple[str, str | None]:
    model, at, url = rest.rpartition("@")
    if not at or not model.strip():
        raise ValueError("openai-compatible needs MODEL@BASE_URL")
    url = url.strip()
    if not re.match(r"^https?://[^/\s]+", url):
        raise ValueError("BASE_URL must start with http:// or https://")
    return model.strip(), url


def _openai_compatible(spec: ModelSpec, cfg: dict[str, Any], env: Mapping[str, str]) -> KindModel:
    """llama.cpp / vLLM / LM Studio: Chat Completions, since few of them speak Responses."""
    var = cfg.get("api_key_env")
    if var:
        if not env.get(var):
            raise ModelError(f"{spec.raw} is configured to read its API key from {var}, "
                             f"which is not set: set {var}", env_var=var, code=USAGE_ERROR)
        key = env[var]
    else:
        key = env.get(COMPATIBLE_KEY_VAR) or "not-needed"  # local servers ignore the key
    from simagent.compatible_chat import server_window  # langchain: only when used

    # The window the server loaded, where it says it (llama.cpp, vLLM); else the lookup.
    window = None if cfg.get("window") else server_window(spec.base_url or "", spec.name)
    return KindModel(compatible_chat(spec.name, spec.base_url or "", key, cfg),
                     window=window)


def compatible_chat(model: str, base_url: str, api_key: str, cfg: Mapping[str, Any],
                    **extra: Any) -> Any:
    """A Chat Completions client for an OpenAI-compatible server (also what ``local:``
    talks to); ``cfg["window"]`` and ``cfg["max_output"]`` become its profile's input
    window and reply limit (see ``CompatibleChatOpenAI.reply_tokens``)."""
    from simagent.compatible_chat import CompatibleChatOpenAI  # langchain_openai: heavy, as above

    kwargs: dict[str, Any] = {k: cfg[k] for k in PASSTHROUGH if k in cfg}
    _no_sdk_retries("openai", cfg, kwargs)
    profile = {"max_input_tokens": cfg.get("window"), "max_output_tokens": cfg.get("max_output")}
    if any(profile.values()):  # max_output: the reply limit each request carries, too
        kwargs["profile"] = {k: v for k, v in profile.items() if v}
    return CompatibleChatOpenAI(model=model, base_url=base_url, api_key=api_key,
                                use_responses_api=False, stream_usage=True, **kwargs,
                                **extra)


@hookimpl
def register_model_kinds(register: Callable[[ModelKind], None]) -> None:
    """The kinds this module knows: any langchain provider, and ``openai-compatible:``."""
    register(ModelKind(PROVIDER_KIND, _provider, "provider:model"))
    register(ModelKind("openai-compatible", _openai_compatible,
                       "openai-compatible:MODEL@BASE_URL", _split_compatible))


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
    kind = type(model).__name__
    if kind in ("ChatOpenAI", "AzureChatOpenAI", "CompatibleChatOpenAI") and not \
            _uses_responses(model):
        base = str(getattr(model, "openai_api_base", None) or "")
        if not base or "api.openai.com" in base or kind == "AzureChatOpenAI":
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
