"""How much output there really was, for the notes a card prints about what it hides.

A card draws the end of a capped copy: the result the model got (capped, with its own
truncation marker) or the live terminal buffers (bounded, oldest rows dropped). Counting
"earlier rows" in that copy told a person "26 earlier rows" after 500,000 printed lines.
The counts come from here instead: the run's raw output file (every byte printed, on
disk), or the live buffers together with the rows they dropped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from simagent.kernel.terminal import TerminalBuffer
from simagent.kernel_api.outputs import OutputRecord, number_of, size_text


@dataclass(frozen=True)
class Extent:
    """Lines and bytes of a whole output; None where it is not known."""

    lines: int | None
    size: int | None = None


#: Known to be larger than the text in hand, by an unknown amount.
UNKNOWN = Extent(None)


@lru_cache(maxsize=256)
def _count(path: str, n: int, size: int, mtime_ns: int) -> Extent:
    # keyed by size and mtime: a file still growing is counted again
    return Extent(OutputRecord(Path(path).parent, n).line_count(), size)


def raw_extent(raw_path: str | os.PathLike[str] | None) -> Extent | None:
    """Lines and bytes of a run's raw output file (None if there is none or it is gone).

    Counting streams the file once (64 KB blocks: about 50 MB/s on a loaded core) and is
    cached per file version, so a 50 MB output costs one pass, on the first ctrl+O.
    """
    n = number_of(raw_path)
    if n is None:
        return None
    try:
        st = os.stat(raw_path)
    except OSError:
        return None
    return _count(str(raw_path), n, st.st_size, st.st_mtime_ns)


def buffer_lines(*buffers: TerminalBuffer) -> int:
    """Lines a terminal would have shown: the rows kept plus the rows dropped."""
    total = 0
    for buf in buffers:
        rows = len(buf.rows) - (1 if buf.rows and not buf.rows[-1] else 0)
        total += buf.stats.rows_dropped + rows
    return total


def hidden_note(text_lines: int, shown: int, shown_bytes: int, total: Extent | None) -> str:
    """``… N earlier lines (X MB) not shown``, counted from ``total`` where it is larger
    than the text in hand (``text_lines`` lines, of which the last ``shown`` are drawn)."""
    if total is not None and total.lines is None:
        return "… earlier lines not shown (only the end is kept here)"
    real = total if total is not None and (total.lines or 0) > text_lines else None
    lines = (real.lines or 0) - shown if real is not None else text_lines - shown
    size = ""
    if real is not None and real.size is not None:
        size = f" ({size_text(max(0, real.size - shown_bytes))})"
    return f"… {lines:,} earlier line{'' if lines == 1 else 's'}{size} not shown"
