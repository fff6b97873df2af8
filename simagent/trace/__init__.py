"""The trace: an append-only SQLite event log of everything a session did (design.md §5).

Never fed back to the model. Transcripts, `simagent sessions`, `/context` and the bench
read it; secrets in the environment are redacted before anything is written.
"""

from simagent.trace.log import EVENT_KINDS, Event, TraceLog

__all__ = ["EVENT_KINDS", "Event", "TraceLog"]
