"""What a waiting tool call would do, as text every front end shows alike: a unified diff
for a file change, the whole cell for ``run_python``, the command for the shell.

The TUI's approval card and an ACP client's permission request (``simagent acp``) show
the same words, so this lives below both (front ends never import each other).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from simagent.agent import confine
from simagent.presentation.notices import one_line

#: File tools whose approval shows a diff of the file as it is now.
DIFF_TOOLS = ("write_file", "edit_file")


def file_now(name: str, args: dict[str, Any], workspace: Path) -> str | None:
    """The text of the file a ``write_file``/``edit_file`` call would change, read where
    the file tool would land (``confine.resolve``); None for other tools, or when the
    file does not exist or cannot be read."""
    if name not in DIFF_TOOLS:
        return None
    key, follow = confine.WRITE_TOOLS[name]
    try:
        target = confine.resolve(str(args.get(key) or ""), workspace, follow_last=follow)
        return target.read_text(errors="replace")
    except (OSError, ValueError):
        return None


def edited(name: str, args: dict[str, Any], current: str | None) -> str | None:
    """The file's text after the call, as the tool would leave it (None: not known,
    e.g. an ``edit_file`` whose old string is not in the file)."""
    if name == "write_file":
        return str(args.get("content") or "")
    if name == "edit_file":
        old_s, new_s = str(args.get("old_string") or ""), str(args.get("new_string") or "")
        if current is None or not old_s or old_s not in current:
            return None
        return (current.replace(old_s, new_s) if args.get("replace_all")
                else current.replace(old_s, new_s, 1))
    return None


def action_preview(name: str, args: dict[str, Any], current: str | None) -> str:
    """What an approval would do, as text: a unified diff for file changes.

    ``current`` is the file's text now (None when it does not exist or is unreadable).
    """
    path = str(args.get("file_path") or args.get("path") or "")
    if name == "write_file":
        new = str(args.get("content") or "")
        old = current or ""
        diff = difflib.unified_diff(old.splitlines(), new.splitlines(),
                                    "a/" + path if current is not None else "/dev/null",
                                    "b/" + path, lineterm="", n=2)
        return "\n".join(diff) or f"(no change to {path})"
    if name == "edit_file":
        after = edited(name, args, current)
        if current is not None and after is not None:
            diff = difflib.unified_diff(current.splitlines(), after.splitlines(),
                                        "a/" + path, "b/" + path, lineterm="", n=2)
        else:
            old_s, new_s = str(args.get("old_string") or ""), str(args.get("new_string") or "")
            diff = difflib.unified_diff(old_s.splitlines(), new_s.splitlines(),
                                        "a/" + path, "b/" + path, lineterm="", n=1)
        return "\n".join(diff) or f"(no change to {path})"
    if name == "execute":
        return f"$ {args.get('command', '')}"
    if name == "run_python":  # the whole cell, as it will run (ask mode gates it)
        return str(args.get("code", ""))
    return one_line(args, width=2_000)
