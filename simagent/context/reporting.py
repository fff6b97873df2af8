"""One way for every context layer to report: a trace event plus a live stream item.

The trace is the record (``/context``, transcripts, the bench read it); the stream item
(``{"type": "context", "kind": ..., "detail": ...}``) is what ``TurnRunner`` turns into a
``ContextEvent`` so an interface can show a short notice while the turn runs.
"""

from __future__ import annotations

from typing import Any

from simagent.trace.log import TraceLog

#: Trace kinds shown as notices in transcripts and a resumed TUI (one line each, by
#: ``simagent.presentation.notices.context_line``).
CONTEXT_KINDS = ("context_eviction", "context_clear", "context_summary", "context_checkpoint",
                 "context_emergency", "context_state_card", "watchdog_alert", "repl_watchdog",
                 "cost_ceiling", "mcp_server")


def write_stream(item: dict[str, Any]) -> None:
    """Hand ``item`` to the running graph's stream (``TurnRunner._on_custom`` reads it);
    nothing outside a streamed run (manual /compact, a plain invoke, the bench)."""
    try:
        from langgraph.config import get_stream_writer  # heavy; the TUI imports this early

        get_stream_writer()(item)
    except Exception:  # no runnable context or no stream consumer
        pass


def emit(trace: TraceLog | None, kind: str, payload: dict[str, Any]) -> None:
    if trace is not None:
        trace.append(kind, payload)
    write_stream({"type": "context", "kind": kind, "detail": payload})
