"""Where a file tool's path lands: one resolution for the approval decision and the act.

A path spelled by the model is resolved exactly once, by :func:`resolve`, and every
reader uses that answer: the approval decision (``approval.py``), the path rewrite the
tool call gets before it runs (``WorkspacePathsMiddleware``) and the file back end
itself (``WorkspaceBackend._resolve_path``). Two resolvers disagreeing was how
``~/.bashrc`` once counted as ``<workspace>/~/.bashrc`` for the decision while the act
edited ``$HOME/.bashrc``.

What a spelling means (documented in the README's approval section):

* ``~`` and ``~user`` mean what they mean in a shell: that user's home folder, which
  lies outside the workspace, so a change there waits for approval in ``workspace``
  mode. An unknown ``~user`` is an error, never a literal folder named ``~user``.
* A relative path is taken from the workspace (the kernel's working directory).
* Every folder on the way is resolved for real: ``..``, ``.``, ``//`` and symbolic
  links (a linked folder inside the workspace that points out is outside).
* The last component is followed too when it is a link (writing or editing a linked
  file changes its target), except for ``delete``, which removes the link itself.
* Nothing else is normalised: Linux does not fold unicode lookalikes (full-width dots,
  a full-width solidus) or trailing dots, so they are ordinary names, where they stand.

Some places may be read but never changed by the file tools, whatever the approval
mode: installed simulator source, simagent's bundled content, and the notebook a session
started from (``--from-notebook``) unless the person allowed writes
(:func:`notebook_read_only`). Python in the kernel and the shell are not confined by a
path check; the README says so.

The one race left is a link swapped between the decision and the act; the act
resolves again, and the decision is re-run on resume, but a process changing links
concurrently is beyond what a path check can close.
"""

from __future__ import annotations

import os
from pathlib import Path

#: File tools that change files: the argument naming the path, and whether a link in
#: the last component is followed (delete removes the link itself).
WRITE_TOOLS: dict[str, tuple[str, bool]] = {
    "write_file": ("file_path", True),
    "edit_file": ("file_path", True),
    "delete": ("file_path", False),
}
#: File tools that only read, and their path argument.
READ_TOOLS: dict[str, str] = {"read_file": "file_path", "ls": "path", "glob": "path",
                              "grep": "path"}
#: Every file tool and its path argument (one home; the path rewrite reads it).
PATH_ARGS: dict[str, str] = {**READ_TOOLS, **{k: v[0] for k, v in WRITE_TOOLS.items()}}


def notebook_read_only(notebook: Path | None, writable: bool) -> tuple[Path, ...]:
    """The starting notebook as a read-only path for the file tools, unless the person
    allowed writes (``--notebook-writable``): the agent was handed the notebook's state,
    not its authorship."""
    if notebook is None or writable:
        return ()
    return (Path(os.path.realpath(notebook)),)


class PathError(OSError):
    """A path that names no place (an unknown ``~user``, a NUL byte, an empty string)."""


def resolve(raw: str, workspace: Path, *, follow_last: bool = True) -> Path:
    """The real, absolute path a file tool touches for ``raw`` (see the module doc)."""
    if not isinstance(raw, str) or not raw:
        raise PathError("empty path")
    if "\x00" in raw:
        raise PathError(f"path {raw!r} contains a NUL byte")
    path = raw
    if path.startswith("~"):
        path = os.path.expanduser(path)
        if path.startswith("~"):
            user = raw[1:].split("/", 1)[0]
            raise PathError(f"{raw}: no user {user!r} on this machine, so '~{user}' names "
                            "no folder")
    if not os.path.isabs(path):
        path = os.path.join(os.path.realpath(workspace), path)
    head, last = os.path.split(path)
    if follow_last or last in ("", ".", ".."):
        return Path(os.path.realpath(path))
    return Path(os.path.realpath(head or "/"), last)


def within(target: Path, root: Path) -> bool:
    """Whether ``target`` is ``root`` or lies under it (both already resolved)."""
    return target == root or root in target.parents


def inside(raw: str, workspace: Path, *, follow_last: bool = True) -> bool:
    """Whether the path ``raw`` resolves to lies in the workspace, strictly below it.

    The workspace folder itself is not inside: deleting it is not a change within it.
    False when ``raw`` names no place, so an unresolvable path waits, never slips through.
    """
    try:
        target = resolve(raw, workspace, follow_last=follow_last)
    except OSError:
        return False
    return Path(os.path.realpath(workspace)) in target.parents
