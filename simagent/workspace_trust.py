"""Workspace trust: a folder's ``.simagent/config.toml`` acts only once the person trusted it.

A cloned repository or an unpacked archive can carry a ``.simagent/config.toml``. Read as if
the person wrote it, that file could turn approval off, start any command as an MCP server
(at session start and in ``simagent doctor``), or send the person's API key to an endpoint
of its choosing. So, as VS Code's Workspace Trust does for a folder's settings and tasks, a
workspace's config takes effect only after the person trusted *that folder with that
content*: the store keeps, per real folder path, the sha256 of the config's bytes. A changed
file (a ``git pull``, a cell in the kernel, an editor) is a new file and asks again.

Until then the file is ignored whole: every command runs on the user's config and its
flags, and says so in one line (:func:`ignored_line`). What the file would change is
summed up by :func:`would_change`, a pure function, for the TUI's question and that line.

The store (``paths.trust_store_path``) is state like any other: 0600 in a 0700 home, and no
file tool writes it or ``.simagent/`` in any mode (``agent/confine.py``). Only the person
adds to it: the TUI's question, ``simagent trust``, ``--trust-workspace``, or
``simagent init`` writing a config it made itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simagent.paths import private_dir, private_opener, trust_store_path, workspace_config_path

#: How a workspace's config stands (``Trust.status``).
ABSENT = "absent"  # no .simagent/config.toml: nothing to trust
TRUSTED = "trusted"  # trusted with this content (the store, or --trust-workspace now)
UNTRUSTED = "untrusted"  # present and not trusted (or changed since): ignored
#: The flag that trusts a folder for good from any command (one home for its spelling).
TRUST_FLAG = "--trust-workspace"


@dataclass(frozen=True)
class Trust:
    """Where a workspace's config stands, and what it holds (parsed, even when ignored:
    the question and the notice say what it would change)."""

    status: str
    path: Path
    data: Mapping[str, Any]
    digest: str | None = None

    @property
    def ignored(self) -> bool:
        return self.status == UNTRUSTED


def digest(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def _folder(workspace: str | os.PathLike[str]) -> str:
    return str(Path(workspace).expanduser().resolve())


def read_store(path: Path | None = None) -> dict[str, str]:
    """Trusted folders: real path -> sha256 of the config trusted there. An unreadable or
    damaged store trusts nothing (the safe reading); the next trust rewrites it."""
    path = path or trust_store_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    folders = data.get("folders") if isinstance(data, dict) else None
    if not isinstance(folders, dict):
        return {}
    return {k: v for k, v in folders.items() if isinstance(k, str) and isinstance(v, str)}


def _write_store(folders: Mapping[str, str]) -> None:
    path = trust_store_path()
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8", opener=private_opener) as fh:
        json.dump({"folders": dict(sorted(folders.items()))}, fh, indent=1)
        fh.write("\n")
    os.replace(tmp, path)  # a reader sees the old store or the new one, never half


def config_bytes(workspace: str | os.PathLike[str]) -> bytes | None:
    """The workspace config's bytes, None when there is none (a folder there counts as
    none: it is no file to trust)."""
    path = workspace_config_path(workspace)
    if not path.is_file():
        return None
    return path.read_bytes()


def trust(workspace: str | os.PathLike[str], content: bytes | None = None) -> str | None:
    """Record that the person trusts ``workspace`` with its config as it is now (or with
    ``content``, the bytes they were shown); returns the digest, None when there is no
    config to trust."""
    content = config_bytes(workspace) if content is None else content
    if content is None:
        return None
    folders = read_store()
    folders[_folder(workspace)] = value = digest(content)
    _write_store(folders)
    return value


def revoke(workspace: str | os.PathLike[str]) -> bool:
    """Forget ``workspace``; True when it was trusted."""
    folders = read_store()
    if folders.pop(_folder(workspace), None) is None:
        return False
    _write_store(folders)
    return True


def is_trusted(workspace: str | os.PathLike[str], content: bytes) -> bool:
    return read_store().get(_folder(workspace)) == digest(content)


def standing(workspace: str | os.PathLike[str], data: Mapping[str, Any],
             content: bytes | None, *, trust_now: bool = False, record: bool = True) -> Trust:
    """Where the config of ``workspace`` (``content``, parsed as ``data``) stands.

    ``trust_now``: the person passed ``--trust-workspace``; the trust is recorded, so the
    TUI and later commands agree with this one. ``record=False``: trusted for this load
    only (the bench, which wrote the folder itself from the workflow it was asked to run).
    """
    path = workspace_config_path(workspace)
    if content is None:
        return Trust(ABSENT, path, {})
    if trust_now:
        return Trust(TRUSTED, path, data,
                     trust(workspace, content) if record else digest(content))
    status = TRUSTED if is_trusted(workspace, content) else UNTRUSTED
    return Trust(status, path, data, digest(content))


def _servers(data: Mapping[str, Any]) -> list[str]:
    mcp = data.get("mcp")
    servers = mcp.get("servers") if isinstance(mcp, Mapping) else None
    out = []
    for name, table in (servers or {}).items() if isinstance(servers, Mapping) else ():
        if not isinstance(table, Mapping):
            continue
        if table.get("command"):
            argv = " ".join(str(a) for a in [table["command"], *(table.get("args") or [])])
            out.append(f"run MCP server {name}: {argv}")
        elif table.get("url"):
            out.append(f"connect to MCP server {name} at {table['url']}")
    return out


def would_change(data: Mapping[str, Any]) -> list[str]:
    """What a workspace config would change, riskiest first, one short phrase each.

    The phrases name what the person must judge: approval, programs it would run, places
    it would send requests (and which key variables go with them), a kernel it would
    attach to, a Dask scheduler it would hand code to, folders it would open to reading.
    Other tables are named, not described: they tune simagent, they do not act.
    """
    out: list[str] = []
    if "approval" in data:
        out.append(f"set approval = {data['approval']!r}")
    out.extend(_servers(data))
    model = data.get("model")
    table = model if isinstance(model, Mapping) else {}
    spec = table.get("id") if table else model
    if spec:
        out.append(f"use model {spec}")
    if table.get("api_key_env"):
        out.append(f"send your ${table['api_key_env']} to it")
    kernel = data.get("kernel")
    if isinstance(kernel, Mapping) and kernel.get("existing"):
        out.append(f"attach to kernel {kernel['existing']}")
    ensembles = data.get("ensembles")
    if isinstance(ensembles, Mapping) and ensembles.get("scheduler"):
        out.append(f"send ensemble tasks to {ensembles['scheduler']}")
    files = data.get("files")
    if isinstance(files, Mapping) and files.get("readable"):
        out.append(f"let the agent read {', '.join(map(str, files['readable']))}")
    named = {"approval", "mcp", "model", "kernel", "ensembles", "files"}
    rest = [k for k in data if k not in named]
    if rest:
        out.append("set " + ", ".join(f"[{k}]" if isinstance(data[k], Mapping) else k
                                      for k in rest))
    return out


#: How to trust a folder, said after every notice that one is ignored.
HOW_TO_TRUST = f"after reading it, trust it with 'simagent trust' or {TRUST_FLAG}"


def ignored_reason(state: Trust) -> str:
    """What is ignored and what it would have done (the doctor's row)."""
    changes = would_change(state.data)
    what = f" (it would {'; '.join(changes)})" if changes else ""
    return f"ignoring {state.path}: this folder's config is not trusted{what}"


def ignored_line(state: Trust) -> str:
    """The one line every command prints while it runs without an untrusted config."""
    return f"simagent: {ignored_reason(state)}; {HOW_TO_TRUST}"


def parse(content: bytes, path: Path) -> dict[str, Any]:
    """``content`` as TOML; ``ValueError`` naming ``path`` when it is not (the caller
    turns it into its own error type)."""
    try:
        return tomllib.loads(content.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") \
            from exc
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: invalid TOML: {exc}") from exc
