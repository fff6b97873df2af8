"""The ``replay:WORKFLOW_ID`` model kind: a bench workflow's scripted trajectory as a
model (its kernel steps run for real; the zero-key demo).

It registers itself with :mod:`simagent.models` on import (``simagent.model_kinds``
imports it), so the base layer never imports the bench.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from simagent.bench.workflow import WorkflowError, bundled_workflows, resolve_workflows
from simagent.exit_codes import USAGE
from simagent.models import KindModel, ModelError, ModelKind, ModelSpec, register_kind


def build_replay(spec: ModelSpec, cfg: dict[str, Any], env: Mapping[str, str]) -> KindModel:
    from simagent.agent.scripted import ScriptedChatModel  # langchain: only when used

    try:
        (workflow,) = resolve_workflows([spec.name])
    except WorkflowError as exc:
        raise ModelError(f"replay: {exc}; 'simagent bench list' shows the workflows",
                         code=USAGE) from exc
    window = cfg.get("window") or workflow.window
    chat = ScriptedChatModel.from_steps(workflow.steps, window=window,
                                        name=f"replay:{workflow.id}")
    return KindModel(chat, workflow=workflow)


def replay_suggestions() -> list[tuple[str, str]]:
    """Every bundled workflow as a ``replay:`` spec (``/model``'s Tab offers them)."""
    return [(f"replay:{wf}", "bench trajectory, no key") for wf in bundled_workflows()]


KIND = register_kind(ModelKind("replay", build_replay, "replay:WORKFLOW_ID",
                               suggest=replay_suggestions))
