"""The conversation as the TUI shows it: entries built from ``TurnRunner`` events.

Pure state, no prompt_toolkit: :meth:`Conversation.apply` folds each typed event into
an entry (a user message, streamed assistant text, a reasoning block, a tool card, a
notice, an approval request, a command's panel), and the renderer draws the entries.
Display state only: collapsing a card never touches what the model sees.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from simagent.agent.events import (
    ContextEvent,
    Interrupt,
    Notice,
    ReasoningDelta,
    TextDelta,
    ToolFinished,
    ToolOutput,
    ToolRequested,
    ToolStarted,
)
from simagent.kernel.terminal import TerminalBuffer
from simagent.outcomes import outcome_of
from simagent.presentation.footnotes import (
    Footnoted,
    TracedAnswer,
    footnote,
    source_lines,
    sup,
    superscript,
)
from simagent.presentation.notices import GUARD_NOTICES, context_line

#: A tool card keeps at most this much live output (the full output is on disk).
CARD_MAX_CHARS = 64 * 1024
CARD_MAX_ROWS = 2_000
#: A subagent's streamed text kept on its task card (the tail; its report is the result).
NOTES_MAX_CHARS = 16 * 1024
#: The tool whose cards are subagent runs (deepagents' ``task``).
TASK_TOOL = "task"


@dataclass
class UserEntry:
    text: str


@dataclass
class AssistantEntry:
    text: str = ""
    agent: str = "main"
    #: The turn's final answer with its numbers' footnotes (set once, as the turn ends),
    #: and each footnote's source lines by its key (what ctrl+O shows).
    footnoted: Footnoted | None = None
    lines: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    event_id: int | None = None  # its trace event, for a resumed session's answers


def answer_sources(traced: TracedAnswer) -> tuple[Footnoted, dict[int, list[tuple[int, str]]]]:
    """The final answer footnoted for the terminal (superscript markers) and each
    footnote's source lines: computed once, off the UI thread, when the turn ends."""
    f = footnote(traced.text, traced.provenance, superscript, ref=sup)
    return f, {n.key: source_lines(n, traced.sources) for n in f.notes}


@dataclass
class ReasoningEntry:
    text: str = ""
    done: bool = False
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None


@dataclass
class NoticeEntry:
    text: str
    level: str = "info"  # info | warning | error | context | human


@dataclass
class PanelEntry:
    """A slash command's output, shown preformatted (``/context``, ``/help`` ...)."""

    title: str
    text: str


@dataclass
class ApprovalEntry:
    """One action waiting for the user's decision (and, later, the decision)."""

    interrupt_id: str
    index: int
    name: str
    args: dict[str, Any]
    allowed: tuple[str, ...] = ("approve", "reject", "respond")
    decision: str | None = None  # what the user chose, as shown
    sent: dict[str, Any] | None = None  # the decision not yet sent to the graph


@dataclass
class ToolCard:
    id: str
    name: str
    args: dict[str, Any]
    agent: str = "main"
    status: str = "requested"  # requested | running | success | error | cancelled
    #: How the call ended (``simagent.outcomes``), once it did; the card's mark reads it.
    ended: str | None = None
    started: float | None = None
    elapsed_s: float | None = None
    content: str = ""
    raw_path: str | None = None
    notes: str = ""  # a subagent's streamed text, for its task card
    output: TerminalBuffer = field(default_factory=lambda: _buffer())
    errors: TerminalBuffer = field(default_factory=lambda: _buffer())

    @property
    def running(self) -> bool:
        return self.status == "running"

    @property
    def open(self) -> bool:
        """Not finished: requested (maybe waiting for approval) or running."""
        return self.status in ("requested", "running")

    @property
    def outcome(self) -> str:
        """The ``simagent.outcomes`` key of the card's mark."""
        if self.ended:
            return self.ended
        if self.status in ("requested", "cancelled", "error"):
            return self.status
        return "ok" if self.status == "success" else "requested"

    def elapsed(self, now: float | None = None) -> float:
        if self.elapsed_s is not None:
            return self.elapsed_s
        if self.started is None:
            return 0.0
        return (now if now is not None else time.monotonic()) - self.started

    def feed(self, kind: str, text: str) -> None:
        """Live output: stdout and stderr apart (as the model sees them), so a progress
        bar on stderr redraws in place instead of gluing onto printed lines."""
        if kind == "clear":
            self.output.clear()
            self.errors.clear()
        elif kind == "stderr":
            self.errors.feed(text)
        elif kind in ("stdout", "error"):
            self.output.feed(text)
        elif kind == "display" and text:
            self.output.feed(f"[display] {text.strip()}\n")

    def rendered(self, rows: int) -> str:
        """The last ``rows`` rows of stdout followed by those of stderr."""
        out = self.output.render(max_rows=rows).rstrip("\n")
        err = self.errors.render(max_rows=rows).rstrip("\n")
        return "\n".join(part for part in (out, err) if part.strip())


def _buffer() -> TerminalBuffer:
    return TerminalBuffer(max_chars=CARD_MAX_CHARS, max_rows=CARD_MAX_ROWS)


Entry = (UserEntry | AssistantEntry | ReasoningEntry | NoticeEntry | PanelEntry
         | ApprovalEntry | ToolCard)


class Conversation:
    """Entries in display order plus an index of tool cards by call id."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.cards: dict[str, ToolCard] = {}
        self._muted: set[str] = set()
        self.version = 0  # bumped on every change (the renderer caches on it)

    def add(self, entry: Entry) -> Entry:
        self._close_reasoning()
        self.entries.append(entry)
        self.version += 1
        return entry

    def note(self, text: str, level: str = "info") -> None:
        self.add(NoticeEntry(text, level))

    def pending_approvals(self) -> list[ApprovalEntry]:
        return [e for e in self.entries if isinstance(e, ApprovalEntry) and e.decision is None]

    def running_cards(self) -> list[ToolCard]:
        return [c for c in self.cards.values() if c.running]

    def end_turn(self) -> None:
        """The turn ended: close reasoning and mark cards that never finished."""
        self._close_reasoning()
        waiting = {e.interrupt_id for e in self.pending_approvals()}
        for card in [c for c in self.cards.values() if c.open]:
            if card.status == "requested" and waiting:
                continue  # it waits for the user's decision, it was not cancelled
            card.status = "cancelled"
            card.elapsed_s = card.elapsed()
        self._muted.clear()
        self.version += 1

    def footnote(self, footnoted: Footnoted,
                 lines: dict[int, list[tuple[int, str]]]) -> None:
        """The turn's final answer (its last main-agent text since the person spoke)
        gets its numbers' footnotes; an answer with no numbers is left as it is."""
        if not footnoted.statuses:
            return
        for entry in reversed(self.entries):
            if isinstance(entry, UserEntry):
                return
            if isinstance(entry, AssistantEntry) and entry.agent == "main":
                entry.footnoted, entry.lines = footnoted, lines
                self.version += 1
                return

    # ---------------------------------------------------------------- events
    def apply(self, event: Any) -> None:
        self.version += 1
        if isinstance(event, ReasoningDelta):
            self._reasoning(event)
        elif isinstance(event, TextDelta):
            self._text(event)
        elif isinstance(event, ToolRequested | ToolStarted):
            self._tool_start(event)
        elif isinstance(event, ToolOutput):
            self._tool_output(event)
        elif isinstance(event, ToolFinished):
            self._tool_end(event)
        elif isinstance(event, ContextEvent):
            if line := context_line(event):
                self.add(NoticeEntry(line, "alert" if line.startswith("!") else "context"))
            if event.kind in GUARD_NOTICES:
                self._muted.add(GUARD_NOTICES[event.kind])
        elif isinstance(event, Interrupt):
            for i, req in enumerate(event.action_requests):
                cfg = event.review_configs[i] if i < len(event.review_configs) else {}
                allowed = tuple(d for d in cfg.get("allowed_decisions",
                                                   ("approve", "reject", "respond"))
                                if d != "edit")
                self.add(ApprovalEntry(event.interrupt_id, i, str(req.get("name", "?")),
                                       dict(req.get("args") or {}), allowed))
        elif isinstance(event, Notice) and not any(event.text.startswith(p)
                                                   for p in self._muted):
            self.add(NoticeEntry(event.text, event.level))

    def _close_reasoning(self) -> None:
        for entry in reversed(self.entries[-3:]):
            if isinstance(entry, ReasoningEntry) and not entry.done:
                entry.done = True
                entry.ended = time.monotonic()

    def _reasoning(self, event: ReasoningDelta) -> None:
        if event.agent != "main":
            return
        last = self.entries[-1] if self.entries else None
        if isinstance(last, ReasoningEntry) and not last.done:
            last.text += event.text
        else:
            self.add(ReasoningEntry(event.text))

    def _text(self, event: TextDelta) -> None:
        if event.agent != "main":
            running = [c for c in reversed(self.cards.values())
                       if c.name == TASK_TOOL and c.running]
            task = next((c for c in running if c.args.get("subagent_type") == event.agent),
                        running[0] if running else None)
            if task is not None:
                task.notes = (task.notes + event.text)[-NOTES_MAX_CHARS:]
            return
        last = self.entries[-1] if self.entries else None
        if isinstance(last, AssistantEntry) and last.agent == event.agent:
            last.text += event.text
        else:
            self.add(AssistantEntry(event.text, event.agent))

    def _tool_start(self, event: ToolRequested | ToolStarted) -> None:
        card = self.cards.get(event.id) if event.id else None
        if card is not None and not card.open:
            card = None  # a provider reused an ended call's id: a new card, the old one stays
        if card is None:
            card = ToolCard(event.id, event.name, dict(event.args), event.agent)
            if event.id:
                self.cards[event.id] = card
            self.add(card)
        if isinstance(event, ToolStarted):
            card.status = "running"
            card.started = time.monotonic()
            card.elapsed_s = None
            card.args = dict(event.args) or card.args
            card.agent = event.agent

    def _tool_output(self, event: ToolOutput) -> None:
        if event.kind == "human":  # for the person only (e.g. a dashboard link)
            self.add(NoticeEntry(event.text.strip(), "human"))
            return
        card = self.cards.get(event.id)
        if card is not None:
            card.feed(event.kind, event.text)

    def _tool_end(self, event: ToolFinished) -> None:
        card = self.cards.get(event.id)
        if card is None:
            card = ToolCard(event.id, event.name, {}, event.agent)
            self.cards[event.id] = card
            self.add(card)
        card.status = "error" if event.status == "error" else "success"
        card.ended = event.outcome or outcome_of(event.status)
        card.elapsed_s = event.elapsed_s
        card.content = event.content
        card.raw_path = getattr(event, "raw_path", None)
