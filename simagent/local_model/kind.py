"""The ``local:`` model kind: ``local:PATH.gguf`` or ``local:PACKAGE`` (a packaged model).

Resolving one checks the file (or assembles and verifies the packaged one), starts
llama.cpp's server for it with ``n_ctx`` = the configured window (``window`` in the
``[model]`` config, else :data:`DEFAULT_WINDOW` or the model's trained window if that is
smaller), and reads back the window the server really loaded: that is the window (and so
the tier) simagent budgets against. Each reply is limited to ``max_output`` (else a quarter
of the window, at most ``context.thresholds.REPLY_TOKENS``), which the budget
reserves: without a limit the server writes until ``n_ctx`` is full.
``ResolvedModel.close`` stops the server. Optional ``[model]`` keys: ``port`` (else a
free one), ``chat_format`` (else the model's own template). Imports only the standard
library at load: a built-in plugin (:data:`simagent.plugins.BUILTIN`), loaded whenever a
model spec is resolved; its ``register_model_kinds`` hook adds the kind.
"""

from __future__ import annotations

import importlib.util
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from simagent.exit_codes import PROVIDER, USAGE
from simagent.hookspecs import hookimpl
from simagent.models import (
    KindModel,
    ModelError,
    ModelKind,
    ModelSpec,
    compatible_chat,
)
from simagent.paths import state_home

#: The window a local model gets when none is configured: small models live at 8-16k,
#: and llama.cpp allocates the whole KV cache for it up front.
DEFAULT_WINDOW = 8192
LOCAL_KEYS = ("port", "chat_format", "threads")


def model_file(name: str) -> Path:
    """``name`` as a GGUF path (``*.gguf`` or anything with a slash) or a packaged model."""
    if name.lower().endswith(".gguf") or "/" in name or os.sep in name:
        return Path(name).expanduser().resolve()
    from simagent.local_model.packaged import assembled_path  # not at CLI start, which loads kind

    return assembled_path(name, state_home())


def server_log_path(alias: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return state_home() / "logs" / f"llama-server-{alias}-{stamp}-{os.getpid()}.log"


def build_local(spec: ModelSpec, cfg: dict[str, Any], env: Mapping[str, str]) -> KindModel:
    from simagent.local_model.gguf_file import inspect_gguf  # not at CLI start (as above)

    info = inspect_gguf(model_file(spec.name))
    window = cfg.get("window") or min(DEFAULT_WINDOW, info.trained_window or DEFAULT_WINDOW)
    if info.trained_window and window > info.trained_window:
        raise ModelError(f"window {window} is larger than {info.path.name} supports "
                         f"({info.trained_window} tokens); set window <= "
                         f"{info.trained_window} in the [model] config", code=USAGE,
                         setting="window" if cfg.get("window") else None)
    port = cfg.get("port")
    if port is not None and (not isinstance(port, int) or isinstance(port, bool)
                             or not 0 < port < 65536):
        raise ModelError(f"port must be a TCP port number, got {port!r}", code=USAGE,
                         setting="port")
    threads = cfg.get("threads")
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool)
                                or threads < 1):
        raise ModelError(f"threads must be a whole number >= 1, got {threads!r}", code=USAGE,
                         setting="threads")
    if importlib.util.find_spec("llama_cpp") is None:
        raise ModelError("local: models need llama.cpp's server: pip install "
                         "'simagent[local]' (make install builds it)", code=PROVIDER)
    from simagent.local_model.llama_server import (  # not at CLI start (as above)
        ServerWatch,
        start_server,
    )

    alias = re.sub(r"[^A-Za-z0-9._-]+", "-", info.path.stem)[:60] or "local"
    server = start_server(info.path, alias=alias, n_ctx=window, port=port,
                          log_path=server_log_path(alias),
                          chat_format=cfg.get("chat_format"), threads=threads,
                          name=spec.raw)
    try:
        from simagent.compatible_chat import reply_limit  # langchain: only when used

        loaded = int(server.props.get("n_ctx") or window)
        chat_cfg = {k: v for k, v in cfg.items() if k not in LOCAL_KEYS}
        # every request carries a reply limit, and simagent reserves that much of the window
        limit = cfg.get("max_output") or reply_limit(loaded)
        chat = compatible_chat(alias, server.url, "not-needed",
                               {**chat_cfg, "window": loaded, "max_output": limit})
    except BaseException:
        server.stop()
        raise
    return KindModel(chat, close=server.stop, window=loaded, move_log=server.move_log,
                     revive=ServerWatch(server, spec.raw), stop_reply=server.stop_reply,
                     info={"url": server.url, "log": str(server.log_path), "pid": server.pid,
                           "model_file": str(info.path), "n_ctx": loaded,
                           "trained_window": info.trained_window})


def _split_local(rest: str) -> tuple[str, str | None]:
    return rest, None


KIND = ModelKind("local", build_local, "local:PATH.gguf or local:PACKAGE", _split_local)


@hookimpl
def register_model_kinds(register: Callable[[ModelKind], None]) -> None:
    register(KIND)
