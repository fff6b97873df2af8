"""The ``scripted:PATH`` model kind: a JSON trajectory played as a chat model.

A built-in plugin (:data:`simagent.plugins.BUILTIN`): its ``register_model_kinds`` hook
adds the kind, so nothing imports this module for a side effect.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from simagent.exit_codes import USAGE
from simagent.hookspecs import hookimpl
from simagent.models import KindModel, ModelError, ModelKind, ModelSpec

DEFAULT_SCRIPTED_WINDOW = 128000


def script_path(spec: ModelSpec) -> Path:
    """The script's file; a missing one is a usage error (checked before langchain loads)."""
    path = Path(spec.name).expanduser()
    if not path.is_file():
        raise ModelError(f"scripted model file not found: {path}", code=USAGE)
    return path


def build_scripted(spec: ModelSpec, cfg: dict[str, Any], env: Mapping[str, str]) -> KindModel:
    path = script_path(spec)
    from simagent.agent.scripted import ScriptedChatModel  # langchain: only when used

    try:
        window = cfg.get("window") or DEFAULT_SCRIPTED_WINDOW
        return KindModel(ScriptedChatModel.from_file(path, window=window))
    except (OSError, ValueError) as exc:
        raise ModelError(f"invalid scripted model: {exc}", code=USAGE) from exc


KIND = ModelKind("scripted", build_scripted, "scripted:PATH", check=script_path)


@hookimpl
def register_model_kinds(register: Callable[[ModelKind], None]) -> None:
    register(KIND)
