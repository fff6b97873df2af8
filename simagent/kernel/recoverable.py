"""What the recovery ladder may do to a kernel: the one interface between the two.

The ladder (:mod:`simagent.kernel.ladder`) climbs the same steps for a kernel simagent
started and for one it attached to (:mod:`simagent.kernel.attach`), so it must not know
which class it drives nor reach into private state: it did (``Kernel._poll``,
``_probe``, ``_reply`` and the supervisor's ``_death_reason``), which made ladder and
supervisor import each other. This protocol names each operation the ladder uses, and
``owned`` says whether it may restart the kernel at all (an attached kernel is the
person's: the ladder asks through :meth:`Recoverable.may_restart` first).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Protocol

from simagent.kernel.replay import ReplayBudget
from simagent.paths import SessionPaths


class Recoverable(Protocol):
    """A supervised kernel, as the recovery ladder sees it."""

    paths: SessionPaths
    cwd: Path
    state: str
    death_reason: str
    #: what found the kernel dead while a cell ran: ``died`` or ``frozen``
    death_trigger: str
    heartbeat_grace_s: float
    replay_budget: ReplayBudget
    lineage: int
    last_recovery: Any
    #: a recovery the person did not agree to (an attached kernel), until it answers
    awaiting_consent: Any
    #: True while a recovery replays cells; ``replay_abort`` set stops the replay
    replaying: bool
    replay_abort: threading.Event
    #: held by whoever runs code in the kernel (one at a time)
    lock: threading.Lock

    @property
    def owned(self) -> bool:
        """Whether simagent started this kernel (and so may restart or kill it)."""

    @property
    def client(self) -> Any:
        """The jupyter_client ``BlockingKernelClient`` talking to the kernel."""

    @property
    def pid(self) -> int | None:
        """The kernel's process id where simagent knows it (its own kernel)."""

    def is_alive(self) -> bool: ...

    def heartbeat_ok(self) -> bool: ...

    def exit_reason(self) -> str:
        """Why the kernel is gone, in words (signal, exit code, silence)."""

    def poll(self, msg_id: str) -> tuple[bool, dict | None]:
        """One poll interval on iopub: (anything arrived, the message if ``msg_id``'s)."""

    def reply(self, msg_id: str) -> dict:
        """The shell reply to ``msg_id`` (bounded wait; ``{}`` when none came)."""

    def probe(self, registry: list[dict[str, Any]] | None) -> dict[str, Any] | None:
        """A state probe for a caller that holds ``lock``."""

    def respawn(self) -> float:
        """Restart the kernel process (state lost, lineage kept); seconds it took."""

    def interrupt_process(self) -> None:
        """Interrupt whatever the kernel runs (signal, or control channel)."""

    def kill_process(self) -> None:
        """SIGKILL the kernel's process group (an owned kernel only; else nothing)."""

    def may_restart(self, reason: str) -> bool:
        """Whether the kernel may be restarted: always for an owned one; for an attached
        one, the person's answer (False where no one can be asked)."""
