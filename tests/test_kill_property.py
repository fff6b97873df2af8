"""SIGKILL a live session at random moments, hundreds of times, and check it survives.

Property: whatever instruction a simagent process is on when it is SIGKILLed (streaming
a model reply, running a cell, compacting the context, writing the trace, starting the
kernel, repairing a resume), what it leaves on disk is consistent and resumable:

* ``PRAGMA integrity_check`` is ``ok`` for ``trace.sqlite`` and ``checkpoints.sqlite``;
* every trace event the process saw committed (announced over a pipe right after the
  commit) is in the trace;
* the next process resumes the session; after ``resume_repair`` no tool call in the
  checkpoint is left unanswered and no tool result answers nothing, and no request the
  "provider" (the scripted model) receives, ever, holds an orphaned call or result;
* no kernel outlives the process that started it.

Real parts throughout: real SIGKILL, real SQLite, real kernels, the real deepagents graph
with a scripted model at a 16k window (so compaction runs often). Children fork from a
warmed fork server (``simagent.bench.kill_child``). ``SIMAGENT_KILLS`` sets the number of
kills (default 200; the lead raises it for the data-safety figure).
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from simagent.bench.kill_child import (
    ChildReport,
    ChildSpec,
    alive,
    integrity,
    kill_context,
    processes_with_env,
    request_problems,
    run_child,
    state_problems,
    trace_ids,
)
from simagent.paths import SESSION_DIR_ENV, SessionPaths

KILLS = int(os.environ.get("SIMAGENT_KILLS", "200"))
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


def check_left_on_disk(paths: SessionPaths, report: ChildReport) -> list[str]:
    problems = []
    for db in (paths.trace, paths.checkpoints):
        if db.exists() and (verdict := integrity(db)) != "ok":
            problems.append(f"{db.name}: integrity_check = {verdict}")
    if paths.trace.exists():
        lost = set(report.events) - trace_ids(paths.trace)
        if lost:
            problems.append(f"committed trace events missing after the kill: {sorted(lost)}")
    elif report.events:
        problems.append("trace.sqlite is gone but events were committed")
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
    return problems


def run_session(index: int, kills: int, base: Path, ctx) -> dict:
    """Create a session, kill ``kills`` children on it, then resume it to the end."""
    rng = random.Random(1000 + index)
    workspace = base / f"ws{index}"
    workspace.mkdir(parents=True)
    home = os.environ["SIMAGENT_HOME"]  # the parent reads the same state home
    session_id = None
    out: dict = {"problems": [], "last_kinds": Counter(), "repaired": 0, "kernels": [],
                 "requests": 0, "events": 0}
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
        found = check_left_on_disk(paths, report)
        out["problems"] += [f"session {index} child {child}: {p}" for p in found]
        out["repaired"] += bool(report.repaired)
        out["kernels"] += report.kernel_pids
        out["requests"] += len(report.requests)
        out["events"] += len(report.events)
        if report.killed:
            out["last_kinds"][report.last_kind or "none"] += 1
        if final:
            if not report.done:
                out["problems"].append(f"session {index}: the last resume did not finish "
                                       f"({report.error or report.exitcode})")
            out["workspace"], out["session_id"] = workspace, session_id
    return out


def test_sigkill_at_random_moments_leaves_a_consistent_resumable_session(tmp_path):
    ctx = kill_context()
    sessions = max(1, KILLS // KILLS_PER_SESSION)
    per = [KILLS // sessions + (1 if i < KILLS % sessions else 0) for i in range(sessions)]
    started = time.monotonic()
    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(lambda i: run_session(i, per[i], tmp_path, ctx),
                                range(sessions)))
    elapsed = time.monotonic() - started
    problems = [p for r in results for p in r["problems"]]
    assert not problems, "\n".join(problems[:40])
    # no kernel outlives its killed parent (the launcher's watcher kills its group),
    # including kernels still starting when the parent died (found by their environment)
    pids = [pid for r in results for pid in r["kernels"]]
    assert len(pids) >= KILLS // 4  # kernels did start, so kills hit them
    deadline = time.monotonic() + 5
    left = [0]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in pids if alive(p)] + processes_with_env(SESSION_DIR_ENV,
                                                                   str(tmp_path))
    assert not left, f"processes left running after their simagent died: {left}"
    # the kills landed where it matters: some mid-tool (a repair was needed), and the
    # sessions were long enough for compaction to run
    assert sum(r["repaired"] for r in results) >= max(1, KILLS // 20)
    compactions = 0
    for r in results:
        db = SessionPaths.for_session(r["workspace"], r["session_id"]).trace
        conn = sqlite3.connect(db)
        compactions += conn.execute("SELECT COUNT(*) FROM events WHERE kind IN "
                                    "('context_summary', 'context_clear')").fetchone()[0]
        conn.close()
    assert compactions > 0
    print(f"\n{KILLS} kills over {sessions} sessions in {elapsed:.0f}s; "
          f"{sum(r['repaired'] for r in results)} resumes repaired open calls; "
          f"{sum(r['requests'] for r in results)} model requests and "
          f"{sum(r['events'] for r in results)} committed events checked; "
          f"{compactions} compactions")
    kinds = sum((r["last_kinds"] for r in results), Counter())
    print("last committed event before each kill:", dict(kinds.most_common()))


def test_simagent_run_continue_resumes_a_killed_session(tmp_path, workspace):
    """The CLI path: a session killed mid-cell resumes with ``simagent run --continue``,
    and the killed call reaches the model answered as interrupted."""
    ctx = kill_context()
    home = os.environ["SIMAGENT_HOME"]
    turns = [[{"tool": "run_python", "id": "slow-1",
               "args": {"code": "import time\nprint('started', flush=True)\ntime.sleep(60)"}},
              {"final": "never"}]]
    report = run_child(ctx, ChildSpec(str(workspace), home, turns), kill_after_ready=1.5)
    assert report.killed and report.session_id and not report.done
    script = tmp_path / "next.json"
    script.write_text(json.dumps([{"final": "resumed: {out[-1]|interrupted: [a-z ]+}"}]))
    env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_MODEL"}
    proc = subprocess.run([sys.executable, "-m", "simagent", "run", "--continue", "--json",
                           "--model", f"scripted:{script}", "go on"], cwd=workspace, env=env,
                          text=True, capture_output=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["session_id"] == report.session_id
    assert data["final"] == "resumed: interrupted: the process was killed while this tool call ran"
    paths = SessionPaths.for_session(workspace, report.session_id)
    assert integrity(paths.trace) == "ok" and integrity(paths.checkpoints) == "ok"
