"""Boundaries: the one non-mutating record of what the model no longer sees verbatim.

Summaries, task checkpoints and emergency truncations all end the same way: the thread's
raw messages stay in graph state untouched, the older ones are appended to the history
file, and a *boundary* (stored in state) says "from message ``cutoff`` on, preceded by this
summary message". Every request is rebuilt from the raw messages and the latest boundary,
so nothing is lost and each kind of compaction composes with the others.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.messages import BaseMessage

from simagent.context.boundaries import cut_keeping_messages, cut_keeping_tokens, safe_cuts
from simagent.context.clearing import apply_cleared
from simagent.context.counting import count_messages
from simagent.context.summary import ExtractiveSummarizer, Summarizer, boundary_message, offload

if TYPE_CHECKING:
    from simagent.context.ledger import Ledger


def cutoff_of(messages: Sequence[BaseMessage], boundary: dict[str, Any] | None) -> int:
    """Where the verbatim part starts, located by message id (robust to index shifts)."""
    if not boundary:
        return 0
    last_id = boundary.get("last_dropped_id")
    cutoff = int(boundary.get("cutoff") or 0)
    if last_id and not (0 < cutoff <= len(messages) and messages[cutoff - 1].id == last_id):
        for i, msg in enumerate(messages):
            if msg.id == last_id:
                return i + 1
    return min(cutoff, len(messages))


def view_of(messages: Sequence[BaseMessage], boundary: dict[str, Any] | None) -> list[BaseMessage]:
    """What the model sees before clearing: the boundary message, then the verbatim tail."""
    if not boundary:
        return list(messages)
    return [boundary["message"], *messages[cutoff_of(messages, boundary):]]


def visible(messages: Sequence[BaseMessage], boundary: dict[str, Any] | None,
            cleared: Collection[str], inputs: Collection[str] = ()) -> list[BaseMessage]:
    """The model's view: the boundary's view with cleared results as placeholders and
    cleared inputs as pointers."""
    return apply_cleared(view_of(messages, boundary), cleared, inputs)


@dataclass
class Compaction:
    boundary: dict[str, Any]
    dropped: int  # raw messages newly moved behind the boundary
    kept: int
    path: Path
    ledger: dict[str, Any] | None = None  # the ledger entry of what left the view


class Compactor:
    """Writes boundaries; ``summarizer`` condenses, the history file keeps everything."""

    def __init__(self, history_path: Path, summarizer: Summarizer,
                 ledger: Ledger | None = None) -> None:
        self.history_path = history_path
        self.summarizer = summarizer
        self.extractive = ExtractiveSummarizer()
        #: every compaction's dropped items, with pointers (None: the policy keeps none)
        self.ledger = ledger

    def _make(self, messages: Sequence[BaseMessage], boundary: dict[str, Any] | None,
              cut: int, *, kind: str, focus: str | None = None, how: str = "",
              extractive: bool = False) -> Compaction | None:
        start = cutoff_of(messages, boundary)
        if cut <= start:
            return None
        dropped = list(messages[start:cut])
        starts = offload(self.history_path, dropped, kind=kind, first_index=start)
        entry = self.ledger.record(kind, dropped, history=self.history_path, starts=starts,
                                   cutoff=cut, focus=focus) if self.ledger else None
        previous = [boundary["message"]] if boundary else []
        write = self.extractive if extractive else self.summarizer
        text = write([*previous, *dropped], kind=kind if kind != "emergency" else "summary",
                     focus=focus)
        message = boundary_message(kind, text, self.history_path, cut, how=how)
        new = {"cutoff": cut, "last_dropped_id": messages[cut - 1].id, "message": message,
               "path": str(self.history_path), "kind": kind,
               "at": datetime.now(UTC).isoformat(timespec="seconds")}
        return Compaction(new, dropped=len(dropped), kept=len(messages) - cut,
                          path=self.history_path, ledger=entry)

    def summarize(self, messages: Sequence[BaseMessage], boundary: dict[str, Any] | None,
                  keep_tokens: int, *, focus: str | None = None) -> Compaction | None:
        """Condense all but the newest ``keep_tokens`` of the verbatim part."""
        start = cutoff_of(messages, boundary)
        tail = list(messages[start:])
        cut = cut_keeping_tokens(tail, keep_tokens, count_messages)
        return self._make(messages, boundary, start + cut, kind="summary", focus=focus)

    def checkpoint(self, messages: Sequence[BaseMessage], boundary: dict[str, Any] | None,
                   cut: int, *, note: str | None, how: str) -> Compaction | None:
        """Close a finished task: everything before ``cut`` becomes its record."""
        start = cutoff_of(messages, boundary)
        safe = [start + i for i in safe_cuts(messages[start:]) if start + i <= cut]
        if not safe:
            return None
        return self._make(messages, boundary, safe[-1], kind="checkpoint", focus=note,
                          how=how)

    def emergency(self, messages: Sequence[BaseMessage], boundary: dict[str, Any] | None,
                  min_messages: int) -> Compaction | None:
        """Keep half of the verbatim part (at least ``min_messages``); no model call."""
        start = cutoff_of(messages, boundary)
        tail = list(messages[start:])
        keep = max(min_messages, len(tail) // 2)
        cut = cut_keeping_messages(tail, keep)
        return self._make(messages, boundary, start + cut, kind="emergency", extractive=True)
