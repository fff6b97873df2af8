"""File and shell backend: real paths, rooted at the workspace, source read-only.

The model sees the machine's real absolute paths (the same ones the kernel prints), so a
path from a traceback can be opened directly. Every path, for the approval decision and
for the act alike, is resolved by ``confine.resolve`` (relative paths mean the
workspace, ``~`` the home folder, links followed). Installed simulator source and
simagent's bundled content may be read but never written. Offloaded results and history
(``large_tool_results/``, ``conversation_history/``) land in the session's state folder,
because the composite backend's ``artifacts_root`` is that folder's real path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from deepagents.backends import CompositeBackend, LocalShellBackend
from deepagents.backends.protocol import DeleteResult, EditResult, WriteResult
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage

from simagent.agent import confine
from simagent.paths import private_dir, private_file
from simagent.trace.redact import redact

#: File tools and the argument that names their path (one home: ``confine``).
PATH_ARGS = confine.PATH_ARGS
#: Seconds one shell command may run.
SHELL_TIMEOUT_S = 600
#: Bytes of shell output kept (the rest is cut by the backend).
SHELL_OUTPUT_BYTES = 100_000


class WorkspaceBackend(LocalShellBackend):
    """``LocalShellBackend`` on real paths that refuses writes under read-only roots."""

    def __init__(self, workspace: Path, *, read_only: Iterable[Path] = (),
                 timeout: int = SHELL_TIMEOUT_S, state_dir: Path | None = None) -> None:
        super().__init__(root_dir=workspace, virtual_mode=False, timeout=timeout,
                         max_output_bytes=SHELL_OUTPUT_BYTES, inherit_env=True)
        self.workspace = Path(workspace).resolve()
        self.read_only = tuple(Path(p).resolve() for p in read_only)
        #: The session's state folder: deepagents offloads (a long message of the
        #: user's, evicted results) land there, and are state like any other file.
        self.state_dir = Path(state_dir).resolve() if state_dir is not None else None

    def _resolve_path(self, key: str) -> Path:
        """Every operation of the back end resolves here, as the decision does."""
        return confine.resolve(key, self.workspace)

    def _protected(self, file_path: str, follow_last: bool = True) -> Path | None:
        try:
            target = confine.resolve(file_path, self.workspace, follow_last=follow_last)
        except OSError:
            return None  # the operation itself reports the bad path
        return next((root for root in self.read_only if confine.within(target, root)), None)

    def _refusal(self, file_path: str, root: Path) -> str:
        if not root.is_dir():  # a read-only file: the notebook the session started from
            return (f"{file_path} is the notebook this session started from; it is "
                    "read-only to the agent (the person can allow changes with "
                    "--notebook-writable). Write a copy under another name instead.")
        return (f"{file_path} is inside {root}, which is read-only (installed package "
                "source or bundled content). Copy the file into the workspace to change it.")

    def write(self, file_path: str, content: str) -> WriteResult:
        if root := self._protected(file_path):
            return WriteResult(error=self._refusal(file_path, root))
        if self.state_dir is not None:
            try:
                target = confine.resolve(file_path, self.workspace)
            except OSError:
                target = None
            if target is not None and confine.within(target, self.state_dir):
                content = redact(content)  # state: no secret at rest, private
                with contextlib.suppress(OSError):  # the write itself reports a bad path
                    private_file(private_dir(target.parent) / target.name)
        return super().write(file_path, content)

    def edit(self, file_path: str, old_string: str, new_string: str,
             replace_all: bool = False) -> EditResult:
        if root := self._protected(file_path):
            return EditResult(error=self._refusal(file_path, root))
        return super().edit(file_path, old_string, new_string, replace_all)

    def delete(self, file_path: str) -> DeleteResult:
        """Removes a link itself, never its target (the decision reads the same)."""
        follow = confine.WRITE_TOOLS["delete"][1]
        if root := self._protected(file_path, follow):
            return DeleteResult(error=self._refusal(file_path, root))
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


def build_backend(workspace: Path, session_dir: Path, *,
                  read_only: Iterable[Path] = ()) -> CompositeBackend:
    """The composite backend every agent of a session shares."""
    default = WorkspaceBackend(workspace, read_only=read_only, state_dir=session_dir)
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
    hook repeats the rewrite for calls a reviewer edited. A path that names no place (an
    unknown ``~user``) is left as written: the tool refuses it, and the trace records the
    call and the refusal.
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
        try:
            fixed = resolved_call(call, self.workspace)
        except OSError:
            return request  # deepagents refuses it (a leading ~ it cannot read)
        return request if fixed is call else request.override(tool_call=fixed)

    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        return handler(self._fix(request))

    async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
        return await handler(self._fix(request))
