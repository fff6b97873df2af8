"""The slash commands ``simagent acp`` advertises (``available_commands_update``) and
serves: ``/context``, ``/compact``, ``/done``, ``/restore``, ``/notebook``, ``/approval``.

Each runs the lower-layer function the TUI's command runs (``context.panel``,
``context.manual``, ``Session.restore_kernel``, ``notebooks.export``, ``approval``'s
``MODE_HELP``), so a panel reads the same in both; the reply is markdown for the chat.
:func:`serve` blocks (a compaction calls the model, a restore replays cells): the runtime
calls it in a worker thread, never while a turn runs.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from acp.schema import AvailableCommand, AvailableCommandInput, UnstructuredCommandInput

from simagent.agent.approval import MODE_HELP, NEVER_GATED
from simagent.config import APPROVAL_MODES
from simagent.kernel.ladder import offer_text

#: name -> (description, input hint or None): what a client lists for ``/``.
COMMANDS: dict[str, tuple[str, str | None]] = {
    "context": ("what fills the context window: categories, thresholds, boundaries, "
                "subagents, cost", None),
    "compact": ("summarize the conversation now", "optional focus for the summary"),
    "done": ("checkpoint a finished task; the next request starts clean",
             "optional note on what was done"),
    "restore": ("restart the kernel and re-run this session's cells that defined state "
                "since the last reset", "'run' runs the cells a restore left out"),
    "notebook": ("write this session as a Jupyter notebook that re-runs",
                 "path (default: <session id>.ipynb in the workspace)"),
    "approval": ("show or set which tool calls wait for your approval",
                 " | ".join(APPROVAL_MODES)),
}
#: The word after ``/restore`` that runs the cells the last restore offered.
RUN_OFFERED = "run"
#: Cells ``/restore`` left out for their effects, per session, until ``/restore run``.
_offered: weakref.WeakKeyDictionary[Any, list[int]] = weakref.WeakKeyDictionary()


@dataclass
class Context:
    """What a command acts on: the session, its turn runner (None before a model is
    chosen) and the runtime's way to switch approval mode (it rebuilds the graph; raises
    when it cannot, and the old mode stays)."""

    session: Any
    runner: Any = None
    set_approval: Callable[[str], Any] | None = None


def available_commands() -> list[AvailableCommand]:
    return [AvailableCommand(name=name, description=desc, input=AvailableCommandInput(
        root=UnstructuredCommandInput(hint=hint)) if hint else None)
        for name, (desc, hint) in COMMANDS.items()]


def parse(text: str) -> tuple[str, str] | None:
    """``"/compact focus"`` → ``("compact", "focus")``; None when ``text`` is no command
    of :data:`COMMANDS` (a prompt that starts with a path such as ``/data/run.csv``)."""
    stripped = text.strip()
    if not stripped.startswith("/"):
        return None
    head, _, rest = stripped[1:].partition(" ")
    name = head.lower()
    return (name, rest.strip()) if name in COMMANDS else None


def serve(name: str, arg: str, ctx: Context | Any, runner: Any = None) -> str:
    """Run command ``name`` with ``arg`` and return the reply (markdown). ``ctx``: a
    :class:`Context`, or the session itself with ``runner`` beside it."""
    if not isinstance(ctx, Context):
        ctx = Context(session=ctx, runner=runner)
    handler = _HANDLERS.get(name)
    if handler is None:
        return f"unknown command /{name}; these are served: " + \
            ", ".join(f"/{n}" for n in COMMANDS)
    try:
        return handler(ctx, arg.strip())
    except Exception as exc:  # a command's failure is its reply, never a dead session
        return f"/{name} failed: {type(exc).__name__}: {exc}".splitlines()[0]


def _block(text: str) -> str:
    """Preformatted text (a panel's columns) as a markdown code block."""
    fence = "````" if "```" in text else "```"
    return f"{fence}text\n{text}\n{fence}"


def _context(ctx: Context, arg: str) -> str:
    from simagent.context.panel import render_context  # langchain: not at start-up
    from simagent.context.stats import stats_from_trace  # as above

    agent = getattr(ctx.runner, "agent", None)
    stats = stats_from_trace(ctx.session.paths.trace, ctx.session.context_settings,
                             model_id=getattr(agent, "model_id", None),
                             window=getattr(agent, "window", None))
    return _block(render_context(stats, width=88))


def _manual(ctx: Context, arg: str, which: str) -> str:
    from simagent.context.manual import checkpoint_now, compact_now  # langchain, as above

    agent = getattr(ctx.runner, "agent", None)
    if agent is None or agent.context is None:
        return f"/{which} needs a model with simagent's context layers"
    fn = compact_now if which == "compact" else checkpoint_now
    result = fn(agent.graph, ctx.session.thread_config, agent.context, arg or None)
    return ("~ " if result.done else "") + result.message


def _restore(ctx: Context, arg: str) -> str:
    session = ctx.session
    if arg == RUN_OFFERED:
        ns = _offered.pop(session, None)
        if not ns:
            return "no cells are waiting to run: /restore first"
        done = session.run_offered(ns)
        return "\n".join(f"- `_out[{d['n']}]` `{d['line']}`: {d['status']}"
                         + (f" ({d['error']})" if d["error"] else "") for d in done)
    if arg:
        return f"/restore takes no argument but '{RUN_OFFERED}'"
    if session.kernel_state == "replay":
        return "a replayed session's kernel is its recording; nothing to restore"
    rec = session.restore_kernel()
    if not rec.offered:
        _offered.pop(session, None)
        return rec.message()
    _offered[session] = [s.n for s in rec.offered]
    return (f"{rec.message()}\n\n{_block(offer_text(rec, session.workspace))}\n\n"
            f"Run them now with `/restore {RUN_OFFERED}`.")


def _notebook(ctx: Context, arg: str) -> str:
    from simagent.notebooks.export import ExportError, export  # nbformat: /notebook only

    s = ctx.session
    # a relative path means the workspace: this process's own folder is the client's choice
    output = Path(s.workspace, Path(arg).expanduser()) if arg else None
    try:
        _, _, message = export(s.paths.root, output, s.workspace)
    except ExportError as exc:
        return f"/notebook: {exc}"
    return message


def _approval(ctx: Context, arg: str) -> str:
    now = ctx.session.approval
    if not arg:
        modes = "\n".join(f"- **{m}**{' (now)' if m == now else ''}: {h}"
                          for m, h in MODE_HELP.items())
        return (f"approval: **{now}** (`/approval MODE` or the client's mode picker sets "
                f"it)\n\n{modes}\n\nEvery mode: {NEVER_GATED}")
    mode = arg.lower()
    if mode not in APPROVAL_MODES:
        return f"approval mode must be one of {', '.join(APPROVAL_MODES)}"
    if mode == now:
        return f"approval: {mode} (unchanged)"
    if ctx.set_approval is None:
        return f"approval stays {now}: this client cannot switch it here"
    ctx.set_approval(mode)
    return f"approval: {mode}"


_HANDLERS: dict[str, Callable[[Context, str], str]] = {
    "context": _context,
    "compact": lambda ctx, arg: _manual(ctx, arg, "compact"),
    "done": lambda ctx, arg: _manual(ctx, arg, "done"),
    "restore": _restore,
    "notebook": _notebook,
    "approval": _approval,
}
