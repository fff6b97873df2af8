"""List and find a workspace's sessions from their traces (design.md §4, §5).

The trace is the source of truth for what a session was, so the listing reads it rather than
keeping a separate index that could drift. Traces are opened read-only, so listing never
disturbs a live session, and one unreadable trace shows up as such instead of hiding the
others.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from simagent import paths
from simagent.trace.log import Event, TraceLog
from simagent.trace.usage import token_count

TITLE_MAX = 60


@dataclass(frozen=True)
class SessionInfo:
    """One row of ``simagent sessions``; ``path`` is the session folder."""

    id: str
    path: Path
    started: str | None
    last_activity: str | None
    title: str
    model: str | None
    simulator: str | None
    turns: int
    tool_calls: int
    input_tokens: int
    output_tokens: int
    #: The latest notebook written of the session (``simagent notebook``), if any.
    notebook: str | None = None


def sessions_dir(workspace: str | os.PathLike[str]) -> Path:
    return paths.workspace_state_dir(workspace) / "sessions"


def _session_dirs(workspace: str | os.PathLike[str]) -> list[Path]:
    """Session folders holding a trace, newest first (ids sort by time)."""
    root = sessions_dir(workspace)
    if not root.is_dir():
        return []
    found = [d for d in root.iterdir() if d.is_dir() and (d / "trace.sqlite").is_file()]
    return sorted(found, key=lambda d: d.name, reverse=True)


def _title(content: object, notebook: dict | None = None) -> str:
    """The first line of the person's words. A session started from a notebook begins
    with the account simagent wrote of it (``notebook_load``'s ``account_chars`` long,
    then a blank line): its title is the prompt after it, or "from NAME.ipynb" when the
    person gave none."""
    text = str(content or "")
    if notebook is not None:
        text = text[int(notebook.get("account_chars") or 0):]
        if not text.strip():
            return f"from {Path(str(notebook.get('path') or 'the notebook')).name}"
    lines = text.strip().splitlines()
    first = lines[0].strip() if lines else ""
    return first if len(first) <= TITLE_MAX else first[: TITLE_MAX - 3] + "..."


#: Events that name the model a session runs with, in the order they take effect.
MODEL_EVENTS = ("session_start", "session_resume", "model_switch")


def latest_model(events: Sequence[Event]) -> str | None:
    """The model in use after ``events``: the last start/resume model or switch target."""
    model = None
    for ev in events:
        p = ev.payload if isinstance(ev.payload, dict) else {}
        if ev.kind in MODEL_EVENTS:
            model = p.get("to_model" if ev.kind == "model_switch" else "model") or model
    return str(model) if model else None


def _read(session: Path) -> SessionInfo:
    """Summarize one trace; any failure becomes an "(unreadable trace: ...)" entry."""
    try:
        with TraceLog(session / "trace.sqlite", readonly=True) as log:
            events = log.events()
    except Exception as exc:  # corrupt file, locked db, bad JSON: list it, don't crash
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return SessionInfo(session.name, session, None, None, f"(unreadable trace: {reason})",
                           None, None, 0, 0, 0, 0)
    started = simulator = title = None
    turns = tools = tok_in = tok_out = 0
    notebook = loaded = None
    for ev in events:
        p = ev.payload if isinstance(ev.payload, dict) else {}
        if ev.kind == "session_start":
            started = started or ev.ts
            simulator = p.get("simulator") or simulator
        elif ev.kind == "message_user":
            turns += 1
            if title is None:
                title = _title(p.get("content"), loaded)
        elif ev.kind == "tool_call":
            tools += 1
        elif ev.kind == "notebook_load" and title is None:
            loaded = p
        elif ev.kind == "notebook_written":
            notebook = p.get("path") or notebook
        elif ev.kind == "model_usage":
            tok_in += token_count(p.get("input_tokens"))
            tok_out += token_count(p.get("output_tokens"))
    return SessionInfo(
        id=session.name, path=session,
        started=started or (events[0].ts if events else None),
        last_activity=events[-1].ts if events else None,
        title=title if title is not None else _title("", loaded) if loaded else "(no messages)",
        model=latest_model(events), simulator=str(simulator) if simulator else None,
        turns=turns, tool_calls=tools, input_tokens=tok_in, output_tokens=tok_out,
        notebook=str(notebook) if notebook else None)


def list_sessions(workspace: str | os.PathLike[str]) -> list[SessionInfo]:
    """Every session of ``workspace`` with a trace, newest first."""
    infos = [_read(d) for d in _session_dirs(workspace)]
    # Ids carry local time to the second; the start timestamp breaks ties within a second.
    return sorted(infos, key=lambda i: (i.id[:15], i.started or "", i.id), reverse=True)


def _last_session(workspace: str | os.PathLike[str]) -> str | None:
    marker = paths.last_session_marker(workspace)
    try:
        text = marker.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return Path(text).name if text else None  # tolerate a marker holding a full path


def find_session(workspace: str | os.PathLike[str], prefix: str | None) -> Path:
    """Folder of the session whose id starts with ``prefix``.

    ``None`` means the session named in ``last-session``, else the newest. Raises
    :class:`LookupError` with a one-line message naming up to 5 candidates when nothing or
    more than one session matches.
    """
    dirs = _session_dirs(workspace)
    if not dirs:
        raise LookupError(f"no sessions for workspace {workspace}")
    ids = [d.name for d in dirs]
    if prefix is None:
        last = _last_session(workspace)
        if last in ids:
            return dirs[ids.index(last)]
        return list_sessions(workspace)[0].path
    prefix = prefix.strip()
    if prefix in ids:
        return dirs[ids.index(prefix)]
    matches = [d for d in dirs if d.name.startswith(prefix)]
    if len(matches) == 1:
        return matches[0]

    def names(ds: Sequence[Path]) -> str:
        more = f" (+{len(ds) - 5} more)" if len(ds) > 5 else ""
        return ", ".join(d.name for d in ds[:5]) + more

    if matches:
        raise LookupError(f"session prefix {prefix!r} is ambiguous: {names(matches)}")
    raise LookupError(f"no session matches {prefix!r}; recent: {names(dirs)}")


def _when(ts: str | None) -> str:
    if not ts:
        return "-"
    try:
        return datetime.fromisoformat(ts).astimezone().strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return ts[:16]


def _tokens(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


def format_sessions_table(infos: Sequence[SessionInfo]) -> str:
    """Plain-text table for the terminal: id, started, turns, tools, tokens, whether a
    notebook was written, model, title."""
    if not infos:
        return "(no sessions)"
    head = ("id", "started", "turns", "tools", "tokens in/out", "notebook", "model", "title")
    rows = [head] + [(i.id, _when(i.started), str(i.turns), str(i.tool_calls),
                      f"{_tokens(i.input_tokens)}/{_tokens(i.output_tokens)}",
                      "yes" if i.notebook else "-", i.model or "-", i.title) for i in infos]
    widths = [max(len(r[c]) for r in rows) for c in range(len(head) - 1)]
    lines = ["  ".join([*(r[c].ljust(widths[c]) for c in range(len(widths))), r[-1]]).rstrip()
             for r in rows]
    return "\n".join(lines)
