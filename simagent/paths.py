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

State is private: folders 0700, files 0600 (a session holds the scientist's code, data
and conversation). Every writer creates through :func:`private_dir`,
:func:`private_opener` / :func:`write_private`, or :func:`private_file` (SQLite, which
then gives its ``-wal``/``-shm`` files the database's mode). Not a process umask: that
would also make the scientist's own files, written by the agent, the shell or the kernel,
private. ``tests/test_secrets_at_rest.py`` walks the tree.
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
#: Modes of state folders and files.
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def private_dir(path: str | os.PathLike[str]) -> Path:
    """``mkdir -p`` where every folder it creates is 0700, and ``path`` itself made
    0700 if it already existed wider (state folders of an older simagent)."""
    path = Path(path)
    missing = []
    probe = path
    while not os.path.lexists(probe) and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, PRIVATE_DIR_MODE)
        except FileExistsError:  # another process made it first
            pass
    try:
        if path.stat().st_mode & 0o777 != PRIVATE_DIR_MODE:
            os.chmod(path, PRIVATE_DIR_MODE)
    except OSError:  # not ours to change; the folder above keeps it private
        pass
    return path


def private_opener(path: str | os.PathLike[str], flags: int) -> int:
    """``open(path, mode, opener=private_opener)``: a new file is created 0600."""
    return os.open(path, flags, PRIVATE_FILE_MODE)


def write_private(path: str | os.PathLike[str], text: str) -> None:
    """``Path.write_text`` for state files (UTF-8, created 0600)."""
    with open(path, "w", encoding="utf-8", opener=private_opener) as fh:
        fh.write(text)


def private_file(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` empty and 0600 if missing (a database before SQLite opens it)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, PRIVATE_FILE_MODE))
    return Path(path)


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
    return workspace_settings_dir(workspace) / "config.toml"


def workspace_settings_dir(workspace: str | os.PathLike[str]) -> Path:
    """``<workspace>/.simagent``: what a folder says about how simagent treats it. No file
    tool writes under it in any mode (a session must not set the next one's approval)."""
    return Path(workspace) / ".simagent"


def trust_store_path() -> Path:
    """``<home>/trusted-workspaces.json``: the folders the person trusted, each with the
    content hash of the config they trusted (``simagent.workspace_trust``). No file tool
    writes it in any mode."""
    return state_home() / "trusted-workspaces.json"


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
    def number_cache(self) -> Path:
        """``numbers/NNNN.bin``: the values each large raw output shows, read once for
        the provenance engine (``context/provenance/read_cache.py``); a cache, rebuilt
        from ``outputs/`` when missing or stale."""
        return self.root / "numbers"

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
        private_dir(state_home())  # tightens a state home an older simagent left 0755
        for d in (self.root, self.outputs, self.artifacts):
            private_dir(d)
        return self
