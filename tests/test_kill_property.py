"""SIGKILL a live session at random moments, dozens to hundreds of times, and check it survives.

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
kills (50 in ``make test``; ``make test-deep``, which CI runs, sets 300).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from simagent.bench.kill_child import (
    ChildSpec,
    integrity,
    kill_context,
    run_child,
)
from simagent.bench.kill_series import run_series
from simagent.paths import SessionPaths

KILLS = int(os.environ.get("SIMAGENT_KILLS", "50"))


@pytest.mark.real
@pytest.mark.sampled
def test_sigkill_at_random_moments_leaves_a_consistent_resumable_session(tmp_path):
    series = run_series(tmp_path, KILLS, kill_context())
    assert not series.problems, "\n".join(series.problems[:40])
    assert series.lost_bytes == 0
    assert series.kernels >= KILLS // 4  # kernels did start, so kills hit them
    assert not series.left_running, \
        f"processes left running after their simagent died: {series.left_running}"
    # the kills landed where it matters: some mid-tool (a repair was needed), and the
    # sessions were long enough for compaction to run
    assert series.repaired >= max(1, KILLS // 20)
    assert series.compactions > 0
    print(f"\n{KILLS} kills over {series.sessions} sessions in {series.seconds:.0f}s; "
          f"{series.repaired} resumes repaired open calls; {series.requests} model requests "
          f"and {series.events} committed events checked; {series.compactions} compactions")
    print("last committed event before each kill:", dict(series.last_kinds.most_common()))


@pytest.mark.slow
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
