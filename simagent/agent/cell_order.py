"""Cells asked for in one model message run in the order the model wrote them.

A model that writes two ``run_python`` calls in one message means "this, then that": the
second cell often reads what the first defines. The graph runs a message's tool calls on
parallel threads, and whichever thread reached the kernel first ran first, so the second
cell could run before the first (seen: ``y = 2`` ran, then the cell before it; a test of
a kernel dying mid-cell failed half its runs on that race). The kernel runs one cell at a
time anyway, so ordering costs nothing: each call waits until the calls before it in its
message have finished.

A call before it that never starts (approval rejected it, or the graph answered it some
other way) is waited for only :data:`UNSEEN_GRACE_S`: the message's calls start within
milliseconds of each other. A cancel ends every wait at once (``Session.execute`` then
refuses the cell).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

#: How long a call waits for an earlier call of its message that has not started.
UNSEEN_GRACE_S = 1.0
_POLL_S = 0.05


def calls_before(messages: Sequence[Any], call_id: str, name: str) -> list[str]:
    """Ids of the ``name`` calls written before ``call_id`` in the message that asked for
    it (the latest AI message holding it); [] when it is not found."""
    for message in reversed(messages):
        calls = getattr(message, "tool_calls", None) or []
        ids = [c.get("id") for c in calls if c.get("name") == name]
        if call_id in ids:
            return [i for i in ids[:ids.index(call_id)] if i]
    return []


class CellOrder:
    """One per session's ``run_python``: who has started and who has finished."""

    def __init__(self, cancelled: Callable[[], bool] = lambda: False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._cancelled, self._clock = cancelled, clock
        self._changed = threading.Condition()
        self._started: set[str] = set()
        self._done: set[str] = set()

    @contextmanager
    def turn(self, call_id: str, earlier: Sequence[str]) -> Iterator[None]:
        """Wait for ``earlier`` (see the module docstring), run the body, mark it done."""
        unseen_until = self._clock() + UNSEEN_GRACE_S
        with self._changed:
            self._started.add(call_id)
            self._changed.notify_all()
            while not self._cancelled() and any(
                    c not in self._done and (c in self._started or self._clock() < unseen_until)
                    for c in earlier):
                self._changed.wait(_POLL_S)
        try:
            yield
        finally:
            with self._changed:
                self._done.add(call_id)
                self._changed.notify_all()
