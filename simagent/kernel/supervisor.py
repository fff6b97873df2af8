"""The kernel supervisor: one persistent Jupyter kernel, robust to whatever user code does.

Contract (design.md §6): ``execute`` always returns an :class:`ExecResult`, whatever
happens: errors, interrupts, timeouts, a kernel that dies mid-cell (detected while
waiting, by polling the process, never by waiting out a timeout), one that freezes
(heartbeat lost), or a cell that ignores SIGINT. The last three climb the recovery
ladder (:mod:`simagent.kernel.ladder`: interrupt, control-channel interrupt, signals to
child processes, restart) and a restart replays the session's state-defining cells
(:mod:`simagent.kernel.replay`); the result's ``notice`` says what died, what came back
and what did not, ``state_lost`` is True only when something did not, and
``recovery`` holds the same as data. A cell whose end-of-cell message never comes
ends after its reply and a quiet grace (:mod:`simagent.kernel.cell_end`), flagged
``output_maybe_incomplete``. The agent layer never has to catch kernel exceptions except
:class:`KernelStartError`.

Lineage: each execution record carries the lineage id current when it ran. A clean
restart (:meth:`Kernel.restart`, ``/reset``) starts a new lineage, so cells before it
are never replayed; a crash restart keeps it. The id is kept in ``kernel.lineage`` in
the session folder, so a new process (``--continue``) can :meth:`Kernel.restore` it.

Attached kernels (``--kernel``, :mod:`simagent.kernel.attach`): the same contract, but
the kernel is the person's. Interrupts go through the control channel; the ladder never
signals, kills or restarts it unless the person agrees (``consent``): it stops, the result
says so (``recovery["needs_consent"]``), and cells are refused until the kernel answers
again. Only this session's requests are read (iopub by parent header).

Threading: ``execute`` runs in the caller's thread, one at a time. ``interrupt`` may be
called from any other thread (a UI's Ctrl+C handler) while ``execute`` waits or replays.
"""

from __future__ import annotations

import ast
import json
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from simagent.kernel import env_secrets, ladder
from simagent.kernel.capture import Capture, OnOutput
from simagent.kernel.cell_end import IDLE_LOST_NOTICE, CellEnd
from simagent.kernel.connection import GONE
from simagent.kernel.ladder import (
    INTERRUPT_RESEND_S,
    INTERRUPT_STEPS,
    KILL_WAIT_S,
    REPLAY_STOP_S,
    Recovery,
)
from simagent.kernel.lifecycle import KernelBase, KernelState
from simagent.kernel.port import KernelStartError
from simagent.kernel.replay import ReplaySource
from simagent.kernel.result import ExecResult
from simagent.kernel_api import effects
from simagent.kernel_api.outputs import RecordFile, raw_name
from simagent.kernel_api.state_probe import expression
from simagent.outcomes import NOT_RUN
from simagent.trace.redact import SECRET_NAME_PATTERN

__all__ = ["PROBE_WAIT_S", "Kernel", "KernelStartError", "KernelState"]

#: How long a state probe waits for a busy kernel before giving up (a running cell).
PROBE_WAIT_S = 2.0


class Kernel(KernelBase):
    """A supervised Jupyter kernel whose outputs land in a session's folders (see the
    module docstring; its life between executions is :class:`KernelBase`'s)."""

    #: the running execution's record file, made while its cell runs (``_write_record``)
    _record: RecordFile | None = None

    def restore(self) -> Recovery:
        """Restart (or start) the kernel and replay the current lineage (``/restore``);
        in a new process this brings back the state the previous one built."""
        with self.lock:  # what the person's names were, to say any a replay misses
            before = ladder.names_back(self.probe(None)) if self.owned else []
            rec = self._recover("restore", "")
            back = set(rec.names)
            rec.lost = [n for n in before if n not in back] if rec.survived else []
            return rec

    def probe_state(self, registry: list[dict[str, Any]] | None = None,
                    wait_s: float = PROBE_WAIT_S) -> dict[str, Any] | None:
        """The live kernel's names, imports and registry objects (``state_probe.probe``),
        read with one silent ``user_expressions`` request: no history entry, no execution
        count, nothing left in the namespace.

        None when there is no idle kernel to ask within ``wait_s`` (a cell is running, the
        kernel is dead or not started): a model call must never wait on a simulation.
        """
        if self._link is None or self.state != "idle" or not self.lock.acquire(timeout=wait_s):
            return None
        try:
            return self.probe(registry)
        finally:
            self.lock.release()

    def probe(self, registry: list[dict[str, Any]] | None) -> dict[str, Any] | None:
        """:meth:`probe_state` for a caller that holds the lock."""
        try:
            if self.client is None or not self.is_alive():
                return None
            asks = {"state": expression(registry, SECRET_NAME_PATTERN),
                    env_secrets.EXPRESSION_KEY: env_secrets.EXPRESSION}  # its secrets too
            msg_id = self.client.execute("", silent=True, store_history=False,
                                         allow_stdin=False, user_expressions=asks)
            reply = self.reply(msg_id)
            env_secrets.learn(reply)
            found = (reply.get("user_expressions") or {}).get("state") or {}
            if found.get("status") != "ok":
                return {"error": f"{found.get('ename', 'no reply')}: {found.get('evalue', '')}"}
            return json.loads(ast.literal_eval(found["data"]["text/plain"]))
        except Exception as exc:  # a probe that fails costs the card's names, not the call
            return {"error": f"{type(exc).__name__}: {exc}"[:300]}

    # ------------------------------------------------------------- interrupt
    def interrupt(self) -> None:
        """Interrupt the running cell, keeping kernel state (thread-safe).

        This is the ladder's first step (SIGINT). If the cell does not stop, the waiting
        ``execute`` escalates (:data:`ladder.INTERRUPT_STEPS`) and after
        ``interrupt_grace_s`` restarts the kernel and replays its state. While a
        recovery replays cells, an interrupt stops the replay instead. An attached kernel
        gets a control-channel interrupt and nothing more: after the grace the ladder asks.
        """
        if self.replaying:
            self.replay_abort.set()
            return
        if self.state != "busy" or self._link is None or self._draining:
            return
        now = time.monotonic()
        if self._interrupt_at is None:
            self._interrupt_at = now
        elif now - self._last_sigint < INTERRUPT_RESEND_S:
            # a burst of SIGINTs can land while the kernel sends its execute_reply,
            # which is then lost and the wait runs to its 10 s limit
            return
        self._last_sigint = now
        step = "sigint" if self.owned else "control_interrupt"  # not simagent's process
        self._steps.append({"step": step, "at_s": round(now - self._interrupt_at, 3)})
        if self.owned:
            self._link.interrupt()
        else:  # a control-channel message, sent by the waiting thread (sockets are not
            self._control_interrupt = True  # thread-safe)

    def _escalate(self, since: float) -> None:
        """Run the interrupt steps whose time has come (``since`` the first SIGINT)."""
        done = {s["step"] for s in self._steps}
        for step, at in INTERRUPT_STEPS if self.owned else ():  # the person's processes
            if step not in done and since >= at * self.interrupt_grace_s:
                self._steps.append(ladder.escalate(step, since, self.client, self.pid))

    # ---------------------------------------------------------- the ladder's
    def _recover(self, trigger: str, reason: str, **kw: Any) -> Recovery:
        """Climb the ladder (:func:`ladder.recover`, the caller holds the lock) and keep
        what it says: the latest climb (the state card's), and a person's kernel left as
        it is (not allowed, or restarted and not back while it still runs the cell) in
        ``awaiting_consent``: cells are refused until it answers again."""
        rec = ladder.recover(self, trigger, reason, **kw)
        if rec.attached and not rec.restarted and (rec.declined or rec.survived):
            self.awaiting_consent = rec
        self.last_recovery = rec
        return rec

    def _lost(self) -> tuple[str, str] | None:
        """(trigger, reason) when the idle kernel is dead or frozen, else None (the
        ladder's step 1, before a cell is sent).

        A frozen process still exists, so the heartbeat tells; a failing heartbeat is
        confirmed on the control channel (a live idle kernel answers at once; the
        heartbeat is stale for a second after a restart) before the process is killed
        (an owned one: an attached kernel is left as it is).
        """
        if self.state == "dead":  # found while a cell ran
            return self.death_trigger, self.death_reason
        if not self.is_alive():  # died while idle
            return "died", self.exit_reason()
        if self.heartbeat_ok():
            return None
        if ladder.control_request(self.client, "kernel_info_request", self.heartbeat_grace_s):
            return None
        self._kill_frozen()
        return "frozen", ladder.frozen_reason(self.heartbeat_grace_s, self.owned)

    def _kill_frozen(self) -> None:
        """SIGKILL a frozen kernel's process group (works on a stopped process) and wait
        up to :data:`ladder.KILL_WAIT_S`; never a kernel simagent does not own."""
        if not self.owned:
            return
        self._link.kill()
        deadline = time.monotonic() + KILL_WAIT_S
        while self.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)

    @property
    def replay_source(self) -> ReplaySource:
        """What a replay reads and may spend (:class:`ReplaySource`)."""
        return ReplaySource(self.paths, self.cwd, self.replay_budget)

    @contextmanager
    def hold_for_replay(self) -> Iterator[threading.Event]:
        """Hold the kernel (its lock) while the ladder runs cells quietly; meanwhile
        :meth:`interrupt` stops the replay instead of a cell, by setting the event yielded
        (cleared here first)."""
        with self.lock:
            self.replay_abort.clear()
            self.replaying = True
            try:
                yield self.replay_abort
            finally:
                self.replaying = False

    def run_quiet(self, code: str, timeout: float,
                  stop: threading.Event | None = None) -> tuple[str, str]:
        """Run ``code`` with its output discarded and no history entry or ``_out`` number
        (a replayed cell; the caller holds the lock).

        Returns (status, error): ``ok``, ``error``, ``stopped`` (ran past ``timeout`` or
        ``stop`` was set, and it stopped), ``wedged`` (it did not stop within
        :data:`ladder.REPLAY_STOP_S` of its interrupt) or ``died``.
        """
        kc = self.client
        msg_id = kc.execute(code, silent=False, store_history=False, allow_stdin=False)
        deadline = time.monotonic() + timeout
        stop_at: float | None = None
        error = ""
        end = CellEnd(kc, msg_id)
        while True:
            arrived, msg = self.poll(msg_id)
            now = time.monotonic()
            if msg is not None:
                if end.saw(msg, now):
                    break
                if msg["msg_type"] == "error":
                    c = msg["content"]
                    error = f"{c.get('ename', 'Error')}: {c.get('evalue', '')}"[:300]
            if end.over_without_idle(now):
                break
            if not arrived and not self.is_alive():
                return "died", "the kernel died while replaying it"
            if end.reply is not None:  # the cell is over; only its idle status is awaited
                continue
            if stop_at is None and (now > deadline or (stop is not None and stop.is_set())):
                stop_at = now
                self._link.interrupt()
            elif stop_at is not None and now - stop_at > REPLAY_STOP_S:
                return "wedged", f"did not stop within {REPLAY_STOP_S:g} s of an interrupt"
        reply = end.reply if end.reply is not None else self.reply(msg_id)
        if stop_at is not None:
            return "stopped", ("the user interrupted the replay"
                               if stop is not None and stop.is_set()
                               else f"ran past its {timeout:g} s replay limit")
        if error or reply.get("status", "ok") != "ok":
            return "error", error or str(reply.get("status"))
        return "ok", ""

    # --------------------------------------------------------------- execute
    def execute(self, code: str, on_output: OnOutput | None = None,
                timeout: float | None = None) -> ExecResult:
        """Run ``code`` in the kernel; see the module docstring for the guarantees.

        A kernel found dead or frozen is recovered first (restart and replay); the
        result's ``notice`` and ``recovery`` say so.
        """
        with self.lock:
            recovery = None
            if self._link is None:
                self.start()
            elif self.awaiting_consent is not None and not self._answers_again():
                held = self.awaiting_consent
                recovery = self._recover(held.trigger, held.reason)  # asks again
            elif (lost := self._lost()) is not None:
                recovery = self._recover(*lost)
            if recovery is not None and recovery.declined:  # it never ran: no result
                return ExecResult(status=NOT_RUN, state_lost=not recovery.survived,
                                  notice="not run: " + recovery.message(),
                                  recovery=recovery.to_dict())
            result = self._run(code, on_output, timeout, recovery)
            self._write_record(code, result)
            return result

    def _write_record(self, code: str, result: ExecResult) -> None:
        """Execution ``n``'s record beside its raw output, for ``_out[n]`` in the kernel
        and for replay (``lineage``, and ``effects``: what it did outside the kernel)."""
        error = result.error.text() if result.error is not None else None
        record, self._record = self._record, None
        if record is None or record.n != self._seq:
            record = RecordFile(self.paths.outputs, self._seq)
        record.write({
            "n": self._seq, "code": code, "status": result.status, "error": error,
            "figures": [str(d.path) for d in result.displays if d.path is not None],
            "elapsed_s": round(result.elapsed_s, 3), "execution_count": result.execution_count,
            "raw_chars": result.raw_chars, "notice": result.notice or None,
            "lineage": self.lineage,
            effects.KEY: effects.take(self.paths.root, self.pid, result.execution_count)})

    def _run(self, code: str, on_output: OnOutput | None, timeout: float | None,
             recovery: Recovery | None) -> ExecResult:
        result = self._wait(code, on_output, timeout, recovery)
        if result.recovery is not None:  # restarted after the grace
            return result
        if recovery is None and len(self._steps) > 1:  # escalated, and the cell stopped
            recovery = Recovery("interrupt", steps=list(self._steps),
                                seconds=time.monotonic() - (self._interrupt_at or 0.0))
            result.notice = _join(result.notice, recovery.message())
        result.recovery = recovery.to_dict() if recovery is not None else None
        return result

    def _wait(self, code: str, on_output: OnOutput | None, timeout: float | None,
              recovery: Recovery | None) -> ExecResult:
        self._seq += 1
        tag = f"{self._seq:04d}"
        cap = Capture(self.paths.outputs / raw_name(self._seq), self.paths.artifacts, tag,
                      on_output, self.output_cap)
        kc = self.client
        self._interrupt_at, self._control_interrupt = None, False
        self._steps = []
        t0 = time.monotonic()
        deadline = t0 + timeout if timeout else None
        timed_out = False
        self.state = "busy"
        msg_id = kc.execute(code, store_history=True, allow_stdin=False,
                            user_expressions=env_secrets.expressions(code))  # what it set
        self._record = RecordFile(self.paths.outputs, self._seq)  # made while it runs
        notice = _join(self._notice, recovery.message() if recovery is not None else "")
        self._notice = ""
        state_lost = recovery is not None and not recovery.state_restored
        end = CellEnd(kc, msg_id)
        try:
            while True:
                if self._control_interrupt:
                    self._control_interrupt = False
                    self._link.interrupt()
                arrived, msg = self.poll(msg_id)
                now = time.monotonic()
                if msg is not None:
                    if end.saw(msg, now):
                        break
                    if msg["msg_type"] != "status":
                        cap.handle(msg["msg_type"], msg["content"])
                if end.over_without_idle(now):
                    break
                # Checked on every iteration, not only when the kernel is quiet: a cell
                # that ignores SIGINT may keep printing. A cell whose reply is in has
                # stopped: nothing left to time out or interrupt.
                self._draining = end.reply is not None
                if deadline and not timed_out and now > deadline and not self._draining:
                    timed_out = True
                    self.interrupt()
                if self._interrupt_at is not None and not self._draining:
                    since = now - self._interrupt_at
                    if since > self.interrupt_grace_s:
                        return self._unresponsive(cap, msg_id, t0, notice, state_lost,
                                                  timed_out)
                    self._escalate(since)
                if not arrived and (dead := self._silent_death(cap, now, t0)):
                    return dead
            self._draining = True
            reply = end.reply if end.reply is not None else self.reply(msg_id)
        finally:
            self._draining = False
            if self.state == "busy" and self._abandoned is None:
                self.state = "idle"
        return self._ended(cap, reply, end, t0, notice, state_lost,
                           timeout if timed_out else None)

    def _ended(self, cap: Capture, reply: dict[str, Any], end: CellEnd, t0: float,
               notice: str, state_lost: bool, timed_out_at: float | None) -> ExecResult:
        """The result of a cell that ended (its reply in): ``timed_out_at`` is the timeout
        it ran past and was interrupted at; else interrupted, ok or error."""
        if end.idle_lost:
            notice = _join(notice, IDLE_LOST_NOTICE)
        elapsed = time.monotonic() - t0
        if reply.get("execution_count"):
            cap.execution_count = reply["execution_count"]
        env_secrets.learn(reply)
        if timed_out_at is not None:
            result = cap.result("timeout", elapsed, _join(
                notice, f"execution exceeded the {timed_out_at:g} s timeout and was "
                        f"interrupted; kernel state is kept"), state_lost)
        elif self._interrupt_at is not None:
            result = cap.result("interrupted", elapsed, _join(
                notice, "execution was interrupted; kernel state is kept"), state_lost)
        else:
            ok = reply.get("status", "ok") == "ok" and cap.error is None
            result = cap.result("ok" if ok else "error", elapsed, notice, state_lost)
        result.output_maybe_incomplete = end.idle_lost
        return result

    def _unresponsive(self, cap: Capture, msg_id: str, t0: float, notice: str,
                      state_lost: bool, timed_out: bool) -> ExecResult:
        """The cell did not stop within the grace after its interrupt: the recovery
        ladder's result (a declined restart leaves it running in the person's kernel)."""
        rec = self._recover(
            "unresponsive", f"the cell did not stop within "
            f"{self.interrupt_grace_s:g} s of the interrupt",
            steps=self._steps, started=self._interrupt_at)
        result = cap.result(
            "timeout" if timed_out else "interrupted", time.monotonic() - t0,
            _join(notice, rec.message()), state_lost or not rec.state_restored)
        result.recovery = rec.to_dict()
        if rec.declined:  # left running in the person's kernel
            self._abandoned = msg_id
        return result

    def _silent_death(self, cap: Capture, now: float, t0: float) -> ExecResult | None:
        """Nothing arrived: the result when the kernel died (a dead kernel sends nothing) or
        froze (its heartbeat stopped), else None."""
        if not self._link.is_alive():
            self.death_reason = self._link.exit_reason()
            return self._died(cap, now - t0, "died")
        if self._hb_silent_s(now) < self.heartbeat_grace_s:
            return None
        self._kill_frozen()
        self.death_reason = (
            f"the kernel process stopped answering its heartbeat for "
            f"{self.heartbeat_grace_s:g} s (frozen: stopped or wedged) and "
            f"was killed" if self.owned else GONE.format(where=self.where) if self.gone else
            f"{self.where} stopped answering its heartbeat for "
            f"{self.heartbeat_grace_s:g} s (it stopped, or is stuck)")
        return self._died(cap, now - t0, "frozen")

    def _died(self, cap: Capture, elapsed: float, trigger: str) -> ExecResult:
        self.state = "dead"
        self.death_trigger = trigger
        then = ("kernel state is lost until the next execution restarts the kernel and "
                "replays the session's state-defining cells" if self.owned else
                "simagent does not restart a kernel it does not own without asking")
        return cap.result("died", elapsed, f"{self.death_reason}; {then} "
                                           f"({self._link.log_hint()})", True)

    def _answers_again(self) -> bool:
        """Whether an attached kernel left alone for want of consent is usable again:
        the cell left running there ended, or the silent kernel answers."""
        if self._abandoned is not None:
            for _ in range(1000):  # what came meanwhile, without waiting on a quiet kernel
                try:
                    msg = self.client.get_iopub_msg(timeout=0)
                except queue.Empty:
                    break
                if (msg["parent_header"].get("msg_id") == self._abandoned
                        and msg["msg_type"] == "status"
                        and msg["content"].get("execution_state") == "idle"):
                    self._abandoned = None
            back = self._abandoned is None
        else:
            back = self.heartbeat_ok() and ladder.control_request(
                self.client, "kernel_info_request") is not None
        if back:
            self.awaiting_consent, self.state, self.death_reason = None, "idle", ""
        return back

def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)
