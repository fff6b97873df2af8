"""Every path simagent uses, in one place.

Two kinds of location matter:

* **Content** (``skills/``, ``memory/``, ``simulators/``, ``subagents/``, ``bench/``)
  lives at the top of a
  checkout and is force-included into the wheel as ``simagent/_content/<name>``. One
  function, :func:`content_dir`, finds it in either layout, so no other module ever
  guesses.
* **State** (traces, checkpoints, raw outputs, artifacts) lives under the state home,
  one folder per workspace and per session (design.md §4). :class:`SessionPaths` names
  every file of a session; code asks it rather than joining strings.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

CONTENT_FOLDERS = ("skills", "memory", "simulators", "subagents", "bench")
#: Environment variable telling the kernel process its session state folder (the Kernel
#: sets it), so in-kernel helpers such as ``ensemble`` keep their files under the session.
SESSION_DIR_ENV = "SIMAGENT_SESSION_DIR"

_PACKAGE_DIR = Path(__file__).resolve().parent


def content_root() -> Path:
    """Folder holding the content folders: ``_content`` in a wheel, the checkout otherwise."""
    bundled = _PACKAGE_DIR / "_content"
    if bundled.is_dir():
        return bundled
    return _PACKAGE_DIR.parent


def content_dir(name: str) -> Path:
    if name not in CONTENT_FOLDERS:
        raise ValueError(f"unknown content folder {name!r}; expected one of {CONTENT_FOLDERS}")
    return content_root() / name


def state_home() -> Path:
    """``$SIMAGENT_HOME``, else ``$XDG_DATA_HOME/simagent``, else ``~/.local/share/simagent``."""
    if home := os.environ.get("SIMAGENT_HOME"):
        return Path(home).expanduser()
    if xdg := os.environ.get("XDG_DATA_HOME"):
        return Path(xdg).expanduser() / "simagent"
    return Path.home() / ".local" / "share" / "simagent"


def workspace_key(workspace: str | os.PathLike[str]) -> str:
    """Stable short id of a workspace folder (first 12 hex of the sha256 of its real path)."""
    real = str(Path(workspace).expanduser().resolve())
    return hashlib.sha256(real.encode()).hexdigest()[:12]


def workspace_state_dir(workspace: str | os.PathLike[str]) -> Path:
    return state_home() / "workspaces" / workspace_key(workspace)


def last_session_marker(workspace: str | os.PathLike[str]) -> Path:
    """File naming the workspace's most recent session (``--continue`` reads it)."""
    return workspace_state_dir(workspace) / "last-session"


def workspace_config_path(workspace: str | os.PathLike[str]) -> Path:
    return Path(workspace) / ".simagent" / "config.toml"


def kernelspec_dir() -> Path:
    """Where simagent writes the kernelspec of its own default Python kernel."""
    return state_home() / "kernels"


def new_session_id(now: float | None = None) -> str:
    """``YYYYMMDD-HHMMSS-<4 hex>``: sortable by time, unique enough within a second."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{stamp}-{secrets.token_hex(2)}"


@dataclass(frozen=True)
class SessionPaths:
    """The files and folders of one session (design.md §4)."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @classmethod
    def for_session(cls, workspace: str | os.PathLike[str], session_id: str) -> SessionPaths:
        return cls(workspace_state_dir(workspace) / "sessions" / session_id)

    @property
    def trace(self) -> Path:
        return self.root / "trace.sqlite"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints.sqlite"

    @property
    def kernel_log(self) -> Path:
        return self.root / "kernel.log"

    @property
    def outputs(self) -> Path:
        return self.root / "outputs"

    @property
    def large_tool_results(self) -> Path:
        return self.root / "large_tool_results"

    @property
    def conversation_history(self) -> Path:
        return self.root / "conversation_history"

    @property
    def ledger(self) -> Path:
        """``ledger.jsonl``: one entry per compaction, what left the model's view and where
        it is (``simagent.context.ledger``)."""
        return self.root / "ledger.jsonl"

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    @property
    def task_records(self) -> Path:
        """``tasks.jsonl``: one typed record per closed task (``/done``, ``mark_task_done``)."""
        return self.root / "tasks.jsonl"

    @property
    def ensembles(self) -> Path:
        """``ensembles/<name>/``: cached case results and result tables of each sweep."""
        return self.root / "ensembles"

    def ensure(self) -> SessionPaths:
        for d in (self.root, self.outputs, self.artifacts):
            d.mkdir(parents=True, exist_ok=True)
        return self
