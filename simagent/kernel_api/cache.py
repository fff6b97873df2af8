"""Finished cases of a sweep on disk: ``ensembles/<name>/cases/<key>.pkl``, one file each.

Each record is written to a temporary file in the same folder and renamed into place,
so a cell that is interrupted or killed mid-write leaves either the whole record or
none; a file that still cannot be read (a full disk, a foreign file) counts as a miss
and is removed. Only successful cases are stored: a failure may be transient, and a
re-run should try it again. A result that cannot be stored (it cannot be pickled, the
disk is full) is not an error of the sweep: ``save`` returns False, counts the reason
in ``failures`` and the sweep ends with a one-line :meth:`CaseCache.note`.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

from simagent.paths import private_dir

_SUFFIX = ".pkl"
_TMP_PREFIX = ".tmp-"


class CaseCache:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        #: Why results were not stored: reason -> count.
        self.failures: dict[str, int] = {}

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
        """Store ``record`` atomically; False when it cannot be pickled or written."""
        try:
            data = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            return self._failed(f"the result cannot be pickled ({type(exc).__name__})")
        tmp = None
        try:
            private_dir(self.folder)
            fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=self.folder)  # 0600
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, self.path(key))
        except OSError as exc:
            self._discard(tmp)
            return self._failed(f"{type(exc).__name__}: {exc.strerror or exc}")
        except BaseException:
            self._discard(tmp)
            raise
        return True

    def note(self) -> str:
        """One line saying how many results were not cached and why ("" when none)."""
        if not self.failures:
            return ""
        total = sum(self.failures.values())
        reasons = "; ".join(f"{n} x {why}" if len(self.failures) > 1 else why
                            for why, n in self.failures.items())
        return (f"note: {total} result{'s' * (total != 1)} not cached ({reasons}); "
                "they run again next time")

    def _failed(self, reason: str) -> bool:
        self.failures[reason] = self.failures.get(reason, 0) + 1
        return False

    @staticmethod
    def _discard(tmp: str | None) -> None:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

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
