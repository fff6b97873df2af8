"""Turns the user gave up on while the graph was blocked, and the guard that keeps them
from writing afterwards.

ctrl+C must give the prompt back within a second or two. A cell stops on a kernel
interrupt, but a model call cannot be stopped from outside: a provider that thinks
for a minute before its first token, or a stalled connection, holds the graph's thread
in a socket read that no flag or signal reaches. So ``TurnRunner`` runs the graph on a
pump thread and, when a cancelled turn does not stop within ``ABANDON_AFTER_S``, returns
without it: the turn is *abandoned*.

The pump goes on until the blocked call returns; a streaming model client ends it at the
reply's next chunk (:func:`check_abandoned`), closing the stream so that a server which
generates only for the connection (llama.cpp's) stops too. Its late reply must not land in the
thread's state, where a newer turn may be running by then. Each graph run carries its
turn number in a context variable (langgraph and langchain copy the context into the
threads that run nodes and tools); ``AbandonGuard``, the outermost middleware of every
agent, raises ``TurnAbandoned`` before and after each model and tool call of an
abandoned turn. The node fails, so langgraph writes no checkpoint for that step, and
the next turn goes on from the last one the abandoned turn completed (deepagents
patches any tool call left without an answer). The tokens the late call used are still
counted: the recorder, inside the guard, has seen the call by then.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import threading

#: How long a cancelled turn may take to stop before it is abandoned (seconds).
ABANDON_AFTER_S = 1.5

#: The graph run the calling context belongs to: its registry and turn number.
_CURRENT: contextvars.ContextVar[tuple[TurnRegistry, int] | None] = contextvars.ContextVar(
    "simagent_turn", default=None)


class TurnAbandoned(BaseException):
    """Ends a graph run the user abandoned.

    A ``BaseException`` (like ``KeyboardInterrupt``), so no tool or middleware error
    handler turns it into a message that would then be written to the state.
    """


#: Pump threads of abandoned turns, process-wide: ``exit_process`` must not wait on them.
_LINGERING: list[threading.Thread] = []


def lingering() -> list[threading.Thread]:
    """Abandoned turns' pumps still blocked in a model call."""
    return [t for t in _LINGERING if t.is_alive()]


def exit_process(code: int) -> None:
    """End the process with ``code`` without waiting for an abandoned model call.

    Python joins thread-pool workers at exit, and langgraph runs nodes on one: a call
    that never answers would hold the exit for as long as the provider's timeout. The
    session is closed by then (trace and checkpoints written), so nothing is lost.
    """
    if lingering():
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)
    sys.exit(code)


class TurnRegistry:
    """Numbers graph runs and remembers the abandoned ones (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = 0
        self._abandoned: set[int] = set()

    def begin(self) -> int:
        with self._lock:
            self._last += 1
            return self._last

    def abandon(self, turn: int, pump: threading.Thread | None = None) -> None:
        with self._lock:
            self._abandoned.add(turn)
        if pump is not None:
            _LINGERING[:] = [*lingering(), pump]

    def is_abandoned(self, turn: int | None) -> bool:
        with self._lock:
            return turn is not None and turn in self._abandoned

    def bind(self, turn: int) -> None:
        """Mark the calling thread's context as running ``turn`` of this registry."""
        _CURRENT.set((self, turn))

    def _current(self) -> int | None:
        """The turn of this registry the calling context runs, if any."""
        bound = _CURRENT.get()
        return bound[1] if bound is not None and bound[0] is self else None

    def current_abandoned(self) -> bool:
        """Whether the calling context runs a turn of this registry that was abandoned."""
        return self.is_abandoned(self._current())

    def check(self) -> None:
        """Raise ``TurnAbandoned`` inside a run of an abandoned turn; else nothing."""
        turn = self._current()
        if self.is_abandoned(turn):
            raise TurnAbandoned(f"turn {turn} was abandoned")


def check_abandoned() -> None:
    """Raise ``TurnAbandoned`` when the calling context runs an abandoned turn, whichever
    registry numbered it. For the code that holds no registry but can stop an abandoned
    call's work: a model client closes its reply stream with it, so the server stops
    generating (``simagent.compatible_chat``)."""
    bound = _CURRENT.get()
    if bound is not None:
        bound[0].check()
