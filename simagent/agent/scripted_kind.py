"""The ``scripted:PATH`` model kind: a JSON trajectory played as a chat model.

It registers itself with :mod:`simagent.models` on import; the assemblers import it
(``simagent.model_kinds``, ``agent.builder``), so the base layer never reaches up here.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from simagent.exit_codes import USAGE
from simagent.models import KindModel, ModelError, ModelKind, ModelSpec, register_kind

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


KIND = register_kind(ModelKind("scripted", build_scripted, "scripted:PATH",
                                check=script_path))
