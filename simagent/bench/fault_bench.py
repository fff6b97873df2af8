"""``simagent bench faults``: every fault simagent claims to survive, run for real, one row each.

A claim of robustness is only as good as the faults it was measured against, so each
row here drives the *real* graph (scripted model, or the local OpenAI-compatible stub
server over real HTTP for provider faults) and the *real* kernel into one fault, then
asks four questions a user would:

* **survived**: did the session go on? The faulted turn ends as a turn (an answer, or
  one clear error for faults that must stop it), a following turn runs normally, and
  no tool call is left without its result in the checkpoint;
* **restored**: is the kernel state back? A check cell reads the names the set-up
  turn defined (``-`` where the fault never touched the kernel's state);
* **recover s**: seconds from the fault (or from the moment it could be detected, for a
  cell that hangs until its timeout) until the session was usable again; for the SIGKILL
  series, the median seconds a resuming process took to be ready for a turn;
* **lost bytes**: bytes written before the fault that are missing afterwards: trace
  events, raw outputs of earlier cells, and what the faulting cell printed before it
  faulted.

The catalogue lives in :mod:`simagent.bench.fault_cases`; this module holds the lab
(temporary state home, sessions, runners) and the measurement, so a new fault is a few
lines of catalogue. ``fast`` cases are the subset ``make test`` runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simagent.agent.builder import build_agent
from simagent.agent.events import ToolFinished, ToolStarted
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.context.boundaries import orphans
from simagent.session import Session

if TYPE_CHECKING:
    from simagent.agent.runner import TurnRunner
    from simagent.session import Session

#: What the set-up turn defines and the check cell reads back (a state-restoring recovery
#: must bring back an import, plain values, a container and a function).
SETUP_CODE = ("import math\nx = 41\nparams = {'dt': 0.01, 'n': 128}\n"
              "def energy(v):\n    return 0.5 * v * v\n")
CHECK_CODE = "print('restored', x + 1, params['n'], energy(2.0), math.floor(math.pi))"
RESTORED = "restored 42 128 2.0 3"
#: A cell after the fault proves the session goes on.
ALIVE_CODE = "print('alive', 6 * 7)"
ALIVE = "alive 42"
#: What a faulting cell prints first (flushed, then a pause so it reaches simagent):
#: afterwards its raw output must hold it, or those bytes count as lost.
FAULT_MARK = "fault-start " + "." * 88


@dataclass
class Outcome:
    """What one fault run measured (see the module docstring for each field)."""

    survived: bool
    restored: bool | None = None
    recover_s: float | None = None
    lost_bytes: int = 0
    detail: str = ""


@dataclass
class FaultRow:
    id: str
    group: str
    title: str
    survived: bool
    restored: bool | None
    recover_s: float | None
    lost_bytes: int
    detail: str
    wall_s: float = 0.0


@dataclass(frozen=True)
class FaultCase:
    """One catalogue entry: ``run`` drives the fault in a :class:`Lab` and measures it."""

    id: str
    group: str  # kernel | provider | watchdog | data
    title: str
    run: Callable[[Lab, bool], Outcome]  # (lab, fast) -> outcome
    fast: bool = False


# ------------------------------------------------------------------------------ the lab
@dataclass
class Clock:
    """Monotonic times of tool events, by tool call id, recorded from a turn's events."""

    started: dict[str, float] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # tool call ids in start order
    contents: dict[str, str] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)  # every finished tool's text, in order
    retries: list[Any] = field(default_factory=list)

    def __call__(self, event: Any) -> None:
        now = time.monotonic()
        if isinstance(event, ToolStarted):
            self.started[event.id] = now
            self.order.append(event.id)
        elif isinstance(event, ToolFinished):  # ToolError too (a subclass)
            self.finished[event.id] = now
            self.contents[event.id] = event.content
            self.outputs.append(event.content)
        elif type(event).__name__ == "Retrying":
            self.retries.append(event)


class Lab:
    """A temporary state home and workspace root; every session it opens is closed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._sessions: list[Session] = []
        self._count = 0

    def session(self) -> Session:
        self._count += 1
        ws = self.root / f"ws{self._count:02d}"
        ws.mkdir(parents=True, exist_ok=True)
        session = Session.create(ws, approval="auto")
        self._sessions.append(session)
        return session

    def scripted(self, session: Session, steps: Sequence[dict[str, Any]],
                 settings: Any = None, front_end: str = "headless") -> TurnRunner:
        """A runner whose model plays ``steps``; the bench runs as ``simagent run`` does
        (headless) unless a case says otherwise."""
        model = ScriptedChatModel.from_steps(list(steps))
        return TurnRunner(session, build_agent(session, model, context_settings=settings,
                                               front_end=front_end))

    def close(self) -> None:
        for s in self._sessions:
            try:
                s.close()
            except Exception:
                pass
        self._sessions.clear()


@contextmanager
def lab_home() -> Iterator[Lab]:
    """A :class:`Lab` whose sessions live under a fresh ``SIMAGENT_HOME`` (restored after)."""
    before = os.environ.get("SIMAGENT_HOME")
    with tempfile.TemporaryDirectory(prefix="simagent-faults-") as tmp:
        os.environ["SIMAGENT_HOME"] = str(Path(tmp) / "home")
        lab = Lab(Path(tmp))
        try:
            yield lab
        finally:
            lab.close()
            if before is None:
                os.environ.pop("SIMAGENT_HOME", None)
            else:
                os.environ["SIMAGENT_HOME"] = before


# ----------------------------------------------------------------------- measurement
@dataclass
class Snapshot:
    """What was on disk before the fault: trace events and raw output files."""

    events: dict[int, int]  # id -> payload bytes
    files: dict[str, tuple[int, str]]  # raw output name -> (size, sha256)


def snapshot(session: Session) -> Snapshot:
    events = {e.id: len(json.dumps(e.payload, ensure_ascii=False).encode())
              for e in session.trace.events()}
    files = {p.name: (p.stat().st_size, _sha_prefix(p, p.stat().st_size))
             for p in sorted(session.paths.outputs.glob("*.txt"))}
    return Snapshot(events, files)


def lost_since(session: Session, before: Snapshot) -> tuple[int, list[str]]:
    """Bytes of ``before`` that are gone or changed now, and what they were."""
    now = {e.id for e in session.trace.events()}
    lost, what = 0, []
    missing = [i for i in before.events if i not in now]
    if missing:
        lost += sum(before.events[i] for i in missing)
        what.append(f"{len(missing)} trace events")
    for name, (size, digest) in before.files.items():
        path = session.paths.outputs / name
        if not path.is_file() or path.stat().st_size < size or _sha_prefix(path, size) != digest:
            lost += size
            what.append(f"raw output {name}")
    return lost, what


def _sha_prefix(path: Path, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        left = size
        while left > 0 and (chunk := f.read(min(left, 1 << 20))):
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


def no_orphans(runner: TurnRunner) -> bool:
    """No tool call without its result and no result without its call, in the checkpoint
    (``context.boundaries.orphans``: what a provider would reject)."""
    state = runner.agent.graph.get_state(runner.session.thread_config)
    return not orphans(state.values.get("messages", []))


def raw_of(session: Session, code_start: str) -> Path | None:
    """The raw output file of the latest execution whose code starts with ``code_start``."""
    for event in reversed(session.trace.events(["kernel_exec"])):
        if str(event.payload.get("code", "")).startswith(code_start):
            raw = event.payload.get("raw_path")
            return Path(raw) if raw else None
    return None


def mark_lost(path: Path | None) -> int:
    """Bytes of :data:`FAULT_MARK` missing from a faulting cell's raw output."""
    if path is None or not path.is_file():
        return len(FAULT_MARK) + 1
    with open(path, "rb") as f:
        head = f.read(4096).decode("utf-8", "replace")
    return 0 if FAULT_MARK in head else len(FAULT_MARK) + 1


def marked(code: str) -> str:
    """``code`` preceded by the flushed :data:`FAULT_MARK` and a pause for it to arrive."""
    return (f"import sys as _fs, time as _ft\nprint({FAULT_MARK!r}, flush=True)\n"
            f"_ft.sleep(0.3)\n{code}")


# ------------------------------------------------------------------------------ running
def run_faults(cases: Sequence[FaultCase], *, fast: bool = False,
               progress: Callable[[str], None] | None = None) -> list[FaultRow]:
    """Run ``cases`` one after another, each in a fresh lab; a crash of the bench's own
    harness becomes a failed row with the error, never a lost run."""
    rows = []
    for case in cases:
        if progress:
            progress(f"fault {case.id}: {case.title}")
        t0 = time.monotonic()
        with lab_home() as lab:
            try:
                out = case.run(lab, fast)
            except Exception as exc:  # the harness failed: the row says so
                out = Outcome(False, detail=f"bench error: {type(exc).__name__}: {exc}"[:300])
        rows.append(FaultRow(case.id, case.group, case.title, out.survived, out.restored,
                             None if out.recover_s is None else round(out.recover_s, 2),
                             out.lost_bytes, out.detail, round(time.monotonic() - t0, 1)))
    return rows


def _yn(v: bool | None) -> str:
    return "-" if v is None else ("yes" if v else "NO")


def format_table(rows: Sequence[FaultRow]) -> str:
    head = ("fault", "group", "survived", "restored", "recover s", "lost bytes", "detail")
    body = [(r.id, r.group, _yn(r.survived), _yn(r.restored),
             "-" if r.recover_s is None else f"{r.recover_s:.2f}", str(r.lost_bytes),
             r.detail) for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h)
              for i, h in enumerate(head[:-1])]

    def line(cells: Sequence[str]) -> str:
        padded = (c.ljust(w) for c, w in zip(cells[:-1], widths, strict=True))
        return "  ".join(padded) + "  " + cells[-1]

    lines = [line(head), *(line(b) for b in body)]
    ok = sum(r.survived for r in rows)
    restorable = [r for r in rows if r.restored is not None]
    lines.append(f"\n{ok}/{len(rows)} survived; state restored in "
                 f"{sum(bool(r.restored) for r in restorable)}/{len(restorable)}; "
                 f"{sum(r.lost_bytes for r in rows)} bytes lost")
    return "\n".join(lines)


def as_json(rows: Sequence[FaultRow]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]
