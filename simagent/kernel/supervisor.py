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

Threading: ``execute`` runs in the caller's thread, one at a time. ``interrupt`` may be
called from any other thread (a UI's Ctrl+C handler) while ``execute`` waits or replays.
"""

from __future__ import annotations

import ast
import json
import os
import queue
import signal
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Literal

from simagent.kernel import ladder
from simagent.kernel.capture import Capture, OnOutput
from simagent.kernel.cell_end import IDLE_LOST_NOTICE, CellEnd
from simagent.kernel.ladder import (
    HEARTBEAT_GRACE_S,
    HEARTBEAT_START_S,
    INTERRUPT_GRACE_S,
    INTERRUPT_RESEND_S,
    INTERRUPT_STEPS,
    Recovery,
)
from simagent.kernel.launcher import FLOW_ENV, FlowAck
from simagent.kernel.replay import ReplayBudget, read_lineage, save_lineage
from simagent.kernel.result import MODEL_TEXT_CAP, ExecResult
from simagent.kernel_api.outputs import raw_name
from simagent.paths import (
    SESSION_DIR_ENV,
    SessionPaths,
    kernelspec_dir,
    private_dir,
    private_opener,
    write_private,
)

KernelState = Literal["stopped", "starting", "idle", "busy", "restarting", "dead"]

#: How often a waiting ``execute`` checks that the kernel process is alive.
_POLL_S = 0.1
#: How long a state probe waits for a busy kernel before giving up (a running cell).
PROBE_WAIT_S = 2.0
_STARTUP_TIMEOUT_S = 60.0
_READY_STEP_S = 5.0
#: Starts tried when the kernel's ports were taken between their pick and its bind.
_PORT_CLASH_TRIES = 3
_DEFAULT_SPEC = "simagent-python"
#: Environment variables the kernel must not inherit: pytest's disables fd capture.
_SCRUB_ENV = ("PYTEST_CURRENT_TEST",)
#: ipykernel's start-up warning: in every log, never the cause (tokens the model pays for).
_LOG_NOISE = "running over TCP without encryption"


class KernelStartError(RuntimeError):
    """The kernel could not be started; the message says why and where the log is."""


def default_kernelspec() -> Path:
    """Write the kernelspec of simagent's own Python kernel (this interpreter + launcher)."""
    spec_dir = kernelspec_dir() / _DEFAULT_SPEC
    spec = {
        "argv": [sys.executable, "-m", "simagent.kernel.launcher", "-f", "{connection_file}"],
        "display_name": "Python (simagent)",
        "language": "python",
        "interrupt_mode": "signal",
        "metadata": {"debugger": False},
    }
    text = json.dumps(spec, indent=1)
    path = spec_dir / "kernel.json"
    if not path.exists() or path.read_text() != text:
        private_dir(spec_dir)
        write_private(path, text)
    return spec_dir.parent


def _death_reason(code: int | None) -> str:
    if code is None:
        return "the kernel process stopped responding"
    if code < 0:
        sig = -code
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        hint = {
            signal.SIGSEGV: " (segmentation fault in native code)",
            signal.SIGKILL: " (often the out-of-memory killer)",
            signal.SIGABRT: " (aborted by native code)",
            signal.SIGBUS: " (bus error in native code)",
        }.get(sig, "")
        return f"the kernel was killed by {name}{hint}"
    return f"the kernel process exited with code {code}"


class Kernel:
    """A supervised Jupyter kernel whose outputs land in a session's folders."""

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
    ) -> None:
        self.paths = paths.ensure()
        self.cwd = Path(cwd) if cwd is not None else Path.cwd()
        self.kernel_name = kernel_name
        self.output_cap = output_cap
        self.interrupt_grace_s = interrupt_grace_s
        self.extra_env = dict(env or {})
        self.state: KernelState = "stopped"
        self.death_reason = ""
        self._km = None
        self._kc = None
        self._log: IO[bytes] | None = None
        self._lock = threading.Lock()
        self._interrupt_at: float | None = None
        self._last_sigint = 0.0
        self._draining = False  # the cell went idle; only its reply is awaited
        self._seq = self._last_output_seq()
        self._flow: FlowAck | None = None
        #: how many times a process was started for this kernel (1 after start; +1 per
        #: restart): the state card tells a restart by a changed generation
        self.generation = 0
        self.replay_budget = replay or ReplayBudget()
        self.heartbeat_grace_s = heartbeat_grace_s
        self.lineage = read_lineage(self.paths.root, self.paths.outputs)
        #: the latest climb of the recovery ladder (None until one happened)
        self.last_recovery: Recovery | None = None
        self._hb_silent_since: float | None = None
        self._started_at = 0.0  # monotonic time of the latest (re)start
        self._steps: list[dict[str, Any]] = []  # ladder steps of the running execution
        self._death_trigger, self._replaying, self._replay_abort = "died", False, threading.Event()

    # ------------------------------------------------------------- lifecycle
    def _last_output_seq(self) -> int:
        """The last execution number on disk: its record (``<n>.json``) counts too, since
        a cell that printed nothing leaves no raw ``<n>.txt``, and a resumed session must
        not number its next cell over it."""
        nums = [int(p.stem) for p in self.paths.outputs.glob("*.*")
                if p.stem.isdigit() and p.suffix in (".txt", ".json")]
        return max(nums, default=0)

    def _kernel_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _SCRUB_ENV}
        env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
        env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
        env[SESSION_DIR_ENV] = str(self.paths.root)
        if self._flow is not None:
            env[FLOW_ENV] = str(self._flow.path)
        env.update(self.extra_env)
        return env

    def start(self) -> None:
        """Start the kernel and wait until it answers (raises :class:`KernelStartError`)."""
        from jupyter_client.kernelspec import KernelSpecManager
        from jupyter_client.manager import KernelManager

        self.state = "starting"
        if self._log is None:
            self._log = open(self.paths.kernel_log, "ab", buffering=0,  # noqa: SIM115 - kernel's life
                             opener=private_opener)
        if self.kernel_name:
            km = KernelManager(kernel_name=self.kernel_name)
        else:
            if self._flow is None:
                self._flow = FlowAck(self.paths.root / "kernel.flow")
            self._flow.reset()
            ksm = KernelSpecManager(kernel_dirs=[str(default_kernelspec())])
            km = KernelManager(kernel_name=_DEFAULT_SPEC, kernel_spec_manager=ksm)
        for attempt in range(_PORT_CLASH_TRIES):
            log_at = self._log.tell()
            try:
                km.start_kernel(cwd=str(self.cwd), env=self._kernel_env(),
                                stdout=self._log, stderr=self._log)
                kc = km.client()
                kc.start_channels()
                self._wait_ready(kc, log_at)
                break
            except Exception as exc:
                self.state = "dead"
                try:
                    km.shutdown_kernel(now=True)
                except Exception:
                    pass
                if self._port_clash(log_at) and attempt + 1 < _PORT_CLASH_TRIES:
                    km = KernelManager(kernel_name=km.kernel_name,
                                       kernel_spec_manager=km.kernel_spec_manager)
                    self.state = "starting"
                    continue  # new ports: another process took one between pick and bind
                raise KernelStartError(
                    f"kernel {self.kernel_name or _DEFAULT_SPEC!r} could not start: {exc}; "
                    f"{self._log_hint()}") from exc
        self._km, self._kc = km, kc
        self._ready()

    def _port_clash(self, log_at: int) -> bool:
        """Whether the kernel started at log offset ``log_at`` failed to bind a port.

        jupyter_client picks free TCP ports and the kernel binds them a moment later, so
        another process starting a kernel (a second test worker, a bench beside the
        session) can take one in between; the cure is fresh ports, not a failure."""
        try:
            with open(self.paths.kernel_log, "rb") as fh:
                fh.seek(log_at)
                return b"Address already in use" in fh.read()
        except OSError:
            return False

    def _wait_ready(self, kc: Any, log_at: int) -> None:
        """``wait_for_ready`` in short steps, so a kernel that failed to bind its ports
        (and lingers without answering) is retried at once instead of after the full
        start-up timeout."""
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        while True:
            step = min(_READY_STEP_S, max(0.1, deadline - time.monotonic()))
            try:
                kc.wait_for_ready(timeout=step)
                return
            except RuntimeError as exc:  # died, or did not answer within the step
                if ("didn't respond" not in str(exc) or self._port_clash(log_at)
                        or time.monotonic() >= deadline):
                    raise

    def _ready(self) -> None:
        """A new kernel process answers: one more generation, heartbeat watched afresh."""
        self.state = "idle"
        self.death_reason = ""
        self.generation += 1
        self._hb_silent_since, self._started_at = None, time.monotonic()
        self._install_outputs()

    def _process(self):
        """The kernel's Popen, where the provisioner is local (None otherwise)."""
        return getattr(getattr(self._km, "provisioner", None), "process", None)

    @property
    def executions(self) -> int:
        """Executions so far in this session (the ``n`` of the latest ``_out[n]``)."""
        return self._seq

    @property
    def pid(self) -> int | None:
        return getattr(self._process(), "pid", None)

    def is_alive(self) -> bool:
        return self._km is not None and self._km.is_alive()

    def _exit_code(self) -> int | None:
        proc = self._process()
        return None if proc is None else proc.poll()

    def heartbeat_ok(self) -> bool:
        """Whether the kernel answered its latest heartbeat (pinged every second)."""
        hb = getattr(self._kc, "hb_channel", None)
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
        seconds = self._respawn()
        self.last_recovery = None  # a clean kernel: no replay to tell the state card of
        self.lineage += 1
        save_lineage(self.paths.root, self.lineage)
        return seconds

    def restore(self) -> Recovery:
        """Restart (or start) the kernel and replay the current lineage (``/restore``);
        in a new process this brings back the state the previous one built."""
        with self._lock:
            return ladder.recover(self, "restore", "")

    def _respawn(self) -> float:
        """Restart the kernel process (state is lost, lineage kept); returns seconds."""
        t0 = time.perf_counter()
        if self._km is None:
            self.start()
            return time.perf_counter() - t0
        self.state = "restarting"
        if self._flow is not None:
            self._flow.reset()
        # the restart kills the kernel's process group; children that left it would outlive it
        ladder.signal_descendants(self.pid, signal.SIGKILL)
        try:
            self._km.restart_kernel(now=True)
            self._kc.wait_for_ready(timeout=_STARTUP_TIMEOUT_S)
        except Exception:  # a fresh kernel instead (start() makes it ready, once)
            self.shutdown()
            self.start()
            return time.perf_counter() - t0
        self._drain()
        self._ready()
        return time.perf_counter() - t0

    def probe_state(self, registry: list[dict[str, Any]] | None = None,
                    wait_s: float = PROBE_WAIT_S) -> dict[str, Any] | None:
        """The live kernel's names, imports and registry objects (``state_probe.probe``),
        read with one silent ``user_expressions`` request: no history entry, no execution
        count, nothing left in the namespace.

        None when there is no idle kernel to ask within ``wait_s`` (a cell is running, the
        kernel is dead or not started): a model call must never wait on a simulation.
        """
        if self._km is None or self.state != "idle" or not self._lock.acquire(timeout=wait_s):
            return None
        try:
            return self._probe(registry)
        finally:
            self._lock.release()

    def _probe(self, registry: list[dict[str, Any]] | None) -> dict[str, Any] | None:
        """:meth:`probe_state` for a caller that holds the lock."""
        try:
            if self._kc is None or not self.is_alive():
                return None
            from simagent.kernel_api.state_probe import expression

            msg_id = self._kc.execute("", silent=True, store_history=False, allow_stdin=False,
                                      user_expressions={"state": expression(registry)})
            reply = self._reply(msg_id)
            found = (reply.get("user_expressions") or {}).get("state") or {}
            if found.get("status") != "ok":
                return {"error": f"{found.get('ename', 'no reply')}: {found.get('evalue', '')}"}
            return json.loads(ast.literal_eval(found["data"]["text/plain"]))
        except Exception as exc:  # a probe that fails costs the card's names, not the call
            return {"error": f"{type(exc).__name__}: {exc}"[:300]}

    def _install_outputs(self) -> None:
        """``_out`` in a kernel started by name. simagent's own kernel installs it at start
        (the launcher); another kernel may run in an environment without simagent, so it
        gets the (standard-library-only) module's source in one silent cell."""
        if not self.kernel_name or self._kc is None:
            return
        from simagent.kernel_api import effects, figures, outputs

        code = "import types as _simagent_t, sys as _simagent_s\n"
        for module, name, call in (
                (outputs, "simagent_outputs", "(get_ipython().user_ns, "
                                              "get_ipython().user_ns_hidden)"),
                (figures, "simagent_figures", "(get_ipython())"),  # figure data summaries
                (effects, "simagent_effects", "(get_ipython())")):  # what cells do outside
            source = Path(module.__file__).read_text(encoding="utf-8")
            code += (f"_simagent_m = _simagent_t.ModuleType({name!r})\n"
                     f"exec(compile({source!r}, {name!r}, 'exec'), _simagent_m.__dict__)\n"
                     f"_simagent_s.modules[{name!r}] = _simagent_m\n"
                     f"_simagent_m.install{call}\n")
        code += "del _simagent_t, _simagent_s, _simagent_m\n"
        try:
            self._reply(self._kc.execute(code, silent=True, store_history=False,
                                         allow_stdin=False))
        except Exception:  # a kernel that cannot take it still runs code; markers say where
            pass

    def _poll(self, msg_id: str) -> tuple[bool, dict | None]:
        """Wait up to one poll interval on iopub: (whether anything arrived, the message
        when it belongs to ``msg_id``). Every stream message is acked for flow control,
        whoever sent it, or a chatty abandoned cell would stall the capture."""
        try:
            msg = self._kc.get_iopub_msg(timeout=_POLL_S)
        except queue.Empty:
            return False, None
        if msg["msg_type"] == "stream" and self._flow is not None:
            self._flow.ack(len(msg["content"].get("text", "")))
        return True, (msg if msg["parent_header"].get("msg_id") == msg_id else None)

    def _drain(self) -> None:
        """Drop messages left over from before a restart or an abandoned cell."""
        for get in (self._kc.get_iopub_msg, self._kc.get_shell_msg):
            while True:
                try:
                    get(timeout=0)
                except queue.Empty:
                    break

    def shutdown(self) -> None:
        km, kc = self._km, self._kc
        self._km = self._kc = None
        if kc is not None:
            try:
                kc.stop_channels()
            except Exception:
                pass
        if km is not None:
            try:
                km.shutdown_kernel(now=True)
            except Exception:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._flow is not None:
            self._flow.close()
            self._flow = None
        self.state = "stopped"

    def __enter__(self) -> Kernel:
        if self._km is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------- interrupt
    def interrupt(self) -> None:
        """Interrupt the running cell, keeping kernel state (thread-safe).

        This is the ladder's first step (SIGINT). If the cell does not stop, the waiting
        ``execute`` escalates (:data:`ladder.INTERRUPT_STEPS`) and after
        ``interrupt_grace_s`` restarts the kernel and replays its state. While a
        recovery replays cells, an interrupt stops the replay instead.
        """
        if self._replaying:
            self._replay_abort.set()
            return
        if self.state != "busy" or self._km is None or self._draining:
            return
        now = time.monotonic()
        if self._interrupt_at is None:
            self._interrupt_at = now
        elif now - self._last_sigint < INTERRUPT_RESEND_S:
            # a burst of SIGINTs can land while the kernel sends its execute_reply,
            # which is then lost and the wait runs to its 10 s limit
            return
        self._last_sigint = now
        self._steps.append({"step": "sigint", "at_s": round(now - self._interrupt_at, 3)})
        try:
            self._km.interrupt_kernel()
        except Exception:
            pass

    def _escalate(self, since: float) -> None:
        """Run the interrupt steps whose time has come (``since`` the first SIGINT)."""
        done = {s["step"] for s in self._steps}
        for step, at in INTERRUPT_STEPS:
            if step not in done and since >= at * self.interrupt_grace_s:
                self._steps.append(ladder.escalate(self, step, since))

    # --------------------------------------------------------------- execute
    def execute(self, code: str, on_output: OnOutput | None = None,
                timeout: float | None = None) -> ExecResult:
        """Run ``code`` in the kernel; see the module docstring for the guarantees.

        A kernel found dead or frozen is recovered first (restart and replay); the
        result's ``notice`` and ``recovery`` say so.
        """
        with self._lock:
            recovery = None
            if self._km is None:
                self.start()
            elif (lost := ladder.diagnose(self)) is not None:
                recovery = ladder.recover(self, *lost)
            result = self._run(code, on_output, timeout, recovery)
            self._write_record(code, result)
            return result

    def _write_record(self, code: str, result: ExecResult) -> None:
        """Execution ``n``'s record beside its raw output, for ``_out[n]`` in the kernel
        and for replay (``lineage``, and ``effects``: what it did outside the kernel)."""
        from simagent.kernel_api import effects
        from simagent.kernel_api.outputs import write_record

        error = result.error.text() if result.error is not None else None
        write_record(self.paths.outputs, self._seq, {
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
        kc = self._kc
        self._interrupt_at = None
        self._steps = []
        t0 = time.monotonic()
        deadline = t0 + timeout if timeout else None
        timed_out = False
        self.state = "busy"
        msg_id = kc.execute(code, store_history=True, allow_stdin=False)
        notice = recovery.message() if recovery is not None else ""
        state_lost = recovery is not None and not recovery.state_restored
        end = CellEnd(kc, msg_id)
        try:
            while True:
                arrived, msg = self._poll(msg_id)
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
                        rec = ladder.recover(
                            self, "unresponsive", f"the cell did not stop within "
                            f"{self.interrupt_grace_s:g} s of the interrupt",
                            steps=self._steps, started=self._interrupt_at)
                        result = cap.result(
                            "timeout" if timed_out else "interrupted", time.monotonic() - t0,
                            _join(notice, rec.message()),
                            state_lost or not rec.state_restored)
                        result.recovery = rec.to_dict()
                        return result
                    self._escalate(since)
                if not arrived:
                    if not self._km.is_alive():  # a dead kernel sends nothing
                        self.death_reason = _death_reason(self._exit_code())
                        return self._died(cap, now - t0, "died")
                    if self._hb_silent_s(now) >= self.heartbeat_grace_s:
                        ladder.kill_frozen(self)
                        self.death_reason = (
                            f"the kernel process stopped answering its heartbeat for "
                            f"{self.heartbeat_grace_s:g} s (frozen: stopped or wedged) and "
                            f"was killed")
                        return self._died(cap, now - t0, "frozen")
            self._draining = True
            reply = end.reply if end.reply is not None else self._reply(msg_id)
        finally:
            self._draining = False
            if self.state == "busy":
                self.state = "idle"
        if end.idle_lost:
            notice = _join(notice, IDLE_LOST_NOTICE)
        elapsed = time.monotonic() - t0
        if reply.get("execution_count"):
            cap.execution_count = reply["execution_count"]
        if timed_out:
            result = cap.result("timeout", elapsed, _join(
                notice, f"execution exceeded the {timeout:g} s timeout and was interrupted; "
                        f"kernel state is kept"), state_lost)
        elif self._interrupt_at is not None:
            result = cap.result("interrupted", elapsed, _join(
                notice, "execution was interrupted; kernel state is kept"), state_lost)
        else:
            ok = reply.get("status", "ok") == "ok" and cap.error is None
            result = cap.result("ok" if ok else "error", elapsed, notice, state_lost)
        result.output_maybe_incomplete = end.idle_lost
        return result

    def _died(self, cap: Capture, elapsed: float, trigger: str) -> ExecResult:
        self.state = "dead"
        self._death_trigger = trigger
        return cap.result(
            "died", elapsed, f"{self.death_reason}; kernel state is lost until the next "
            f"execution restarts the kernel and replays the session's state-defining cells "
            f"({self._log_hint()})", True)

    def _reply(self, msg_id: str) -> dict:
        """The execute_reply for ``msg_id`` (stale replies of abandoned cells are skipped)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                msg = self._kc.get_shell_msg(timeout=_POLL_S)
            except queue.Empty:
                if not self._km.is_alive():
                    return {}
                continue
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg["content"]
        return {}

    def _log_hint(self) -> str:
        tail = _tail_lines(self.paths.kernel_log, 6)
        where = f"kernel log: {self.paths.kernel_log}"
        return f"{where}; last lines:\n{tail}" if tail else where


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _tail_lines(path: Path, n: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 8192))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [ln for ln in data.splitlines() if ln.strip() and _LOG_NOISE not in ln]
    return "\n".join(lines[-n:])
