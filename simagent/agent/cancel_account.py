"""What a cancelled turn did to the kernel, told the same way to the person and the model.

ctrl+C interrupts the running cell. A cell that ignores SIGINT is stopped by the
recovery ladder instead: the kernel is restarted and earlier state-defining cells are
replayed (``kernel/ladder.py``). Then "the kernel kept its state" is false: what the
interrupted cell itself assigned is gone, and the ladder's notice says what came back.

The graph's stream is closed once the turn is cancelled, so the interrupted call's
result may never reach the saved state (the model would later read deepagents' generic
"did not complete"), and the runner no longer reads the stream's ``tool_finished``. The
recorder has written the real result to the trace all the same. :func:`settle` answers
the thread's open calls from those recorded results (``resume_repair``), hands each one
to the interfaces as a ``ToolFinished`` (card mark, headless line) and returns the
accounts the turn's closing notice and ``--json`` report.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from langchain_core.messages import ToolMessage

from simagent.agent.events import Notice, ToolError, ToolFinished
from simagent.agent.resume_repair import CANCELLED, repair
from simagent.kernel.ladder import names_not_back
from simagent.outcomes import outcome_of

#: Kernel states in which a cell (or the ladder's restart and replay) is still running.
STOPPING = ("busy", "restarting", "starting")
#: How long a new turn (or the follower) waits for an abandoned turn's cell to stop. The
#: ladder bounds it (grace, restart, replay budget); this keeps a wedged wait finite.
SETTLE_WAIT_S = 300.0
#: What an abandoned turn left running -> (the trace's error message, the notice). A
#: second ctrl+C may come while the cell, not the model, is still stopping.
ABANDONED = {
    "cell": ("turn abandoned: not waiting for the cell, which was still being stopped",
             "Not waiting for the cell: it ignored the interrupt and is still being stopped "
             "(the kernel is restarted and earlier state replayed if it does not stop)."),
    "model": ("turn abandoned: the model call did not stop on cancel; its late reply will "
              "be dropped",
              "The model call did not stop; the turn was abandoned and its late reply will "
              "be dropped."),
}


def assigned_names(code: str) -> list[str]:
    """Names a cell binds at its top level (assignments, imports, defs, loops, ``with``)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return []
    found: dict[str, None] = {}

    def targets(node: ast.AST) -> None:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                found.setdefault(sub.id, None)

    for stmt in tree.body:
        if isinstance(stmt, ast.Assign | ast.AugAssign | ast.AnnAssign):
            for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]):
                targets(t)
        elif isinstance(stmt, ast.Import | ast.ImportFrom):
            for alias in stmt.names:
                if alias.name != "*":
                    found.setdefault((alias.asname or alias.name).split(".")[0], None)
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.setdefault(stmt.name, None)
        elif isinstance(stmt, ast.For | ast.AsyncFor):
            targets(stmt.target)
        elif isinstance(stmt, ast.With | ast.AsyncWith):
            for item in stmt.items:
                if item.optional_vars is not None:
                    targets(item.optional_vars)
    return list(found)


def lost_line(code: str, status: str, recovery: dict[str, Any] | None) -> str:
    """What a cell restarted under it lost of its own work ("" when nothing was lost).

    The ladder replays earlier cells; the interrupted one never finished, so it is not
    among them and whatever it assigned is gone, even where the ladder says "earlier
    state is restored"."""
    if outcome_of(None, status, recovery) != "restarted":
        return ""
    back = set((recovery or {}).get("names") or ())  # an earlier replayed cell's
    names = [n for n in assigned_names(code) if n not in back]
    if not names:
        return "this cell never finished; re-run it if you need its effects"
    return names_not_back("this cell never finished, so the names it assigned are", names)


def account(content: str) -> str:
    """The kernel's notice at the end of a ``run_python`` result (``[...]``), or ""."""
    text = content.strip()
    if not text.endswith("]"):
        return ""
    start = 0 if text.startswith("[") else text.rfind("\n[") + 1
    return text[start + 1:-1] if start or text.startswith("[") else ""


def recorded_results(trace: Any, since_id: int) -> list[dict[str, Any]]:
    """Main-agent ``tool_result`` payloads written after event ``since_id``."""
    return [e.payload for e in trace.events(["tool_result"], after_id=since_id)
            if (e.payload.get("agent") or "main") == "main"]


def _finished(p: dict[str, Any]) -> ToolFinished:
    """The ``ToolFinished`` of a recorded result, as the stream would have carried it."""
    cls = ToolError if p.get("status") == "error" else ToolFinished
    return cls(str(p.get("tool_call_id")), str(p.get("name") or "?"),
               str(p.get("status") or "success"), str(p.get("content") or ""),
               float(p.get("elapsed_s") or 0.0), "main", None,
               p.get("outcome") or outcome_of(p.get("status")))


def settle(session: Any, graph: Any, emit: Callable[[Any], None], since_id: int,
           pump: Any = None, shown: set[str] | None = None) -> list[dict[str, Any]]:
    """Answer open calls from the trace and tell the interfaces how each one ended.

    ``pump``: the graph thread of an abandoned turn that left a cell stopping; it is
    waited for (bounded) first, since its call's result is written when the tool returns,
    a moment after the kernel is idle again. ``shown``: ids whose ``ToolFinished`` the
    interfaces already have. Returns one ``{tool_call_id, name, outcome, account}`` per
    recorded call that did not end ok.
    """
    if pump is not None and pump.is_alive():
        emit(Notice("waiting for the interrupted cell to stop (the kernel restarts it if "
                    "it ignores the interrupt) before this turn starts", level="warning"))
        pump.join(SETTLE_WAIT_S)
    results = recorded_results(session.trace, since_id)
    recorded = {str(p.get("tool_call_id")): ToolMessage(
        content=str(p.get("content") or ""), tool_call_id=str(p.get("tool_call_id")),
        name=p.get("name"), status="error" if p.get("status") == "error" else "success")
        for p in results}
    try:
        repair(session, graph, recorded=recorded, answer=CANCELLED)
    except Exception as exc:  # the turn still ends, and says so; the model gets the patch
        session.trace.append("error", {"message": f"open calls left unanswered: {exc}",
                                       "where": "turn"})
    shown = set() if shown is None else shown
    accounts = []
    for p in results:
        event = _finished(p)
        if event.id not in shown:
            shown.add(event.id)
            emit(event)
        if event.outcome != "ok":
            accounts.append({"tool_call_id": event.id, "name": event.name,
                             "outcome": event.outcome, "account": account(event.content)})
    return accounts


def cancel_notice(accounts: list[dict[str, Any]], abandoned_cell: bool = False) -> str:
    """The closing line of a cancelled turn: true about the kernel's state."""
    # the ladder's account says what stopped the cell and what came back
    said = {"restarted": "the kernel was restarted under the cell", "died": "the kernel died"}
    parts = [a["account"] or said[a["outcome"]] for a in accounts if a["outcome"] in said]
    if parts:
        return "Turn cancelled: " + " ".join(parts)
    if abandoned_cell:
        return "Turn cancelled without waiting for the cell, which is still being stopped."
    if any(a["outcome"] in ("interrupted", "timeout") for a in accounts):
        return "Turn cancelled; the cell was interrupted and the kernel kept its state."
    return "Turn cancelled; the kernel kept its state."


def last_event_id(trace: Any) -> int:
    """The id of the newest turn-opening event (what a turn's results follow)."""
    last = trace.events(["session_start", "session_resume", "message_user", "hitl_response"])
    return last[-1].id if last else 0


def follow(session: Any, pump: Any, emit: Callable[[Any], None], since: int,
           shown: set[str]) -> None:
    """After an abandon that left a cell stopping: tell the person how it ended once it
    has (the model is told at the next turn, which answers the call from the trace)."""
    pump.join(SETTLE_WAIT_S)
    for p in recorded_results(session.trace, since):
        event = _finished(p)
        if event.id in shown:
            continue
        shown.add(event.id)
        emit(event)
        if told := account(event.content):
            emit(Notice(f"The interrupted cell has stopped: {told}",
                        level="alert" if event.outcome in ("restarted", "died") else "warning"))
