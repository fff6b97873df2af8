"""A resumed session's earlier conversation, rebuilt from its trace.

The trace holds what was said and done (``message_user``, ``message_assistant``,
``tool_call``/``tool_result``, guard and context events), so a resumed TUI shows the
past the way it looked, with every tool card collapsed and its output as recorded.
:func:`history_footnotes` adds each shown turn's final answer's footnotes, traced as
they were when it was given; it reads the session's raw outputs (seconds, cold, for a
session that printed megabytes), so the TUI runs it off the UI thread after the history
is on screen.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from prompt_toolkit.history import FileHistory

from simagent.agent.events import ContextEvent
from simagent.context.reporting import CONTEXT_KINDS
from simagent.outcomes import outcome_of
from simagent.paths import private_dir, private_file
from simagent.presentation.footnotes import Footnoted, final_ids, trace_answers
from simagent.presentation.notices import context_line
from simagent.trace.redact import redact
from simagent.tui.entries import (
    AssistantEntry,
    Entry,
    NoticeEntry,
    ToolCard,
    UserEntry,
    answer_sources,
)

_CONTEXT_KINDS = CONTEXT_KINDS
#: How many of the newest entries a resumed session shows (older ones stay in the trace).
HISTORY_LIMIT = 200


def history_entries(events: Iterable[Any], limit: int = HISTORY_LIMIT) -> list[Entry]:
    entries: list[Entry] = []
    cards: dict[str, ToolCard] = {}
    for ev in events:
        p = ev.payload if isinstance(ev.payload, dict) else {}
        agent = p.get("agent", "main") or "main"
        if ev.kind == "message_user":
            entries.append(UserEntry(str(p.get("content") or "")))
        elif ev.kind == "message_assistant" and agent == "main":
            if text := str(p.get("content") or "").strip():
                entries.append(AssistantEntry(text, event_id=ev.id))
        elif ev.kind == "tool_call" and agent == "main":
            card = ToolCard(str(p.get("id") or ""), str(p.get("name") or "?"),
                            dict(p.get("args") or {}), agent)
            card.status = "cancelled"  # until its result shows up
            cards[card.id] = card
            entries.append(card)
        elif ev.kind == "tool_result" and (card := cards.get(str(p.get("tool_call_id")))):
            card.status = "error" if p.get("status") == "error" else "success"
            # an older trace has no outcome: the cell's kernel_exec status (read above) is
            card.ended = p.get("outcome") or card.ended or outcome_of(p.get("status"))
            card.content = str(p.get("content") or "")
            try:
                card.elapsed_s = float(p.get("elapsed_s") or 0.0)
            except (TypeError, ValueError):
                card.elapsed_s = 0.0
        elif ev.kind == "kernel_exec" and (card := cards.get(str(p.get("tool_call_id")))):
            card.raw_path = p.get("raw_path")
            if p.get("status"):
                card.ended = outcome_of(None, p.get("status"))
        elif ev.kind in _CONTEXT_KINDS and (line := context_line(ContextEvent(ev.kind, p))):
            entries.append(NoticeEntry(line, "context"))
    return entries[-limit:]


def history_footnotes(events: Sequence[Any], entries: Sequence[Entry]
                      ) -> list[tuple[AssistantEntry, Footnoted, dict[int, list[tuple[int, str]]]]]:
    """The footnotes of each turn's final answer among ``entries`` (those with numbers),
    to set on them: ``(entry, footnoted, lines)``."""
    finals = set(final_ids(events))
    shown = {e.event_id: e for e in entries
             if isinstance(e, AssistantEntry) and e.event_id in finals}
    out = []
    for i, traced in trace_answers(events, shown).items():
        footnoted, lines = answer_sources(traced)
        if footnoted.statuses:
            out.append((shown[i], footnoted, lines))
    return out


def redacting_file_history(path: str) -> Any:
    """prompt_toolkit's ``FileHistory`` for the input box, with secrets redacted before a
    line reaches the file (a pasted key stays usable in this session's prompt, but is
    never written to ``input_history``)."""
    private_dir(os.path.dirname(path) or ".")
    private_file(path)  # FileHistory appends to it: created private here

    class RedactingFileHistory(FileHistory):
        def store_string(self, string: str) -> None:
            super().store_string(redact(string))

    return RedactingFileHistory(path)
