"""The ``replay:WORKFLOW_ID`` model kind: a bench workflow's scripted trajectory as a
model (its kernel steps run for real; the zero-key demo).

A built-in plugin (:data:`simagent.plugins.BUILTIN`): its ``register_model_kinds`` hook
adds the kind, so the layers below never import the bench for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from simagent.bench.workflow import WorkflowError, known_workflows, resolve_workflows
from simagent.exit_codes import USAGE
from simagent.hookspecs import hookimpl
from simagent.models import KindModel, ModelError, ModelKind, ModelSpec


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
    """Every known workflow as a ``replay:`` spec (``/model``'s Tab offers them)."""
    return [(f"replay:{wf}", "bench trajectory, no key") for wf in known_workflows()]


KIND = ModelKind("replay", build_replay, "replay:WORKFLOW_ID", suggest=replay_suggestions)


@hookimpl
def register_model_kinds(register: Callable[[ModelKind], None]) -> None:
    register(KIND)
