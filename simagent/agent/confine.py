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
mode: installed simulator source, simagent's bundled content, the notebook a session
started from (``--from-notebook``) unless the person allowed writes
(:func:`notebook_read_only`), and what says how simagent treats a folder, which only
the person changes: the workspace's ``.simagent/`` and the trust store
(:func:`settings_read_only`). Python in the kernel and the shell are not confined by a
path check; the README says so.

A write judges the file, not the name. A regular file with more than one hard link
(:func:`hard_links`) has another name that may lie outside the workspace, so changing
it counts as a change outside; a read-only file is recognised by its device and inode,
so a hard link to it is read-only too.

The act cannot be redirected after the decision: :func:`open_exact` opens the
resolved path folder by folder, each relative to the one above and none through a
link (``O_NOFOLLOW``), so a link put in place since (a folder or the file itself)
makes the write fail rather than land elsewhere; the back end then checks the file it
opened (``fstat``) is the entry it looked at just before, with no name added. What is
left: a file of the workspace swapped for a hard link to an outside one between the
approval decision and the act, which needs a process of the same user running at
that moment (kernel code or the shell, which a path check does not confine anyway).
An absolute path reaching the act is opened as given, never resolved again: the
model's path was resolved once, as its reply arrived, and resolving it again at the
act would follow a link put there since.

Reads are judged by where they land too: outside the workspace they wait in ``ask``
and ``workspace`` mode, except the places simagent reads by design (``approval.py``),
and a path that looks like it holds a secret waits even inside (:func:`secret_reason`).
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import re
import stat
from pathlib import Path

from simagent.paths import trust_store_path, workspace_settings_dir

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
#: Read tools whose path may be left out: deepagents then searches its root, the
#: workspace (and glob reads ``/`` as that root too).
ROOTED_SEARCHES = ("glob", "grep")
#: Why each kind of read-only place is read-only, for the refusal the model reads.
SETTINGS_WHY = ("says how simagent treats this folder (its config: approval, model, "
                "servers); only the person changes it, with `simagent init` or an editor, "
                "never a file tool")
TRUST_WHY = ("is simagent's record of the folders the person trusted; only the person "
             "changes it, never a file tool")


def notebook_read_only(notebook: Path | None, writable: bool) -> tuple[Path, ...]:
    """The starting notebook as a read-only path for the file tools, unless the person
    allowed writes (``--notebook-writable``): the agent was handed the notebook's state,
    not its authorship."""
    if notebook is None or writable:
        return ()
    return (Path(os.path.realpath(notebook)),)


def settings_read_only(workspace: Path) -> dict[Path, str]:
    """What no file tool writes in any mode, with why: the workspace's ``.simagent/``
    (a session must not set the next one's approval) and the trust store."""
    return {Path(os.path.realpath(workspace_settings_dir(workspace))): SETTINGS_WHY,
            Path(os.path.realpath(trust_store_path())): TRUST_WHY}


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


def read_target(name: str, args: dict, workspace: Path) -> Path:
    """The real path read tool ``name`` reads for ``args`` (``resolve``'s answer).

    glob and grep without a path (glob's ``/`` too) search deepagents' root, the workspace.
    Raises ``PathError`` when the path names no place.
    """
    raw = args.get(READ_TOOLS[name])
    if name in ROOTED_SEARCHES and (raw in (None, "") or (name == "glob" and raw == "/")):
        return Path(os.path.realpath(workspace))
    return resolve(raw, workspace)


def prompt_line(request: dict) -> str | None:
    """The line an approval prompt shows above a waiting file call: the request's
    description (``approval.file_reason``), which names the real file it would touch and
    why it waits (outside, hard links, a secret). None for other tools, whose description
    is langchain's generic one."""
    if request.get("name") not in PATH_ARGS:
        return None
    return str(request.get("description") or "").strip() or None


def hard_links(target: Path) -> int:
    """How many names the regular file ``target`` has (1 for a folder, a link, or nothing).

    More than one: another name for the same file may lie anywhere on the file system,
    and a change made through this one shows there too.
    """
    try:
        st = os.lstat(target)
    except OSError:
        return 1
    return st.st_nlink if stat.S_ISREG(st.st_mode) else 1


def same_file(a: os.stat_result, b: os.stat_result) -> bool:
    """One file (device and inode), whatever names lead to it."""
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


#: ``~/<folder>``s that hold keys and credentials, and why each (see ``secret_reason``).
SECRET_HOME_FOLDERS = {".ssh": "SSH keys", ".aws": "cloud access keys",
                       ".gnupg": "the GPG private keyring"}
#: ``~/<file>``s that hold passwords in plain text.
SECRET_HOME_FILES = {".netrc": "passwords for remote hosts",
                     ".pgpass": "PostgreSQL passwords"}
#: Private-key file name patterns, wherever they lie.
_KEY_NAME = re.compile(r"id_(rsa|dsa|ecdsa|ed25519)(_sk)?$|.*\.(pem|key|p12|pfx)$")


def secret_reason(path: Path, home: Path) -> str | None:
    """What secret the resolved ``path`` may hold, or None when it looks like none.

    A read hands the file's content to the model's provider and stores it in the
    session, so these wait for the person in every mode but ``auto``, even inside the
    workspace. Each rule is here because of what conventionally lives there:

    * ``~/.ssh``: SSH private keys; ``~/.aws``: cloud access keys and SSO tokens;
      ``~/.gnupg``: the GPG private keyring.
    * ``~/.config/*/credentials*``: where command-line tools keep their tokens
      (gcloud's ``credentials.db``, for one).
    * ``~/.netrc`` and ``~/.pgpass``: plain-text passwords for hosts and PostgreSQL.
    * ``.env`` and ``.env.*`` anywhere: the convention for an application's secrets,
      often kept inside the project folder itself.
    * ``id_rsa``-like names and ``*.pem``/``*.key``/``*.p12``/``*.pfx`` anywhere: private
      keys and certificates carry their key in the file (``*.pub`` is not matched).

    ``home``: the person's home folder, resolved (``path`` is resolved too).
    """
    with contextlib.suppress(ValueError):
        rel = path.relative_to(home).parts
        if rel and rel[0] in SECRET_HOME_FOLDERS:
            return f"{SECRET_HOME_FOLDERS[rel[0]]} live in ~/{rel[0]}"
        if len(rel) == 1 and rel[0] in SECRET_HOME_FILES:
            return f"~/{rel[0]} holds {SECRET_HOME_FILES[rel[0]]}"
        if len(rel) >= 3 and rel[0] == ".config" and fnmatch.fnmatch(rel[2], "credentials*"):
            return f"~/.config/{rel[1]}/{rel[2]} is where a tool keeps its credentials"
    name = path.name
    if name == ".env" or name.startswith(".env."):
        return f"{name} is where an application's secrets are kept"
    if _KEY_NAME.match(name):
        return f"{name} looks like a private key"
    return None


class Moved(OSError):
    """The resolved path changed before the act: a link, or another file, now stands where
    the decision looked. Nothing was written."""


def open_exact(path: Path, flags: int, mode: int = 0o644, *, make_parents: bool = False
               ) -> tuple[int, os.stat_result | None, list[os.stat_result]]:
    """Open the absolute ``path`` without following a link anywhere on the way.

    Each folder is opened relative to the one above it with ``O_NOFOLLOW``, the file
    relative to its folder likewise (and ``O_NONBLOCK``, so a FIFO put there cannot hang
    the call), so a link placed since ``path`` was resolved makes the open fail
    (:class:`Moved`) instead of redirecting it. ``make_parents`` creates missing folders,
    as a write does. Returns the file's descriptor, what its name held just before the
    open (None: nothing, so the open created it) and the folders on the way, top first.
    """
    if not path.is_absolute() or path.name in ("", ".", ".."):
        raise PathError(f"{path}: not a file path")
    # O_PATH: a folder the person may cross but not list (mode 711) opens too
    folder_flags = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW
    dir_fd = os.open("/", folder_flags)
    folders = [os.fstat(dir_fd)]
    try:
        for part in path.parts[1:-1]:
            try:
                next_fd = _open_here(part, folder_flags, 0, dir_fd, path)
            except FileNotFoundError:
                if not make_parents:
                    raise
                with contextlib.suppress(FileExistsError):  # made meanwhile: opened next
                    os.mkdir(part, 0o777, dir_fd=dir_fd)
                next_fd = _open_here(part, folder_flags, 0, dir_fd, path)
            os.close(dir_fd)
            dir_fd = next_fd
            folders.append(os.fstat(dir_fd))
        try:
            before: os.stat_result | None = os.stat(path.name, dir_fd=dir_fd,
                                                    follow_symlinks=False)
        except FileNotFoundError:
            before = None
        fd = _open_here(path.name, flags | os.O_NOFOLLOW | os.O_NONBLOCK, mode, dir_fd, path)
    finally:
        os.close(dir_fd)
    return fd, before, folders


def _open_here(name: str, flags: int, mode: int, dir_fd: int, path: Path) -> int:
    """``os.open`` relative to ``dir_fd``; a link (or a file where a folder was) standing
    at ``name`` is :class:`Moved`."""
    try:
        return os.open(name, flags, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Moved(f"{path}: {name!r} is a link now (or not a folder), not what the "
                        "decision found; nothing was written") from exc
        raise
