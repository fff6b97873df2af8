"""``TraceLog``: one table of events in ``trace.sqlite``, WAL, append-only (design.md §5).

Payloads are schemaless JSON, so there are no migrations; readers use the small payload
shapes documented in :data:`EVENT_KINDS`. Every write is redacted (see ``redact.py``) and
committed at once, so a killed process loses at most the event being written.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from simagent.paths import private_dir, private_file
from simagent.trace.redact import Redactor

#: Fields every compaction event adds for its dropped-items ledger entry (context/ledger.py).
_LEDGER = ("; ledger (entry id), ledger_items, ledger_kinds, ledger_found, ledger_preview, "
           "ledger_path (absent when the policy keeps no ledger)")

#: Every kind the trace may hold, with the payload fields its writer sets.
EVENT_KINDS: dict[str, str] = {
    "session_start": "session_id, workspace, simulator, model, approval, pid, continued_from "
                     "(the session a /clear replaced, with its kernel), from_notebook, "
                     "notebook_writable (--from-notebook; absent otherwise)",
    "session_resume": "session_id, model, kernel_restarted, pid",
    "session_end": "session_id, reason",
    "message_user": "content, turn",
    "prompt_note": "note (what a front end set aside from a prompt, not the person's words: "
                   "simagent acp, a JupyterLab persona's system note)",
    "client_files": "op (read|write), path, reason, then (disk|refused): simagent acp's "
                    "client file system failed or did not take a file, so the disk was read "
                    "or written, or its person refused a write, so nothing was written (a "
                    "read: the first of a session only)",
    "message_assistant": "content, agent",
    "message_reasoning": "content, agent",
    "model_usage": "agent, model, input_tokens, output_tokens, total_tokens, cache_read, "
                   "cache_creation, reasoning_tokens, source (provider|estimated), "
                   "request (tokens by category of the request sent: system_prompt, "
                   "tool_schemas, skills_index, memory_index, conversation, tool_results, "
                   "summaries, state_card, images), window, dropped (true: a late reply of "
                   "an abandoned turn, paid but never shown)",
    "tool_call": "id, name, args, agent",
    "tool_result": "tool_call_id, name, content, status (success|error), elapsed_s, agent, "
                   "outcome (simagent.outcomes: ok|error|interrupted|timeout|died|restarted), "
                   "dropped (true: it ended after its turn was abandoned)",
    "tool_cancelled": "tool_call_id, name, stage (queued|starting|running): a host cancelled "
                      "the request (simagent mcp); running: its cell was interrupted",
    "kernel_exec": "tool_call_id, code, status, elapsed_s, raw_path, execution_count, state_lost, "
                   "human (notices for the user only, e.g. a dashboard link; absent if none)",
    "kernel_recovery": "trigger (died|frozen|unresponsive|interrupt|restore), reason, steps "
                       "([{step, at_s, ...}]), restarted, restart_s, replay_s, seconds, "
                       "replayed (execution numbers), skipped ([{n, line, seconds, kind, "
                       "why, effects}] of cells that defined state; kind 'effects': it acted "
                       "outside the kernel), failed, names, lineage, survived, "
                       "state_restored, files_not_restored (kernel/ladder.py Recovery)",
    "notebook_load": "path, cells, code_cells, ran, skipped, status (ok|error|interrupted), "
                     "failed_cell, error, elapsed_s, account_chars, card_tokens, names "
                     "(--from-notebook: its cells ran; simagent.notebooks.load)",
    "kernel_replay_offered": "cells ([{n, line, status, error}]): cells a replay left out "
                             "for their effects, run after the user said yes to /restore",
    "artifact": "path, mime, tool_call_id",
    "attempt": "index, id, parent, rationale, parameters, metrics, outcome, notes",
    "memory_write": "path, title, kind",
    "recovery": "reason, attempt, agent",
    "reply_cut": "agent, output_tokens (a reply that stopped at the output token limit: "
                 "simagent.agent.recovery.cut_notice)",
    "provider_retry": "retry, max_retries, delay_s, retry_after (seconds the server asked; "
                      "null if none), cause (short: 503, connection reset, timed out, reply "
                      "cut off), reason (the one-line provider error), agent; on giving up: "
                      "gave_up, retries, max_retries, cause, reason, cancelled, agent",
    "model_server_restart": "agent, notice (a local: model's own server had stopped and was "
                            "started again on its port: why, how many restarts, its log; "
                            "simagent.local_model.llama_server.ServerWatch)",
    "model_switch": "from_model, to_model",
    "context_eviction": "tool_call_id, tool, path, chars, tokens_before, tokens_after, agent, "
                        "source ('user' when a person's message was saved to a file)",
    "context_clear": "cleared (newly cleared results), total_cleared, inputs_cleared "
                     "(calls whose code is cleared too), words_cut (AI messages whose words "
                     "are cut to their first sentence), tokens_before, tokens_after, reason "
                     "(window|cost), rent, price, agent"
                     + _LEDGER,
    "context_clear_cost": "the call's clearing decision (context/epoch_cost.py): freed, "
                          "rewrite (tokens), rent, price (input-token units), candidates, "
                          "due (window|cost, or null), agent",
    "context_summary": "cutoff_index, messages, path, reason (threshold|budget|manual), "
                       "focus, summarizer, tokens_before, tokens_after, summary_tokens, agent"
                       + _LEDGER,
    "context_checkpoint": "note, source (tool|command), cutoff_index, messages, path, "
                          "tokens_before, tokens_after, agent" + _LEDGER,
    "context_emergency": "error, kept, dropped, path, tokens_before, tokens_after, agent"
                         + _LEDGER,
    "context_state_card": "reason (summary|emergency|compact|checkpoint|clear), tokens, names "
                          "(how many the kernel holds), shown, generation, restarted, lost "
                          "(names a restart took), agent",
    "watchdog_alert": "tool, args, repeats, mode (warn|enforce), agent",
    "repl_watchdog": "signal (same_error|failed_run|whitespace_rerun), signature (normalised "
                     "'Type: message'), count (failed cells in the run), mode (warn|enforce), "
                     "stopped (the turn was ended), tool_call_id (the cell it fired at), agent",
    "cost_ceiling": "action (tripped|reset|refused), scope (turn|session), limit, spent, "
                    "unit (usd|tokens)",
    "subagent_start": "name, description, tool_call_id",
    "subagent_end": "name, tool_call_id, status",
    "notebook_written": "path, cells (code cells a re-run runs), concerns (lines naming the "
                        "cells that may not re-run by themselves; simagent.notebooks)",
    "hitl_request": "interrupt_id, action_requests",
    "hitl_response": "interrupt_id, decisions",
    "error": "message, where",
    "mcp_server": "server, what (started|failed|died|timeout|malformed|stopped), notice (the "
                  "line shown to the person), tools, detail",
    "tool_schemas": "servers ({name: {tools, tokens, status}}), deferred (bool), limit (tokens "
                    "above which MCP schemas are deferred), loaded (tool names whose schemas "
                    "find_tools loaded), deferred_tokens, agent",
}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    ts TEXT NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_kind ON events(kind);
"""


@dataclass(frozen=True)
class Event:
    id: int
    ts: str
    kind: str
    payload: dict[str, Any]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _open_readonly(path: Path) -> sqlite3.Connection:
    """A read-only connection. A WAL database needs its ``-shm`` file even to be read, and
    SQLite cannot make one in a folder it cannot write (a read-only state home): there the
    file is read as ``immutable``, which is true, since nothing can write it either."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
    try:
        db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        return db
    except sqlite3.OperationalError:
        if os.access(path.parent, os.W_OK):
            raise
        db.close()
    return sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True,
                           check_same_thread=False)


class TraceLog:
    """Append-only event log. Safe to share between the agent thread and tool threads."""

    def __init__(self, path: str | Path, *, redactor: Redactor | None = None,
                 readonly: bool = False) -> None:
        self.path = Path(path)
        self._redact = Redactor() if redactor is None else redactor
        self._lock = threading.Lock()
        if readonly:
            self._db = _open_readonly(self.path)
        else:
            private_dir(self.path.parent)
            private_file(self.path)  # SQLite gives -wal/-shm the database's mode
            # autocommit (isolation_level=None): each INSERT is its own committed
            # transaction, so an event whose append returned survives a SIGKILL; WAL with
            # synchronous=NORMAL keeps that true at a fraction of FULL's fsyncs (only an
            # OS crash may lose the newest events, never the file's consistency).
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA busy_timeout=5000")
            self._db.executescript(_SCHEMA)
        self._readonly = readonly

    def append(self, kind: str, payload: dict[str, Any] | None = None) -> int:
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown trace event kind {kind!r}")
        if self._readonly:
            raise PermissionError(f"{self.path} is open read-only")
        text = json.dumps(payload or {}, default=str, ensure_ascii=False)
        text = self._redact(text)
        with self._lock:
            cur = self._db.execute("INSERT INTO events(ts, kind, payload) VALUES (?, ?, ?)",
                                   (_now(), kind, text))
            return int(cur.lastrowid)

    def events(self, kinds: Iterable[str] | None = None, *, after_id: int = 0) -> list[Event]:
        return list(self.iter_events(kinds, after_id=after_id))

    def iter_events(self, kinds: Iterable[str] | None = None, *,
                    after_id: int = 0) -> Iterator[Event]:
        sql = "SELECT id, ts, kind, payload FROM events WHERE id > ?"
        params: list[Any] = [after_id]
        if kinds is not None:
            kinds = list(kinds)
            sql += f" AND kind IN ({','.join('?' * len(kinds))})"
            params += kinds
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY id", params).fetchall()
        for id_, ts, kind, payload in rows:
            yield Event(id_, ts, kind, json.loads(payload))

    def first(self, kind: str) -> Event | None:
        with self._lock:
            row = self._db.execute("SELECT id, ts, kind, payload FROM events WHERE kind = ? "
                                   "ORDER BY id LIMIT 1", (kind,)).fetchone()
        return Event(row[0], row[1], row[2], json.loads(row[3])) if row else None

    def max_id(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT MAX(id) FROM events").fetchone()
        return int(row[0] or 0)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> TraceLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
