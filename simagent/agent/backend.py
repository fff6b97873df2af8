"""File and shell backend: real paths, rooted at the workspace, source read-only.

The model sees the machine's real absolute paths (the same ones the kernel prints), so a
path from a traceback can be opened directly. Every path, for the approval decision and
for the act alike, is resolved by ``confine.resolve`` (relative paths mean the
workspace, ``~`` the home folder, links followed). Installed simulator source,
simagent's bundled content, ``.simagent/`` and the trust store may be read but never
written; writes open the decided path without following any link and check the file
they opened (``confine`` says why). Offloaded results and history
(``large_tool_results/``, ``conversation_history/``) land in the session's state folder,
because the composite backend's ``artifacts_root`` is that folder's real path.
A front end whose person edits files in an editor may hand the back end that editor's
open buffers (``OpenFiles``): reads and changes of workspace files then go through it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from deepagents.backends import CompositeBackend, LocalShellBackend
from deepagents.backends.protocol import (
    DeleteResult,
    EditResult,
    FileData,
    ReadResult,
    WriteResult,
)
from deepagents.backends.utils import (
    check_empty_content,
    perform_string_replacement,
    slice_read_response,
)
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage

from simagent.agent import confine
from simagent.paths import PRIVATE_FILE_MODE, private_dir
from simagent.trace.redact import redact

#: File tools and the argument that names their path (one home: ``confine``).
PATH_ARGS = confine.PATH_ARGS
#: Seconds one shell command may run.
SHELL_TIMEOUT_S = 600
#: Bytes of shell output kept (the rest is cut by the backend).
SHELL_OUTPUT_BYTES = 100_000


#: What a write or edit result adds when the editor did not take the text (it does not
#: take that file, as JupyterLab a notebook, or it failed) and it went to the disk.
ON_DISK = "(on disk: the editor did not take the write)"


class Refused(OSError):
    """A change the back end will not make (a read-only place); its text is the answer."""


class OpenFiles(Protocol):
    """The files an editor holds open, as the file tools' back end reads and writes them.

    Why: the person may have unsaved edits in the editor (``simagent acp``'s client); the
    model must read what they see, and its changes must land in that buffer, not in the
    disk file under it, which the editor would overwrite at its next save. Reads and
    writes go together: ``edit_file`` reads, changes and writes one text, so reading the
    buffer but writing the disk would save the person's unsaved edits unasked.

    The back end asks only for a regular text file strictly inside the workspace, after
    confinement allowed the act (``WorkspaceBackend._open_path``): the editor's file
    system is the same workspace, and its rules do not relax.
    """

    def read(self, path: str) -> str | None:
        """The text of ``path`` (absolute) as the editor holds it; None: not handled (not
        open, refused, failed), so the disk is read."""

    def write(self, path: str, text: str) -> bool | str:
        """True: the editor took ``text`` for ``path``; False: not handled (it does not
        take this file, or failed), so the disk is written; a string: the editor (its
        person) refused the write, and nothing is written; the string says why."""


class WorkspaceBackend(LocalShellBackend):
    """``LocalShellBackend`` on real paths that refuses writes under read-only roots and
    writes so that no link swapped after the decision can redirect them."""

    def __init__(self, workspace: Path, *, read_only: Iterable[Path] = (),
                 timeout: int = SHELL_TIMEOUT_S, state_dir: Path | None = None,
                 open_files: OpenFiles | None = None) -> None:
        super().__init__(root_dir=workspace, virtual_mode=False, timeout=timeout,
                         max_output_bytes=SHELL_OUTPUT_BYTES, inherit_env=True)
        self.workspace = Path(workspace).resolve()
        self.read_only = tuple(Path(p).resolve() for p in read_only)
        #: ``.simagent/`` and the trust store: read-only in every mode, with why.
        self.settings = confine.settings_read_only(self.workspace)
        #: The session's state folder: deepagents offloads (a long message of the
        #: user's, evicted results) land there, and are state like any other file.
        self.state_dir = Path(state_dir).resolve() if state_dir is not None else None
        #: The editor's open buffers, when a front end has them (``OpenFiles``).
        self.open_files = open_files

    def _resolve_path(self, key: str) -> Path:
        """Every operation of the back end resolves here, as the decision does."""
        return confine.resolve(key, self.workspace)

    def _roots(self) -> list[tuple[Path, str]]:
        """Every read-only place and why it is (the refusal says it)."""
        return [*((root, "") for root in self.read_only), *self.settings.items()]

    def _protected(self, file_path: str, follow_last: bool = True) -> str | None:
        """The refusal for a change at ``file_path``, judged by name and, for an existing
        file, by identity (a hard link to a read-only file is that file); None if allowed."""
        try:
            target = confine.resolve(file_path, self.workspace, follow_last=follow_last)
        except OSError:
            return None  # the operation itself reports the bad path
        for root, why in self._roots():
            if confine.within(target, root):
                return self._refusal(file_path, root, why)
        try:
            here = os.lstat(target)
        except OSError:
            return None
        return self._refused_file(file_path, here, [])

    def _refused_file(self, file_path: str, opened: os.stat_result,
                      folders: list[os.stat_result]) -> str | None:
        """The refusal when the file ``opened`` or a folder on its way is a read-only
        place, judged by device and inode (what a name swap or a hard link cannot hide)."""
        for root, why in self._roots():
            try:
                st = os.stat(root)
            except OSError:
                continue  # not there: nothing of it to protect
            on_way = folders if stat.S_ISDIR(st.st_mode) else [opened]
            if any(confine.same_file(st, seen) for seen in on_way):
                return self._refusal(file_path, root, why)
        return None

    def _refusal(self, file_path: str, root: Path, why: str = "") -> str:
        if why:
            return f"{file_path}: {root} {why}."
        if not root.is_dir():  # a read-only file: the notebook the session started from
            return (f"{file_path} is the notebook this session started from; it is "
                    "read-only to the agent (the person can allow changes with "
                    "--notebook-writable). Write a copy under another name instead.")
        return (f"{file_path} is inside {root}, which is read-only (installed package "
                "source or bundled content). Copy the file into the workspace to change it.")

    def _act_path(self, file_path: str) -> Path:
        """The path the act opens: an absolute one as given (it was resolved as the
        model's reply arrived; resolving again would follow a link put there since),
        any other spelling resolved now (a direct caller's)."""
        if os.path.isabs(file_path):
            return Path(file_path)
        return confine.resolve(file_path, self.workspace)

    def _open_checked(self, file_path: str, target: Path, flags: int, *,
                      create: bool = False, mode: int = 0o644) -> int:
        """A descriptor on the file at ``target``, opened by ``confine.open_exact`` and
        checked: a regular file, the entry its name held just before the open, no name
        added since, and no read-only place. Raises ``confine.Moved`` when it is not the
        file decided on, ``Refused`` when it is read-only."""
        fd, before, folders = confine.open_exact(target, flags, mode, make_parents=create)
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode):
                raise IsADirectoryError(errno.EISDIR, f"{file_path} is not a regular file")
            if (before is None and opened.st_nlink != 1) or (
                    before is not None and (not confine.same_file(before, opened)
                                            or opened.st_nlink > before.st_nlink)):
                raise confine.Moved(f"{file_path}: another file (or a new name for it) "
                                    "stood there by the time it was opened; nothing was "
                                    "written")
            if refusal := self._refused_file(file_path, opened, folders):
                raise Refused(refusal)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_path(self, file_path: str) -> str | None:
        """The absolute path to hand ``open_files`` for ``file_path``, or None: the disk.

        Only a file strictly inside the workspace, outside the state folder and every
        read-only place, with one name, and no link on its way now (a link put there
        since the decision, or a path spelled with ``..``, goes the disk way, whose
        checks refuse what they must)."""
        if self.open_files is None:
            return None
        try:
            target = self._act_path(file_path)
        except OSError:
            return None
        if self.workspace not in target.parents or (
                self.state_dir is not None and confine.within(target, self.state_dir)):
            return None
        if Path(os.path.realpath(target)) != target or confine.hard_links(target) > 1:
            return None
        if self._protected(str(target)) is not None:
            return None
        return str(target)

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        """The disk's read (errors, binary files, paging as deepagents'), with the text
        the editor holds for a workspace text file in place of the disk's."""
        result = super().read(file_path, offset, limit)
        data = result.file_data
        if result.error or data is None or data.get("encoding") != "utf-8":
            return result
        if (path := self._open_path(file_path)) is None:
            return result
        text = self.open_files.read(path) if self.open_files is not None else None
        if text is None:
            return result
        if empty := check_empty_content(text):
            return ReadResult(file_data=FileData(content=empty, encoding="utf-8"))
        return slice_read_response(FileData(content=text, encoding="utf-8"), offset, limit)

    def write(self, file_path: str, content: str) -> WriteResult:
        if refusal := self._protected(file_path):
            return WriteResult(error=refusal)
        try:
            target = self._act_path(file_path)
        except OSError as exc:
            return WriteResult(error=f"Error writing file '{file_path}': {exc}")
        if (path := self._open_path(file_path)) is not None and self.open_files is not None:
            taken = self.open_files.write(path, content)
            if isinstance(taken, str):
                return WriteResult(error=taken)
            if taken:
                return WriteResult(path=file_path)
            result = self._write_disk(file_path, target, content)
            return result if result.error else WriteResult(path=f"{file_path} {ON_DISK}")
        return self._write_disk(file_path, target, content)

    def _write_disk(self, file_path: str, target: Path, content: str) -> WriteResult:
        """``content`` into the file at ``target``, opened as ``_open_checked`` vouches."""
        mode = 0o644
        if self.state_dir is not None and confine.within(target, self.state_dir):
            content = redact(content)  # state: no secret at rest, private
            mode = PRIVATE_FILE_MODE
            with contextlib.suppress(OSError):  # the write itself reports a bad path
                private_dir(target.parent)
        try:
            fd = self._open_checked(file_path, target, os.O_WRONLY | os.O_CREAT,
                                    create=True, mode=mode)
            os.ftruncate(fd, 0)  # only now: the file is the one decided on
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
                fh.write(content)
        except Refused as exc:
            return WriteResult(error=str(exc))
        except (OSError, UnicodeEncodeError) as exc:
            return WriteResult(error=f"Error writing file '{file_path}': {exc}")
        return WriteResult(path=file_path)

    def edit(self, file_path: str, old_string: str, new_string: str,
             replace_all: bool = False) -> EditResult:
        """deepagents' edit (same results and errors), on a descriptor ``_open_checked``
        vouches for: the file read is the file written. A file the editor holds is read
        and written there (``OpenFiles``), so the edit applies to what the person sees."""
        if refusal := self._protected(file_path):
            return EditResult(error=refusal)
        try:
            target = self._act_path(file_path)
        except OSError as exc:
            return EditResult(error=f"Error editing file '{file_path}': {exc}")
        if (path := self._open_path(file_path)) is not None and self.open_files is not None:
            held = self.open_files.read(path)
            if held is not None:
                return self._edit_held(file_path, target, path, held,
                                       (old_string, new_string, replace_all))
        try:
            fd = self._open_checked(file_path, target, os.O_RDWR)
        except (FileNotFoundError, IsADirectoryError):
            return EditResult(error=f"Error: File '{file_path}' not found")
        except Refused as exc:
            return EditResult(error=str(exc))
        except OSError as exc:
            return EditResult(error=f"Error editing file '{file_path}': {exc}")
        try:
            with os.fdopen(fd, "rb+") as fh:
                result = _replaced(fh.read().decode("utf-8"), old_string, new_string,
                                   replace_all)
                if isinstance(result, str):
                    return EditResult(error=result)
                new_content, occurrences = result
                fh.seek(0)
                fh.truncate()
                fh.write(new_content.encode("utf-8"))
        except (OSError, UnicodeDecodeError, UnicodeEncodeError) as exc:
            return EditResult(error=f"Error editing file '{file_path}': {exc}")
        return EditResult(path=file_path, occurrences=int(occurrences))

    def _edit_held(self, file_path: str, target: Path, path: str, held: str,
                   change: tuple[str, str, bool]) -> EditResult:
        """The edit on the text the editor holds, written back there (or, when the
        editor does not take it, to the disk, and the result says so; when it refuses,
        nowhere)."""
        result = _replaced(held, *change)
        if isinstance(result, str):
            return EditResult(error=result)
        new_content, occurrences = result
        taken = self.open_files.write(path, new_content) if self.open_files else False
        if isinstance(taken, str):
            return EditResult(error=taken)
        if taken:
            return EditResult(path=file_path, occurrences=int(occurrences))
        written = self._write_disk(file_path, target, new_content)
        if written.error:
            return EditResult(error=written.error)
        return EditResult(path=f"{file_path} {ON_DISK}", occurrences=int(occurrences))

    def delete(self, file_path: str) -> DeleteResult:
        """Removes a link itself, never its target (the decision reads the same)."""
        follow = confine.WRITE_TOOLS["delete"][1]
        if refusal := self._protected(file_path, follow):
            return DeleteResult(error=refusal)
        try:
            target = confine.resolve(file_path, self.workspace, follow_last=follow)
        except OSError as exc:
            return DeleteResult(error=f"Error deleting '{file_path}': {exc}")
        if target.is_symlink():
            try:
                target.unlink()
            except OSError as exc:
                return DeleteResult(error=f"Error deleting '{file_path}': {exc}")
            return DeleteResult(path=file_path)
        return super().delete(str(target))

    def inside_workspace(self, file_path: str, follow_last: bool = True) -> bool:
        return confine.inside(file_path, self.workspace, follow_last=follow_last)


def _replaced(content: str, old: str, new: str, replace_all: bool
              ) -> tuple[str, int] | str:
    """deepagents' string replacement on universal newlines (as its text-mode read)."""
    def lf(text: str) -> str:
        return text.replace("\r\n", "\n").replace("\r", "\n")
    return perform_string_replacement(lf(content), lf(old), lf(new), replace_all)


def build_backend(workspace: Path, session_dir: Path, *,
                  read_only: Iterable[Path] = (),
                  open_files: OpenFiles | None = None) -> CompositeBackend:
    """The composite backend every agent of a session shares (``open_files``: an
    editor's open buffers, ``OpenFiles``)."""
    default = WorkspaceBackend(workspace, read_only=read_only, state_dir=session_dir,
                               open_files=open_files)
    return CompositeBackend(default=default, routes={},
                            artifacts_root=str(Path(session_dir).resolve()))


def resolved_call(call: dict[str, Any], workspace: Path) -> dict[str, Any]:
    """``call`` with its file path replaced by the resolved one (``confine.resolve``).

    Raises ``confine.PathError`` when the path names no place.
    """
    name = call.get("name", "")
    key = PATH_ARGS.get(name)
    args = call.get("args") or {}
    value = args.get(key) if key else None
    if not isinstance(value, str) or not value:
        return call
    follow = confine.WRITE_TOOLS.get(name, (key, True))[1]
    fixed = str(confine.resolve(value, workspace, follow_last=follow))
    return call if fixed == value else {**call, "args": {**args, key: fixed}}


class WorkspacePathsMiddleware(AgentMiddleware):
    """Gives every file-tool call its resolved path, once, as the model's reply arrives.

    The reply enters the state with each file tool's path already resolved, so the
    approval decision, the approval prompt (its diff reads the real file), the trace and
    the tool all read one path. deepagents' tools would otherwise read ``data.csv`` as
    ``/data.csv`` (a virtual-filesystem habit) and refuse ``~`` and ``..``. The tool-call
    hook repeats the rewrite for a relative or ``~`` path (a reviewer's edit) but leaves
    an absolute one alone: it was resolved when the decision read it, and resolving it
    again at the act would follow a link put there since (the back end opens it without
    following any). A path that names no place (an unknown ``~user``) is left as
    written: the tool refuses it, and the trace records the call and the refusal.
    """

    def __init__(self, workspace: Path) -> None:
        super().__init__()
        self.workspace = Path(workspace).resolve()

    def _fix_reply(self, response: Any) -> Any:
        messages = getattr(response, "result", None)
        if not isinstance(messages, list):
            return response
        for i, msg in enumerate(messages):
            if isinstance(msg, AIMessage) and msg.tool_calls:
                calls = []
                for call in msg.tool_calls:
                    try:
                        calls.append(resolved_call(dict(call), self.workspace))
                    except OSError:
                        calls.append(call)  # as written: the tool refuses it
                if calls != list(msg.tool_calls):
                    messages[i] = msg.model_copy(update={"tool_calls": calls})
        return response

    def wrap_model_call(self, request: Any, handler: Any) -> Any:
        return self._fix_reply(handler(request))

    async def awrap_model_call(self, request: Any, handler: Any) -> Any:
        return self._fix_reply(await handler(request))

    def _fix(self, request: Any) -> Any:
        call = request.tool_call
        key = PATH_ARGS.get(call.get("name", ""))
        if key and os.path.isabs(str((call.get("args") or {}).get(key) or "")):
            return request  # resolved as the reply arrived: see the class doc
        try:
            fixed = resolved_call(call, self.workspace)
        except OSError:
            return request  # deepagents refuses it (a leading ~ it cannot read)
        return request if fixed is call else request.override(tool_call=fixed)

    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        return handler(self._fix(request))

    async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
        return await handler(self._fix(request))
