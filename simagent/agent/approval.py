"""Approval modes: which tool calls wait for the user (one home for the policy).

* ``ask``: shell commands and every file write, edit or delete wait.
* ``workspace``: shell commands wait; file changes inside the workspace go ahead,
  changes outside it wait.
* ``auto``: nothing waits.

``run_python``, ``remember`` and ``record_attempt`` never wait: running code in the
kernel is the agent's job, and saving notes must stay frictionless.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simagent.config import APPROVAL_MODES

SHELL_TOOLS = ("execute",)
FILE_WRITE_TOOLS = ("write_file", "edit_file", "delete")
DECISIONS = ["approve", "edit", "reject", "respond"]
#: One line per mode, for completion menus and help.
MODE_HELP = {"ask": "shell commands and every file change wait",
             "workspace": "shell commands and changes outside the workspace wait",
             "auto": "nothing waits"}


def next_mode(mode: str) -> str:
    """The mode shift+Tab moves to."""
    return APPROVAL_MODES[(APPROVAL_MODES.index(mode) + 1) % len(APPROVAL_MODES)]


def _outside(inside_workspace: Callable[[str], bool]) -> Callable[[Any], bool]:
    def when(request: Any) -> bool:
        args = request.tool_call.get("args") or {}
        path = args.get("file_path") or args.get("path") or ""
        return not inside_workspace(str(path))

    return when


def interrupt_on_for_mode(mode: str, inside_workspace: Callable[[str], bool]
                          ) -> dict[str, Any]:
    """The ``interrupt_on`` map for ``create_deep_agent``."""
    if mode not in APPROVAL_MODES:
        raise ValueError(f"approval mode {mode!r} is not one of {', '.join(APPROVAL_MODES)}")
    if mode == "auto":
        return {}
    gated: dict[str, Any] = {name: {"allowed_decisions": list(DECISIONS)}
                             for name in SHELL_TOOLS}
    for name in FILE_WRITE_TOOLS:
        cfg: dict[str, Any] = {"allowed_decisions": list(DECISIONS)}
        if mode == "workspace":
            cfg["when"] = _outside(inside_workspace)
        gated[name] = cfg
    return gated
