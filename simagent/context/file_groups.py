"""Files whose names differ only in their numbers, as one line of the state card.

A sweep writes a file per case (``logs/newton_3.50.log``, ``runs/case_017.csv``). Listed
one by one they cost ~20 tokens a file on every request until the next card, and the
newest few crowd the other files off it. Names that are equal once each run of digits is
masked (``logs/newton_*.log``) form a group when there are at least :data:`MIN_GROUP` of
them; the card then says the pattern once, with the count, the size, the first and last
names in natural order and the cells that wrote them, so the model can still name any
member (the numbers it swept are in its own code) and ``glob`` lists them all.

Pure: file entries in (newest first, as the snapshot lists them), items out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: Fewest files that make a group: two are cheaper listed by name.
MIN_GROUP = 3
#: A run of digits, with its decimal part (``3.50``) so a float is one field (a group, so
#: ``split`` keeps the numbers).
_NUMBER = re.compile(r"(\d+(?:\.\d+)?)")


def pattern_of(path: str) -> str:
    """``logs/newton_3.50.log`` -> ``logs/newton_*.log``: the folder kept, each number
    of the file's name masked (a numbered folder stays as it is)."""
    folder, sep, name = path.rpartition("/")
    return f"{folder}{sep}{_NUMBER.sub('*', name)}"


def natural_key(name: str) -> tuple[Any, ...]:
    """Sort key that puts ``case_2`` before ``case_10`` and ``0.5`` before ``1.0``."""
    return tuple((0, float(p), p) if i % 2 else (1, 0.0, p)
                 for i, p in enumerate(_NUMBER.split(name)))


@dataclass(frozen=True)
class FileItem:
    """One line of the card's file list: a file, or a group of numbered files."""

    paths: tuple[str, ...]  # newest first
    bytes: int  # all of them together
    pattern: str | None = None  # set for a group

    @property
    def ends(self) -> tuple[str, str]:
        """The first and last names of a group, in natural order (file names only)."""
        names = sorted((p.rpartition("/")[2] for p in self.paths), key=natural_key)
        return names[0], names[-1]


def group_files(files: Sequence[dict[str, Any]], min_group: int = MIN_GROUP
                ) -> list[FileItem]:
    """The card's file items, in the order of each item's newest file: ``files``
    (``{"path", "bytes"}``, newest first) with numbered names of one pattern merged."""
    keyed = [(f, str(f["path"]), pattern_of(str(f["path"]))) for f in files]
    by_pattern: dict[str, list[dict[str, Any]]] = {}
    for f, path, key in keyed:
        if key != path:
            by_pattern.setdefault(key, []).append(f)
    items, done = [], set()
    for f, path, key in keyed:
        members = by_pattern.get(key, [])
        if len(members) >= min_group:
            if key not in done:
                done.add(key)
                items.append(FileItem(tuple(str(m["path"]) for m in members),
                                      sum(int(m.get("bytes") or 0) for m in members), key))
        else:
            items.append(FileItem((path,), int(f.get("bytes") or 0)))
    return items


def cells_phrase(numbers: Sequence[int], most: int = 3) -> str:
    """``_out[3], _out[5]``, or the span ``_out[4]…_out[14]`` past ``most`` cells."""
    ns = sorted(set(numbers))
    if len(ns) <= most:
        return ", ".join(f"_out[{n}]" for n in ns)
    return f"_out[{ns[0]}]…_out[{ns[-1]}]"
