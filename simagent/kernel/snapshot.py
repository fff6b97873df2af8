"""A snapshot of the session's runtime for the kernel state card.

The card (``simagent.context.state_card``) is a pure function of this plain data, so the
bench can record one snapshot per kernel step and serve it back in replay, and tests can
render cards without a kernel. What the snapshot holds and why:

* ``kernel``: status, generation (process starts) and executions, from the supervisor;
* ``probe``: names, imports, functions and registry objects, read inside the kernel
  (:mod:`simagent.kernel_api.state_probe`); None when the kernel is busy or not started;
* ``figures``: every figure the session saved (the trace's ``artifact`` events);
* ``files``: workspace files written since the session started, newest first, found by
  a bounded walk that skips hidden folders (``.simagent`` state, ``.git``, virtualenvs);
* ``effects``: what the session's latest cells did outside the kernel (their execution
  records' ``effects``: ``simagent.kernel_api.effects``), ``base`` the workspace.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simagent.kernel.replay import load_records
from simagent.kernel_api import effects as fx

if TYPE_CHECKING:
    from simagent.kernel.supervisor import Kernel
    from simagent.trace.log import TraceLog

#: Most directory entries the file walk looks at (a workspace may hold a data lake).
MAX_WALK_ENTRIES = 20_000
#: Most files listed; the rest are counted.
MAX_FILES = 50
#: Most executions whose effects the card lists (the latest).
MAX_EFFECT_CELLS = 10
_SKIP_DIRS = frozenset({"node_modules", "__pycache__", "venv", "site-packages"})


def kernel_part(kernel: Kernel | None) -> dict[str, Any]:
    if kernel is None:
        return {"status": "not started", "generation": 0, "executions": 0}
    part = {"status": kernel.state, "generation": kernel.generation,
            "executions": kernel.executions}
    rec = getattr(kernel, "last_recovery", None)
    if rec is not None and rec.restarted:  # the card tells a replayed restart from a bare one
        part["replayed"] = {"cells": len(rec.replayed), "restored": rec.state_restored}
    return part


def workspace_files(root: Path, since: float) -> tuple[list[dict[str, Any]], int]:
    """(newest files modified at or after ``since``, how many more there were)."""
    found: list[tuple[float, str, int]] = []
    seen = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                             if not d.startswith(".") and d not in _SKIP_DIRS)
        for name in filenames:
            seen += 1
            if seen > MAX_WALK_ENTRIES:
                break
            if name.startswith("."):
                continue
            path = Path(dirpath) / name
            try:
                st = path.stat()
            except OSError:
                continue
            if st.st_mtime >= since:
                found.append((st.st_mtime, path.relative_to(root).as_posix(), st.st_size))
        if seen > MAX_WALK_ENTRIES:
            break
    found.sort(key=lambda f: (-f[0], f[1]))
    files = [{"path": rel, "bytes": size} for _t, rel, size in found[:MAX_FILES]]
    return files, max(0, len(found) - MAX_FILES)


def cell_effects(outputs: Path, keep: int = MAX_EFFECT_CELLS) -> list[dict[str, Any]]:
    """``[{n, effects}]`` of the latest ``keep`` executions that acted outside the kernel."""
    found = [{"n": r["n"], "effects": fx.of(r)} for r in load_records(outputs) if fx.of(r)]
    return found[-keep:]


def figures(trace: TraceLog) -> list[dict[str, Any]]:
    """Figures in the order they were made, one per distinct path."""
    out: dict[str, dict[str, Any]] = {}
    for event in trace.events(["artifact"]):
        p = event.payload if isinstance(event.payload, dict) else {}
        path = str(p.get("path") or "")
        if path and path not in out:
            out[path] = {k: p[k] for k in ("id", "title") if p.get(k)} | {"path": path}
    return list(out.values())


def session_start(trace: TraceLog) -> float:
    """When the session started (epoch seconds), from its first trace event."""
    first = trace.first("session_start")
    try:
        return datetime.fromisoformat(str(first.ts)).timestamp() if first else 0.0
    except ValueError:
        return 0.0


def take(kernel: Kernel | None, registry: list[dict[str, Any]], workspace: Path,
         trace: TraceLog, since: float) -> dict[str, Any]:
    probe = kernel.probe_state(registry) if kernel is not None else None
    files, more = workspace_files(workspace, since)
    paths = getattr(kernel, "paths", None)
    effects = cell_effects(paths.outputs) if paths is not None else []
    return {"kernel": kernel_part(kernel), "probe": probe, "figures": figures(trace),
            "files": files, "files_more": more, "effects": effects, "base": str(workspace)}
