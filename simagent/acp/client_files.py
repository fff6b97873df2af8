"""The client's file system as the file tools' open buffers (``agent.backend.OpenFiles``).

An editor that offers ``fs.readTextFile`` / ``fs.writeTextFile`` in ``initialize`` holds
the person's unsaved edits; ``read_file``, ``edit_file`` and ``write_file`` on a file of
the workspace then read and write through it, so the model sees what the person sees and
its change lands in the buffer (the back end decides which paths: never one confinement
would not let the tool touch on disk).

The tools run on the turn's worker thread, the connection on the event loop: each call
is sent to the loop (``run_coroutine_threadsafe``) and waited for, bounded. A read the
client fails (not found, an error, no answer) reads the disk. A write the client does
not take (JupyterLab refuses ``.ipynb`` with invalid_params) or fails goes to the disk,
and the tool's result says so; but a write the client's person denied (acpx asks before
each write, and denies without a terminal) or one it did not answer in time (its person
may still be deciding) is written nowhere, and the tool's result says why: a refusal in
the editor is not overruled on the disk. The trace records the first failed read of a
session and every write not taken (``client_files`` events); a client that does not
answer in time is not asked again in that session.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any

#: Seconds a ``fs/read_text_file`` may take before the disk is read instead.
READ_TIMEOUT_S = 10.0
#: Seconds a ``fs/write_text_file`` may take: a client may ask its person first.
WRITE_TIMEOUT_S = 120.0
#: Words of a client's error that say its person denied the write (acpx: "Permission
#: denied for fs/write_text_file").
DENIED = ("permission", "denied", "rejected")


def offered(capabilities: Any) -> tuple[bool, bool]:
    """(read, write): what the client's ``initialize`` capabilities offer of ``fs``."""
    fs = getattr(capabilities, "fs", None)
    return (bool(getattr(fs, "read_text_file", False)),
            bool(getattr(fs, "write_text_file", False)))


class ClientFiles:
    """``OpenFiles`` over one ACP session's client connection.

    ``note(payload)``: records a fallback (the host writes it to the session's trace).
    """

    def __init__(self, conn: Any, loop: asyncio.AbstractEventLoop, session_id: str, *,
                 read: bool, write: bool, note: Callable[[dict[str, Any]], None],
                 read_timeout_s: float = READ_TIMEOUT_S,
                 write_timeout_s: float = WRITE_TIMEOUT_S) -> None:
        self.conn = conn
        self.loop = loop
        self.session_id = session_id
        self.can_read = read
        self.can_write = write
        self.note = note
        self.read_timeout_s = read_timeout_s
        self.write_timeout_s = write_timeout_s
        self._read_failed = False
        self._lock = threading.Lock()

    def read(self, path: str) -> str | None:
        if not self.can_read:
            return None
        try:
            answer = self._call(lambda: self.conn.read_text_file(
                session_id=self.session_id, path=path), self.read_timeout_s)
        except Exception as exc:  # any failure of the client: the disk answers
            with self._lock:
                first, self._read_failed = not self._read_failed, True
            if first:
                self._record("read", path, exc)
            return None
        content = getattr(answer, "content", None)
        return content if isinstance(content, str) else None

    def write(self, path: str, text: str) -> bool | str:
        if not self.can_write:
            return False
        try:
            self._call(lambda: self.conn.write_text_file(
                session_id=self.session_id, path=path, content=text), self.write_timeout_s)
        except Exception as exc:
            reason = _reason(exc)
            refused = isinstance(exc, TimeoutError) or any(
                w in reason.lower() for w in DENIED)
            self.note({"op": "write", "path": path, "reason": reason,
                       "then": "refused" if refused else "disk"})
            if refused:  # the editor's no stands: not overruled on the disk
                return (f"The editor did not write {path}: {reason}. simagent did not "
                        "write it either.")
            return False
        return True

    def _call(self, make: Callable[[], Any], timeout_s: float) -> Any:
        """The client's answer to ``make()``'s request, sent from this (worker) thread
        to the loop and waited for at most ``timeout_s``; raises on any failure."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:  # waiting here would block the loop that answers
            raise RuntimeError("asked on the event loop's own thread")
        coro = make()
        try:
            fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError:  # the loop has closed: the client is gone
            coro.close()
            raise
        try:
            return fut.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            self.can_read = self.can_write = False  # not asked again this session
            raise TimeoutError(f"no answer in {timeout_s:g} s; the client's file "
                               "system is not used again in this session") from None

    def _record(self, op: str, path: str, exc: BaseException) -> None:
        self.note({"op": op, "path": path, "reason": _reason(exc), "then": "disk"})


def _reason(exc: BaseException) -> str:
    """A client error in one line: its message and, when it has them, its details
    (a JSON-RPC error's ``data``: acpx puts the words there)."""
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    data = getattr(exc, "data", None)
    if isinstance(data, dict) and len(data) == 1:
        data = next(iter(data.values()))
    return f"{reason}: {data}" if data else reason
