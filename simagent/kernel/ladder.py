"""The recovery ladder: bring a kernel that stopped answering back, with its state.

The supervisor (:mod:`simagent.kernel.supervisor`) climbs it, handing itself over as a
:class:`~simagent.kernel.recoverable.LadderKernel` (the port and four members); it tells
a dead or frozen kernel itself (step 1: ``Kernel._lost``, ``Kernel._silent_death``). The
steps and their timings live here and nowhere else. Each step was checked on the real kernel
(ipykernel 7.4, jupyter_client 8.10, Linux; ``tests/test_kernel_recovery.py``):

1. **Heartbeat.** jupyter_client's heartbeat channel pings the kernel every second; the
   kernel answers from a zmq device thread that holds no GIL, so it keeps beating while
   a cell runs (even a GIL-holding numeric loop) and goes silent only when the whole
   process is frozen: SIGSTOPped, or stuck in the operating system. Silence for
   :data:`HEARTBEAT_GRACE_S` while a cell runs, or at the start of an execution
   silence with no reply on the control channel either, means frozen: the process is
   killed and recovered like a dead one.
2. **SIGINT** to the kernel's process group (``km.interrupt_kernel``): stops Python code
   and children that share the group.
3. **Control-channel interrupt** (``interrupt_request``). ipykernel answers it on its
   control thread within milliseconds even while the main thread is busy, but what it
   does is send SIGINT to its own process group: the same signal as step 2. It adds
   nothing against a cell that ignores SIGINT; it is kept because it reaches kernels
   the client cannot signal, and its reply (or silence) is recorded.
4. **Signal the kernel's child processes** directly (SIGTERM, then SIGKILL), whatever
   process group they are in. This is what frees a cell blocked on a child that never
   sees the group's SIGINT: ``os.system("setsid sleep 100")`` ignored steps 2 and 3 and
   returned as soon as its child got SIGTERM, with the kernel's state intact.
5. **Restart with replay.** After ``interrupt_grace_s`` (or for a dead or frozen
   kernel) the process is restarted and the session's state-defining cells of the
   current lineage are re-run in order (:mod:`simagent.kernel.replay` chooses them)
   with their output discarded: no ``_out[n]`` number is taken, ``In``/``Out`` history
   is untouched. A cell that ignores SIGINT in its main thread gets here; nothing in
   between can stop it.

:class:`Recovery` says what happened (the notice the model and the user read, and a
dict for the trace and ``simagent bench faults``).
"""

from __future__ import annotations

import queue
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from simagent.kernel import backup
from simagent.kernel.port import KernelPort
from simagent.kernel.process import signal_descendants
from simagent.kernel.recoverable import LadderKernel
from simagent.kernel.replay import Cell, ReplayBudget, Skip, first_line, load_records, select
from simagent.kernel_api import effects as fx

#: Seconds an interrupted cell may take to stop before the kernel is restarted.
INTERRUPT_GRACE_S = 10.0
#: Repeated interrupts of one execution are at least this far apart.
INTERRUPT_RESEND_S = 1.0
#: The escalation after the first SIGINT, as fractions of ``interrupt_grace_s``; the
#: restart with replay comes at 1.0.
INTERRUPT_STEPS: tuple[tuple[str, float], ...] = (
    ("control_interrupt", 0.25),
    ("term_children", 0.5),
    ("kill_children", 0.75),
)
#: Heartbeat silence that marks a kernel process as frozen.
HEARTBEAT_GRACE_S = 5.0
#: After a (re)start the heartbeat can read as failed for a ping cycle or two (its
#: socket reconnects); silence counts only from this long after the start.
HEARTBEAT_START_S = 2.0
#: How long a control-channel request waits for its reply while a cell runs.
CONTROL_REPLY_S = 0.5
#: How long a frozen kernel's SIGKILLed process may take to go.
KILL_WAIT_S = 3.0
#: A replayed cell may take this multiple of its recorded seconds (at least
#: :data:`REPLAY_TIMEOUT_MIN_S`), and the replay as a whole this multiple of its budget.
REPLAY_TIMEOUT_FACTOR = 2.0
REPLAY_TIMEOUT_MIN_S = 10.0
#: After interrupting a replayed cell that ran over, seconds to wait before giving up.
REPLAY_STOP_S = 3.0
_POLL_S = 0.1
_MAX_NAMES = 40
#: Names a "NOT back" line shows: each is one the model or the person must re-create.
NOT_BACK_SHOWN = 12
#: Where a replay keeps the files it rewrites until it puts them back (session folder).
BACKUP_DIR = "replay-backup"


@dataclass
class Recovery:
    """One climb of the ladder: what was tried, how long it took, what came back.

    ``trigger``: ``died`` (process gone), ``frozen`` (heartbeat lost), ``unresponsive``
    (a cell ignored every interrupt), ``interrupt`` (an escalated interrupt stopped the
    cell; no restart) or ``restore`` (asked for: ``/restore``).
    """

    trigger: str
    reason: str = ""
    steps: list[dict[str, Any]] = field(default_factory=list)
    restarted: bool = False
    restart_s: float = 0.0
    replay_s: float = 0.0
    #: From detection (or the first interrupt) to a usable kernel.
    seconds: float = 0.0
    replayed: list[int] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    lineage: int | None = None
    survived: bool = True
    #: Files a replay rewrote and could not put back (path and reason): said loudly.
    files_not_restored: list[str] = field(default_factory=list)
    #: The kernel is the person's (attached): it is never replayed into, and ...
    attached: bool = False
    #: ... it was not restarted, for want of their consent.
    declined: bool = False
    #: ... they consented, and it did not come back: what state it is in, in words.
    not_back: str = ""
    #: Names the kernel had before a ``/restore`` and has not after it (a cell that
    #: raised after assigning them is not replayed): said, never silently lost.
    lost: list[str] = field(default_factory=list)

    @property
    def listed(self) -> list[Skip]:
        """Cells left out that defined state (their names are missing)."""
        return [s for s in self.skipped if s.loses_state]

    @property
    def offered(self) -> list[Skip]:
        """Cells left out because they act outside the kernel: ``/restore`` offers them."""
        return [s for s in self.skipped if s.kind == "effects"]

    @property
    def state_restored(self) -> bool:
        """Kernel state is as it was: kept (no restart) or fully replayed."""
        return self.survived and not self.lost and (not self.restarted or (
            not self.attached and not self.listed and not self.failed))

    def message(self) -> str:
        """The one notice for the model and the user."""
        parts = [self.reason] if self.reason else []
        tried = list(dict.fromkeys(s["step"] for s in self.steps))
        if self.declined or self.not_back:
            if tried:
                parts.append("tried: " + ", ".join(_STEP_WORDS.get(s, s) for s in tried))
            return "; ".join([*parts, self.not_back or (
                DECLINED if self.survived else DECLINED_GONE)])
        if not self.restarted:
            return f"the cell stopped only after {_STEP_WORDS.get(tried[-1], tried[-1])}" \
                if tried else "kernel state is kept"
        if tried:
            parts.append("tried first: " + ", ".join(_STEP_WORDS.get(s, s) for s in tried))
        parts.append(f"the kernel was restarted ({self.restart_s:.1f} s)")
        if self.attached:
            parts.append("nothing was replayed into it (it is the person's kernel): its "
                         "earlier state, theirs and simagent's, is lost")
        if self.replayed:
            refs = ", ".join(f"_out[{n}]" for n in self.replayed)
            parts.append(f"{len(self.replayed)} earlier cell(s) that defined state were "
                         f"replayed in {self.replay_s:.1f} s ({refs})")
        if self.attached:
            pass
        elif self.state_restored:
            parts.append("earlier state is restored" if self.replayed
                         else "no earlier cell defined state, so nothing was lost")
        else:
            parts.append("earlier state is only partly restored" if self.replayed
                         else "earlier state is lost")
        if self.names:
            shown = self.names[:_MAX_NAMES]
            more = f", … (+{len(self.names) - len(shown)} more)" if len(self.names) > len(
                shown) else ""
            parts.append("names back: " + ", ".join(shown) + more)
        if self.lost:
            parts.append(names_not_back("names the kernel had before are", self.lost))
        rest = [s for s in self.listed if s.kind != "effects"]
        if rest:
            parts.append("NOT replayed (re-run what you need): " + "; ".join(
                f"_out[{s.n}] `{s.line}` ({s.seconds:.1f} s: {s.why})" for s in rest))
        if self.offered:
            parts.append("NOT replayed because a replay would repeat what they did outside "
                         "the kernel (re-run one only if that should happen again): " +
                         "; ".join(f"skipped _out[{s.n}] `{s.line}`: {s.why}"
                                   for s in self.offered))
        if self.files_not_restored:
            parts.append("files a replay rewrote COULD NOT be put back (their copies stay "
                         f"in the session's {BACKUP_DIR} folder): "
                         + "; ".join(self.files_not_restored))
        if self.failed:
            parts.append("failed when replayed: " + "; ".join(
                f"_out[{f['n']}] `{f['line']}` ({f['error']})" for f in self.failed))
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"trigger": self.trigger, "reason": self.reason, "steps": self.steps,
                "restarted": self.restarted, "restart_s": round(self.restart_s, 3),
                "replay_s": round(self.replay_s, 3), "seconds": round(self.seconds, 3),
                "replayed": list(self.replayed),
                "skipped": [s.to_dict() for s in self.listed],
                "skipped_display_or_failed": sum(not s.loses_state for s in self.skipped),
                "failed": list(self.failed), "names": list(self.names),
                **({"lost": list(self.lost)} if self.lost else {}),
                "lineage": self.lineage, "survived": self.survived,
                "files_not_restored": list(self.files_not_restored),
                "state_restored": self.state_restored,
                **({"attached": True, "needs_consent": self.declined,
                    **({"not_back": self.not_back} if self.not_back else {})}
                   if self.attached else {})}


def names_not_back(subject: str, names: list[str]) -> str:
    """The one wording for names a restart did not bring back (a cell restarted under
    it, ``/restore``): ``subject`` "NOT back", the names, and what to do."""
    shown = ", ".join(names[:NOT_BACK_SHOWN]) + (", …" if len(names) > NOT_BACK_SHOWN else "")
    return f"{subject} NOT back: {shown}; re-run what you need"


#: What a declined recovery says: the kernel is the person's, so the ladder stops and asks.
DECLINED = ("simagent did not restart it: the kernel is the person's (attached), and "
            "simagent restarts it only when they agree; its variables are untouched (a cell "
            "may still be running there). Stop or restart it where it runs (JupyterLab: "
            "Kernel > Interrupt or Restart); simagent goes on when it answers again")


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


_STEP_WORDS = {
    "sigint": "SIGINT",
    "control_interrupt": "a control-channel interrupt",
    "term_children": "SIGTERM to its child processes",
    "kill_children": "SIGKILL to its child processes",
}


# -------------------------------------------------------------------- steps
def control_request(kc: Any, msg_type: str, timeout: float = CONTROL_REPLY_S,
                    content: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Send ``msg_type`` on the control channel; its reply content, or None on silence
    (at once for ``timeout`` 0: sent, not awaited)."""
    msg = kc.session.msg(msg_type, content or {})
    kc.control_channel.send(msg)
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            reply = kc.control_channel.get_msg(timeout=min(left, _POLL_S))
        except queue.Empty:
            continue
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            return reply["content"]
    return None


def escalate(step: str, at_s: float, client: Any, pid: int | None) -> dict[str, Any]:
    """Run one interrupt step (see the module docstring) on the kernel that ``client``
    talks to and whose process is ``pid``; its record for ``steps``."""
    out: dict[str, Any] = {"step": step, "at_s": round(at_s, 3)}
    if step == "control_interrupt":
        reply = control_request(client, "interrupt_request")
        out["reply"] = None if reply is None else reply.get("status")
    elif step in ("term_children", "kill_children"):
        sig = signal.SIGTERM if step == "term_children" else signal.SIGKILL
        out["processes"] = signal_descendants(pid, sig)
    return out


def frozen_reason(grace_s: float, killed: bool) -> str:
    """Why an idle kernel counts as frozen (step 1), in words."""
    then = " and was killed" if killed else ""
    return (f"the kernel stopped answering (no heartbeat, no reply on its control channel "
            f"for {grace_s:g} s: a stopped or wedged process){then}")


# ------------------------------------------------------------------- replay
def replay(kernel: LadderKernel, rec: Recovery) -> None:
    """Re-run the state-defining cells of ``rec``'s lineage into ``rec`` (kernel freshly
    started; the caller holds its lock)."""
    source = kernel.replay_source
    budget = source.budget
    records = load_records(source.paths.outputs)
    spare = source.paths.root / BACKUP_DIR
    leftover = rec.files_not_restored = backup.put_back_leftover(spare)
    written = [str(e["path"]) for r in records for e in fx.of(r) if e.get("kind") == "write"]
    plan = select(records, budget, rec.lineage, backup.sizes(written), str(source.cwd))
    try:
        if leftover:  # its copies are the only ones: never overwrite them
            raise OSError(f"an earlier replay's backup of {len(leftover)} file(s) could "
                          f"not be put back")
        backup.save(spare, plan.writes)
    except OSError as exc:  # no backup, no rewrite: those cells are listed instead
        why = f"its files could not be backed up for a replay ({exc.strerror or exc})"
        plan.skipped += [Skip(c.n, c.first_line, c.seconds, "effects", why)
                         for c in plan.run if c.writes]
        plan.run = [c for c in plan.run if not c.writes]
        if not leftover:
            backup.put_back(spare)
    rec.skipped = list(plan.skipped)
    t0 = time.monotonic()
    try:
        with kernel.hold_for_replay() as stop:
            _replay_cells(kernel, rec, plan.run, budget, stop, t0)
    finally:
        if not leftover:
            rec.files_not_restored += backup.put_back(spare)
        rec.replay_s = time.monotonic() - t0


def _replay_cells(kernel: LadderKernel, rec: Recovery, cells: list[Cell],
                  budget: ReplayBudget, stop: threading.Event, t0: float) -> None:
    """Run the replay's ``cells`` in order until one dies or wedges, the budget runs out
    or ``stop`` is set (the person's interrupt)."""
    for i, cell in enumerate(cells):
        over = time.monotonic() - t0 > REPLAY_TIMEOUT_FACTOR * budget.total_s
        if over or stop.is_set():
            why = ("the user interrupted the replay" if not over else
                   f"replay ran past {REPLAY_TIMEOUT_FACTOR:g}x its {budget.total_s:g} s "
                   f"budget")
            rec.skipped += [Skip(c.n, c.first_line, c.seconds, "stopped", why)
                            for c in cells[i:]]
            return
        timeout = max(REPLAY_TIMEOUT_MIN_S, REPLAY_TIMEOUT_FACTOR * cell.seconds)
        status, error = kernel.run_quiet(cell.code, timeout, stop)
        if status == "ok":
            rec.replayed.append(cell.n)
            continue
        rec.failed.append({"n": cell.n, "line": cell.first_line, "error": error})
        if status in ("died", "wedged"):  # start clean; what was replayed is gone
            kernel.respawn()
            rec.failed += [{"n": c.n, "line": c.first_line, "error": "lost when the "
                            "kernel was restarted again"}
                           for c in cells[:i] if c.n in rec.replayed]
            rec.replayed = []
            rec.skipped += [Skip(c.n, c.first_line, c.seconds, "stopped",
                                 f"replay stopped at _out[{cell.n}]")
                            for c in cells[i + 1:]]
            return


def offer_text(rec: Recovery, base: Any = None) -> str:
    """What ``/restore`` shows before it asks to run the cells the replay left out for
    their effects: each cell's first line and everything it would do again."""
    lines = ["Not replayed because they acted outside the kernel; running them again "
             "repeats that:"]
    for s in rec.offered:
        lines.append(f"  _out[{s.n}] `{s.line}`: " + (fx.describe_all(s.effects, base, limit=8)
                                                       if s.effects else s.why))
    return "\n".join(lines)


def run_offered(kernel: LadderKernel, ns: list[int]) -> list[dict[str, Any]]:
    """Run the cells ``ns`` (left out of a replay for their effects) after the user
    agreed, in order, output discarded, the kernel held throughout; one ``{n, line,
    status, error}`` per cell."""
    by_n = {r["n"]: r for r in load_records(kernel.replay_source.paths.outputs)}
    done: list[dict[str, Any]] = []
    with kernel.hold_for_replay():  # no interrupt reaches these cells: only their timeout
        for n in ns:
            code = str((by_n.get(n) or {}).get("code") or "")
            seconds = float((by_n.get(n) or {}).get("elapsed_s") or 0.0)
            if not code or kernel.state != "idle":
                done.append({"n": n, "line": first_line(code), "status": "not run",
                             "error": "no such cell" if not code else "the kernel is "
                             f"{kernel.state}"})
                continue
            timeout = max(REPLAY_TIMEOUT_MIN_S, REPLAY_TIMEOUT_FACTOR * seconds)
            status, error = kernel.run_quiet(code, timeout)
            done.append({"n": n, "line": first_line(code), "status": status, "error": error})
            if status in ("died", "wedged"):
                break
    return done


def names_back(probe: dict[str, Any] | None) -> list[str]:
    """The user's names in a state probe (``state_probe.probe``): variables, imports
    (their bound names), functions and classes."""
    if not probe or "error" in probe:
        return []
    names = [str(e.get("name")) for e in probe.get("names") or []]
    names += [str(i).split("=")[0] for i in probe.get("imports") or []]
    names += [str(f) for f in probe.get("functions") or []]
    return list(dict.fromkeys(n for n in names if n))

#: ... and what it says when the person's kernel is gone (nothing simagent may restart).
DECLINED_GONE = ("the kernel is the person's (attached) and it no longer answers; simagent "
                 "restarts it only when they agree (the TUI asks; /reset), and one started "
                 "with `jupyter kernel` does not come back: start a kernel and attach to it "
                 "(simagent --kernel latest)")


def consents(kernel: KernelPort, reason: str) -> bool:
    """Whether the person lets simagent restart their (attached) kernel: their answer to
    ``consent``; no one to ask, or a front end that failed to ask, is no."""
    try:
        return bool(kernel.consent and kernel.consent(reason))
    except Exception:  # a front end that cannot ask has not been answered yes
        return False


def recover(kernel: LadderKernel, trigger: str, reason: str, *,
            steps: list[dict[str, Any]] | None = None,
            started: float | None = None) -> Recovery:
    """Restart (or start) the kernel, replay its lineage, read back its names.

    The caller holds the kernel's lock, and keeps what the climb says (the supervisor:
    ``last_recovery``, and ``awaiting_consent`` for a person's kernel left as it is).
    ``started`` is when the trouble was first seen (the first interrupt), for
    :attr:`Recovery.seconds`. A kernel simagent does not own is restarted only if the
    person agrees (:func:`consents`), and never replayed into; without consent the climb
    stops here: ``declined``, kernel untouched.
    """
    t0 = started if started is not None else time.monotonic()
    was = kernel.status()
    rec = Recovery(trigger, reason, steps=list(steps or []), lineage=was.lineage,
                   attached=not was.owned)
    if not was.owned and not consents(kernel, reason or trigger):
        rec.declined = True
        rec.survived = trigger not in ("died", "frozen")  # a live kernel keeps its state
        rec.seconds = time.monotonic() - t0
        return rec
    t = time.monotonic()
    rec.restarted = True
    try:
        kernel.respawn()  # starts the kernel if there is none
    except Exception as exc:  # an attached kernel whose manager did not bring it back
        if was.owned:
            raise
        rec.restarted, rec.not_back = False, str(exc)
        rec.survived = kernel.state != "dead"  # still running the cell that held it
        rec.seconds = time.monotonic() - t0
        return rec
    rec.restart_s = time.monotonic() - t
    kernel.state = "restarting"
    try:
        if was.owned:
            replay(kernel, rec)
    finally:
        kernel.state = "idle" if kernel.status().alive else "dead"
    rec.survived = kernel.state == "idle"
    rec.names = names_back(kernel.probe_state(None)) if rec.survived else []
    rec.seconds = time.monotonic() - t0
    return rec
