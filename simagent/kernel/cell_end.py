"""When a cell is over: one rule for the cell wait (``Kernel._wait``) and the replay loop.

A cell ends with its iopub ``status: idle``. That message can be lost (a PUB socket
drops what a slow subscriber cannot take, a kernel can fail to send it), and a loop that
waits only for it waits forever on a kernel that finished long ago. So the shell
channel's ``execute_reply`` is read as well, without waiting: once the reply is in and
iopub has been quiet for the cell for :data:`IDLE_LOST_GRACE_S`
(or :data:`IDLE_LOST_MAX_S` passed since the reply), the cell is
over and ``idle_lost`` says its end was inferred: output sent at its very end, which would
have arrived before the idle status, may be missing.
"""

from __future__ import annotations

import queue
import time
from typing import Any

#: A cell's iopub ``status: idle`` can be lost (PUB/SUB drops under load, a kernel bug):
#: once its ``execute_reply`` is in and iopub has been quiet for it this long, the cell
#: is over anyway ...
IDLE_LOST_GRACE_S = 2.0
#: ... and at the latest this long after the reply, however chatty its threads are.
IDLE_LOST_MAX_S = 30.0

#: The reply is looked for at most this often (first this long after the request): a
#: short cell's idle comes first and its reply is then read once, where a look per
#: message cost ~0.1 ms of a ~5 ms round trip (``simagent bench kernel``).
REPLY_CHECK_S = 0.01

#: What the result says when the idle status never came (model and person read it).
IDLE_LOST_NOTICE = ("the kernel's end-of-cell message never arrived; the cell finished "
                    "(its reply came), but output printed at its very end may be missing")


class CellEnd:
    """Tracks one cell's end from its iopub messages and its shell reply."""

    def __init__(self, kc: Any, msg_id: str, grace_s: float = IDLE_LOST_GRACE_S,
                 max_s: float = IDLE_LOST_MAX_S) -> None:
        self.kc, self.msg_id = kc, msg_id
        self.grace_s, self.max_s = grace_s, max_s
        #: the cell's ``execute_reply`` content, once read
        self.reply: dict | None = None
        self.idle_lost = False
        self._reply_at = 0.0
        self._last_msg = 0.0
        self._check_at = time.monotonic() + REPLY_CHECK_S

    def saw(self, msg: dict, now: float) -> bool:
        """A message of this cell came on iopub; True when it is the idle status."""
        self._last_msg = now
        return (msg["msg_type"] == "status"
                and msg["content"].get("execution_state") == "idle")

    def over_without_idle(self, now: float) -> bool:
        """Whether the cell is over although its idle status has not come."""
        if self.reply is None:
            if now < self._check_at:
                return False
            self._check_at = now + REPLY_CHECK_S
            self.reply = self._read_reply()
            if self.reply is None:
                return False
            self._reply_at = now
        quiet_s = now - max(self._reply_at, self._last_msg)
        self.idle_lost = quiet_s >= self.grace_s or now - self._reply_at >= self.max_s
        return self.idle_lost

    def _read_reply(self) -> dict | None:
        """This cell's reply if one is waiting; stale replies of abandoned cells are
        dropped (as ``Kernel._reply`` does)."""
        while True:
            try:
                msg = self.kc.get_shell_msg(timeout=0)
            except queue.Empty:
                return None
            if msg["parent_header"].get("msg_id") == self.msg_id:
                return msg["content"]
