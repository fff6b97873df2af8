"""The REPL watchdog: notices a model stuck on failing ``run_python`` cells.

The identical-call watchdog (``context.guards``) only sees literal repeats, but a model
stuck in a REPL rarely repeats itself byte for byte: it tweaks a number, re-indents, and
runs into the same exception again. Three signals, each over the *current turn's* cells
(a user message is the intervention an alert asks for, so it starts afresh):

* ``same_error``: :data:`~simagent.context.thresholds.REPL_SAME_ERROR` failing cells in a
  row with one error signature (exception type + message, numbers, memory addresses and
  quoted paths normalised, see :func:`error_signature`);
* ``failed_run``: :data:`~simagent.context.thresholds.REPL_FAILED_RUN` failing cells in a
  row, whatever the errors;
* ``whitespace_rerun``: a cell whose code equals the failed cell before it up to
  whitespace (:func:`same_code`), caught before it runs.

One alert per stuck run (a success ends the run). ``warn`` (the TUI's default) traces
it, shows the user a notice and gives the model one short ``[watchdog]`` nudge before
its next call; ``enforce`` (headless) ends the turn with the reason, stripping the calls
not yet run (``guards.stop_turn``), so no tool call is left without its result.

Everything is read from the checkpointed messages (the kernel's status rides on each
``run_python`` result's artifact; the context layers clear results only in the model's
view, never in state), and which alerts already fired is read from the marks they left
there, so a resumed or rebuilt agent behaves the same. The pure core (:func:`scan`) is a
function of a list of :class:`Cell` and is tested without a graph.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from langchain.agents.middleware import AgentMiddleware, hook_config
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from simagent.context.counting import is_user_message
from simagent.context.guards import MARK, notice, stop_turn
from simagent.context.reporting import emit
from simagent.context.settings import ContextSettings
from simagent.context.thresholds import repl_watchdog_mode
from simagent.tool_names import RUN_PYTHON
from simagent.trace.log import TraceLog

#: Kernel statuses of a failed cell (``interrupted`` is the user stepping in, not a failure).
FAILED = frozenset({"error", "timeout", "died"})
SIGNALS = ("same_error", "failed_run", "whitespace_rerun")
#: ``lc_source`` of the warn-mode nudge (a HumanMessage the context layers know is no user's).
NUDGE_SOURCE = "simagent_repl_watchdog"
#: Tools that change neither files nor the kernel: a failed cell re-run after only these
#: is a rerun; after anything else (``write_file``, ``reset_kernel``, a subagent, an unknown
#: tool) the same code may well behave differently, so the rerun signal stays quiet.
READ_ONLY_TOOLS = frozenset({"read_file", "ls", "glob", "grep", "view_figure", "recall",
                             "record_attempt", "remember", "write_todos"})
#: Longest signature kept (traces, notices and nudges stay one line).
SIGNATURE_CHARS = 200

_EXC_LINE = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|"
                       r"Warning|Iteration|Fault|Failure))(?::\s*(.*))?$")
_QUOTED_PATH = re.compile(r"""(["'])(?:[A-Za-z]:)?[^"'\s]*[/\\][^"']*\1""")
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]+\b")
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])")


# ----------------------------------------------------------------------- pure core
def normalise(text: str) -> str:
    """``text`` with what varies between otherwise identical errors replaced: quoted
    paths (``"PATH"``, with their line numbers), memory addresses (``0xADDR``) and
    numbers (``N``); whitespace collapsed."""
    text = _QUOTED_PATH.sub(lambda m: f"{m.group(1)}PATH{m.group(1)}", text)
    text = _ADDRESS.sub("0xADDR", text)
    text = _NUMBER.sub("N", text)
    return " ".join(text.split())


def _is_notice(line: str) -> bool:
    return line.startswith("[") and line.endswith("]")


def error_signature(text: str, status: str = "error") -> str:
    """The normalised ``Type: message`` of the error at the end of a cell's output.

    The kernel's text puts the error after streams and values, followed only by
    ``[notices]``, so the last line that reads as ``SomethingError: ...`` starts it (a
    message may run over several lines). A timeout or a dead kernel is its status; an
    error with no such line falls back to the last line of the output."""
    if status != "error":
        return f"[{status}]"
    lines = [ln.strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln and not _is_notice(ln)]
    for i in range(len(lines) - 1, -1, -1):
        found = _EXC_LINE.match(lines[i])
        if found:
            message = " ".join([found.group(2) or "", *lines[i + 1:]]).strip()
            head = f"{found.group(1)}: {message}" if message else found.group(1)
            return normalise(head)[:SIGNATURE_CHARS]
    return normalise(lines[-1])[:SIGNATURE_CHARS] if lines else "[error]"


def _shape(code: str) -> list[tuple[int, str]]:
    lines = textwrap.dedent(code.expandtabs(4)).splitlines()
    return [(len(ln) - len(ln.lstrip()), "".join(ln.split())) for ln in lines if ln.strip()]


def same_code(a: str, b: str) -> bool:
    """Equal up to whitespace that does not change what Python runs: blank lines, spaces
    within a line, trailing space and a common indent. Relative indentation is syntax
    (fixing an ``IndentationError`` is a real change), so it counts."""
    return _shape(a) == _shape(b)


@dataclass(frozen=True)
class Cell:
    """One ``run_python`` call as the watchdog sees it."""

    code: str
    status: str | None  # the kernel's status; None: requested, not run yet
    text: str = ""  # the model-facing output (the error is at its end)
    call_id: str | None = None
    #: a tool that may change files or the kernel ran since the previous cell
    changed: bool = False

    @property
    def failed(self) -> bool:
        return self.status in FAILED

    @cached_property  # read up to three times per cell by scan(); regexes over the output
    def signature(self) -> str:
        return error_signature(self.text, self.status or "error") if self.failed else ""


@dataclass(frozen=True)
class Alert:
    index: int  # of the cell it fires at
    signal: str  # one of SIGNALS
    signature: str  # the error repeated (the failed cell's, for a rerun)
    count: int  # failed cells in the run so far (for a rerun: before it)
    call_id: str | None = None


def scan(cells: Sequence[Cell], *, same_error: int = 3, failed_run: int = 3,
         whitespace: bool = True) -> list[Alert]:
    """Every alert over ``cells`` (oldest first), at most one per stuck run.

    A run is a stretch of failed cells; any other outcome ends it. A pending cell (status
    None) can only fire the rerun signal, which depends on its code alone, so the same
    cell gives the same alert before and after it runs. ``same_error`` or ``failed_run``
    of 0 switches that signal off; when both fire at one cell, ``same_error`` is named.
    """
    alerts: list[Alert] = []
    run = same = 0
    alerted = False
    prev: Cell | None = None
    for i, cell in enumerate(cells):
        if (whitespace and not alerted and prev is not None and prev.failed
                and not cell.changed and same_code(prev.code, cell.code)):
            alerts.append(Alert(i, "whitespace_rerun", prev.signature, run, cell.call_id))
            alerted = True
        if cell.status is None:
            break  # nothing ran yet: no outcome to count
        if cell.failed:
            sig = cell.signature
            same = same + 1 if prev is not None and prev.failed and prev.signature == sig \
                else 1
            run += 1
            signal = ("same_error" if same_error and same >= same_error else
                      "failed_run" if failed_run and run >= failed_run else None)
            if signal and not alerted:
                count = same if signal == "same_error" else run
                alerts.append(Alert(i, signal, sig, count, cell.call_id))
                alerted = True
        else:
            run = same = 0
            alerted = False
        prev = cell
    return alerts


def describe(alert: Alert) -> str:
    """The alert in words, for notices, nudges and the stop note."""
    if alert.signal == "same_error":
        return (f"the last {alert.count} run_python cells failed with the same error "
                f"({alert.signature})")
    if alert.signal == "failed_run":
        return (f"the last {alert.count} run_python cells all failed (latest: "
                f"{alert.signature})")
    return (f"a cell that just failed ({alert.signature}) was re-run with only whitespace "
            "changes")


# ------------------------------------------------------------- reading the thread
def _artifact_status(msg: ToolMessage) -> str | None:
    artifact = msg.artifact if isinstance(msg.artifact, dict) else {}
    status = artifact.get("status")
    return str(status) if status else None


def turn_start(messages: Sequence[Any]) -> int:
    """Index just after the latest user message (nudges and summaries carry an
    ``lc_source`` and are no user's), 0 when there is none."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if is_user_message(m):
            return i + 1
    return 0


def cells_of(messages: Sequence[Any]) -> list[Cell]:
    """The ``run_python`` cells of the current turn, in call order.

    A result without a kernel status (the tool itself raised, an approval rejected it)
    says nothing about the code, so it counts as a neutral outcome that ends a run."""
    turn = messages[turn_start(messages):]
    results = {m.tool_call_id: m for m in turn if isinstance(m, ToolMessage)}
    cells: list[Cell] = []
    changed = False
    for m in turn:
        if not isinstance(m, AIMessage):
            continue
        for call in m.tool_calls:
            if call.get("name") != RUN_PYTHON:
                changed = changed or call.get("name") not in READ_ONLY_TOOLS
                continue
            result = results.get(call.get("id"))
            code = str((call.get("args") or {}).get("code", ""))
            if result is None:
                status, text = None, ""
            else:
                status, text = _artifact_status(result) or "unknown", result.text
            cells.append(Cell(code, status, text, call.get("id"), changed))
            changed = False
    return cells


def fired(messages: Sequence[Any]) -> set[str]:
    """Call ids this turn's alerts were raised at, from the marks they left in state."""
    out: set[str] = set()
    for m in messages[turn_start(messages):]:
        if isinstance(m, HumanMessage) and m.additional_kwargs.get("lc_source") == NUDGE_SOURCE:
            out.update(str(c) for c in m.additional_kwargs.get("call_ids") or ())
        elif isinstance(m, AIMessage):
            mark = m.additional_kwargs.get(MARK)
            if isinstance(mark, dict) and mark.get("guard") == "repl_watchdog":
                out.add(str(mark.get("tool_call_id")))
    return out


# -------------------------------------------------------------------- middleware
class ReplWatchMiddleware(AgentMiddleware):
    """Warns once per stuck run (``warn``) or ends the turn (``enforce``); see the module.

    ``warn`` acts in ``before_model``, once the failing results are in, so its nudge
    follows them (a message may not sit between a call and its result); it never blocks
    a call, a rerun included. ``enforce`` acts in ``after_model``, on the reply that
    would go on: a rerun is stopped before it runs.
    """

    def __init__(self, trace: TraceLog | None, settings: ContextSettings | None = None, *,
                 front_end: str = "tui", agent: str = "main", small: bool = False) -> None:
        super().__init__()
        self.trace = trace
        self.settings = settings or ContextSettings()
        self.mode = repl_watchdog_mode(self.settings, front_end, small=small)
        self.agent = agent

    @property
    def name(self) -> str:
        return f"ReplWatchMiddleware[{self.agent}]"

    def _new_alerts(self, messages: Sequence[Any]) -> list[Alert]:
        s = self.settings
        done = fired(messages)
        return [a for a in scan(cells_of(messages), same_error=s.repl_same_error,
                                failed_run=s.repl_failed_run,
                                whitespace=s.repl_whitespace_rerun)
                if a.call_id not in done]

    def _raise(self, alert: Alert, stopped: bool) -> dict[str, Any]:
        detail = {"signal": alert.signal, "signature": alert.signature, "count": alert.count,
                  "mode": self.mode, "stopped": stopped, "tool_call_id": alert.call_id,
                  "agent": self.agent}
        emit(self.trace, "repl_watchdog", detail)  # trace event + context stream item
        notice(f"repl watchdog: {describe(alert)}" + ("; turn stopped" if stopped else ""))
        return detail

    def before_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        messages = list(state.get("messages") or [])
        if self.mode != "warn" or not messages:
            return None
        alerts = self._new_alerts(messages)
        for alert in alerts:
            self._raise(alert, stopped=False)
        if not alerts:
            return None
        alert = alerts[-1]
        what = describe(alert)
        text = (f"[watchdog] {what[0].upper()}{what[1:]}. Stop repeating variations of the "
                "same code: read the error, check the inputs or the documentation, try a "
                "different approach, or ask the user.")
        return {"messages": [HumanMessage(content=text, additional_kwargs={
            "lc_source": NUDGE_SOURCE, "signal": alert.signal,
            "call_ids": [a.call_id for a in alerts]})]}  # what fired(): one nudge for all

    async def abefore_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        return self.before_model(state, runtime)

    @hook_config(can_jump_to=["end"])
    def after_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        messages = list(state.get("messages") or [])
        if self.mode != "enforce" or not messages or not isinstance(messages[-1], AIMessage):
            return None
        alerts = self._new_alerts(messages)
        if not alerts:
            return None
        alert = alerts[0]  # the turn ends here: one alert, the first one
        pending = bool(messages[-1].tool_calls)
        detail = self._raise(alert, stopped=pending)
        if not pending:  # the model ended the turn itself; its answer stands
            return None
        note = (f"[watchdog] Turn stopped: {describe(alert)}, so the calls in this reply "
                "were not run. Fix the cause or give new instructions to go on.")
        return stop_turn(messages, note, {"guard": "repl_watchdog", **detail})

    @hook_config(can_jump_to=["end"])
    async def aafter_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        return self.after_model(state, runtime)
