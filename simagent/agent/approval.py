"""Approval modes: which tool calls wait for the user (one home for the policy).

* ``ask``: every call that can change something outside the conversation waits: kernel
  code (``run_python``, ``reset_kernel``), shell commands, every file write, edit or
  delete, and ``remember`` (its note enters every later session's prompt).
* ``workspace``: shell commands wait, and file changes whose file may lie outside the
  workspace (its path resolves outside, or it has more than one hard link); kernel
  code runs without asking (it can still write anywhere: a path check cannot confine
  Python).
* ``auto``: nothing waits.

Reading files (``read_file``, ``ls``, ``glob``, ``grep``) waits in ``ask`` and
``workspace`` where it lands outside the workspace, except the places simagent reads
by design (:func:`readable_roots`: the bundled content, the simulator's source and
skills, the session's own state folder, memory notes, and ``[files] readable`` in the
config); a path that looks like it holds a secret (``confine.secret_reason``: ``~/.ssh``,
``~/.aws``, ``.env`` ...) waits in both even inside the workspace. Other reading
(``view_figure``, ``recall``), keeping the session's notes (``record_attempt``,
``mark_task_done``, ``write_todos``), ``find_tools`` (it only loads schemas) and
delegating (``task``: the subagent's own calls wait by the same rules) never wait. Any
other tool, such as one added later or from an MCP server (an external action, like
the shell), waits in ``ask`` and ``workspace`` until it is classified here: a tool
cannot slip past approval by being new.

Where a file call lands is decided by ``confine.resolve``, the function the file back
end uses for the act, so the decision and the act cannot disagree; what a file call
waiting would touch, and why it waits, is the request's ``description``
(:func:`file_reason`), which the approval prompts show.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from simagent.agent import confine
from simagent.config import APPROVAL_MODES
from simagent.context.deferral_policy import FIND_TOOLS

SHELL_TOOLS = ("execute",)
KERNEL_TOOLS = ("run_python", "reset_kernel")
FILE_WRITE_TOOLS = tuple(confine.WRITE_TOOLS)
FILE_READ_TOOLS = tuple(confine.READ_TOOLS)
#: Tools that wait in ``ask`` only: ``remember``'s note enters the next sessions' prompt.
ASK_ONLY = ("remember",)
#: Tools that never wait: they read the session's own record, keep its notes, or
#: delegate (see the module doc).
NEVER_WAIT = ("view_figure", "recall", "record_attempt", "mark_task_done", "task",
              "write_todos", FIND_TOOLS)
#: deepagents' own tools, present in every graph beside the ones we pass.
BUILTIN_TOOLS = (*confine.PATH_ARGS, "execute", "task")
DECISIONS = ["approve", "edit", "reject", "respond"]
#: What each mode gates, for completion menus, ``/approval`` and the README.
MODE_HELP = {
    "ask": "kernel code, shell commands, every file change, remember, and reading files "
           "outside the workspace or secret-looking ones wait",
    "workspace": "shell commands, file changes outside the workspace (or to a file with "
                 "other hard links), and reading files outside it or secret-looking ones "
                 "wait; kernel code runs unasked and can write anywhere",
    "auto": "nothing waits",
}
#: Said under every mode: what no mode gates.
NEVER_GATED = ("reading the workspace (but for secret-looking files), simagent's own "
               "folders and [files] readable, record_attempt and task never wait "
               "(a subagent's own calls wait by the same rules); no mode lets a file tool "
               "write .simagent/ or bundled content")


def next_mode(mode: str) -> str:
    """The mode shift+Tab moves to."""
    return APPROVAL_MODES[(APPROVAL_MODES.index(mode) + 1) % len(APPROVAL_MODES)]


def _check_mode(mode: str) -> None:
    if mode not in APPROVAL_MODES:
        raise ValueError(f"approval mode {mode!r} is not one of {', '.join(APPROVAL_MODES)}")


def file_reason(mode: str, name: str, args: dict[str, Any], workspace: Path,
                readable: Iterable[Path] = ()) -> str | None:
    """Why file tool ``name`` waits in ``mode``, naming the real file it would touch, or
    None when it goes ahead unasked. The approval prompt shows this line.

    ``readable``: resolved folders read outside the workspace without asking.
    """
    _check_mode(mode)
    if mode == "auto":
        return None
    root = Path(os.path.realpath(workspace))
    if name in confine.WRITE_TOOLS:
        key, follow = confine.WRITE_TOOLS[name]
        raw = str(args.get(key) or "")
        try:
            target = confine.resolve(raw, root, follow_last=follow)
        except OSError as exc:
            return f"{raw!r} names no place ({exc})"
        links = confine.hard_links(target) if follow else 1
        shared = (f"; it has {links} hard links, so another name for this file may lie "
                  "outside the workspace and the change shows there too" if links > 1 else "")
        if root not in target.parents:
            return f"changes {target}, outside the workspace{shared}"
        if shared or mode == "ask":
            return f"changes {target}{shared}"
        return None
    try:
        target = confine.read_target(name, args, root)
    except OSError as exc:
        return f"{args.get(confine.READ_TOOLS[name])!r} names no place ({exc})"
    if why := confine.secret_reason(target, Path(os.path.realpath(Path.home()))):
        return f"reads {target}, which may hold a secret: {why}"
    if confine.within(target, root) or any(confine.within(target, r) for r in readable):
        return None
    return f"reads {target}, outside the workspace"


def waits(mode: str, name: str, args: dict[str, Any], workspace: Path,
          readable: Iterable[Path] = ()) -> bool:
    """Whether a call of tool ``name`` with ``args`` waits for approval in ``mode``.

    The pure decision: ``interrupt_on_for_mode`` wires it into the graph. ``readable``:
    resolved folders read outside the workspace without asking (:func:`readable_roots`).
    """
    _check_mode(mode)
    if mode == "auto" or name in NEVER_WAIT:
        return False
    if name in KERNEL_TOOLS or name in ASK_ONLY:
        return mode == "ask"
    if name in confine.PATH_ARGS:
        return file_reason(mode, name, args, workspace, readable) is not None
    return True  # shell, and any tool not classified above


def readable_roots(content: Iterable[Path], source: Iterable[Path],
                   own: Iterable[Path], allowed: Iterable[Path]) -> tuple[Path, ...]:
    """The folders read outside the workspace without asking, resolved: the bundled
    ``content`` folders, the simulator's ``source`` and skills, simagent's ``own``
    session state and memory notes (offloaded results, history: it points the model
    there), and the person's ``allowed`` list (``[files] readable``)."""
    return tuple(dict.fromkeys(Path(os.path.realpath(p))
                               for group in (content, source, own, allowed) for p in group))


def notebook_waits(mode: str) -> bool:
    """Whether a starting notebook's cells (``--from-notebook``) wait for the person.

    They are kernel code like ``run_python``'s, so they wait exactly where it does: a
    notebook is one more way into the kernel, not a way around approval.
    """
    return waits(mode, KERNEL_TOOLS[0], {}, Path.cwd())


def interrupt_on_for_mode(mode: str, workspace: Path, tool_names: Iterable[str] = (),
                          readable: Iterable[Path] = ()) -> dict[str, Any]:
    """The ``interrupt_on`` map for ``create_deep_agent``.

    ``tool_names``: the tools passed to the graph (deepagents' own are always added), so
    an unclassified one is gated too. ``readable``: as for :func:`waits`. A file tool's
    request carries :func:`file_reason` as its description.
    """
    _check_mode(mode)
    root = Path(workspace).resolve()
    roots = tuple(readable)
    gated: dict[str, Any] = {}
    for name in dict.fromkeys([*BUILTIN_TOOLS, *tool_names]):
        if mode == "auto" or name in NEVER_WAIT:
            continue

        def when(request: Any, _name: str = name) -> bool:
            return waits(mode, _name, request.tool_call.get("args") or {}, root, roots)

        gated[name] = {"allowed_decisions": list(DECISIONS), "when": when}
        if name in confine.PATH_ARGS:
            def describe(call: Any, _state: Any, _runtime: Any, _name: str = name) -> str:
                return file_reason(mode, _name, call.get("args") or {}, root, roots) or ""

            gated[name]["description"] = describe
    return gated
