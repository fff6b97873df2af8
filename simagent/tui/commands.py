"""Slash commands: one declarative table drives help, completion and dispatch.

Each :class:`CommandSpec` names the controller method that runs it and, for its
argument, a completion source the controller provides; a test checks that every
handler and source exists, so the table cannot promise a command the UI lacks.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class CommandSpec:
    name: str
    usage: str
    help: str
    handler: str  # method of TuiController
    source: str | None = None  # completion source for the argument (controller method)
    while_busy: bool = False  # may run while a turn is running
    aliases: tuple[str, ...] = ()


COMMANDS: tuple[CommandSpec, ...] = (
    CommandSpec("/help", "", "list commands and keys", "cmd_help", while_busy=True),
    CommandSpec("/context", "", "what fills the context window: categories, thresholds, "
                "boundaries, subagents, cost", "cmd_context", while_busy=True),
    CommandSpec("/compact", "[focus]", "summarize the conversation now (optional focus)",
                "cmd_compact"),
    CommandSpec("/done", "[note]", "checkpoint a finished task; the next request starts clean",
                "cmd_done"),
    CommandSpec("/model", "[provider:model]", "show or switch the model (same conversation)",
                "cmd_model", source="complete_models"),
    CommandSpec("/reset", "", "restart the Python kernel (variables are lost)", "cmd_reset"),
    CommandSpec("/restore", "", "restart the kernel and re-run this session's cells that "
                "defined state since the last /reset", "cmd_restore"),
    CommandSpec("/interrupt", "", "stop the running turn (its cell is interrupted)",
                "cmd_interrupt", while_busy=True),
    CommandSpec("/memory", "[note]", "list workspace memory notes, or show one", "cmd_memory",
                source="complete_memory", while_busy=True),
    CommandSpec("/skills", "", "list the skills the agent can load", "cmd_skills",
                while_busy=True),
    CommandSpec("/sessions", "", "list this workspace's sessions", "cmd_sessions",
                while_busy=True),
    CommandSpec("/transcript", "[md|html]", "write this session's transcript to a file",
                "cmd_transcript", source="complete_transcript", while_busy=True),
    CommandSpec("/notebook", "[path]", "write this session as a Jupyter notebook that "
                "re-runs (default: <session id>.ipynb in the workspace)", "cmd_notebook"),
    CommandSpec("/approval", "[ask|workspace|auto]", "show or set which tools wait for "
                "approval (shift+Tab cycles)", "cmd_approval", source="complete_approval"),
    CommandSpec("/resume-after-cost-ceiling", "", "clear a tripped cost ceiling so turns run "
                "again", "cmd_reset_ceiling"),
    CommandSpec("/clear", "", "start a new conversation (the kernel keeps its state)",
                "cmd_clear"),
    CommandSpec("/quit", "", "leave simagent (the session can be resumed)", "cmd_quit",
                while_busy=True, aliases=("/exit",)),
)

KEYS: tuple[tuple[str, str], ...] = (
    ("Enter", "send"), ("Alt+Enter", "new line"),
    ("ctrl+C", "interrupt the turn; twice when idle to quit"),
    ("ctrl+O", "expand / collapse tool output, reasoning, figure file paths and the "
               "lines an answer's numbers come from"),
    ("shift+Tab", "cycle approval mode"), ("Tab", "complete commands and arguments"),
    ("ctrl+P / ctrl+N", "previous / next input (also up / down)"),
    ("PageUp / PageDown", "scroll the conversation"),
)


def find(name: str) -> CommandSpec | None:
    """The spec for ``/name`` or one of its aliases (exact, case-insensitive)."""
    name = name.lower()
    for spec in COMMANDS:
        if name == spec.name or name in spec.aliases:
            return spec
    return None


def parse(text: str) -> tuple[CommandSpec | None, str]:
    """``("/compact", "focus text")`` → (spec, argument); spec None if unknown."""
    head, _, rest = text.strip().partition(" ")
    return find(head), rest.strip()


def suggestion(text: str) -> str:
    """A one-line hint for an unknown command (closest names by prefix)."""
    head = text.strip().split(" ", 1)[0]
    close = [s.name for s in COMMANDS if s.name.startswith(head[:3])] if len(head) > 1 else []
    hint = f"; did you mean {', '.join(close)}?" if close else "; /help lists commands"
    return f"unknown command {head}{hint}"


def help_text(columns: int = 80) -> str:
    """Commands and keys in two columns; a long description wraps under itself (hanging
    indent) at ``columns``, so no continuation starts at column 0 like a command."""
    width = max(len(f"{s.name} {s.usage}".strip()) for s in COMMANDS)
    lines = ["Commands:"]
    for s in COMMANDS:
        lines += _two_columns(f"{s.name} {s.usage}".strip(), width, s.help, columns)
    lines += ["", "Keys:"]
    kw = max(len(k) for k, _ in KEYS)
    for k, what in KEYS:
        lines += _two_columns(k, kw, what, columns)
    return "\n".join(lines)


def _two_columns(left: str, width: int, text: str, columns: int) -> list[str]:
    indent = " " * (width + 4)
    room = max(20, columns - len(indent))
    body = textwrap.wrap(text, room) or [""]
    return [f"  {left:<{width}}  {body[0]}", *(indent + more for more in body[1:])]


def completions(text: str, source: Callable[[str], list[tuple[str, str]]]
                ) -> Iterator[tuple[str, int, str]]:
    """``(completion, start_position, meta)`` for the input ``text`` before the cursor.

    The first word completes command names; after a space, the command's argument
    completes from ``source(spec.source)``, a list of ``(value, meta)``.
    """
    if not text.startswith("/"):
        return
    if " " not in text:
        for spec in COMMANDS:
            if spec.name.startswith(text.lower()):
                yield spec.name, -len(text), spec.help
        return
    spec, _ = parse(text)
    if spec is None or spec.source is None:
        return
    typed = text.split(" ", 1)[1].lstrip()
    for value, meta in source(spec.source):
        if value.startswith(typed) and value != typed:
            yield value, -len(typed), meta
