"""A kernel's life: start (or attach), restart, helpers, its channels, shutdown.

:class:`KernelBase` holds what a supervised kernel is between executions: its link (a
process simagent owns, :mod:`simagent.kernel.process`, or the person's kernel it
attached to, :mod:`simagent.kernel.attach`), its generation and lineage, the heartbeat
watch, and the primitives that read its channels. What happens while code runs, and the
recovery ladder's use of it, are in :mod:`simagent.kernel.supervisor`.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Self

from simagent.kernel import env_secrets, helpers, memory
from simagent.kernel.attach import AttachedLink
from simagent.kernel.connection import GONE
from simagent.kernel.ladder import (
    HEARTBEAT_GRACE_S,
    HEARTBEAT_START_S,
    INTERRUPT_GRACE_S,
    Recovery,
)
from simagent.kernel.port import KernelStartError, KernelStatus
from simagent.kernel.process import OwnedLink
from simagent.kernel.replay import ReplayBudget, read_lineage, save_lineage
from simagent.kernel.result import MODEL_TEXT_CAP
from simagent.paths import SessionPaths

KernelState = Literal["stopped", "starting", "idle", "busy", "restarting", "dead"]

#: How often a waiting ``execute`` checks that the kernel process is alive.
POLL_S = 0.1


class KernelBase:
    """A supervised Jupyter kernel whose outputs land in a session's folders.

    ``existing`` attaches to a kernel the person runs (:mod:`simagent.kernel.attach`)
    instead of starting one; everything else works the same, except that the recovery
    ladder restarts it only with the consent ``consent`` returns (a front end sets it)."""

    def __init__(
        self,
        paths: SessionPaths,
        cwd: str | os.PathLike[str] | None = None,
        kernel_name: str | None = None,
        output_cap: int = MODEL_TEXT_CAP,
        interrupt_grace_s: float = INTERRUPT_GRACE_S,
        env: dict[str, str] | None = None,
        replay: ReplayBudget | None = None,
        heartbeat_grace_s: float = HEARTBEAT_GRACE_S,
        existing: str | None = None,
        keep_secret_env: frozenset[str] | None = None,
        transport: str | None = None,
    ) -> None:
        self.paths = paths.ensure()
        #: ``memory``: cells run in this process (:mod:`simagent.kernel.memory`, the test
        #: seam); None: the environment's ``SIMAGENT_TEST_KERNEL`` decides, else a process
        self.transport = transport
        self.cwd = Path(cwd) if cwd is not None else Path.cwd()
        self.kernel_name = kernel_name
        self.existing = existing
        self.output_cap = output_cap
        self.interrupt_grace_s = interrupt_grace_s
        self.extra_env = dict(env or {})
        #: None: the kernel inherits simagent's whole environment; a set: secret-named
        #: variables are withheld but these (``process.inherited_env``)
        self.keep_secret_env = keep_secret_env
        self.state: KernelState = "stopped"
        self.death_reason = ""
        self._link: OwnedLink | AttachedLink | memory.MemoryLink | None = None
        #: one runner of code at a time; re-entrant for the ladder (``recoverable.py``)
        self.lock = threading.RLock()
        self._interrupt_at: float | None = None
        self._last_sigint = 0.0
        self._control_interrupt = False  # an attached kernel's interrupt, sent by _wait
        self._draining = False  # the cell went idle; only its reply is awaited
        self._seq = self._last_output_seq()
        #: how many times a process was started for this kernel (1 after start; +1 per
        #: restart): the state card tells a restart by a changed generation
        self.generation = 0
        self.replay_budget = replay or ReplayBudget()
        self.heartbeat_grace_s = heartbeat_grace_s
        self.lineage = read_lineage(self.paths.root, self.paths.outputs)
        #: the latest climb of the recovery ladder (None until one happened)
        self.last_recovery: Recovery | None = None
        #: asked (from the executing thread) before an attached kernel is restarted; it
        #: returns the person's answer. None: no one to ask, so the answer is no.
        self.consent: Callable[[str], bool] | None = None
        #: the connection file of the person's kernel, once attached (None: simagent's own)
        self.connection_file: Path | None = None
        #: the recovery an attached kernel needs and was not allowed (cleared when the
        #: kernel answers again); executions are refused meanwhile
        self.awaiting_consent: Recovery | None = None
        self._abandoned: str | None = None  # a cell left running in an attached kernel
        self._hb_silent_since: float | None = None
        self._started_at = 0.0  # monotonic time of the latest (re)start
        self._steps: list[dict[str, Any]] = []  # ladder steps of the running execution
        self._notice = ""  # said once, with the next result (an attached kernel's _out)
        self.death_trigger, self.replaying, self.replay_abort = "died", False, threading.Event()

    # ------------------------------------------------------------- lifecycle
    def _last_output_seq(self) -> int:
        """The last execution number on disk: its record (``<n>.json``) counts too, since
        a cell that printed nothing leaves no raw ``<n>.txt``, and a resumed session must
        not number its next cell over it."""
        nums = [int(p.stem) for p in self.paths.outputs.glob("*.*")
                if p.stem.isdigit() and p.suffix in (".txt", ".json")]
        return max(nums, default=0)

    def _new_link(self) -> OwnedLink | AttachedLink | memory.MemoryLink:
        if self.existing:
            return AttachedLink(self.existing)
        if memory.selected(self.transport):
            return memory.MemoryLink(self.paths, self.cwd, self.extra_env)
        return OwnedLink(self.paths, self.cwd, self.kernel_name, self.extra_env,
                         self.keep_secret_env)

    def _kernel_env(self) -> dict[str, str]:
        """The environment an owned kernel is started with."""
        return OwnedLink(self.paths, self.cwd, self.kernel_name, self.extra_env,
                         self.keep_secret_env).env()

    @property
    def owned(self) -> bool:
        """Whether simagent started this kernel (False: attached to the person's)."""
        return not self.existing

    @property
    def client(self) -> Any:
        return None if self._link is None else self._link.kc

    @property
    def where(self) -> str:
        """The kernel in words, for messages."""
        return (self._link or self._new_link()).where

    @property
    def on_restart(self) -> str:
        """What a restart does to an attached kernel, for the person's consent ("" for
        simagent's own: it restarts and replays)."""
        return self._link.on_restart() if isinstance(self._link, AttachedLink) else ""

    def attached_line(self) -> str:
        """Said once simagent is attached to the person's kernel ("" for its own)."""
        return self._link.attached_line() if isinstance(self._link, AttachedLink) else ""

    @property
    def gone(self) -> bool:
        """An attached kernel whose process ended (its ports refuse): nothing runs there,
        its variables went with it, and only the person can start another."""
        return isinstance(self._link, AttachedLink) and self._link.gone()

    def left_alone(self, gone: bool | None = None) -> str:
        """What the person is told when they do not let simagent restart their kernel:
        the state it is in and how simagent goes on (``gone``: already asked of the
        kernel's ports, so :meth:`status` checks them once)."""
        if self.gone if gone is None else gone:
            return (GONE.format(where=self.where) + "; start a kernel and attach to it "
                    "(simagent --resume ID --kernel latest), or /reset to try a restart")
        now = {"busy": "it is still running the cell that would not stop",
               "dead": "it does not answer (stopped, or stuck)"}.get(
                   self.state, f"it is {self.state}")
        return (f"simagent left {self.where} as it is: {now}, and its variables are "
                "untouched. simagent runs cells there again once it answers (stop the cell "
                "where it runs; if interrupts do not, only ending its process does); /reset "
                "restarts it")

    def start(self) -> None:
        """Start (or attach to) the kernel and wait until it answers (raises
        :class:`KernelStartError`)."""
        if self._link is not None:  # a dead one's sockets (and process, if simagent's)
            self._link, old = None, self._link
            old.close()
        self.state = "starting"
        link = self._new_link()
        try:
            link.start()
        except KernelStartError:
            self.state = "dead"
            link.close()
            raise
        self._link = link
        if isinstance(link, AttachedLink):
            self.connection_file = link.path  # kept after closing, for the exit line
        self._ready()

    def _ready(self) -> None:
        """A new kernel process answers: one more generation, heartbeat watched afresh."""
        self.state = "idle"
        self.death_reason = ""
        self.awaiting_consent, self._abandoned = None, None
        self.generation += 1
        self._hb_silent_since, self._started_at = None, time.monotonic()
        self._install_helpers()
        self._learn_env_secrets()

    def _learn_env_secrets(self) -> None:
        """Register the secret-named variables of the kernel's own environment for
        redaction (:mod:`simagent.kernel.env_secrets`): one silent request, nothing
        printed; each cell's reply refreshes them."""
        try:
            env_secrets.learn(self.reply(self.client.execute(
                "", silent=True, store_history=False, allow_stdin=False,
                user_expressions={env_secrets.EXPRESSION_KEY: env_secrets.EXPRESSION})))
        except Exception:  # a kernel that cannot answer it still runs code
            return

    def _process(self) -> Any:
        """The kernel's Popen, where simagent started it locally (None otherwise)."""
        return self._link.process() if isinstance(self._link, OwnedLink) else None

    def status(self) -> KernelStatus:
        """What the kernel is now, in one record (the port's only way to read it)."""
        gone = self.gone  # an attached kernel's ports, asked once
        return KernelStatus(
            state=self.state, alive=self.is_alive(), owned=self.owned, where=self.where,
            pid=self.pid, executions=self.executions, generation=self.generation,
            lineage=self.lineage, connection_file=self.connection_file, gone=gone,
            attached_line=self.attached_line(), on_restart=self.on_restart,
            left_alone=self.left_alone(gone) if not self.owned else "")

    @property
    def executions(self) -> int:
        """Executions so far in this session (the ``n`` of the latest ``_out[n]``)."""
        return self._seq

    @property
    def pid(self) -> int | None:
        return None if self._link is None else self._link.pid

    def is_alive(self) -> bool:
        return self._link is not None and self._link.is_alive()

    def exit_reason(self) -> str:
        return self._link.exit_reason() if self._link is not None else "no kernel"

    def heartbeat_ok(self) -> bool:
        """Whether the kernel answered its latest heartbeat (pinged every second)."""
        hb = getattr(self.client, "hb_channel", None)
        return hb is not None and hb.is_beating()

    def _hb_silent_s(self, now: float) -> float:
        """How long the heartbeat has been failing, as seen by these checks (counted
        from ``HEARTBEAT_START_S`` after a (re)start: until then it may read stale)."""
        if self.heartbeat_ok():
            self._hb_silent_since = None
            return 0.0
        if self._hb_silent_since is None:
            self._hb_silent_since = max(now, self._started_at + HEARTBEAT_START_S)
        return max(0.0, now - self._hb_silent_since)

    def restart(self) -> float:
        """Restart with a clean namespace (``/reset``): state is lost and a new lineage
        begins, so no later recovery replays the cells before it. Returns seconds."""
        seconds = self.respawn()
        self.last_recovery = None  # a clean kernel: no replay to tell the state card of
        self.lineage += 1
        save_lineage(self.paths.root, self.lineage)
        return seconds

    def respawn(self) -> float:
        """Restart the kernel process (state is lost, lineage kept); returns seconds.
        An attached kernel is restarted by its manager; :class:`KernelStartError` when
        it does not come back."""
        t0 = time.perf_counter()
        if self._link is None:
            self.start()
            return time.perf_counter() - t0
        self.state = "restarting"
        if not self._link.restart():
            if isinstance(self._link, AttachedLink):
                self.state, why = self._link.not_back()
                raise KernelStartError(why)
            self.shutdown()  # a fresh kernel instead (start() makes it ready, once)
            self.start()
            return time.perf_counter() - t0
        self._drain()
        self._ready()
        return time.perf_counter() - t0

    def _install_helpers(self) -> None:
        """``_out`` and figure summaries in a kernel that did not start with them
        (:mod:`simagent.kernel.helpers`); an attached kernel that keeps an ``_out`` of
        its own is told of once, with the next result."""
        if self._link is None or not self._link.needs_helpers:
            return
        code = (helpers.named_kernel_code() if self.owned
                else helpers.attach_code(self.paths.outputs))
        try:
            reply = self.reply(self.client.execute(
                code, silent=True, store_history=False, allow_stdin=False,
                user_expressions={"out": helpers.OUT_CLASS_EXPR}))
        except Exception:  # a kernel that cannot take it still runs code; markers say where
            return
        found = ((reply.get("user_expressions") or {}).get("out") or {}).get("data") or {}
        if not self.owned and helpers.ATTACHED_CLASS not in str(found.get("text/plain")):
            self._notice = ("this kernel has an `_out` of its own, which simagent left "
                            "alone: `_out[n]` does not work here; read earlier outputs from "
                            "the raw files the results name")

    def poll(self, msg_id: str) -> tuple[bool, dict | None]:
        """Wait up to one poll interval on iopub: (whether anything arrived, the message
        when it belongs to ``msg_id``). Every stream message is acked for flow control,
        whoever sent it, or a chatty abandoned cell would stall the capture. Messages of
        other requests (another client of an attached kernel) are dropped here."""
        try:
            msg = self.client.get_iopub_msg(timeout=POLL_S)
        except queue.Empty:
            return False, None
        if msg["msg_type"] == "stream":
            self._link.ack(len(msg["content"].get("text", "")))
        parent = msg["parent_header"].get("msg_id")
        if parent == self._abandoned and msg["msg_type"] == "status" and \
                msg["content"].get("execution_state") == "idle":
            self._abandoned = None  # the cell left running in an attached kernel is over
        return True, (msg if parent == msg_id else None)

    def _drain(self) -> None:
        """Drop messages left over from before a restart or an abandoned cell."""
        for get in (self.client.get_iopub_msg, self.client.get_shell_msg):
            while True:
                try:
                    get(timeout=0)
                except queue.Empty:
                    break

    def shutdown(self) -> None:
        """Shut simagent's own kernel down; from an attached one, only disconnect."""
        link, self._link = self._link, None
        if link is not None:
            link.close()
        self.state = "stopped"

    def __enter__(self) -> Self:
        if self._link is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def reply(self, msg_id: str) -> dict:
        """The execute_reply for ``msg_id`` (stale replies of abandoned cells are skipped)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                msg = self.client.get_shell_msg(timeout=POLL_S)
            except queue.Empty:
                if not self._link.is_alive():
                    return {}
                continue
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg["content"]
        return {}
