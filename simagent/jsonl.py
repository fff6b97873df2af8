"""JSON Lines files: the session's attempt log, ledger and task records, bench records.

One reader for all of them, because they share the failure that matters: a process
killed mid-write leaves a torn last line, which must cost that line, never the file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every object in ``path``, in order; a missing or unreadable file is empty, and a
    line that is not a JSON object (a torn write) is skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            out.append(row)
    return out


def drop_torn_tail(path: Path) -> None:
    """Cut a torn last line (no newline: the writer was killed mid-write) off ``path``
    before appending to it; else the next record would be glued to the fragment and
    lost with it. Reads one byte unless the file really is torn."""
    try:
        with Path(path).open("rb+") as fh:
            end = fh.seek(0, 2)
            if end == 0:
                return
            fh.seek(end - 1)
            if fh.read(1) == b"\n":
                return
            fh.seek(0)
            data = fh.read()
            fh.truncate(data.rfind(b"\n") + 1)
    except FileNotFoundError:
        return


def append_jsonl(path: Path, line: str, *, opener: Callable[[str, int], int] | None = None,
                 ) -> None:
    """Append one serialized record as a line, after cutting a torn tail, so every
    JSONL writer survives a kill of the one before it. Callers serialize (and redact)
    the record themselves: their formats differ, the framing does not."""
    drop_torn_tail(path)
    with open(path, "a", encoding="utf-8", opener=opener) as fh:
        fh.write(line + "\n")
