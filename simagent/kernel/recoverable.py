"""What the recovery ladder may do to a kernel: the port, and four things more.

The ladder (:mod:`simagent.kernel.ladder`) climbs the same steps for a kernel simagent
started, for the person's kernel it attached to and for the in-memory stand-in, so it must
not know which it drives nor reach into the supervisor's state. It used to take a wide
``Recoverable`` (fifteen attributes, thirteen methods: the session's folders, the death
bookkeeping, the jupyter client, poll and reply...). Now it takes what every layer above
takes, a :class:`~simagent.kernel.port.KernelPort` (``status()`` says whether the kernel is
simagent's, its lineage, whether it is alive; ``consent`` asks the person; ``state`` is
what the ladder sets while it restarts; ``probe_state`` reads the names back), plus the
four members of :class:`LadderKernel`, which only a restart and a replay need. The rest
goes in as plain values (a client and a pid for an interrupt step) or stays with the
supervisor: telling a dead or frozen kernel (``Kernel._lost``, ``Kernel._silent_death``)
and keeping what a climb said (``last_recovery``, ``awaiting_consent``).
``tests/test_kernel_port.py`` counts the four.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

from simagent.kernel.port import KernelPort
from simagent.kernel.replay import ReplaySource


@runtime_checkable
class LadderKernel(KernelPort, Protocol):
    """A supervised kernel, as the recovery ladder sees it (see the module docstring)."""

    #: what a replay reads and may spend (the records, the backup folder, the workspace,
    #: the budget): plain values the supervisor was built with
    replay_source: ReplaySource

    def respawn(self) -> float:
        """Restart the kernel's process, state lost and lineage kept: the ladder's
        restart, where the port's ``restart`` is ``/reset``'s (a new lineage, nothing
        replayed). Starts one if there is none; an attached kernel is restarted by its
        manager (:class:`~simagent.kernel.port.KernelStartError` when it does not come
        back). Seconds it took."""

    def run_quiet(self, code: str, timeout: float,
                  stop: threading.Event | None = None) -> tuple[str, str]:
        """Run ``code`` with its output discarded, no history entry and no ``_out``
        number: how a replay re-runs a cell (inside :meth:`hold_for_replay`). Past
        ``timeout``, or once ``stop`` is set, the cell is interrupted. Returns (status,
        error): ``ok``, ``error``, ``stopped``, ``wedged`` (it did not stop) or ``died``."""

    def hold_for_replay(self) -> AbstractContextManager[threading.Event]:
        """Hold the kernel for quiet cells, so no other cell runs in between (its lock,
        re-entrant: a climb already holds it, and ``probe_state`` takes it again to read
        the names back); meanwhile the port's ``interrupt`` (ctrl+C) stops the replay
        instead of a cell, by setting the event this yields (cleared on entry)."""
