"""Approval modes: which tool calls wait for the user (one home for the policy).

* ``ask``: every call that can change something outside the conversation waits: kernel
  code (``run_python``, ``reset_kernel``), shell commands and every file write, edit
  or delete.
* ``workspace``: shell commands wait, and file changes whose path resolves outside the
  workspace; kernel code runs without asking (it can still write anywhere: a path
  check cannot confine Python).
* ``auto``: nothing waits.

Reading (``read_file``, ``ls``, ``glob``, ``grep``, ``view_figure``, ``recall``),
saving notes (``remember``, ``record_attempt``, ``mark_task_done``), ``find_tools`` (it
only loads schemas) and delegating (``task``: the subagent's own calls wait by the same
rules) never wait. Any other tool, such as one added later or from an MCP server (an
external action, like the shell), waits in ``ask`` and ``workspace`` until it is
classified here: a tool cannot slip past approval by being new.

Where a file change lands is decided by ``confine.resolve``, the function the file
back end uses for the act, so the decision and the act cannot disagree.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from simagent.agent import confine
from simagent.config import APPROVAL_MODES
from simagent.context.deferral_policy import FIND_TOOLS

SHELL_TOOLS = ("execute",)
KERNEL_TOOLS = ("run_python", "reset_kernel")
FILE_WRITE_TOOLS = tuple(confine.WRITE_TOOLS)
#: Tools that never wait: they read, keep notes, or delegate (see the module doc).
NEVER_WAIT = (*confine.READ_TOOLS, "view_figure", "recall", "remember", "record_attempt",
              "mark_task_done", "task", "write_todos", FIND_TOOLS)
#: deepagents' own tools, present in every graph beside the ones we pass.
BUILTIN_TOOLS = (*confine.PATH_ARGS, "execute", "task")
DECISIONS = ["approve", "edit", "reject", "respond"]
#: What each mode gates, for completion menus, ``/approval`` and the README.
MODE_HELP = {
    "ask": "kernel code, shell commands and every file change wait",
    "workspace": "shell commands and file changes outside the workspace wait; "
                 "kernel code runs unasked and can write anywhere",
    "auto": "nothing waits",
}
#: Said under every mode: what no mode gates.
NEVER_GATED = ("reading files, remember, record_attempt and task never wait "
               "(a subagent's own calls wait by the same rules)")


def next_mode(mode: str) -> str:
    """The mode shift+Tab moves to."""
    return APPROVAL_MODES[(APPROVAL_MODES.index(mode) + 1) % len(APPROVAL_MODES)]


def waits(mode: str, name: str, args: dict[str, Any], workspace: Path) -> bool:
    """Whether a call of tool ``name`` with ``args`` waits for approval in ``mode``.

    The pure decision: ``interrupt_on_for_mode`` wires it into the graph.
    """
    if mode not in APPROVAL_MODES:
        raise ValueError(f"approval mode {mode!r} is not one of {', '.join(APPROVAL_MODES)}")
    if mode == "auto" or name in NEVER_WAIT:
        return False
    if name in KERNEL_TOOLS:
        return mode == "ask"
    if name in FILE_WRITE_TOOLS and mode == "workspace":
        key, follow = confine.WRITE_TOOLS[name]
        return not confine.inside(str(args.get(key) or ""), workspace, follow_last=follow)
    return True  # shell, every file change in ask, and any tool not classified above


def interrupt_on_for_mode(mode: str, workspace: Path, tool_names: Iterable[str] = ()
                          ) -> dict[str, Any]:
    """The ``interrupt_on`` map for ``create_deep_agent``.

    ``tool_names``: the tools passed to the graph (deepagents' own are always added), so
    an unclassified one is gated too.
    """
    if mode not in APPROVAL_MODES:
        raise ValueError(f"approval mode {mode!r} is not one of {', '.join(APPROVAL_MODES)}")
    root = Path(workspace).resolve()
    gated: dict[str, Any] = {}
    for name in dict.fromkeys([*BUILTIN_TOOLS, *tool_names]):
        if mode == "auto" or name in NEVER_WAIT:
            continue

        def when(request: Any, _name: str = name) -> bool:
            return waits(mode, _name, request.tool_call.get("args") or {}, root)

        gated[name] = {"allowed_decisions": list(DECISIONS), "when": when}
    return gated
