"""SIGKILL a live session at a chosen moment, resume it, and check what it left on disk.

Used by ``tests/test_kill_property.py`` (hundreds of kills) and reusable by a fault bench.
A *child* is one simagent process on one session: it opens (or resumes) the session the
way ``simagent run --continue`` does (Session, build_agent, ``resume_repair.repair``, the
kernel started up front), then plays scripted turns until the parent kills it. While it
runs it reports over a pipe, one JSON line per fact, each written *after* the fact is
durable:

* ``{"ev": id}``: a trace event was committed (``TraceLog.append`` returned);
* ``{"req": shape}``: the shape of a request the model (the "provider") received;
* ``{"state": shape, "repaired": [...]}``: the checkpointed messages at resume, before
  and after the repair;
* ``{"kernel": pid}``, ``{"ready": true}``, ``{"turn": n, "status": ...}``, ``{"done": true}``.

The parent reads the pipe to EOF after the kill, so a line is either whole or (cut by the
kill) dropped, and every committed event the child announced must be in the trace.

Children fork from a ``forkserver`` preloaded with the heavy imports (langchain,
langgraph, deepagents, jupyter_client), so a kill cycle costs a fork, a graph build and a
kernel start, not a fresh interpreter (about 1 s instead of 3).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import select
import signal
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing import forkserver
from pathlib import Path
from typing import Any

#: Imported once by the fork server; every child starts with them loaded.
HEAVY_MODULES = [
    "simagent.agent.turn_setup", "simagent.agent.scripted",
    "simagent.agent.resume_repair", "simagent.session", "simagent.kernel",
    "langgraph.checkpoint.sqlite", "jupyter_client.manager", "jupyter_client.kernelspec",
]

#: A message as the checks see it: (type, ids of its tool calls, the call it answers).
Shape = tuple[str, list[str], str | None]


_WARM_ENV = "SIMAGENT_KILL_CHILD_WARM"


def kill_context() -> Any:
    """A multiprocessing context whose children fork from a warmed server.

    The server imports :data:`HEAVY_MODULES` and this module, which (only there, told by
    an environment variable set while the server starts) also loads the tokenizer every
    model request is counted with: 0.6 s a child would otherwise pay. The caller's
    ``__main__`` must be import-safe (``if __name__ == "__main__":``), as for any
    forkserver.
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([*HEAVY_MODULES, __name__])
    os.environ[_WARM_ENV] = "1"
    try:
        forkserver.ensure_running()
    finally:
        os.environ.pop(_WARM_ENV, None)
    return ctx


def _warm() -> None:
    try:
        from simagent.context.tokens import encoding  # in the fork server only (see above)

        encoding()
    except Exception:  # a cold child is slower, not wrong
        pass


@dataclass
class ChildSpec:
    """One child's work: a session (None: create one) and the scripted turns to play."""

    workspace: str
    home: str  # $SIMAGENT_HOME for the child
    turns: list[list[dict[str, Any]]]  # scripted steps of each turn, the last a "final"
    session_id: str | None = None
    window: int = 16_000
    env: dict[str, str] = field(default_factory=dict)
    #: Start the kernel (and the simulator's warm-up cell) before the first turn, as
    #: ``simagent run`` does; False starts it at the first cell, as the TUI does.
    start_kernel: bool = True
    warm_up: bool = True
    #: SIGKILL itself right after the checkpointer saved the writes of a task, before
    #: the checkpoint that includes them: "model" (a reply with tool calls) or "tools"
    #: (a tool result). A precise kill point no timer hits reliably.
    die_after_writes_of: str | None = None


@dataclass
class ChildReport:
    """What a child announced before it ended (killed or not)."""

    session_id: str | None = None
    events: list[int] = field(default_factory=list)
    event_bytes: dict[int, int] = field(default_factory=dict)  # payload bytes by event id
    requests: list[list[Shape]] = field(default_factory=list)
    state_before: list[Shape] | None = None
    state_after: list[Shape] | None = None
    repaired: list[str] = field(default_factory=list)
    kernel_pids: list[int] = field(default_factory=list)
    turns: list[str] = field(default_factory=list)  # status of each finished turn
    last_kind: str | None = None  # kind of the last committed event (where the kill hit)
    ready: bool = False
    ready_s: float | None = None  # seconds from the child's start to its first turn
    done: bool = False
    killed: bool = False
    exitcode: int | None = None
    error: str | None = None


def shape(messages: Sequence[Any]) -> list[Shape]:
    out: list[Shape] = []
    for m in messages:
        calls = [c.get("id") or "" for c in [*(getattr(m, "tool_calls", None) or []),
                                             *(getattr(m, "invalid_tool_calls", None) or [])]]
        out.append((m.type, calls, getattr(m, "tool_call_id", None)))
    return out


# ------------------------------------------------------------------ checks (parent)
def request_problems(req: Sequence[Shape]) -> list[str]:
    """What a provider would refuse: an assistant tool call not answered by the tool
    messages right after it, or a tool message answering no call of the assistant
    message just before it."""
    problems, open_ids, answered = [], set(), set()
    for i, (kind, calls, answers) in enumerate(req):
        if kind == "tool":
            if answers not in open_ids or answers in answered:
                problems.append(f"message {i}: tool result for {answers!r} answers no open call")
            answered.add(answers)
            continue
        if missing := open_ids - answered:
            problems.append(f"message {i}: tool call(s) {sorted(missing)} have no result")
        open_ids, answered = (set(calls), set()) if kind == "ai" else (set(), set())
    if missing := open_ids - answered:
        problems.append(f"end: tool call(s) {sorted(missing)} have no result")
    return problems


def state_problems(messages: Sequence[Shape], *, allow_open: bool) -> list[str]:
    """Checkpointed messages: every tool message answers an earlier call; with
    ``allow_open=False`` every call is answered too."""
    problems, called, answered = [], set(), set()
    for i, (kind, calls, answers) in enumerate(messages):
        if kind == "tool":
            if answers not in called:
                problems.append(f"message {i}: orphaned tool result {answers!r}")
            answered.add(answers)
        called.update(calls)
    if not allow_open and (missing := called - answered):
        problems.append(f"unanswered tool calls {sorted(missing)}")
    return problems


def integrity(path: Path) -> str:
    """``PRAGMA integrity_check`` of a database file ("ok" when sound); a file SQLite
    cannot even read (a truncated or scribbled header page) is a verdict too, not an
    exception that would end the check before it reported."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return "; ".join(r[0] for r in conn.execute("PRAGMA integrity_check"))
    except sqlite3.DatabaseError as exc:
        return f"unreadable ({exc})"
    finally:
        conn.close()


def trace_ids(path: Path) -> set[int]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {r[0] for r in conn.execute("SELECT id FROM events")}
    finally:
        conn.close()


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def processes_with_env(name: str, prefix: str) -> list[int]:
    """Live processes whose environment has ``name`` set to a value under ``prefix``
    (a kernel carries its session folder in ``SIMAGENT_SESSION_DIR``), so kernels are
    found even when their parent was killed before it could say their pid."""
    needle = f"{name}={prefix}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if any(v.startswith(needle) for v in env.split(b"\0")) and alive(int(entry)):
            found.append(int(entry))
    return found


# ------------------------------------------------------------------ parent side
def run_child(ctx: Any, spec: ChildSpec, *, kill_after_start: float | None = None,
              kill_after_ready: float | None = None, timeout: float = 120.0) -> ChildReport:
    """Start a child on ``spec``, SIGKILL it at the chosen moment (or let it finish),
    and return what it announced. The pipe is read to EOF, so nothing it wrote is lost."""
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=child_main, args=(spec, writer), daemon=True)
    started = time.monotonic()
    proc.start()
    writer.close()
    report = ChildReport()
    kill_at = started + kill_after_start if kill_after_start is not None else None
    fd, buf, end = reader.fileno(), b"", started + timeout
    while True:
        now = time.monotonic()
        if kill_at is not None and now >= kill_at and not report.killed:
            os.kill(proc.pid, signal.SIGKILL)
            report.killed = True
        if now > end and not report.killed:
            os.kill(proc.pid, signal.SIGKILL)
            report.killed, report.error = True, "timed out"
        wait = max(0.0, min(kill_at - now, 0.5)) if kill_at and not report.killed else 0.5
        ready, _, _ = select.select([fd], [], [], wait)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            _absorb(report, json.loads(line))
            if report.ready and kill_after_ready is not None and kill_at is None:
                kill_at = time.monotonic() + kill_after_ready
    reader.close()
    proc.join()
    report.exitcode = proc.exitcode
    return report  # a last line without its newline was cut by the kill: not announced


def _absorb(report: ChildReport, item: dict[str, Any]) -> None:
    if "ev" in item:
        report.events.append(item["ev"])
        report.event_bytes[item["ev"]] = int(item.get("b") or 0)
        report.last_kind = item.get("k")
    elif "req" in item:
        report.requests.append([tuple(m) for m in item["req"]])
    elif "state" in item:
        report.state_before = [tuple(m) for m in item["state"]]
        report.state_after = [tuple(m) for m in item["after"]]
        report.repaired = item["repaired"]
    elif "session" in item:
        report.session_id = item["session"]
    elif "kernel" in item:
        report.kernel_pids.append(item["kernel"])
    elif "turn" in item:
        report.turns.append(item["status"])
    elif "ready" in item:
        report.ready = True
        report.ready_s = item["ready"]
    elif "done" in item:
        report.done = True
    elif "error" in item:
        report.error = item["error"]


# ------------------------------------------------------------------- child side
def _die_after_writes(node: str) -> None:
    from langchain_core.messages import AIMessage, ToolMessage  # child side: HEAVY_MODULES
    from langgraph.checkpoint.sqlite import SqliteSaver  # child side, as above

    original = SqliteSaver.put_writes
    wanted = {"model": lambda m: isinstance(m, AIMessage) and bool(m.tool_calls),
              "tools": lambda m: isinstance(m, ToolMessage)}[node]

    def put_writes(self: Any, config: Any, writes: Any, task_id: str,
                   task_path: str = "") -> None:
        original(self, config, writes, task_id, task_path)
        for channel, value in writes:
            if channel == "messages" and any(wanted(m) for m in
                                             (value if isinstance(value, list) else [value])):
                os.kill(os.getpid(), signal.SIGKILL)

    SqliteSaver.put_writes = put_writes  # type: ignore[method-assign]


_FD: int | None = None
_T0 = 0.0


def _say(**item: Any) -> None:
    if _FD is not None:  # one write per line; short lines are atomic on a pipe
        os.write(_FD, (json.dumps(item) + "\n").encode())


def child_main(spec: ChildSpec, conn: Any) -> None:
    """The child: open or resume the session, then play turns until killed."""
    global _FD, _T0
    _FD, _T0 = conn.fileno(), time.monotonic()
    os.environ["SIMAGENT_HOME"] = spec.home
    os.environ.update(spec.env)
    try:
        _play(spec)
    except BaseException as exc:  # reported, then re-raised for the exit code
        _say(error=f"{type(exc).__name__}: {exc}")
        raise


def _play(spec: ChildSpec) -> None:
    from simagent.agent.resume_repair import repair  # child side: the parent never loads these
    from simagent.agent.scripted import ScriptedChatModel  # child side
    from simagent.agent.turn_setup import turn_runner_for  # child side
    from simagent.kernel import Kernel  # child side
    from simagent.session import Session  # child side
    from simagent.trace.log import TraceLog  # child side

    original = TraceLog.append

    def append(self: TraceLog, kind: str, payload: dict[str, Any] | None = None) -> int:
        event_id = original(self, kind, payload)
        size = len(json.dumps(payload or {}, default=str, ensure_ascii=False).encode())
        _say(ev=event_id, k=kind, b=size)  # after the commit: the parent may count on it
        return event_id

    TraceLog.append = append  # type: ignore[method-assign]
    start = Kernel.start

    def start_and_report(self: Kernel) -> None:
        start(self)
        if (process := self._process()) is not None:
            _say(kernel=process.pid)

    Kernel.start = start_and_report  # type: ignore[method-assign]
    if spec.die_after_writes_of:
        _die_after_writes(spec.die_after_writes_of)

    class ReportingModel(ScriptedChatModel):
        def _reply(self, messages: list[Any]) -> Any:
            _say(req=shape(messages))
            return super()._reply(messages)

    steps = [step for turn in spec.turns for step in turn]
    model = ReportingModel.from_steps(steps, window=spec.window)
    if spec.session_id is None:
        session = Session.create(spec.workspace, approval="auto")
    else:
        session = Session.resume(spec.workspace, spec.session_id, approval="auto")
    _say(session=session.id)

    def reported_repair(session: Any, graph: Any) -> list[str]:
        before = graph.get_state(session.thread_config).values.get("messages") or []
        repaired = repair(session, graph)
        after = graph.get_state(session.thread_config).values.get("messages") or []
        _say(state=shape(before), after=shape(after), repaired=repaired)
        return repaired

    runner = turn_runner_for(session, model, repair=reported_repair)
    if not spec.warm_up:
        session._warmed = True
    if spec.start_kernel:
        session.start_kernel()
    _say(ready=round(time.monotonic() - _T0, 3))
    for n in range(len(spec.turns)):
        result = runner.run(f"turn {n}: go on")
        _say(turn=n, status=result.status)
    session.close()
    _say(done=True)


if os.environ.get(_WARM_ENV) == "1":  # imported by the fork server (kill_context)
    _warm()
