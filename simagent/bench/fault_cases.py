"""The faults ``simagent bench faults`` runs: kernel, provider, watchdog and data faults
(the provider cases live in ``provider_fault_cases``).

Each case is a function ``(lab, fast) -> Outcome`` built from a few shared shapes, so
adding a fault is a line or two. The kernel shape is three turns of the scripted model:
set up state, fault (then a check cell reading the state back), and a turn after it.
"""

from __future__ import annotations

import os
import signal
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simagent.agent.resume_repair import repair
from simagent.bench.catalogue import select_cases
from simagent.bench.fault_bench import (
    ALIVE,
    ALIVE_CODE,
    CHECK_CODE,
    FAULT_MARK,
    RESTORED,
    SETUP_CODE,
    Clock,
    FaultCase,
    Lab,
    Outcome,
    lost_since,
    mark_lost,
    marked,
    no_orphans,
    raw_of,
    snapshot,
)
from simagent.bench.kernel_bench import rss_bytes
from simagent.bench.kill_child import ChildSpec, alive, kill_context, run_child
from simagent.bench.kill_series import run_series
from simagent.bench.provider_fault_cases import PROVIDER_CASES
from simagent.context.settings import ContextSettings
from simagent.kernel_api.outputs import raw_name
from simagent.presentation.transcript import render_html, render_markdown
from simagent.session import Session

#: Resident memory at which the bench's stand-in for the kernel OOM killer sends SIGKILL.
OOM_LIMIT_MB = 512
#: Output of the no-newline case: 1 GiB in the full run, 16 MiB in the fast subset.
BIG_OUTPUT_MB, BIG_OUTPUT_MB_FAST = 1024, 16


def _py(code: str, timeout_s: float | None = None) -> dict[str, Any]:
    args: dict[str, Any] = {"code": code}
    if timeout_s:
        args["timeout_s"] = timeout_s
    return {"tool": "run_python", "args": args}


def kernel_fault(lab: Lab, code: str, *, timeout_s: float | None = None,
                 detect_after: float = 0.0, during: Callable[[Any], Callable[[], None]] | None
                 = None, expect_bytes: int = 0) -> Outcome:
    """Set up state, run the faulting ``code``, read the state back, then run one more turn.

    ``detect_after``: seconds after the cell starts at which the fault can first be seen
    (a hang is only a fault once its timeout passes). ``during(session)`` starts something
    beside the faulting cell and returns its stopper. ``expect_bytes``: output the cell
    writes after the mark, which its raw output must hold.
    """
    session = lab.session()
    steps = [_py(SETUP_CODE), {"final": "ready"},
             _py(marked(code), timeout_s), _py(CHECK_CODE), {"final": "{out[-1]}"},
             _py(ALIVE_CODE), {"final": "{out[-1]}"}]
    runner = lab.scripted(session, steps)
    first = runner.run("set up the model")
    before = snapshot(session)
    clock = Clock()
    stop = during(session) if during else None
    try:
        second = runner.run("run the study", clock)
    finally:
        if stop:
            stop()
    third = runner.run("go on")
    fault_id, check_id = ([*clock.order, "", ""])[:2]
    recover = None
    if fault_id in clock.started and check_id in clock.finished:
        recover = clock.finished[check_id] - (clock.started[fault_id] + detect_after)
    lost, what = lost_since(session, before)
    raw = raw_of(session, "import sys as _fs")
    lost += mark_lost(raw)
    if expect_bytes:
        size = raw.stat().st_size if raw and raw.is_file() else 0
        got = max(0, size - len(FAULT_MARK.encode()) - 1)  # the mark's line comes first
        lost += max(0, expect_bytes - got)
    survived = (first.status == second.status == third.status == "done"
                and ALIVE in third.final and no_orphans(runner))
    detail = _recovery_line(session) or _first_line(clock.contents.get(fault_id, ""))
    if what:
        detail = f"lost: {', '.join(what)}; {detail}"
    if not survived:
        detail = (f"turns: {first.status}/{second.status}/{third.status} "
                  f"{second.error or third.error or ''}; {detail}")
    return Outcome(survived, RESTORED in clock.contents.get(check_id, ""), recover,
                   lost, detail)


def _recovery_line(session: Any) -> str:
    """What the kernel's recovery did, from its ``kernel_recovery`` trace events."""
    parts = []
    for event in session.trace.events(["kernel_recovery"]):
        r = event.payload
        steps = [str(s.get("step")) for s in r.get("steps") or []]
        if r.get("restarted") and "restart" not in steps:
            steps.append("restart")
        parts.append(f"{r.get('trigger')}: {'→'.join(steps)}; replayed "
                     f"{len(r.get('replayed') or [])}, skipped {len(r.get('skipped') or [])}")
    return "; ".join(parts) if parts else "state kept (no restart)"


def _first_line(text: str, limit: int = 110) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("fault-start"):
            return line if len(line) <= limit else line[:limit - 1] + "…"
    return ""


# ----------------------------------------------------------------- kernel stand-ins
def _rss_mb(pid: int) -> float:
    return (rss_bytes(pid) or 0) / 2**20


#: Where a memory cgroup (v1) for the real OOM killer can be made, when this process may.
CGROUP_MEMORY = Path("/sys/fs/cgroup/memory")


def _cgroup_limit(pid: int, limit_mb: float) -> Path | None:
    """Put ``pid`` in a fresh memory cgroup capped at ``limit_mb``, so the operating
    system's own OOM killer ends it; None where cgroups are not ours to make."""
    group = CGROUP_MEMORY / f"simagent-fault-{os.getpid()}-{pid}"
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(int(limit_mb) << 20))
        (group / "cgroup.procs").write_text(str(pid))
        return group
    except OSError:
        try:
            group.rmdir()
        except OSError:
            pass
        return None


def oom_killer(limit_mb: float = OOM_LIMIT_MB, used: list[str] | None = None
               ) -> Callable[[Any], Callable[[], None]]:
    """The kernel OOM-killed at ``limit_mb``: by the real OOM killer in a memory cgroup
    where this process may make one (root on cgroup v1), else by a watcher that sends the
    same SIGKILL once the kernel's RSS passes the limit. ``used`` gets which it was."""

    def start(session: Any) -> Callable[[], None]:
        done = threading.Event()
        pid = session.kernel.status().pid
        group = _cgroup_limit(pid, limit_mb) if pid else None
        if used is not None:
            used.append("the OOM killer (memory cgroup)" if group else "an RSS watcher")

        def watch() -> None:
            while not done.wait(0.02):
                now = session.kernel.status().pid if session.kernel_state != "stopped" else None
                if now and _rss_mb(now) > limit_mb:
                    try:
                        os.kill(now, signal.SIGKILL)
                    except OSError:
                        pass

        if group is None:  # in a cgroup the operating system does the killing
            threading.Thread(target=watch, daemon=True).start()

        def stop() -> None:
            done.set()
            for _ in range(50 if group is not None else 0):  # the killed kernel empties it
                try:
                    group.rmdir()
                    return
                except OSError:
                    time.sleep(0.1)

        return stop

    return start


def _oom(lab: Lab, fast: bool) -> Outcome:
    used: list[str] = []
    out = kernel_fault(lab, "_blocks = []\nwhile True:\n    _blocks.append(b'\\x01' * (64 << 20))\n"
                            "    _ft.sleep(0.01)\n", during=oom_killer(used=used))
    out.detail = f"killed by {used[0] if used else '?'}; {out.detail}"
    return out


def _children_left(workspace: Path) -> int:
    """Forked children the cell recorded that are still running (zombies are gone)."""
    try:
        pids = [int(p) for p in (workspace / "fault_kids.txt").read_text().split()]
    except (OSError, ValueError):
        return -1
    left = [pid for pid in pids if alive(pid)]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)  # never leave them to the machine
        except OSError:
            pass
    return len(left)


FORK_CODE = """import os, time
kids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        try:
            time.sleep(300)
        finally:
            os._exit(0)
    kids.append(pid)
open('fault_kids.txt', 'w').write(' '.join(map(str, kids)))
for k in kids:
    os.waitpid(k, 0)
"""


def _forking(lab: Lab, fast: bool) -> Outcome:
    out = kernel_fault(lab, FORK_CODE, timeout_s=2, detect_after=2)
    left = _children_left(lab.root / "ws01")
    if left:
        out.survived = False
    out.detail = f"{left} forked children left running; {out.detail}"
    return out


def _big_output(lab: Lab, fast: bool) -> Outcome:
    mb = BIG_OUTPUT_MB_FAST if fast else BIG_OUTPUT_MB
    code = (f"_chunk = 'x' * (1 << 20)\nfor _ in range({mb}):\n    _fs.stdout.write(_chunk)\n"
            "_fs.stdout.flush()\n_ft.sleep(0.3)\n")
    out = kernel_fault(lab, code, expect_bytes=mb << 20)
    out.detail = f"{mb} MiB without a newline; {out.detail}"
    return out


KERNEL_CASES = [
    FaultCase("kernel-exit", "kernel", "kernel process exits: os._exit(1)",
              lambda lab, fast: kernel_fault(lab, "import os\nos._exit(1)"), fast=True),
    FaultCase("kernel-segfault", "kernel", "segfault in native code via ctypes",
              lambda lab, fast: kernel_fault(lab, "import ctypes\nctypes.string_at(0)")),
    FaultCase("kernel-oom", "kernel", f"OOM kill at {OOM_LIMIT_MB} MB", _oom),
    FaultCase("kernel-sigint-ignored", "kernel",
              "native call that ignores SIGINT (blocked signal, libc sleep)",
              lambda lab, fast: kernel_fault(
                  lab, "import ctypes, signal\n"
                       "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n"
                       "ctypes.CDLL(None).sleep(120)\n", timeout_s=2, detect_after=2)),
    FaultCase("kernel-frozen", "kernel", "kernel process frozen (SIGSTOP)",
              lambda lab, fast: kernel_fault(
                  lab, "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\n",
                  timeout_s=3, detect_after=0.3)),
    FaultCase("kernel-busy-loop", "kernel", "pure-Python infinite loop past its timeout",
              lambda lab, fast: kernel_fault(lab, "while True:\n    pass\n", timeout_s=1,
                                             detect_after=1), fast=True),
    FaultCase("kernel-forks", "kernel", "cell forks children and waits on them", _forking),
    FaultCase("kernel-big-output", "kernel", "1 GiB of output without a newline",
              _big_output, fast=True),
]

# ------------------------------------------------------------------------ watchdog
#: Failing cells per signal: the same error with other numbers, three different errors,
#: and one cell re-run with only whitespace changed.
STUCK_CELLS = {
    "same_error": ["raise ValueError('bad value 1')", "raise ValueError('bad value 2')",
                   "raise ValueError('bad value 3')", "raise ValueError('bad value 4')"],
    "failed_run": ["1 / 0", "undefined_name_here", "[][1]", "{}['k']"],
    "whitespace_rerun": ["raise ValueError('bad value 1')",
                         "raise ValueError( 'bad value 1' )  "],
}


def watchdog_case(lab: Lab, signal_name: str, mode: str) -> Outcome:
    """A model stuck on failing cells: ``enforce`` must end the turn before the next
    stuck call runs, ``warn`` must nudge once and let the turn go on; either way nothing
    is orphaned, the kernel keeps its state and the next turn works."""
    cells = STUCK_CELLS[signal_name]
    session = lab.session()
    stuck = [_py(c) for c in cells]
    if mode == "enforce":  # the last stuck call is stopped; the turn ends there
        steps = [_py(SETUP_CODE), {"final": "ready"}, *stuck,
                 _py(CHECK_CODE), _py(ALIVE_CODE), {"final": "{out[-1]}"}]
    else:
        steps = [_py(SETUP_CODE), {"final": "ready"}, *stuck[:-1], _py(CHECK_CODE),
                 {"final": "{out[-1]}"}, _py(ALIVE_CODE), {"final": "{out[-1]}"}]
    runner = lab.scripted(session, steps, ContextSettings(repl_watchdog=mode))
    first = runner.run("set up the model")
    before = snapshot(session)
    clock, third_clock = Clock(), Clock()
    second = runner.run("run the study", clock)
    third = runner.run("go on", third_clock)
    alerts = [e.payload for e in session.trace.events(["repl_watchdog"])]
    ran = {e.payload.get("code") for e in session.trace.events(["kernel_exec"])}
    fired = [a for a in alerts if a.get("signal") == signal_name]
    if mode == "enforce":
        acted = bool(fired) and any(a.get("stopped") for a in fired) and cells[-1] not in ran
    else:
        acted = len(fired) == 1
    texts = [*clock.outputs, *third_clock.outputs]
    lost, what = lost_since(session, before)
    survived = (first.status == second.status == third.status == "done" and acted
                and any(ALIVE in t for t in texts) and no_orphans(runner))
    if mode == "enforce":
        what_happened = ("stopped before the next stuck cell" if cells[-1] not in ran
                         else "the next stuck cell ran")
    else:
        what_happened = "nudged the model, the turn went on"
    detail = f"{len(fired)} {signal_name} alert(s), mode {mode}, {what_happened}"
    if what:
        detail = f"lost: {', '.join(what)}; {detail}"
    return Outcome(survived, any(RESTORED in t for t in texts), None, lost, detail)


WATCHDOG_CASES = [
    *(FaultCase(f"watchdog-{sig.replace('_', '-')}", "watchdog",
                f"model stuck: {sig.replace('_', ' ')} (enforce, headless default)",
                lambda lab, fast, sig=sig: watchdog_case(lab, sig, "enforce"),
                fast=sig == "same_error")
      for sig in STUCK_CELLS),
    FaultCase("watchdog-warn", "watchdog", "model stuck: same error (warn, TUI default)",
              lambda lab, fast: watchdog_case(lab, "same_error", "warn")),
]

# ---------------------------------------------------------------------------- data
#: Kills in the bench's SIGKILL row (the property test runs 200; see kill_series).
KILLS, KILLS_FAST = 40, 6
#: The secret the secrets row plants (an ``*_API_KEY`` variable the kernel inherits).
SECRET_VAR, SECRET = "FAULTBENCH_API_KEY", "sk-faultbench-5f1e9d3c7b2a4e6f8091"


def _sigkill_series(lab: Lab, fast: bool) -> Outcome:
    """Random SIGKILLs of scripted multi-turn sessions (mid-stream, mid-cell, mid-
    compaction, mid-write), each resumed and checked (``simagent.bench.kill_series``)."""
    kills = KILLS_FAST if fast else KILLS
    series = run_series(lab.root / "kills", kills, kill_context())
    survived = not series.problems and not series.left_running
    detail = (f"{kills} kills over {series.sessions} sessions: every DB integrity_check ok, "
              f"{series.events} committed events all kept, {series.repaired} resumes answered "
              f"open calls, {series.compactions} compactions, "
              f"{len(series.left_running)} processes left")
    if series.problems:
        detail = f"{len(series.problems)} problems: {series.problems[0]}"
    resume = statistics.median(series.resume_s) if series.resume_s else None
    return Outcome(survived, None, resume, series.lost_bytes, detail[:240])


def _sigkill_restore(lab: Lab, fast: bool) -> Outcome:
    """simagent SIGKILLed mid-cell after it set up state; the session is resumed as
    ``--continue`` does and ``/restore`` brings the kernel state back."""
    ws = lab.root / "killed"
    ws.mkdir()
    turns = [[_py(SETUP_CODE), {"final": "ready"}],
             [_py(marked("_ft.sleep(60)")), {"final": "never"}]]
    report = run_child(kill_context(), ChildSpec(str(ws), os.environ["SIMAGENT_HOME"], turns),
                       kill_after_ready=2.5)
    if not (report.killed and report.session_id):
        return Outcome(False, detail=f"the child was not killed mid-turn ({report.error})")
    session = Session.resume(ws, report.session_id, approval="auto")
    lab._sessions.append(session)
    runner = lab.scripted(session, [_py(CHECK_CODE), {"final": "{out[-1]}"},
                                    _py(ALIVE_CODE), {"final": "{out[-1]}"}])
    repaired = repair(session, runner.agent.graph)
    t0 = time.monotonic()
    recovery = session.restore_kernel()
    restore_s = time.monotonic() - t0
    check = runner.run("check the state")
    alive = runner.run("go on")
    lost = sum(report.event_bytes.get(i, 0)
               for i in set(report.events) - {e.id for e in session.trace.events()})
    survived = (check.status == alive.status == "done" and ALIVE in alive.final
                and no_orphans(runner))
    return Outcome(survived, RESTORED in check.final, restore_s, lost,
                   f"{len(repaired)} open call(s) answered on resume; /restore replayed "
                   f"{len(recovery.replayed)} cells, skipped {len(recovery.skipped)}")


def _disk_full(lab: Lab, fast: bool) -> Outcome:
    """The raw output of a cell cannot be written (``/dev/full``: ENOSPC on every write):
    one clear notice, the model gets the capped text, the session goes on."""
    session = lab.session()
    big = "for i in range(20000):\n    print('row', i, 'x' * 40)\n"
    steps = [_py(SETUP_CODE), {"final": "ready"}, _py(big), _py(CHECK_CODE),
             {"final": "{out[-1]}"}, _py(ALIVE_CODE), {"final": "{out[-1]}"}]
    runner = lab.scripted(session, steps)
    first = runner.run("set up the model")
    before = snapshot(session)
    target = session.paths.outputs / raw_name(session.kernel.status().executions + 1)
    target.symlink_to("/dev/full")
    clock = Clock()
    second = runner.run("print the table", clock)
    third = runner.run("go on")
    notice = next((t for t in clock.outputs if "disk full" in t), "")
    lost, what = lost_since(session, before)
    survived = (first.status == second.status == third.status == "done" and bool(notice)
                and "row 19999" in (clock.outputs[0] if clock.outputs else "")
                and ALIVE in third.final and no_orphans(runner))
    line = next((ln for ln in notice.splitlines() if "disk full" in ln), "no notice")
    return Outcome(survived, any(RESTORED in t for t in clock.outputs), None, lost,
                   (f"lost: {', '.join(what)}; " if what else "") + line.strip()[:160])


def _secrets(lab: Lab, fast: bool) -> Outcome:
    """A key in the environment, printed by a cell and quoted in the answer, must reach
    no file simagent writes: trace, checkpoints, raw outputs, transcripts, records."""
    os.environ[SECRET_VAR] = SECRET
    try:
        session = lab.session()
        runner = lab.scripted(session, [
            _py(f"import os\nprint('key', os.environ[{SECRET_VAR!r}])"),
            {"final": "the key is {out[-1]}"}])
        result = runner.run("show me the key the kernel sees")
        events = session.trace.events()
        out_dir = lab.root / "transcripts"
        out_dir.mkdir()
        (out_dir / "t.md").write_text(render_markdown(events, session_dir=session.paths.root))
        (out_dir / "t.html").write_text(render_html(events, session_dir=session.paths.root))
        session.trace.close()
        hits = [str(p.relative_to(lab.root)) for p in lab.root.rglob("*")
                if p.is_file() and SECRET.encode() in p.read_bytes()]
    finally:
        os.environ.pop(SECRET_VAR, None)
    files = sum(1 for p in lab.root.rglob("*") if p.is_file())
    survived = result.status == "done" and not hits and "[redacted:" in result.final
    return Outcome(survived, None, None, 0,
                   f"{len(hits)} of {files} files hold the key" +
                   (f": {', '.join(hits[:3])}" if hits else ""))


DATA_CASES = [
    FaultCase("data-sigkill", "data", "simagent SIGKILLed at random points, then resumed",
              _sigkill_series, fast=True),
    FaultCase("data-sigkill-restore", "data",
              "SIGKILL mid-cell, --continue, /restore brings the kernel state back",
              _sigkill_restore, fast=True),
    FaultCase("data-disk-full", "data", "disk full while writing a raw output",
              _disk_full, fast=True),
    FaultCase("data-secrets", "data", "an API key printed by a cell and quoted back",
              _secrets, fast=True),
]

CASES: list[FaultCase] = [*KERNEL_CASES, *PROVIDER_CASES, *WATCHDOG_CASES, *DATA_CASES]


def select(ids: list[str] | None = None, *, fast: bool = False) -> list[FaultCase]:
    """The faults to run: by id, the fast subset, or all (``catalogue.select_cases``)."""
    return select_cases(CASES, ids, fast=fast, noun="fault")
