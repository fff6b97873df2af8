"""Typed events a turn emits, and how it ended (``TurnResult``), for every interface
(CLI, TUI, bench) alike.

Plain dataclasses: renderers switch on the type, tests compare them, nothing here
imports the agent stack.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from simagent.trace.usage import Usage


@dataclass(frozen=True)
class TextDelta:
    text: str
    agent: str = "main"


@dataclass(frozen=True)
class ReasoningDelta:
    text: str
    agent: str = "main"


@dataclass(frozen=True)
class ToolRequested:
    """The model asked for a tool call (before approval and execution)."""

    id: str
    name: str
    args: dict[str, Any]
    agent: str = "main"


@dataclass(frozen=True)
class ToolStarted:
    id: str
    name: str
    args: dict[str, Any]
    agent: str = "main"


@dataclass(frozen=True)
class ToolOutput:
    """Live output of a running tool (``kind``: stdout, stderr, display, error, clear, human).

    ``human`` is a notice for the person only (e.g. a Dask dashboard link): the model never
    sees it; render it as a notice, not as tool output."""

    id: str
    kind: str
    text: str
    path: str | None = None


@dataclass(frozen=True)
class ToolFinished:
    id: str
    name: str
    status: str
    content: str
    elapsed_s: float
    agent: str = "main"
    #: The uncapped raw output on disk (``run_python``), for "full output in ..." notes.
    raw_path: str | None = None
    #: How it ended (``simagent.outcomes``: ok, error, interrupted, timeout, died,
    #: restarted): the kernel's status for a cell, whatever ``status`` says.
    outcome: str | None = None
    #: The recovery ladder's record when it ran for this cell (``ExecResult.recovery``).
    recovery: dict[str, Any] | None = None


@dataclass(frozen=True)
class ToolError(ToolFinished):
    """A tool that finished with an error result (a subclass: handlers of
    ``ToolFinished`` see it too)."""


@dataclass(frozen=True)
class ContextEvent:
    """A context-management action (eviction, clearing, summary, checkpoint ...)."""

    kind: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Interrupt:
    """The turn paused: these actions wait for the user's decision."""

    interrupt_id: str
    action_requests: list[dict[str, Any]]
    review_configs: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Notice:
    """A short harness message for the user (recovery, cancellation, kernel restart)."""

    text: str
    level: str = "info"


@dataclass(frozen=True)
class Retrying:
    """A model call hit a provider fault and is retried after ``delay_s`` seconds.

    ``retry`` of ``max_retries`` (1-based); ``cause`` is short ("503", "connection
    reset", "timed out", "reply cut off"), ``reason`` the one-line provider error.
    ``discarded`` is how many characters of this agent's streamed text belonged to the
    failed attempt: they were shown but never kept, and the retry streams anew.
    """

    retry: int
    max_retries: int
    delay_s: float
    cause: str
    reason: str
    agent: str = "main"
    discarded: int = 0

    def label(self, left_s: float | None = None) -> str:
        """``provider 503 — retry 2/5 in 3s`` (``left_s``: seconds still to wait)."""
        left = self.delay_s if left_s is None else left_s
        when = f"in {math.ceil(left)}s" if left > 0 else "now"
        return f"provider {self.cause} — retry {self.retry}/{self.max_retries} {when}"


Event = (TextDelta | ReasoningDelta | ToolRequested | ToolStarted | ToolOutput | ToolFinished
         | ContextEvent | Interrupt | Notice | Retrying)


@dataclass
class TurnResult:
    """How a turn ended. ``status``: done | paused (approval) | cancelled | error."""

    status: str
    final: str = ""
    tool_calls: int = 0
    usage: Usage = field(default_factory=Usage)
    interrupts: list[Interrupt] = field(default_factory=list)
    error: str | None = None
    provider_error: bool = False
    #: The ``cost_ceiling`` trip payload (scope, limit, spent, unit, message) when the
    #: ceiling stopped or refused this turn; not retryable until the ceiling is reset.
    cost_ceiling: dict[str, Any] | None = None
    #: A cancelled turn's calls that did not end ok, with their account (``cancel_account``)
    recovery: list[dict[str, Any]] = field(default_factory=list)
