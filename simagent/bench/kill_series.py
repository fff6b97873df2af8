"""A series of SIGKILLs on scripted multi-turn sessions, each followed by a resume and a
check of what the killed process left on disk.

Shared by the property test (``tests/test_kill_property.py``, hundreds of kills) and the
fault bench's ``data-sigkill`` row, so the figure and the test measure the same thing.
The child process and the per-kill checks are in :mod:`simagent.bench.kill_child`.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simagent.bench.kill_child import (
    ChildReport,
    ChildSpec,
    alive,
    integrity,
    processes_with_env,
    request_problems,
    run_child,
    state_problems,
    trace_ids,
)
from simagent.paths import SESSION_DIR_ENV, SessionPaths

KILLS_PER_SESSION = 10
WORKERS = 3  # kernel start-up waits a lot: 3 children keep 2 cores busy
WINDOW = 16_000

def cell(rng: random.Random, call_id: str) -> dict:
    sleep = rng.choice([0, 0, 0.05, 0.2, 0.4])
    lines = rng.randint(5, 60)
    code = (f"import time\nfor k in range({lines}):\n"
            f"    print(f'{call_id} step {{k}}: residual = {{k * 1e-3:.4f}}')\n"
            f"time.sleep({sleep})\nx_{call_id.replace('-', '_')} = {lines}")
    return {"tool": "run_python", "id": call_id, "args": {"code": code}}


def make_turns(rng: random.Random, tag: str, workspace: Path, n: int) -> list[list[dict]]:
    """Scripted turns: cells (some sleeping), file writes, parallel calls, an answer."""
    turns = []
    for t in range(n):
        steps: list[dict] = []
        for k in range(rng.randint(0, 3)):
            cid = f"{tag}-{t}-{k}"
            kind = rng.random()
            if kind < 0.55:
                steps.append(cell(rng, cid))
            elif kind < 0.8:
                steps.append({"tool": "write_file", "id": cid, "args": {
                    "file_path": str(workspace / f"notes-{cid}.txt"),
                    "content": f"result of {cid}\n" * rng.randint(1, 200)}})
            else:
                steps.append({"tools": [cell(rng, f"{cid}a"), cell(rng, f"{cid}b")]})
        steps.append({"final": f"turn {t} of {tag} done"})
        turns.append(steps)
    return turns


def check_left_on_disk(paths: SessionPaths, report: ChildReport) -> tuple[list[str], int]:
    """The problems a killed child left on disk, and the payload bytes of the committed
    trace events that are missing."""
    problems = []
    for db in (paths.trace, paths.checkpoints):
        if db.exists() and (verdict := integrity(db)) != "ok":
            problems.append(f"{db.name}: integrity_check = {verdict}")
    try:
        kept = trace_ids(paths.trace) if paths.trace.exists() else set()
    except sqlite3.DatabaseError:  # damaged: integrity_check said so; nothing is readable
        kept = set()
    lost = set(report.events) - kept
    lost_bytes = sum(report.event_bytes.get(i, 0) for i in lost)
    if not paths.trace.exists() and report.events:
        problems.append("trace.sqlite is gone but events were committed")
    elif lost:
        problems.append(f"committed trace events missing after the kill: {sorted(lost)} "
                        f"({lost_bytes} bytes)")
    for i, req in enumerate(report.requests):
        problems += [f"request {i}: {p}" for p in request_problems(req)]
    if report.state_before is not None:
        problems += [f"resumed state: {p}" for p in
                     state_problems(report.state_before, allow_open=True)]
        problems += [f"repaired state: {p}" for p in
                     state_problems(report.state_after or [], allow_open=False)]
    if problems and report.state_before is not None:  # the evidence, for the failure
        problems.append(f"state at resume: {report.state_before}; repaired: "
                        f"{report.repaired}; last event before the kill: {report.last_kind}")
    return problems, lost_bytes


def run_session(index: int, kills: int, base: Path, ctx) -> dict:
    """Create a session, kill ``kills`` children on it, then resume it to the end."""
    rng = random.Random(1000 + index)
    workspace = base / f"ws{index}"
    workspace.mkdir(parents=True)
    home = os.environ["SIMAGENT_HOME"]  # the parent reads the same state home
    session_id = None
    out: dict = {"problems": [], "last_kinds": Counter(), "repaired": 0, "kernels": [],
                 "requests": 0, "events": 0, "lost_bytes": 0, "resume_s": []}
    for child in range(kills + 1):
        tag = f"s{index}c{child}"
        final = child == kills
        spec = ChildSpec(str(workspace), home, make_turns(rng, tag, workspace, 2 if final else 12),
                         session_id=session_id, window=WINDOW,
                         start_kernel=not final and rng.random() < 0.6, warm_up=False)
        if final:
            report = run_child(ctx, spec)
        elif rng.random() < 0.15:  # during start-up: resume, repair, kernel start
            report = run_child(ctx, spec, kill_after_start=rng.uniform(0.0, 0.8))
        else:
            report = run_child(ctx, spec, kill_after_ready=rng.uniform(0.0, 1.5))
        session_id = session_id or report.session_id
        if session_id is None:  # killed before the session existed: a fresh start next
            continue
        paths = SessionPaths.for_session(workspace, session_id)
        found, lost_bytes = check_left_on_disk(paths, report)
        out["problems"] += [f"session {index} child {child}: {p}" for p in found]
        out["repaired"] += bool(report.repaired)
        out["kernels"] += report.kernel_pids
        out["requests"] += len(report.requests)
        out["events"] += len(report.events)
        if spec.session_id is not None and report.ready_s is not None:
            out["resume_s"].append(report.ready_s)  # open, repair, kernel: ready for a turn
        out["lost_bytes"] += lost_bytes
        if report.killed:
            out["last_kinds"][report.last_kind or "none"] += 1
        if final:
            if not report.done:
                out["problems"].append(f"session {index}: the last resume did not finish "
                                       f"({report.error or report.exitcode})")
            out["workspace"], out["session_id"] = workspace, session_id
    return out


@dataclass
class Series:
    """What a series of kills left: the problems found (none, when all is well)."""

    kills: int
    sessions: int
    seconds: float
    problems: list[str] = field(default_factory=list)
    left_running: list[int] = field(default_factory=list)  # processes outliving simagent
    kernels: int = 0
    repaired: int = 0
    requests: int = 0
    events: int = 0
    lost_bytes: int = 0
    compactions: int = 0
    last_kinds: Counter = field(default_factory=Counter)
    #: seconds from a resuming process's start until it was ready for a turn
    resume_s: list[float] = field(default_factory=list)
    #: (workspace, session id) of each session, resumed to the end
    resumed: list[tuple[Path, str]] = field(default_factory=list)


def run_series(base: Path, kills: int, ctx: Any, *, workers: int = WORKERS,
               per_session: int = KILLS_PER_SESSION) -> Series:
    """``kills`` SIGKILLs over sessions of ``per_session`` kills each, run ``workers`` at a
    time under ``base`` (the caller's ``SIMAGENT_HOME`` holds their state)."""
    sessions = max(1, kills // per_session)
    per = [kills // sessions + (1 if i < kills % sessions else 0) for i in range(sessions)]
    started = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda i: run_session(i, per[i], base, ctx),
                                range(sessions)))
    series = Series(kills, sessions, time.monotonic() - started)
    for r in results:
        series.problems += r["problems"]
        series.repaired += r["repaired"]
        series.requests += r["requests"]
        series.events += r["events"]
        series.lost_bytes += r["lost_bytes"]
        series.last_kinds += r["last_kinds"]
        series.kernels += len(r["kernels"])
        series.resume_s += r["resume_s"]
        if "session_id" in r:
            series.resumed.append((r["workspace"], r["session_id"]))
    # no kernel outlives its killed parent (the launcher's watcher kills its group),
    # including kernels still starting when the parent died (found by their environment)
    pids = [pid for r in results for pid in r["kernels"]]
    deadline = time.monotonic() + 5
    left = [0]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in pids if alive(p)] + processes_with_env(SESSION_DIR_ENV, str(base))
    series.left_running = left
    for workspace, session_id in series.resumed:
        db = SessionPaths.for_session(workspace, session_id).trace
        conn = sqlite3.connect(db)
        series.compactions += conn.execute(
            "SELECT COUNT(*) FROM events WHERE kind IN ('context_summary', 'context_clear')"
        ).fetchone()[0]
        conn.close()
    return series
