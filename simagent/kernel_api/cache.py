"""Finished cases of a sweep on disk: ``ensembles/<name>/cases/<key>.pkl``, one file each.

Each record is written to a temporary file in the same folder and renamed into place,
so a cell that is interrupted or killed mid-write leaves either the whole record or
none; a file that still cannot be read (a full disk, a foreign file) counts as a miss
and is removed. Only successful cases are stored: a failure may be transient, and a
re-run should try it again.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

_SUFFIX = ".pkl"
_TMP_PREFIX = ".tmp-"


class CaseCache:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def path(self, key: str) -> Path:
        return self.folder / f"{key}{_SUFFIX}"

    def load(self, key: str) -> dict[str, Any] | None:
        path = self.path(key)
        try:
            with open(path, "rb") as fh:
                record = pickle.load(fh)
        except FileNotFoundError:
            return None
        except Exception:
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        return record if isinstance(record, dict) and record.get("status") == "ok" else None

    def save(self, key: str, record: dict[str, Any]) -> bool:
        """Store ``record`` atomically; False when it cannot be pickled (not cached)."""
        try:
            data = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            return False
        self.folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=self.folder)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, self.path(key))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return True

    def keys(self) -> set[str]:
        if not self.folder.is_dir():
            return set()
        return {p.name[: -len(_SUFFIX)] for p in self.folder.glob(f"*{_SUFFIX}")
                if not p.name.startswith(_TMP_PREFIX)}

    def clean_temporary(self) -> None:
        """Remove temporary files a killed write left behind."""
        if self.folder.is_dir():
            for p in self.folder.glob(f"{_TMP_PREFIX}*"):
                with contextlib.suppress(OSError):
                    p.unlink()
