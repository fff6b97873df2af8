"""Which lines of a raw output a head-and-tail cut left out (issue 31 §2).

A capped result used to say only how many characters were cut; to page the middle back
the model had to guess line numbers or grep blind. The marker now names the omitted
lines of the raw file, ``lines 41-960 of 1000 not shown: _out[7].slice(41, 960)``, and a
placeholder that later replaces the result repeats where the lines it showed were.

The model sees the *rendered* streams (``kernel.terminal``: progress redraws collapsed,
colours stripped), the raw file keeps every byte, and stderr or displays may interleave
with stdout there, so rendered row numbers are not raw line numbers in general.
:func:`locate_cut` therefore finds the shown head and tail in the raw file itself, and
answers None unless both match line for line: a wrong range would cost the model a
useless read, a missing one only the old marker.

:data:`CUT_RE` reads the note back (``context.placeholders``): one home for its words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from simagent.kernel.digesters import iter_raw_lines
from simagent.kernel.terminal import ESC_SEQ_RE, collapse_cr
from simagent.kernel_api.outputs import count_lines, handle

#: Bytes of the file's end first searched for the tail (x4 per try, up to the max: a
#: tail's raw bytes may hold progress redraws, and displays or a traceback follow it).
_END_BYTES = 1 << 20
MAX_END_BYTES = 4 << 20
#: The note as a marker or placeholder writes it; ``CUT_RE`` reads it back.
CUT_RE = re.compile(r"lines (\d+)-(\d+) of (\d+) not shown")


@dataclass(frozen=True)
class Cut:
    """Lines ``first``..``last`` (1-based, both included) of a ``total``-line raw output
    were not shown (a line shown only in part counts as not shown)."""

    first: int
    last: int
    total: int

    @property
    def shown(self) -> list[tuple[int, int]]:
        """The line ranges that were shown: the head before the cut, the tail after."""
        spans = [(1, self.first - 1), (self.last + 1, self.total)]
        return [(a, b) for a, b in spans if a <= b]


def cut_note(cut: Cut, where: str) -> str:
    """``lines 41-960 of 1000 not shown: <where>`` (``where``: how to page them back)."""
    return f"lines {cut.first}-{cut.last} of {cut.total} not shown: {where}"


def kernel_slice(n: int, cut: Cut) -> str:
    """The kernel one-liner returning exactly the omitted lines of execution ``n``."""
    return f"{handle(n)}.slice({cut.first}, {cut.last})"


def file_slice(cut: Cut) -> str:
    """``read_file`` arguments for the omitted lines (its ``offset`` counts from 0)."""
    return f"read_file offset={cut.first - 1}, limit={cut.last - cut.first + 1}"


def parse_cut(text: str) -> Cut | None:
    """The cut a marker in ``text`` names, if any."""
    found = CUT_RE.search(text)
    return Cut(*(int(g) for g in found.groups())) if found else None


def text_cut(text: str, head: str, tail: str) -> Cut | None:
    """The cut of an in-memory ``text`` whose head and tail were kept (no rendering
    between: ``context.capping`` saves the very text it cuts)."""
    if not text or len(head) + len(tail) >= len(text):
        return None
    total = text.count("\n") + (not text.endswith("\n"))
    first = head.count("\n") + 1  # a partial last head line counts as not shown
    start = len(text) - len(tail)
    # the tail's first line, whole or partial, is the cut's end (+1 when whole)
    last = text.count("\n", 0, start) + (0 if text[start - 1] == "\n" else 1)
    return Cut(first, last, total) if first <= last else None


def _norm(raw: str) -> str:
    """A raw line as the terminal buffer renders it, in its order: tabs expanded first
    (escapes counted as columns, as it does), then colours off and ``\\r`` collapsed."""
    line = raw.rstrip("\n").expandtabs(8)
    if "\x1b" in line:
        line = ESC_SEQ_RE.sub("", line)
    if "\r" in line:
        line = collapse_cr(line)
    return line.rstrip()


def locate_cut(raw_path: str | Path, head: str, tail: str, *,
               tail_whole: bool) -> Cut | None:
    """The raw lines between a rendered ``head`` and ``tail``, or None unless the head is
    the file's first lines and the tail a run of its lines after them, row for row.

    ``tail_whole``: the tail starts at a line start (else its first row is the end of a
    line, which then counts as not shown). The latest place the tail matches wins. Only
    the head's lines and the file's end are read (and its newlines counted), so a 200 MB
    log costs about what its tail does.
    """
    heads = head.split("\n")[:-1]  # whole rows; a partial last one is part of the cut
    rows = tail.split("\n")
    while rows and not rows[-1]:
        rows.pop()
    lead = 0 if tail_whole else 1
    want = rows[lead:]
    if not want or not _starts_with(raw_path, heads):
        return None
    total = count_lines(raw_path)
    room = _END_BYTES
    while True:
        end, whole = _last_lines(raw_path, room)
        start = _last_match(end, want)
        if start is not None:
            start += total - len(end) + 1  # a 1-based line number in the file
            break
        if whole or room >= MAX_END_BYTES:
            return None
        room *= 4
    first, last = len(heads) + 1, start - 1
    return Cut(first, last, total) if first <= last and start > len(heads) + lead else None


def _starts_with(raw_path: str | Path, heads: list[str]) -> bool:
    """Whether the file's first lines are ``heads`` (as rendered)."""
    if not heads:
        return Path(raw_path).is_file()
    try:
        for i, raw in enumerate(iter_raw_lines(raw_path)):
            if _norm(raw) != heads[i]:
                return False
            if i + 1 == len(heads):
                return True
    except OSError:
        return False
    return False


def _last_lines(raw_path: str | Path, room: int) -> tuple[list[str], bool]:
    """The file's last whole lines within about ``room`` bytes, rendered, and whether
    that is the whole file."""
    try:
        with open(raw_path, "rb") as fh:
            size = fh.seek(0, 2)
            pos = max(0, size - room)
            fh.seek(pos)
            data = fh.read()
    except OSError:
        return [], True
    lines = data.decode("utf-8", errors="replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if pos > 0:
        lines = lines[1:]  # it may start inside a line
    return [_norm(x) for x in lines], pos == 0


def _last_match(lines: list[str], want: list[str]) -> int | None:
    """The index of the last run of ``lines`` equal to ``want``."""
    n = len(want)
    for j in range(len(lines) - n, -1, -1):
        if lines[j] == want[0] and lines[j:j + n] == want:
            return j
    return None
