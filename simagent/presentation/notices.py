"""Display text every front end shares: a tool call's one-line summary and one short line
per context event, with the guard notices those lines already cover.

Pure, so ``simagent run``'s stderr, the TUI, a transcript and a resumed history say the same
words (one home; design.md §10 "Layers": front ends do not import each other for text).
"""

from __future__ import annotations

from typing import Any

from simagent.agent.events import ContextEvent
from simagent.trace.redact import redact


def one_line(args: dict[str, Any], width: int = 70) -> str:
    """A short summary of tool arguments (first line of code, or key=value pairs)."""
    if "code" in args:
        first = next((ln for ln in str(args["code"]).splitlines() if ln.strip()), "")
        text = first.strip()
    elif "command" in args:
        text = str(args["command"]).splitlines()[0] if args["command"] else ""
    else:
        text = ", ".join(f"{k}={v!r}" for k, v in args.items())
    text = redact(text)  # before cutting: a cut secret would escape the redaction
    return text if len(text) <= width else text[: width - 1] + "…"


def _count(value: Any) -> str:
    """A token or char count with thousands separators ("?" when missing)."""
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return "?"


def _tokens(detail: dict[str, Any]) -> str:
    return f"{_count(detail.get('tokens_before'))} → {_count(detail.get('tokens_after'))} tokens"


def _amount(value: Any, unit: Any) -> str:
    try:
        return f"${float(value):,.4f}" if unit == "usd" else f"{int(value):,} tokens"
    except (TypeError, ValueError):
        return "?"


def _history(detail: dict[str, Any]) -> str:
    return f"; history in {detail['path']}" if detail.get("path") else ""


def context_line(event: Any) -> str | None:
    """One short line for a ``ContextEvent`` (None for any other event).

    Pure, so the terminal printer and the TUI show the same words. ``~`` marks routine
    context management, ``!`` a guard (watchdog, cost ceiling) the user should notice.
    Payload fields are those of ``simagent.trace.log.EVENT_KINDS``.
    """
    if not isinstance(event, ContextEvent):
        return None
    d, kind = event.detail, event.kind
    agent = d.get("agent")
    who = f"[{agent}] " if agent and agent != "main" else ""
    if kind == "context_summary":
        reason = d.get("reason")
        why = f"{reason}; " if reason and reason != "threshold" else ""
        return f"~ context: {who}summary ({why}{_tokens(d)}{_history(d)})"
    if kind == "context_clear":
        n = d.get("cleared")
        what = "1 old tool result" if n == 1 else f"{_count(n)} old tool results"
        return f"~ context: {who}cleared {what} ({_tokens(d)})"
    if kind == "context_eviction" and d.get("source") == "user":
        return (f"~ context: {who}your message ({_count(d.get('chars'))} chars) is saved to "
                f"{d.get('path')}; the model sees its first and last lines and reads the "
                "rest from that file")
    if kind == "context_eviction":
        where = f" to {d['path']}" if d.get("path") else ""
        return (f"~ context: {who}evicted a {_count(d.get('chars'))}-char result of "
                f"{d.get('tool') or 'a tool'}{where}")
    if kind == "context_checkpoint":
        note = str(d.get("note") or "").strip().splitlines()
        label = f" \"{note[0][:60]}\"" if note else ""
        return f"~ context: {who}checkpoint{label} ({_tokens(d)}{_history(d)})"
    if kind == "context_emergency":
        return (f"~ context: {who}emergency compaction after a context-length error: kept "
                f"{_count(d.get('kept'))}, dropped {_count(d.get('dropped'))} messages "
                f"({_tokens(d)}{_history(d)})")
    if kind == "context_state_card":
        if d.get("restarted"):
            lost = ", ".join(str(n) for n in (d.get("lost") or [])[:8]) or "none listed"
            return (f"! context: {who}kernel state card: the kernel was restarted since the "
                    f"last card; lost: {lost}")
        return (f"~ context: {who}kernel state card after the {d.get('reason') or 'compaction'}"
                f" ({_count(d.get('names'))} names, {_count(d.get('tokens'))} tokens)")
    if kind == "mcp_server":
        return f"! mcp: {d['notice']}" if d.get("notice") else None
    if kind == "watchdog_alert":
        stopped = "; turn stopped" if d.get("mode") == "enforce" else ""
        return (f"! watchdog: {who}{d.get('tool') or 'a tool'} called {_count(d.get('repeats'))} "
                f"times in a row with the same arguments{stopped}")
    if kind == "repl_watchdog":
        stopped = "; turn stopped" if d.get("stopped") else ""
        what = {"same_error": f"same error {_count(d.get('count'))} times in a row",
                "failed_run": f"{_count(d.get('count'))} failing cells in a row",
                "whitespace_rerun": "failed cell re-run with only whitespace changes"}.get(
                    str(d.get("signal")), str(d.get("signal")))
        sig = f": {d['signature']}" if d.get("signature") else ""
        return f"! repl watchdog: {who}{what}{sig}{stopped}"
    if kind == "cost_ceiling":
        action = d.get("action")
        if action == "reset":
            return "~ context: cost ceiling reset"
        what = "this turn" if d.get("scope") == "turn" else "this session"
        spend = (f"{what} used {_amount(d.get('spent'), d.get('unit'))} "
                 f"(limit {_amount(d.get('limit'), d.get('unit'))})")
        if action == "refused":
            return f"! cost ceiling: turn refused, {spend}; reset it to go on"
        return f"! cost ceiling reached: {spend}; turn stopped"
    return f"~ context: {who}{kind.removeprefix('context_')}"


#: Guard notices that repeat what a guard's context line already said.
GUARD_NOTICES = {"watchdog_alert": "watchdog:", "repl_watchdog": "repl watchdog:",
                 "cost_ceiling": "cost ceiling reached"}
