"""Files a replay rewrites, put back exactly as they were when it ends.

A replay may re-run a cell that wrote a file whole (:mod:`simagent.kernel.replay`): the
cell may read it back, so its state needs the write. But the file on disk must not end
different because the kernel restarted: the content a replay writes can differ (a time
stamp, an unseeded random draw, a later cell that changed the file and is not replayed).
So before the replay each such file is copied aside (``shutil.copy2``: bytes, mode and
times), and after it every one is put back; a file (or an empty folder) that did not
exist is removed.

Crash safety: the copies are complete before the manifest that names them is written
(atomically), so a manifest always names whole copies; a process killed mid-replay
leaves the manifest, and the next replay (:func:`put_back_leftover`) restores from it
before anything else. Putting back is idempotent.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from simagent.paths import private_dir, write_private

MANIFEST = "manifest.json"


def sizes(paths: Iterable[str]) -> dict[str, int | None]:
    """Each path's current size in bytes; None where it does not exist (or is no file)."""
    out: dict[str, int | None] = {}
    for p in paths:
        try:
            out[p] = os.path.getsize(p) if os.path.isfile(p) else None
        except OSError:
            out[p] = None
    return out


def save(folder: Path, paths: Iterable[str]) -> None:
    """Copy each existing file in ``paths`` into ``folder`` and write the manifest last.

    Raises ``OSError`` when a copy fails (the caller then does not replay the cells
    that write them)."""
    private_dir(folder)
    entries: dict[str, str | None] = {}
    for i, path in enumerate(dict.fromkeys(paths)):
        if os.path.isdir(path):
            continue  # a folder that exists stays as it is
        if not os.path.lexists(path):
            entries[path] = None  # absent: removed again after the replay
            continue
        name = f"{i:04d}"
        shutil.copy2(path, folder / (name + ".part"))
        os.replace(folder / (name + ".part"), folder / name)
        entries[path] = name
    tmp = folder / (MANIFEST + ".tmp")
    write_private(tmp, json.dumps(entries))
    os.replace(tmp, folder / MANIFEST)


def put_back(folder: Path) -> list[str]:
    """Restore every file the manifest names (remove those that were absent), then drop
    the backup. Returns the paths that could not be restored (with the reason)."""
    try:
        entries = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        shutil.rmtree(folder, ignore_errors=True)  # no manifest: the replay never began
        return []
    failed = []
    # files first, then what was absent, deepest first (a file before its new folder)
    order = [p for p, n in entries.items() if n is not None] + sorted(
        (p for p, n in entries.items() if n is None), key=len, reverse=True)
    for path in order:
        name = entries[path]
        try:
            if name is None:
                if os.path.isdir(path) and not os.path.islink(path):
                    with contextlib.suppress(OSError):  # not empty: something else is in it
                        os.rmdir(path)
                elif os.path.lexists(path):
                    os.remove(path)
                continue
            tmp = f"{path}.simagent-restore"
            shutil.copy2(folder / name, tmp)
            os.replace(tmp, path)
        except OSError as exc:
            failed.append(f"{path} ({exc.strerror or exc})")
    if not failed:
        shutil.rmtree(folder, ignore_errors=True)
    return failed


def put_back_leftover(folder: Path) -> list[str]:
    """A backup left by a process killed mid-replay, restored (nothing when none)."""
    return put_back(folder) if (folder / MANIFEST).exists() else []
