"""What each raw output file shows, read once: in memory for this process and on disk
beside the session's files for later ones.

Reading the values a text shows (``engine.read_text``) is the provenance engine's cost: a
session with 4.8 MB of output shows half a million values and took seconds to read, at
every answer of ``simagent run`` and in every ``simagent transcript``. A raw output,
``outputs/NNNN.txt``, is written by its one execution and never after (``kernel/capture.py``
creates it when the cell first prints and closes it when the cell ends; execution
numbers continue after a restart, ``kernel/lifecycle.py``), so what it shows is keyed
soundly by its path, size and modification time: a file that changed all the same is
read again.

- **Memory**: the texts and their reads, least recently used out first past
  :data:`MEMORY_BYTES`, so a long session's outputs are read once per process, not once
  per answer.
- **Disk**: ``SessionPaths.number_cache`` (``numbers/NNNN.bin``, 0600 like all state),
  only for an output of at least :data:`DISK_MIN_BYTES` and only in a session's own
  folder (one with ``trace.sqlite`` beside ``outputs/``; never a workspace's). A file
  holds one JSON header line (the key, each part's length, count and line offset, a hash
  of the reading rules) and the arrays as bytes, deflated. One that does not match or
  cannot be read is ignored and written again; one that cannot be written is not kept.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import threading
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from simagent.context.provenance import engine, numbers
from simagent.context.provenance.engine import Read, read_text
from simagent.paths import SessionPaths, private_dir, private_opener

#: The memory the cached texts and reads of one process may take. A 4.8 MB output's read
#: takes about 20 MB; this keeps a dozen such sessions.
MEMORY_BYTES = 256 * 1024 * 1024
#: Outputs smaller than this are not kept on disk: a file per short line is not worth
#: its inode. (Measured: a 300-byte output reads in 0.3 ms and loads in 0.02 ms; a
#: 2.4 MB one reads in 2.5 s and loads in 63 ms.)
DISK_MIN_BYTES = 512
#: The on-disk layout's version.
FORMAT = 1
#: zlib's level for the arrays: the fastest, a third of the bytes (positions are small
#: integers in 8 bytes), 30 ms to inflate 10 MB.
ZLIB_LEVEL = 1
#: The type codes of ``Read.arrays()``, in order.
_CODES = ("d", "q", "q", "q", "d")

#: One part of an output as read: its text, the lines before it in the file.
Part = tuple[str, int]
#: ... and what it shows.
ReadPart = tuple[str, int, Read]


class ByteLRU:
    """A mapping of path to (key, value) bounded by the values' size in bytes, the least
    recently used dropped first; a path's entry with another key is stale and dropped."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[str, tuple[Any, Any, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, path: str, key: Any) -> Any | None:
        with self._lock:
            item = self._items.get(path)
            if item is None:
                return None
            if item[0] != key:
                self._drop(path)
                return None
            self._items.move_to_end(path)
            return item[1]

    def put(self, path: str, key: Any, value: Any, nbytes: int) -> None:
        with self._lock:
            if path in self._items:
                self._drop(path)
            if nbytes > self.max_bytes:
                return
            self._items[path] = (key, value, nbytes)
            self.bytes += nbytes
            while self.bytes > self.max_bytes:
                self._drop(next(iter(self._items)))

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.bytes = 0

    def _drop(self, path: str) -> None:
        self.bytes -= self._items.pop(path)[2]


MEMORY = ByteLRU(MEMORY_BYTES)


def output_reads(path: Path, size: int, mtime_ns: int,
                 read_parts: Callable[[], Sequence[Part]]) -> tuple[ReadPart, ...]:
    """The parts of raw output ``path`` (``read_parts`` reads them: its first ``size``
    bytes, head and tail when huge) with what each shows: from memory, else from the disk
    cache, else read and kept in both."""
    key = (size, mtime_ns)
    hit = MEMORY.get(str(path), key)
    if hit is not None:
        return hit
    parts = read_parts()
    if not parts:  # unreadable now: nothing to keep
        return ()
    cache = cache_file(path) if size >= DISK_MIN_BYTES else None
    reads = load(cache, key, parts) if cache is not None else None
    if reads is None:
        reads = [read_text(text) for text, _offset in parts]
        if cache is not None:
            save(cache, key, parts, reads)
    out = tuple((text, offset, r) for (text, offset), r in zip(parts, reads, strict=True))
    MEMORY.put(str(path), key, out,
               sum(sys.getsizeof(text) + r.nbytes for text, _o, r in out))
    return out


def cache_file(raw: Path) -> Path | None:
    """Where raw output ``raw``'s reads are kept: ``numbers/<stem>.bin`` of its session,
    or ``None`` when ``raw`` is not in a session's ``outputs/`` folder."""
    session = SessionPaths(raw.parent.parent)
    if raw.parent.name != session.outputs.name or not session.trace.exists():
        return None
    return session.number_cache / f"{raw.stem}.bin"


@functools.cache
def rules() -> str | None:
    """A hash of the code that reads a text (a change to it makes every cache stale);
    ``None`` where that code's files cannot be read (then nothing is kept on disk)."""
    h = hashlib.sha256(f"{FORMAT} {sys.byteorder}".encode())
    try:
        for module in (numbers, engine):
            h.update(Path(module.__file__ or "").read_bytes())
    except OSError:
        return None
    return h.hexdigest()[:16]


def _header(key: tuple[int, int], parts: Sequence[Part], counts: Sequence[int],
            lines: Sequence[int]) -> dict[str, Any]:
    return {"format": FORMAT, "rules": rules(), "size": key[0], "mtime_ns": key[1],
            "parts": [[len(text), offset, n, nl] for (text, offset), n, nl
                      in zip(parts, counts, lines, strict=True)]}


def load(cache: Path, key: tuple[int, int], parts: Sequence[Part]) -> list[Read] | None:
    """The reads kept in ``cache`` for ``parts`` of the output with ``key``, or ``None``
    when it is missing, stale or unreadable."""
    if rules() is None:
        return None
    try:
        with open(cache, "rb") as fh:
            data = fh.read()
        cut = data.index(b"\n")
        header = json.loads(data[:cut])
        data = zlib.decompress(memoryview(data)[cut + 1:])
        stored = header["parts"]
        counts = [int(p[2]) for p in stored]
        lines = [int(p[3]) for p in stored]
        if header != _header(key, parts, counts, lines):
            return None
        view, at, out = memoryview(data), 0, []
        for n, nl in zip(counts, lines, strict=True):
            arrays = []
            for code in _CODES:
                a = array(code)
                end = at + n * a.itemsize
                if end > len(data):
                    return None
                a.frombytes(view[at:end])
                arrays.append(a)
                at = end
            out.append(Read(*arrays, lines=nl))
        return out if at == len(data) else None
    except (OSError, ValueError, KeyError, TypeError, IndexError, zlib.error):
        return None


def save(cache: Path, key: tuple[int, int], parts: Sequence[Part],
         reads: Sequence[Read]) -> None:
    """Keep ``reads`` in ``cache`` (written aside and renamed: a reader sees a whole file
    or none); a folder that cannot be written keeps nothing."""
    if rules() is None:
        return
    header = _header(key, parts, [len(r.values) for r in reads], [r.lines for r in reads])
    tmp = cache.with_name(f".{cache.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        private_dir(cache.parent)
        with open(tmp, "wb", opener=private_opener) as fh:
            fh.write(json.dumps(header).encode() + b"\n")
            fh.write(zlib.compress(b"".join(a.tobytes() for r in reads for a in r.arrays()),
                                   ZLIB_LEVEL))
        os.replace(tmp, cache)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
