"""File and shell backend: real paths, rooted at the workspace, source read-only.

The model sees the machine's real absolute paths (the same ones the kernel prints), so a
path from a traceback can be opened directly. Relative paths resolve against the
workspace. Installed simulator source and simagent's bundled content may be read but
never written. Offloaded results and history (``large_tool_results/``,
``conversation_history/``) land in the session's state folder, because the composite
backend's ``artifacts_root`` is that folder's real path.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from deepagents.backends import CompositeBackend, LocalShellBackend
from deepagents.backends.protocol import DeleteResult, EditResult, WriteResult
from langchain.agents.middleware import AgentMiddleware

#: File tools and the argument that names their path.
PATH_ARGS = {"read_file": "file_path", "write_file": "file_path", "edit_file": "file_path",
             "delete": "file_path", "ls": "path", "glob": "path", "grep": "path"}
#: Seconds one shell command may run.
SHELL_TIMEOUT_S = 600
#: Bytes of shell output kept (the rest is cut by the backend).
SHELL_OUTPUT_BYTES = 100_000


class WorkspaceBackend(LocalShellBackend):
    """``LocalShellBackend`` on real paths that refuses writes under read-only roots."""

    def __init__(self, workspace: Path, *, read_only: Iterable[Path] = (),
                 timeout: int = SHELL_TIMEOUT_S) -> None:
        super().__init__(root_dir=workspace, virtual_mode=False, timeout=timeout,
                         max_output_bytes=SHELL_OUTPUT_BYTES, inherit_env=True)
        self.workspace = Path(workspace).resolve()
        self.read_only = tuple(Path(p).resolve() for p in read_only)

    def _target(self, file_path: str) -> Path | None:
        """The real path a tool call would touch (None when it cannot be resolved)."""
        try:
            return Path(self._resolve_path(file_path)).resolve()
        except (ValueError, OSError):
            return None

    def _protected(self, file_path: str) -> Path | None:
        target = self._target(file_path)
        return next((root for root in self.read_only if _within(target, root)), None)

    def _refusal(self, file_path: str, root: Path) -> str:
        return (f"{file_path} is inside {root}, which is read-only (installed package "
                "source or bundled content). Copy the file into the workspace to change it.")

    def write(self, file_path: str, content: str) -> WriteResult:
        if root := self._protected(file_path):
            return WriteResult(error=self._refusal(file_path, root))
        return super().write(file_path, content)

    def edit(self, file_path: str, old_string: str, new_string: str,
             replace_all: bool = False) -> EditResult:
        if root := self._protected(file_path):
            return EditResult(error=self._refusal(file_path, root))
        return super().edit(file_path, old_string, new_string, replace_all)

    def delete(self, file_path: str) -> DeleteResult:
        if root := self._protected(file_path):
            return DeleteResult(error=self._refusal(file_path, root))
        return super().delete(file_path)

    def inside_workspace(self, file_path: str) -> bool:
        return _within(self._target(file_path), self.workspace)


def _within(target: Path | None, root: Path) -> bool:
    return target is not None and (target == root or root in target.parents)


def build_backend(workspace: Path, session_dir: Path, *,
                  read_only: Iterable[Path] = ()) -> CompositeBackend:
    """The composite backend every agent of a session shares."""
    default = WorkspaceBackend(workspace, read_only=read_only)
    return CompositeBackend(default=default, routes={},
                            artifacts_root=str(Path(session_dir).resolve()))


def absolute_path(path: str, workspace: Path) -> str:
    """``path`` made absolute: ``~`` expanded, relative paths taken from the workspace."""
    expanded = Path(path).expanduser()
    return str(expanded if expanded.is_absolute() else (workspace / expanded).resolve())


class WorkspacePathsMiddleware(AgentMiddleware):
    """Resolves relative file-tool paths against the workspace before the tool runs.

    deepagents' tools normalise ``data.csv`` to ``/data.csv`` (a virtual-filesystem
    habit), which on real paths means the filesystem root. Models pass relative paths
    often; they mean the workspace, which is also the kernel's working directory.
    """

    def __init__(self, workspace: Path) -> None:
        super().__init__()
        self.workspace = Path(workspace).resolve()

    def _fix(self, request: Any) -> Any:
        call = request.tool_call
        key = PATH_ARGS.get(call.get("name", ""))
        args = call.get("args") or {}
        value = args.get(key) if key else None
        if not isinstance(value, str) or not value or value.startswith("/"):
            return request
        fixed = {**call, "args": {**args, key: absolute_path(value, self.workspace)}}
        return request.override(tool_call=fixed)

    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        return handler(self._fix(request))

    async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
        return await handler(self._fix(request))
