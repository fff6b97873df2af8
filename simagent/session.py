"""A session: one conversation thread with its workspace, kernel, trace and checkpoints.

Everything that must outlive a process lives in the session's state folder (design.md
§4): the trace, the langgraph checkpoints (the thread id is the session id), raw kernel
outputs, artifacts and the attempt log. Resuming opens the same folder; the Python
kernel cannot be carried across processes, so a resumed session starts a fresh one and
the system prompt says so, unless the caller hands over the still-running kernel.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simagent.config import Config, SessionOptions
from simagent.context.memory import ensure_memory
from simagent.context.settings import ContextSettings
from simagent.kernel import ExecResult, Kernel, KernelPort, ladder, snapshot
from simagent.kernel.replay import budget_of as replay_budget_of
from simagent.paths import (
    SessionPaths,
    last_session_marker,
    new_session_id,
    private_file,
    write_private,
)
from simagent.simulators import Simulator, get_simulator
from simagent.trace import TraceLog
from simagent.trace.attempts import AttemptLog
from simagent.trace.redact import register_config
from simagent.trace.sessions import MODEL_EVENTS, find_session, latest_model
from simagent.trace.usage import UsageTotals
from simagent.turns import TurnRegistry

if TYPE_CHECKING:
    from simagent.kernel.ladder import Recovery


class SessionNotFound(LookupError):
    """No session matches; the message lists what exists."""


@dataclass
class ResumeInfo:
    """How this process joined the session (shown to the model once, in the prompt)."""

    resumed_at: str
    kernel_restarted: bool


def resolve_session_id(workspace: str | os.PathLike[str], prefix: str | None) -> str:
    """A full session id from a prefix, or the last session when ``prefix`` is None."""
    try:
        return find_session(workspace, prefix).name
    except LookupError as exc:
        raise SessionNotFound(str(exc)) from exc


def _check_writable(folder: Path) -> None:
    """Raise the ``OSError`` (naming the folder) that writing into ``folder`` gives.

    A resumed session's SQLite files in a read-only state home fail with a bare
    "unable to open database file"; this turns that into an error the CLI can explain.
    """
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:  # name the folder, not the probe's random file
        raise OSError(exc.errno, exc.strerror, str(folder)) from exc


class Session:
    """Workspace + state folder + kernel + trace + checkpointer for one thread."""

    def __init__(self, workspace: Path, session_id: str, *, config: Config,
                 simulator: Simulator | None, approval: str,
                 kernel: KernelPort | None = None, resume: ResumeInfo | None = None,
                 kernel_existing: str | None = None) -> None:
        register_config(config)  # its secrets are redacted from everything any front end writes
        self.workspace = workspace
        self.id = session_id
        self.config = config
        self.context_settings = ContextSettings.from_config(config)
        #: Kernel environment from config ([ensembles]); read now so bad values fail early.
        self.config_kernel_env = config.ensemble_kernel_env()
        #: None: the kernel inherits simagent's whole environment; a set: secret-named
        #: variables are withheld but these (``simagent mcp --http``, ``--pass-env``)
        self.kernel_secret_env: frozenset[str] | None = None
        #: How much a kernel restart may replay ([kernel] replay*); read now, same reason.
        self.replay_budget = replay_budget_of(config)
        #: MCP servers ([mcp.servers.*]); read now, same reason (``agent.mcp_tools`` starts them).
        self.mcp_servers = config.mcp_servers()
        self.simulator = simulator
        self.approval = approval
        #: The person's running kernel to attach to (``--kernel``); None: simagent's own.
        self.kernel_existing = kernel_existing
        #: Called (from the executing thread) when an attached kernel needs a restart the
        #: person must allow (the recovery's dict); the TUI asks, headless exits.
        self.on_kernel_consent: Any = None
        #: The latest such recovery, for a front end that reports it after the turn.
        self.kernel_consent_needed: dict[str, Any] | None = None
        self.resume_info = resume
        self.paths = SessionPaths.for_session(workspace, session_id).ensure()
        self.trace = TraceLog(self.paths.trace)
        self.memory_dir = ensure_memory(workspace)
        self.attempts = AttemptLog(self.paths.root / "attempts.jsonl")
        self.usage = UsageTotals.from_trace(self.trace.iter_events(["model_usage"]))
        self._kernel = kernel
        self._kernel_lock = threading.Lock()
        self._warmed = kernel is not None and kernel.status().alive
        self.cancel_requested = threading.Event()  # set by TurnRunner.cancel, per turn
        self.turns = TurnRegistry()  # graph runs, and those a cancel abandoned
        self._checkpoint_conn: sqlite3.Connection | None = None
        self._checkpointer: Any = None
        self._started_at: float | None = None  # epoch seconds, read from the trace once
        #: Called at close, newest first, before the kernel stops (MCP servers the
        #: session started: ``agent.mcp_hubs.hub_for``); each one bounded and failsafe.
        self.closers: list[Any] = []
        self.closed = False

    # ------------------------------------------------------------ lifecycle
    @classmethod
    def create(cls, workspace: str | os.PathLike[str], *, simulator: str | None = None,
               approval: str | None = None, model: str | None = None,
               config: Config | None = None, kernel: KernelPort | None = None,
               continued_from: str | None = None, notebook: Path | None = None,
               notebook_writable: bool = False,
               kernel_existing: str | None = None) -> Session:
        """A new session; ``kernel`` hands over a running kernel (its state carries on,
        as for the TUI's ``/clear``), ``continued_from`` names the session it replaces,
        ``notebook`` the one it starts from (``--from-notebook``; the front end runs it)."""
        ws = Path(workspace).expanduser().resolve()
        config = config or Config.load(ws)
        sim = get_simulator(config.simulator(simulator))
        session = cls(ws, new_session_id(), config=config, simulator=sim,
                      approval=config.approval(approval), kernel=kernel,
                      kernel_existing=kernel_existing)
        extra: dict[str, Any] = {"continued_from": continued_from} if continued_from else {}
        if kernel_existing:
            extra["kernel_existing"] = kernel_existing
        if notebook is not None:
            extra |= {"from_notebook": str(notebook), "notebook_writable": notebook_writable}
        session.trace.append("session_start", {
            "session_id": session.id, "workspace": str(ws),
            "simulator": sim.name if sim else None, "model": model,
            "approval": session.approval, "pid": os.getpid(), **extra})
        session._mark_last()
        return session

    @classmethod
    def resume(cls, workspace: str | os.PathLike[str], session_id: str | None = None, *,
               approval: str | None = None, model: str | None = None,
               config: Config | None = None, kernel: KernelPort | None = None,
               kernel_existing: str | None = None) -> Session:
        """Reopen a session (``session_id`` may be a prefix; None = the last one)."""
        ws = Path(workspace).expanduser().resolve()
        config = config or Config.load(ws)
        full_id = resolve_session_id(ws, session_id)
        _check_writable(SessionPaths.for_session(ws, full_id).root)
        start = TraceLog(SessionPaths.for_session(ws, full_id).trace, readonly=True)
        try:
            first = start.first("session_start")
        finally:
            start.close()
        sim_name = first.payload.get("simulator") if first else None
        sim = get_simulator(sim_name) if sim_name else None
        keep_kernel = kernel is not None and kernel.status().alive

        info = ResumeInfo(resumed_at=datetime.now().strftime("%Y-%m-%d %H:%M"),
                          kernel_restarted=not keep_kernel and not kernel_existing)
        mode = approval or (first.payload.get("approval") if first else None)
        session = cls(ws, full_id, config=config, simulator=sim,
                      approval=config.approval(mode), kernel=kernel if keep_kernel else None,
                      resume=info, kernel_existing=kernel_existing)
        session.trace.append("session_resume", {"session_id": full_id, "model": model,
                                                "kernel_restarted": info.kernel_restarted,
                                                "pid": os.getpid()})
        session._mark_last()
        return session

    @classmethod
    def open(cls, opts: SessionOptions, *, model: str | None, config: Config,
             default_simulator: str | None = None) -> Session:
        """The session ``opts`` asks for: resumed (``--resume``/``--continue``) or new,
        with ``opts.simulator``, else ``default_simulator`` (a replay workflow's)."""
        existing = config.kernel_existing(opts.kernel)
        if opts.resuming:
            return cls.resume(opts.workspace, opts.resume, approval=opts.approval,
                              model=model, config=config, kernel_existing=existing)
        return cls.create(opts.workspace, simulator=opts.simulator or default_simulator,
                          approval=opts.approval, model=model, config=config,
                          kernel_existing=existing, notebook=opts.from_notebook,
                          notebook_writable=opts.notebook_writable)

    @property
    def notebook(self) -> tuple[Path | None, bool]:
        """(the notebook this session started from, whether the agent may change it),
        from its ``session_start`` event, so a resumed session keeps the same guard."""
        start = self.trace.first("session_start")
        payload = start.payload if start is not None and isinstance(start.payload, dict) \
            else {}
        path = payload.get("from_notebook")
        return (Path(path) if path else None), bool(payload.get("notebook_writable"))

    def _mark_last(self) -> None:
        write_private(last_session_marker(self.workspace), self.id)

    @property
    def thread_config(self) -> dict[str, Any]:
        return {"configurable": {"thread_id": self.id}}

    @property
    def checkpointer(self) -> Any:
        """The langgraph SQLite checkpointer (sync; the agent runs in a worker thread).

        WAL with ``synchronous=NORMAL``: a process killed at any instruction leaves the
        database consistent and keeps every committed checkpoint (only an OS crash or a
        power cut may lose the newest few); readers (``simagent context``) never block
        the writer. ``tests/test_kill_property.py`` SIGKILLs sessions to prove it.
        """
        if self._checkpointer is None:
            from simagent.trace.checkpoint_redaction import redacting_sqlite_saver  # langgraph

            conn = sqlite3.connect(private_file(self.paths.checkpoints),
                                   check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=5000")
            self._checkpoint_conn = conn
            self._checkpointer = redacting_sqlite_saver(conn)  # no secret at rest
        return self._checkpointer

    def detach_kernel(self) -> KernelPort | None:
        """The running kernel, handed over: closing this session then leaves it running."""
        with self._kernel_lock:
            kernel, self._kernel = self._kernel, None
        if kernel is not None and not kernel.status().alive:
            kernel.shutdown()
            return None
        return kernel

    def adopt_kernel(self, kernel: KernelPort | None) -> None:
        """Take back a kernel handed out by :meth:`detach_kernel` (a failed hand-over)."""
        with self._kernel_lock:
            self._kernel = kernel

    def close(self, reason: str = "exit", *, keep_kernel: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        try:  # a trace that cannot be written (closed, disk full) must not keep the kernel
            self.trace.append("session_end", {"session_id": self.id, "reason": reason})
        finally:
            for close in reversed(self.closers):
                with contextlib.suppress(Exception):
                    close()
            if self._kernel is not None and not keep_kernel:
                self._kernel.shutdown()
            if self._checkpoint_conn is not None:
                self._checkpoint_conn.close()
            self.trace.close()

    def close_unused(self) -> None:
        """Close; a new session in which no one ever spoke (a TUI opened and left) is
        discarded instead, so ``simagent sessions`` lists conversations, not visits."""
        if not self.closed and self.resume_info is None and \
                self.trace.first("message_user") is None:
            self.discard()
        else:
            self.close()

    def discard(self) -> None:
        """Close this new session and delete its folder: a run that failed before its
        first turn (the kernel did not start, a bad subagent file) leaves no empty
        session behind in ``simagent sessions`` or for ``--continue``."""
        if self.resume_info is not None:  # never delete a session someone worked in
            self.close("error")
            return
        self.close("discarded")
        shutil.rmtree(self.paths.root, ignore_errors=True)
        marker = last_session_marker(self.workspace)
        try:
            if marker.read_text(encoding="utf-8").strip() == self.id:
                marker.unlink()  # --continue then falls back to the newest session
        except OSError:
            pass

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close("error" if exc[0] else "exit")

    def note_model_switch(self, model_id: str) -> None:
        """Trace a ``model_switch`` when a resumed session goes on with another model
        (``/context`` and the bench price each model's calls apart)."""
        if self.resume_info is None:
            return
        # the last event is this process's own session_resume; the model before it counts
        before = latest_model(self.trace.events(MODEL_EVENTS)[:-1])
        if before and before != model_id:
            self.trace.append("model_switch", {"from_model": before, "to_model": model_id})

    # --------------------------------------------------------------- kernel
    @property
    def kernel(self) -> KernelPort:
        with self._kernel_lock:
            if self._kernel is None:
                env = dict(self.simulator.env) if self.simulator else {}
                env.update(self.config_kernel_env)
                self._kernel = Kernel(self.paths, cwd=self.workspace,
                                      kernel_name=self.config.kernel_name(), env=env,
                                      replay=self.replay_budget,
                                      existing=self.kernel_existing,
                                      keep_secret_env=self.kernel_secret_env)
            return self._kernel

    @property
    def kernel_state(self) -> str:
        return "stopped" if self._kernel is None else self._kernel.state

    def start_kernel(self) -> None:
        """Start the kernel now (raises ``KernelStartError``) and run the warm-up once."""
        kernel = self.kernel
        if kernel.state in ("stopped", "dead"):
            kernel.start()
        self._warm_up()

    def _warm_up(self) -> None:
        if self._warmed:
            return
        self._warmed = True
        # not in an attached kernel: its names are the person's (README: Attaching to a kernel)
        if self.simulator and self.simulator.warmup and not self.kernel_existing:
            result = self._traced_execute(self.simulator.warmup, None, 600.0, None,
                                          warmup=True)
            if result.status == "interrupted" and self.cancel_requested.is_set():
                # A cancelled turn cut it short: run it again next time. A warm-up that
                # crashes or hangs is not retried (it would cost every later call).
                self._warmed = False

    def execute(self, code: str, *, on_output: Any = None, timeout: float | None = None,
                tool_call_id: str | None = None) -> ExecResult:
        """Run code for a tool call: warm-up first if needed, then trace the execution.

        A turn cancelled while the kernel was still starting must not run its cell.
        """
        self._warm_up()
        if self.cancel_requested.is_set():
            return ExecResult(status="interrupted",
                              notice="not run: the user cancelled the turn")
        return self._traced_execute(code, on_output, timeout, tool_call_id)

    def _traced_execute(self, code: str, on_output: Any, timeout: float | None,
                        tool_call_id: str | None, *, warmup: bool = False) -> ExecResult:
        result = self.kernel.execute(code, on_output=on_output, timeout=timeout)
        if result.recovery is not None:  # the recovery ladder ran (kernel/ladder.py)
            self.trace.append("kernel_recovery", result.recovery)
        if (result.recovery or {}).get("needs_consent"):  # an attached kernel: ask, or report
            first = self.kernel_consent_needed is None
            self.kernel_consent_needed = result.recovery
            if first and self.on_kernel_consent is not None:
                self.on_kernel_consent(result.recovery)
        else:  # it answers again
            self.kernel_consent_needed = None
        self.trace_execution(code, result, tool_call_id, warmup=warmup)
        return result

    def trace_execution(self, code: str, result: ExecResult, tool_call_id: str | None, *,
                        warmup: bool = False, **extra: Any) -> None:
        """The ``kernel_exec`` event of one execution and an ``artifact`` per saved figure."""
        self.trace.append("kernel_exec", {
            "tool_call_id": tool_call_id, "code": code, "status": result.status,
            "elapsed_s": round(result.elapsed_s, 3), "execution_count": result.execution_count,
            "raw_path": str(result.raw_path) if result.raw_path else None,
            "state_lost": result.state_lost, "warmup": warmup,
            **({"human": list(result.human)} if result.human else {}), **extra})
        for display in result.displays:
            if display.path is not None:
                figure = {k: v for k, v in (("id", display.figure_id), ("title", display.title),
                                            ("duplicate", display.duplicate)) if v}
                self.trace.append("artifact", {"path": str(display.path), "mime": display.mime,
                                               "tool_call_id": tool_call_id, **figure})

    @property
    def artifact_dirs(self) -> list[Path]:
        """Where this session's figures are (a replayed session adds the recording's)."""
        return [self.paths.artifacts]

    def state_snapshot(self) -> dict[str, Any]:
        """The runtime picture the kernel state card is built from (``kernel/snapshot.py``).

        Never starts a kernel, never waits on a running cell: what cannot be read is
        reported as such.
        """
        if self._started_at is None:
            self._started_at = snapshot.session_start(self.trace)
        registry = list(self.simulator.state_registry) if self.simulator else []
        return snapshot.take(self._kernel, registry, self.workspace, self.trace,
                             self._started_at)

    def restart_kernel(self) -> float:
        kernel = self.kernel
        if kernel.state == "stopped":
            kernel.start()
            seconds = 0.0
        else:
            seconds = kernel.restart()
        self._warmed = False
        self._warm_up()
        return seconds

    def restore_kernel(self) -> Recovery:
        """Restart the kernel and replay this session's state-defining cells since the
        last ``/reset`` (``/restore``; the fault bench calls it too). In a resumed
        session it brings the previous process's state into the fresh kernel."""
        recovery = self.kernel.restore()
        self.trace.append("kernel_recovery", recovery.to_dict())
        self._warmed = True  # the simulator's warm-up is a recorded cell: replayed if needed
        return recovery

    def run_offered(self, ns: list[int]) -> list[dict[str, Any]]:
        """Run cells a replay left out for their effects (the user said yes to
        ``/restore``'s offer); traced as ``kernel_replay_offered``."""
        done = ladder.run_offered(self.kernel, ns)
        self.trace.append("kernel_replay_offered", {"cells": done})
        return done

    def restart_attached_kernel(self) -> Recovery:
        """Restart the attached kernel now that the person agreed (its manager restarts
        it; nothing is replayed into it)."""
        kernel = self.kernel
        kernel.consent = lambda _reason: True
        try:
            recovery = kernel.restore()
        finally:
            kernel.consent = None
        self.kernel_consent_needed = None
        self.trace.append("kernel_recovery", recovery.to_dict())
        self._warmed = False
        return recovery

    def interrupt_kernel(self) -> None:
        if self._kernel is not None:
            self._kernel.interrupt()

    def keep_interrupting(self, going: Callable[[], bool], period_s: float = 0.25,
                          limit_s: float = 15.0) -> None:
        """Re-send the interrupt while ``going()`` and a cell runs: one that reaches the
        kernel just before a sent cell starts is lost, and a cell can start just after
        (a cancelled turn's next call, a notebook's next cell). The check follows the
        sleep, so what started meanwhile under a new ``going`` is left alone."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            time.sleep(period_s)
            if not going():
                return
            if self.kernel_state == "busy":
                self.interrupt_kernel()
