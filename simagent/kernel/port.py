"""The kernel as the layers above it see it: eight methods and one status record.

The session, the agent's tools, the front ends and the bench hold a kernel through
:class:`KernelPort` and nothing wider. Behind it sits one supervisor
(:class:`simagent.kernel.supervisor.Kernel`: capture, raw files, ``_out[n]``, timeouts,
the recovery ladder) over one of three transports, the way httpx puts one ``Client`` over
interchangeable transports:

- a kernel process simagent starts (:mod:`simagent.kernel.process`),
- the person's running kernel it attached to (:mod:`simagent.kernel.attach`),
- cells run in this process (:mod:`simagent.kernel.memory`): the seam tests of the layers
  above use, so they need no kernel process.

Why a port at all: the link used to be ``OwnedLink | AttachedLink`` reached through the
supervisor's attributes (``where``, ``owned``, ``gone``, ``on_restart``, ``pid``...), so
every front end knew which kind of kernel it had and how to ask. Now what a front end may
ask is :meth:`KernelPort.status`, one frozen record (and ``state`` alone), and what it may
do is the other seven methods; ``make lint`` keeps every layer above the kernel from
importing the transports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from simagent.kernel.capture import OnOutput
    from simagent.kernel.ladder import Recovery
    from simagent.kernel.result import ExecResult


class KernelStartError(RuntimeError):
    """The kernel did not start or attach (the message says why and where its log is)."""


@dataclass(frozen=True)
class KernelStatus:
    """What a front end may read of a kernel at one moment (:meth:`KernelPort.status`)."""

    #: ``stopped``, ``starting``, ``idle``, ``busy``, ``restarting`` or ``dead``
    state: str
    #: the kernel answers (its process, or its in-memory worker, is there)
    alive: bool
    #: simagent started it (False: the person's kernel, attached)
    owned: bool
    #: the kernel in words, for messages ("kernel 'simagent-python'")
    where: str
    #: its process id where simagent knows it (None: attached elsewhere, or in memory)
    pid: int | None
    #: executions so far in this session (the ``n`` of the latest ``_out[n]``)
    executions: int
    #: processes started for it so far (a restart adds one)
    generation: int
    #: the replay lineage (``/reset`` begins a new one)
    lineage: int
    #: the person's kernel's connection file, once attached (None: simagent's own)
    connection_file: Path | None
    #: an attached kernel whose process ended: only the person can start another
    gone: bool
    #: said once attached to the person's kernel ("" for simagent's own)
    attached_line: str
    #: what a restart does to an attached kernel, for the person's consent ("" if owned)
    on_restart: str
    #: what the person is told when they do not let simagent restart their kernel
    left_alone: str


@runtime_checkable
class KernelPort(Protocol):
    """A supervised kernel, as everything above the kernel layer uses it."""

    #: :attr:`KernelStatus.state`, readable alone: a status bar polls it many times a
    #: second, and a whole :meth:`status` may ask an attached kernel's ports
    state: str
    #: asked (from the executing thread) before an attached kernel is restarted; returns
    #: the person's answer. None: no one to ask, so the answer is no.
    consent: Callable[[str], bool] | None

    def start(self) -> None:
        """Start (or attach to) the kernel and wait until it answers
        (:class:`KernelStartError` when it does not)."""

    def execute(self, code: str, on_output: OnOutput | None = None,
                timeout: float | None = None) -> ExecResult:
        """Run ``code``; ``on_output`` receives each output event as it arrives. A kernel
        found dead or frozen is recovered first; the result says so."""

    def interrupt(self) -> None:
        """Stop the running cell (escalating while it does not stop)."""

    def restart(self) -> float:
        """A clean namespace (``/reset``): state lost, a new lineage. Seconds it took."""

    def restore(self) -> Recovery:
        """Restart and replay the current lineage's state-defining cells (``/restore``)."""

    def probe_state(self, registry: list[dict[str, Any]] | None = None,
                    wait_s: float = ...) -> dict[str, Any] | None:
        """The kernel's variables and registered simulator objects, for the state card;
        None when it cannot answer now (busy, dead)."""

    def status(self) -> KernelStatus:
        """What the kernel is now (:class:`KernelStatus`)."""

    def shutdown(self) -> None:
        """Shut simagent's own kernel down; from an attached one, only disconnect."""
