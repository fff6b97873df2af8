"""How a tool call ended, and the mark every interface shows for it (one home).

A card's mark must come from what actually happened, not from whether the tool
function returned: ``run_python`` returns normally for a cell that raised, was
interrupted, ran past its timeout or killed the kernel, so the tool message alone says
"success". The kernel's execution status (``ExecResult.status``) and its recovery
(``ExecResult.recovery``: was the kernel restarted?) say what the person must see. The
TUI card, the headless stderr line and ``simagent transcript`` all read
:func:`outcome_of` and :data:`MARKS`, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Mark:
    glyph: str
    style: str  # a TUI style class (``STYLES``); headless prints the glyph and word
    word: str  # what headless and the transcript say


#: Every outcome a finished (or never finished) tool call can have.
MARKS: dict[str, Mark] = {
    "ok": Mark("✓", "outcome.ok", "ok"),
    "error": Mark("✗", "outcome.error", "error"),
    "interrupted": Mark("■", "outcome.interrupted", "interrupted"),
    "timeout": Mark("◷", "outcome.timeout", "timed out"),
    "died": Mark("✖", "outcome.died", "kernel died"),
    "restarted": Mark("↻", "outcome.restarted", "kernel restarted"),
    # the call has no result: the turn ended first (a cancel, an abandoned turn), or its
    # cell never ran (NOT_RUN)
    "cancelled": Mark("□", "outcome.cancelled", "no result"),
    "requested": Mark("○", "dim", "waiting"),
}
#: The colour of each mark in the TUI (prompt_toolkit style strings; one per outcome).
STYLES: dict[str, str] = {
    "outcome.ok": "ansigreen", "outcome.error": "ansired bold",
    "outcome.interrupted": "ansiyellow", "outcome.timeout": "ansimagenta",
    "outcome.died": "bold ansiwhite bg:ansired", "outcome.restarted": "bold ansibrightred",
    "outcome.cancelled": "ansigray",
}
UNKNOWN = Mark("·", "dim", "?")
#: The kernel status of a cell that never ran (``kernel/supervisor.py``: its attached
#: kernel was gone, or waits for its owner): no result, not an interrupted run.
NOT_RUN = "not_run"


def mark(outcome: str | None) -> Mark:
    return MARKS.get(outcome or "", UNKNOWN)


def outcome_of(status: str | None, exec_status: str | None = None,
               recovery: Mapping[str, Any] | None = None) -> str:
    """The outcome of one tool call.

    ``status`` is the tool message's (``success``/``error``); ``exec_status`` the
    kernel's for ``run_python`` (ok, error, interrupted, timeout, died, not_run);
    ``recovery`` the ladder's record when it ran for that execution. A cell whose kernel
    was restarted under it is ``restarted`` whatever stopped it: its own effects are gone.
    """
    if exec_status == NOT_RUN:
        return "cancelled"
    if exec_status:
        if recovery and recovery.get("restarted") and exec_status in ("interrupted",
                                                                       "timeout"):
            return "restarted"
        if exec_status in MARKS:
            return exec_status
    return "error" if status == "error" else "ok"
