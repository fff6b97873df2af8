"""``_out[n]``: every earlier execution's output, queryable from code in the kernel.

Context layers cap, evict and clear kernel output; the full text stays on disk. Getting
it back through ``read_file`` costs a tool call and pages of tokens, while the kernel
that produced it can answer a question about it in one line and return only the answer:
``_out[12].grep("WARNING")``, ``_out[-1].tail(5)``. The supervisor writes each
execution's raw stream text to ``outputs/<n>.txt`` as it arrives and, when the execution
ends, its record (code, status, error, figures, elapsed) to ``outputs/<n>.json``; this
module reads both lazily. Nothing is read until asked for, and ``head``, ``tail`` and
``grep`` stream, so a 200 MB log costs memory only for what they return. ``_out`` is
rebuilt from the folder when the kernel (re)starts, so it survives restarts.

Standard library only: it loads in every kernel at start.
"""

from __future__ import annotations

import json
import os
import re
from collections import deque
from pathlib import Path
from typing import Any, NamedTuple

SESSION_DIR_ENV = "SIMAGENT_SESSION_DIR"  # simagent.paths.SESSION_DIR_ENV (kernel side)
#: The name users and the model type; markers and placeholders name handles with it.
HANDLE = "_out"
#: Matches ``grep`` returns at most, unless asked for more.
GREP_MAX = 200
_BLOCK = 1 << 16


def raw_name(n: int) -> str:
    """File name of execution ``n``'s raw output (the supervisor writes it)."""
    return f"{n:04d}.txt"


def record_name(n: int) -> str:
    return f"{n:04d}.json"


def handle(n: int) -> str:
    """How the model names execution ``n`` in the kernel: ``_out[12]``."""
    return f"{HANDLE}[{n}]"


def number_of(raw_path: str | os.PathLike[str] | None) -> int | None:
    """The execution number of a raw output path (``.../outputs/0012.txt`` -> 12)."""
    if not raw_path:
        return None
    path = Path(raw_path)
    return int(path.stem) if path.suffix == ".txt" and path.stem.isdigit() \
        and path.parent.name == "outputs" else None


def write_record(folder: Path, n: int, record: dict[str, Any]) -> bool:
    """Write execution ``n``'s record next to its raw output (False if the disk refused:
    ``_out[n]`` then still reads the raw text). Secrets in it (a key typed into the
    code) are redacted, and ``secret`` is set when the code was, so a replay knows the
    kept code is not what ran. Called in simagent's process only (imports lazily)."""
    return RecordFile(folder, n).write(record)


class RecordFile:
    """Execution ``n``'s record file, made before its record is known.

    Making a file is the slow part of writing a small one (~0.4 ms on an overlay
    filesystem, more under I/O load), so the supervisor makes it while the cell runs and
    the end of a short cell waits only for the write and the rename (``simagent bench
    kernel``). Until :meth:`write` it is ``<n>.json.tmp``, which no reader of records
    lists. Called in simagent's process only (imports lazily)."""

    def __init__(self, folder: Path, n: int) -> None:
        from simagent.paths import private_opener  # simagent's process only: the kernel skips it

        self.n = n
        self.path = folder / record_name(n)
        self._tmp = self.path.with_suffix(".json.tmp")
        try:
            self._fh: Any = open(self._tmp, "wb", opener=private_opener)  # noqa: SIM115 - closed by write()
        except OSError:  # said by write(), which tries once more
            self._fh = None

    def write(self, record: dict[str, Any]) -> bool:
        """Fill the file with ``record`` (see :func:`write_record`) and rename it into
        place; False if the disk refused."""
        from simagent.paths import private_opener  # simagent's process only: the kernel skips it
        from simagent.trace.redact import redact_data  # simagent's process only, as above

        clean = redact_data(record)
        if clean.get("code") != record.get("code"):
            clean["secret"] = True
        fh, self._fh = self._fh, None
        try:
            with fh or open(self._tmp, "wb", opener=private_opener) as out:
                out.write(json.dumps(clean, default=str).encode())
            os.replace(self._tmp, self.path)
            return True
        except OSError:
            return False


def install(namespace: dict[str, Any], hidden: dict[str, Any] | None = None) -> None:
    """Put ``_out`` into a kernel's user namespace (hidden from ``%who`` and name lists)."""
    outputs = Outputs.from_env()
    namespace[HANDLE] = outputs
    if hidden is not None:
        hidden[HANDLE] = outputs


class Line(NamedTuple):
    """One line of an output, with its 1-based number."""

    number: int
    text: str

    def __str__(self) -> str:
        return f"{self.number:>7}: {self.text}"


class Lines(list):
    """Numbered lines; prints one per line (``list`` otherwise)."""

    def __repr__(self) -> str:
        return "\n".join(str(x) for x in self) if self else "(no lines)"


class OutputRecord:
    """One execution: raw output (``.text``, ``.head``, ``.tail``, ``.grep``) and record."""

    def __init__(self, folder: Path, n: int) -> None:
        self.n = n
        self.path = folder / raw_name(n)
        self._meta_path = folder / record_name(n)
        self._meta: dict[str, Any] | None = None

    # ---------------------------------------------------------------- record
    @property
    def meta(self) -> dict[str, Any]:
        if self._meta is None:
            try:
                self._meta = json.loads(self._meta_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return {}  # still running, or the record could not be written
        return self._meta

    @property
    def code(self) -> str | None:
        return self.meta.get("code")

    @property
    def status(self) -> str:
        return self.meta.get("status") or "unknown"  # running, or its record was lost

    @property
    def error(self) -> str | None:
        return self.meta.get("error")

    @property
    def figures(self) -> list[str]:
        return list(self.meta.get("figures") or [])

    @property
    def elapsed(self) -> float | None:
        return self.meta.get("elapsed_s")

    @property
    def running(self) -> bool:
        return not self._meta_path.exists()

    @property
    def size(self) -> int:
        """Bytes of raw output on disk."""
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    # ---------------------------------------------------------------- text
    def _open(self) -> Any:
        # lines end at "\n" only: a progress bar's "\r" redraws stay on their line
        return open(self.path, encoding="utf-8", errors="replace", newline="\n")

    @property
    def text(self) -> str:
        """The whole raw output (read now; prefer ``grep``/``tail`` for large ones)."""
        try:
            with self._open() as fh:
                return fh.read()
        except OSError:
            return ""

    @property
    def lines(self) -> list[str]:
        """Every line as a terminal shows it (the last state of ``\r`` redraws)."""
        return [_shown(r) for r in _split(self.text)]

    def head(self, k: int = 20) -> Lines:
        """The first ``k`` lines, numbered."""
        out = Lines()
        try:
            with self._open() as fh:
                for i, line in enumerate(fh, 1):
                    if i > k:
                        break
                    out.append(Line(i, _shown(line)))
        except OSError:
            pass
        return out

    def tail(self, k: int = 20) -> Lines:
        """The last ``k`` lines, numbered (reads blocks from the end, not the whole file)."""
        if k <= 0:
            return Lines()
        try:
            with open(self.path, "rb") as fh:
                pos, data = fh.seek(0, os.SEEK_END), b""
                while pos > 0 and data.count(b"\n") <= k:
                    step = min(_BLOCK, pos)
                    pos -= step
                    fh.seek(pos)
                    data = fh.read(step) + data
        except OSError:
            return Lines()
        rows = _split(data.decode("utf-8", errors="replace"))
        if pos > 0:  # the first row may be a partial line
            rows = rows[1:]
        rows = [_shown(r) for r in rows[-k:]]
        start = self.line_count() - len(rows) + 1  # numbering streams the file once
        return Lines(Line(start + i, r) for i, r in enumerate(rows))

    def slice(self, start: int, end: int) -> Lines:
        """Lines ``start`` to ``end`` (1-based, both included), numbered; streams the file
        up to ``end`` only."""
        out = Lines()
        try:
            with self._open() as fh:
                for i, line in enumerate(fh, 1):
                    if i > end:
                        break
                    if i >= start:
                        out.append(Line(i, _shown(line)))
        except OSError:
            pass
        return out

    def line_count(self) -> int:
        """Lines in the output (streams the file once)."""
        return count_lines(self.path)

    def grep(self, pattern: str, context: int = 0, *, ignore_case: bool = False,
             max_matches: int = GREP_MAX) -> Lines:
        """Lines matching the regex ``pattern`` (with ``context`` lines around), numbered.

        Streams the file line by line; stops after ``max_matches`` matches.
        """
        rx = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
        out = Lines()
        before: deque[Line] = deque(maxlen=max(0, context))
        after = 0
        matches = 0
        last = 0
        try:
            with self._open() as fh:
                for i, raw in enumerate(fh, 1):
                    line = Line(i, _shown(raw))
                    if rx.search(line.text):
                        if matches >= max_matches:
                            break
                        matches += 1
                        out.extend(x for x in before if x.number > last)
                        out.append(line)
                        last, after = i, context
                        before.clear()
                    elif after > 0:
                        out.append(line)
                        last, after = i, after - 1
                    else:
                        before.append(line)
        except OSError:
            pass
        return out

    def __repr__(self) -> str:
        first = self.head(1)
        tail = self.tail(1) if self.size else Lines()
        parts = [f"_out[{self.n}]: {self.status}", size_text(self.size)]
        if self.elapsed is not None:
            parts.append(f"{self.elapsed:.1f} s")
        if self.figures:
            parts.append(f"{len(self.figures)} figure(s)")
        text = ", ".join(parts)
        if first:
            text += f"\n  first: {first[0].text[:100]!r}"
        if tail and tail[0].number != (first[0].number if first else 0):
            text += f"\n  last:  {tail[0].text[:100]!r}"
        if self.error:
            text += f"\n  error: {self.error.splitlines()[-1][:160]!r}"
        return text


class Outputs:
    """``_out``: ``_out[n]`` is execution ``n`` (its ``outputs/<n>.txt``); ``_out[-1]`` the
    latest finished one, ``_out[-2]`` the one before; ``len(_out)`` counts them."""

    def __init__(self, folder: str | os.PathLike[str] | None) -> None:
        self.folder = Path(folder) if folder else None

    @classmethod
    def from_env(cls) -> Outputs:
        root = os.environ.get(SESSION_DIR_ENV)
        return cls(Path(root) / "outputs" if root else None)

    def numbers(self) -> list[int]:
        """Executions with output on disk, oldest first, excluding the one running now."""
        if self.folder is None or not self.folder.is_dir():
            return []
        nums = sorted(int(p.stem) for p in self.folder.glob("*.txt") if p.stem.isdigit())
        if nums and not (self.folder / record_name(nums[-1])).exists():
            nums = nums[:-1]  # the running cell (its record comes when it ends)
        return nums

    def __getitem__(self, n: int) -> OutputRecord:
        if not isinstance(n, int):
            raise TypeError("_out takes an execution number (or -1, -2, ... for the latest)")
        nums = self.numbers()
        if n < 0:
            if -n > len(nums):
                raise IndexError(f"_out[{n}]: only {len(nums)} earlier execution(s)")
            return OutputRecord(self.folder, nums[n])  # type: ignore[arg-type]
        if self.folder is None or not (self.folder / raw_name(n)).exists():
            span = f"{nums[0]}..{nums[-1]}" if nums else "none yet"
            raise KeyError(f"_out[{n}]: no such execution (executions: {span})")
        return OutputRecord(self.folder, n)

    def __len__(self) -> int:
        return len(self.numbers())

    def __iter__(self) -> Any:
        return (OutputRecord(self.folder, n) for n in self.numbers())  # type: ignore[arg-type]

    def __repr__(self) -> str:
        nums = self.numbers()
        span = f"{nums[0]}..{nums[-1]}" if nums else "none yet"
        return (f"_out: {len(nums)} execution(s) ({span}); _out[n].tail(k), .head(k), "
                f".grep(pattern, context=0), .text, .code, .error, .figures")


def count_lines(path: str | os.PathLike[str]) -> int:
    """Lines in a raw output file, as ``_out[n]`` numbers them (0 if it cannot be read)."""
    n, last = 0, b"\n"
    try:
        with open(path, "rb") as fh:
            while block := fh.read(_BLOCK):
                n += block.count(b"\n")
                last = block[-1:]
    except OSError:
        return 0
    return n + (last != b"\n")


def _split(text: str) -> list[str]:
    rows = text.split("\n")
    return rows[:-1] if rows and rows[-1] == "" else rows


def _shown(line: str) -> str:
    """A raw line as a terminal shows it: without its newline, the last ``\r`` redraw."""
    line = line.rstrip("\n").rstrip("\r")
    if "\r" in line:
        line = next((seg for seg in reversed(line.split("\r")) if seg), "")
    return line


def size_text(n: int) -> str:
    """``12.3 MB``, ``4.0 KB``, ``17 bytes`` (also the TUI's card notes)."""
    for unit, k in (("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{n} bytes"
