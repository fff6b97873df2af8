"""Choosing a model from inside the TUI: the help shown when none is set, what a model
that cannot be used is told as (inside the TUI, not on a command line), and which model a
resumed conversation keeps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simagent.config import SessionOptions
from simagent.paths import SessionPaths
from simagent.session import resolve_session_id
from simagent.trace.log import TraceLog
from simagent.trace.sessions import MODEL_EVENTS, latest_model

NO_MODEL_HELP = (
    "No model is configured. Choose one with /model provider:model, e.g.\n"
    "  /model anthropic:claude-sonnet-4-5      (needs ANTHROPIC_API_KEY)\n"
    "  /model openai:gpt-5                      (needs OPENAI_API_KEY)\n"
    "  /model ollama:qwen3:8b                   (a local Ollama server)\n"
    "  /model openai-compatible:MODEL@http://127.0.0.1:8080/v1\n"
    "  /model replay:canary                     (a bench trajectory: no key, no server)\n"
    "To keep it, set model = \"...\" in .simagent/config.toml or $SIMAGENT_MODEL.")


def model_error_line(spec: str, exc: Any) -> str:
    """A model that cannot be used, said for someone inside the TUI: a missing key names
    its variable and how to set it (the environment of a running process cannot be
    changed from its prompt), and the spec is not said twice."""
    if getattr(exc, "env_var", None):
        var = exc.env_var
        return (f"{spec} needs an API key, and ${var} is not set. Quit (ctrl+C twice), run "
                f"`export {var}=...` in this shell, then `simagent --continue --model {spec}` "
                f"to come back to this conversation with it; or choose another model here "
                f"with /model.")
    text = str(exc)
    return text if spec in text else f"model {spec}: {text}"


def resumed_model(opts: SessionOptions) -> str | None:
    """The model the session to resume last used (None if unknown or unreadable)."""
    try:
        ws = Path(opts.workspace).expanduser().resolve()
        sid = resolve_session_id(ws, opts.resume)
        with TraceLog(SessionPaths.for_session(ws, sid).trace, readonly=True) as log:
            return latest_model(log.events(list(MODEL_EVENTS)))
    except Exception:  # no such session: Session.open says so with its own words
        return None
