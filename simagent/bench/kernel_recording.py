"""Kernel recording: run a workflow's kernel steps once for real, then serve the results
to every policy's replay.

Kernel results do not depend on the context policy, so recording them once and handing
them back in order keeps a policy's cost to graph time and keeps every policy's tool
results byte-identical (the only fair comparison). The recording runs in a real session
(simulator env, warm-up, real kernel), and its workspace is copied for each policy run,
so files the steps wrote are there for ``read_file`` and scorers.
"""

from __future__ import annotations

import shutil
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simagent.agent.tools import RUN_PYTHON
from simagent.config import Config
from simagent.kernel import ErrorInfo, ExecResult
from simagent.paths import new_session_id, workspace_state_dir
from simagent.session import Session
from simagent.simulators import get_simulator

if TYPE_CHECKING:
    from simagent.bench.workflow import Workflow
    from simagent.kernel import ExecResult


def kernel_codes(steps: list[dict[str, Any]]) -> list[str]:
    """The code of every ``run_python`` call, in play order (parallel calls in list order)."""
    codes = []
    for step in steps:
        for call in step.get("tools") or ([step] if "tool" in step else []):
            if call.get("tool") == RUN_PYTHON:
                codes.append(str((call.get("args") or {}).get("code", "")))
    return codes


@dataclass
class Recording:
    """Recorded results of one workflow's kernel steps, served FIFO per code."""

    workflow: str
    workspace: Path
    session_dir: Path
    results: list[tuple[str, ExecResult]] = field(default_factory=list)
    #: the session's state snapshot after each result (the kernel state card's source)
    snapshots: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def queues(self) -> dict[str, deque[tuple[int, ExecResult]]]:
        out: dict[str, deque[tuple[int, ExecResult]]] = defaultdict(deque)
        for i, (code, result) in enumerate(self.results):
            out[code].append((i, result))
        return out


def record(wf: Workflow, root: Path, progress: Any = None) -> Recording:
    """Run ``wf``'s kernel steps in a real session under ``root``; return the results."""
    workspace = root / "workspace"
    if root.exists():
        shutil.rmtree(root)
    workspace.mkdir(parents=True)
    wf.write_fixtures(workspace)
    session = Session.create(workspace, simulator=wf.simulator, approval="auto",
                             model=f"replay:{wf.id}", config=Config())
    rec = Recording(wf.id, workspace, session.paths.root)
    started = time.monotonic()
    try:
        session.start_kernel()
        codes = kernel_codes(wf.steps)
        for i, code in enumerate(codes):
            if progress:
                progress(f"recording {wf.id}: kernel step {i + 1}/{len(codes)}")
            rec.results.append((code, session.execute(code, timeout=600)))
            rec.snapshots.append(session.state_snapshot())
    finally:
        session.close()
    rec.seconds = time.monotonic() - started
    return rec


class ReplaySession(Session):
    """A session whose kernel is the recording: ``execute`` returns recorded results."""

    def __init__(self, workspace: Path, recording: Recording, wf: Workflow,
                 **kw: Any) -> None:
        super().__init__(workspace, new_session_id(), config=Config(),
                         simulator=get_simulator(wf.simulator), approval="auto", **kw)
        self._queues = recording.queues()
        self._snapshots = recording.snapshots
        self._recorded_artifacts = recording.session_dir / "artifacts"
        #: where ``_out[n]`` reads: the recorded kernel's raw outputs
        self.kernel_outputs = recording.session_dir / "outputs"
        self._last_served: int | None = None
        self._warmed = True
        self.trace.append("session_start", {"session_id": self.id, "workspace": str(workspace),
                                            "simulator": self.simulator.name
                                            if self.simulator else None,
                                            "model": f"replay:{wf.id}", "approval": "auto",
                                            "replay": True})

    @property
    def kernel_state(self) -> str:
        return "replay"

    def start_kernel(self) -> None:  # the recording is the kernel
        return None

    def restart_kernel(self) -> float:
        return 0.0

    def interrupt_kernel(self) -> None:
        return None

    def execute(self, code: str, *, on_output: Any = None, timeout: float | None = None,
                tool_call_id: str | None = None) -> ExecResult:
        queue = self._queues.get(code)
        if not queue:
            result = ExecResult(status="error", error=ErrorInfo(
                "ReplayError", "no recorded result for this code (the trajectory changed)",
                ""))
        else:
            self._last_served, result = queue.popleft()
        self.trace_execution(code, result, tool_call_id, replayed=True)
        return result

    @property
    def artifact_dirs(self) -> list[Path]:
        """The recording's figures too: the recorded results name them."""
        return [self.paths.artifacts, self._recorded_artifacts]

    def state_snapshot(self) -> dict[str, Any]:
        """The recorded kernel's snapshot after the latest served step (what the live
        kernel held at that point), so state cards in replay are those of the real run."""
        if self._last_served is None or self._last_served >= len(self._snapshots):
            return {"kernel": {"status": "not started", "generation": 0, "executions": 0},
                    "probe": None, "figures": [], "files": [], "files_more": 0}
        return self._snapshots[self._last_served]


def policy_workspace(recording: Recording, dest: Path) -> Path:
    """A fresh copy of the recorded workspace for one policy run, with no state from an
    earlier run of the same folder: its memory notes (``remember``) and sessions live in
    the state home under the folder's path, and a rerun of the bench into the same
    ``--out`` would otherwise start with a bigger memory index than the first run."""
    shutil.rmtree(workspace_state_dir(dest), ignore_errors=True)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(recording.workspace, dest, ignore=shutil.ignore_patterns(".simagent"))
    return dest
