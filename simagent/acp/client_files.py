"""The client's file system as the file tools' open buffers (``agent.backend.OpenFiles``).

An editor that offers ``fs.readTextFile`` / ``fs.writeTextFile`` in ``initialize`` holds
the person's unsaved edits; ``read_file``, ``edit_file`` and ``write_file`` on a file of
the workspace then read and write through it, so the model sees what the person sees and
its change lands in the buffer (the back end decides which paths: never one confinement
would not let the tool touch on disk).

The tools run on the turn's worker thread, the connection on the event loop: each call
is sent to the loop (``run_coroutine_threadsafe``) and waited for, bounded by
``CALL_TIMEOUT_S``. A read the client fails (not found, an error, no answer) reads the
disk; a write it refuses (JupyterLab refuses ``.ipynb``) or fails goes to the disk, and
the tool's result says so. The trace records the first failed read of a session and
every write that went to the disk (``client_files`` events); a client that does not
answer in time is not asked again in that session.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any

#: Seconds one ``fs/*`` request may take before the disk is used instead.
CALL_TIMEOUT_S = 10.0


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
                 timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.conn = conn
        self.loop = loop
        self.session_id = session_id
        self.can_read = read
        self.can_write = write
        self.note = note
        self.timeout_s = timeout_s
        self._read_failed = False
        self._lock = threading.Lock()

    def read(self, path: str) -> str | None:
        if not self.can_read:
            return None
        try:
            answer = self._call(lambda: self.conn.read_text_file(
                session_id=self.session_id, path=path))
        except Exception as exc:  # any failure of the client: the disk answers
            with self._lock:
                first, self._read_failed = not self._read_failed, True
            if first:
                self._record("read", path, exc)
            return None
        content = getattr(answer, "content", None)
        return content if isinstance(content, str) else None

    def write(self, path: str, text: str) -> bool:
        if not self.can_write:
            return False
        try:
            self._call(lambda: self.conn.write_text_file(
                session_id=self.session_id, path=path, content=text))
        except Exception as exc:  # refused or failed: the disk takes it
            self._record("write", path, exc)
            return False
        return True

    def _call(self, make: Callable[[], Any]) -> Any:
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
            return fut.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            self.can_read = self.can_write = False  # not asked again this session
            raise TimeoutError(f"no answer in {self.timeout_s:g} s; the client's file "
                               "system is not used again in this session") from None

    def _record(self, op: str, path: str, exc: BaseException) -> None:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        data = getattr(exc, "data", None)
        if data:
            reason = f"{reason}: {data}"
        self.note({"op": op, "path": path, "reason": reason, "then": "disk"})
