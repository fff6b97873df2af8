"""Render a session's trace as a readable transcript (Markdown or one self-contained HTML file).

The trace (design.md §5) is the only complete record of a session: what the user asked, what
the model said and ran, what came back, and what it cost. These renderers are pure functions
of the event list, so they work the same on a live session, a finished one or a crashed one,
and never touch the kernel or the model. Payloads are schemaless JSON written by many hands,
so every field read here is defensive: a missing or odd-typed field degrades the output, it
never raises. HTML output escapes every payload string; nothing from the trace is ever
emitted as markup.
"""

from __future__ import annotations

import base64
import html
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from simagent.context.provenance.sources import execution_number
from simagent.context.reporting import CONTEXT_KINDS
from simagent.kernel_api.outputs import size_text
from simagent.outcomes import mark, outcome_of
from simagent.presentation.footnotes import (
    SOURCES,
    Footnoted,
    Note,
    cell_anchor,
    footnote,
    markdown_marker,
    markdown_sources,
    turn_answers,
)
from simagent.presentation.html_text import CSS, html_table, safe_markdown
from simagent.trace.log import Event
from simagent.trace.redact import redact
from simagent.trace.usage import UsageTotals

#: Tool output shown inline; the rest stays in the raw output file named in the note.
DISPLAY_CAP = 4000
_CONTEXT_KINDS = CONTEXT_KINDS
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------- payload helpers
def _data(ev: Event) -> dict[str, Any]:
    return ev.payload if isinstance(ev.payload, dict) else {}


def _text(value: Any, compact: bool = False) -> str:
    """Any payload value as display text (JSON for structures; one line when ``compact``)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, default=str, ensure_ascii=False, indent=None if compact else 2)
    except (TypeError, ValueError):
        return str(value)


def _key(value: Any) -> str | int | None:
    """A tool-call id usable as a dict key (odd payloads may hold lists or dicts)."""
    return value if isinstance(value, (str, int)) and value != "" else None


def _agent(payload: dict[str, Any]) -> str | None:
    """Name of the subagent that produced an event, or None for the main agent."""
    agent = payload.get("agent")
    return str(agent) if agent and agent != "main" else None


def _cap(text: str, raw_path: Any = None) -> tuple[str, str | None]:
    """Shown text and, when cut, the note saying how much is missing and where it is.

    The count is of the result (itself capped for the model); the raw file's own size
    is named beside its path, so a 50 MB print does not read as a few KB more.
    """
    if len(text) <= DISPLAY_CAP:
        return text, None
    more = f"{len(text) - DISPLAY_CAP:,} more chars of this result"
    if not raw_path:
        return text[:DISPLAY_CAP], f"({more})"
    try:
        size = f", {size_text(Path(raw_path).stat().st_size)}"
    except OSError:
        size = ""  # moved or deleted since: the path is still where it was
    return text[:DISPLAY_CAP], f"({more}; full output{size}: {raw_path})"


def _summary(payload: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_text(v)}" for k, v in payload.items()
                     if not isinstance(v, (dict, list)) and v not in (None, ""))


# --------------------------------------------------------------------------- shared walk
def _walk(events: Sequence[Event]) -> Iterator[tuple[str, str | None, dict[str, Any]]]:
    """Events as display items ``(item, agent, data)``.

    Pairing happens here so both renderers agree: a tool call carries its result, its
    ``kernel_exec`` and its artifacts, and those are not shown again at their own place.
    Consecutive ``attempt`` events become one table. Unknown kinds are dropped.
    """
    call_ids = {_key(_data(e).get("id")) for e in events if e.kind == "tool_call"} - {None}
    results: dict[Any, dict[str, Any]] = {}
    execs: dict[Any, dict[str, Any]] = {}
    arts: dict[Any, list[dict[str, Any]]] = {}
    for e in events:
        cid = _key(_data(e).get("tool_call_id"))
        if cid not in call_ids:
            continue
        if e.kind == "tool_result":
            results.setdefault(cid, _data(e))
        elif e.kind == "kernel_exec":
            execs.setdefault(cid, _data(e))
        elif e.kind == "artifact":
            arts.setdefault(cid, []).append(_data(e))
    used: set[Any] = set()
    attempts: list[dict[str, Any]] = []
    for e in events:
        p, kind = _data(e), e.kind
        if kind != "attempt" and attempts:
            yield "attempts", None, {"rows": attempts}
            attempts = []
        if kind in ("tool_result", "kernel_exec", "artifact") and \
                _key(p.get("tool_call_id")) in call_ids:
            continue
        if kind == "session_start":
            yield "header", None, {**p, "ts": e.ts}
        elif kind == "session_resume":
            yield "resume", None, {**p, "ts": e.ts}
        elif kind == "model_switch":
            yield "notice", None, {"text": f"Model switched: {_text(p.get('from_model')) or '?'} "
                                           f"→ {_text(p.get('to_model')) or '?'}"}
        elif kind == "message_user":
            yield "user", None, p
        elif kind in ("message_assistant", "message_reasoning"):
            yield kind[8:], _agent(p), {**p, "event_id": e.id}
        elif kind == "tool_call":
            cid = _key(p.get("id"))
            fresh = cid is not None and cid not in used
            used.add(cid)
            yield "tool", _agent(p), {"call": p, "result": results.get(cid) if fresh else None,
                                      "exec": execs.get(cid) if fresh else None,
                                      "artifacts": arts.get(cid, []) if fresh else []}
        elif kind == "tool_result":
            yield "tool", _agent(p), {"call": None, "result": p, "exec": None, "artifacts": []}
        elif kind == "kernel_exec":
            call = {"name": "run_python", "args": {"code": p.get("code")}}
            yield "tool", None, {"call": call, "result": None, "exec": p, "artifacts": []}
        elif kind == "artifact":
            yield "artifact", None, p
        elif kind == "attempt":
            attempts.append(p)
        elif kind in ("hitl_request", "hitl_response", "error"):
            yield kind, _agent(p), p
        elif kind == "recovery":
            yield "notice", _agent(p), {"text": f"Recovery: {_text(p.get('reason'))} "
                                                f"(attempt {_text(p.get('attempt')) or '?'})"}
        elif kind in _CONTEXT_KINDS:
            yield "notice", _agent(p), {"text": f"{kind}: {_summary(p)}"}
        elif kind in ("subagent_start", "subagent_end"):
            what = "started" if kind == "subagent_start" else f"ended ({_text(p.get('status'))})"
            desc = _text(p.get("description")).splitlines()[:1] if kind == "subagent_start" else []
            text = f"Subagent {_text(p.get('name')) or '?'} {what}" + (
                f": {desc[0]}" if desc else "")
            yield "notice", None, {"text": text}
        elif kind == "memory_write":
            yield "notice", None, {"text": f"Memory written: {_text(p.get('title'))} "
                                           f"({_text(p.get('path'))})"}
        elif kind == "session_end":
            reason = _text(p.get("reason")) or "no reason"
            yield "notice", None, {"text": f"Session ended ({reason})"
                                           f" at {e.ts}"}
    if attempts:
        yield "attempts", None, {"rows": attempts}


def _usage(events: Sequence[Event]) -> tuple[str, list[tuple[list[str], list[list[str]]]]]:
    """Sums of ``model_usage``: a one-line total, then tables by agent and by model."""
    totals = UsageTotals.from_trace(e for e in events if e.kind == "model_usage")
    t = totals.total
    line = (f"{t.calls} model calls; input {t.input_tokens} tokens, output "
            f"{t.output_tokens} tokens, cache read {t.cache_read} tokens.")
    tables = [([group, "calls", "input", "output", "cache read"],
               [[k, *map(str, (u.calls, u.input_tokens, u.output_tokens, u.cache_read))]
                for k, u in rows.items()])
              for group, rows in (("agent", totals.by_agent), ("model", totals.by_model))
              if rows]
    return line, tables


_ATTEMPT_COLS = ("index", "outcome", "rationale", "parameters", "metrics")


def _header_fields(p: dict[str, Any]) -> list[tuple[str, str]]:
    keys = ("workspace", "simulator", "model", "approval")
    return [(k, _text(p.get(k)) or "?") for k in keys] + [("started", _text(p.get("ts")))]


def _resume_text(p: dict[str, Any]) -> str:
    text = f"Session resumed at {_text(p.get('ts'))}"
    if p.get("model"):
        text += f" with model {_text(p.get('model'))}"
    if p.get("kernel_restarted"):
        text += "; the kernel was restarted, so earlier kernel state is lost"
    return text


def _session_id(events: Sequence[Event], session_dir: Path | None) -> str:
    for e in events:
        if e.kind in ("session_start", "session_resume") and _data(e).get("session_id"):
            return _text(_data(e)["session_id"])
    return session_dir.name if session_dir else "session"


def _tool_parts(d: dict[str, Any]) -> dict[str, Any]:
    """What a tool card shows, independent of the output format."""
    call, result, ex = d["call"] or {}, d["result"] or {}, d["exec"] or {}
    name = _text(call.get("name") or result.get("name")) or "tool"
    args = call.get("args")
    code = args.get("code") if name == "run_python" and isinstance(args, dict) else None
    outcome = result.get("outcome") or (outcome_of(result.get("status"), ex.get("status"))
                                        if d["result"] is not None or ex.get("status") else "")
    # the mark every interface shows (simagent.outcomes), then the status it comes from
    status = [f"{mark(outcome).glyph} status {_text(outcome)}" if outcome else "",
              f"{_text(ex.get('elapsed_s'))} s" if ex.get("elapsed_s") is not None else "",
              "kernel state lost" if ex.get("state_lost") else "",
              *(f"shown to the user: {_text(h)}" for h in ex.get("human") or [])]
    out, note = (_cap(_text(result.get("content")), ex.get("raw_path"))
                 if d["result"] is not None else ("", None))
    n = execution_number(ex) if ex else None
    return {"name": name, "cell": n, "anchor": None if n is None else cell_anchor(n),
            "code": None if code is None else _text(code),
            "args": None if code is not None or args in (None, {}, "") else _text(args),
            "status": ", ".join(s for s in status if s), "has_result": d["result"] is not None,
            "output": out, "note": note, "error": result.get("status") == "error"}


def _fmt_decisions(p: dict[str, Any]) -> str:
    ds = p.get("decisions")
    if isinstance(ds, list):
        parts = [(_text(d.get("type") or d.get("decision")) or _text(d)) if isinstance(d, dict)
                 else _text(d) for d in ds]
        return ", ".join(parts) or "(none)"
    return _text(ds) or "(none)"


def _fmt_requests(p: dict[str, Any]) -> list[str]:
    reqs = p.get("action_requests")
    if not isinstance(reqs, list):
        return [_text(reqs)] if reqs else []
    lines = []
    for r in reqs:
        if isinstance(r, dict):
            name = _text(r.get("name") or r.get("action") or "?")
            args = r.get("args", r.get("arguments"))
            shown = _text(args, True).replace(chr(10), " ")[:300]
            lines.append(f"{name}({shown})" if args else name)
        else:
            lines.append(_text(r))
    return lines


# --------------------------------------------------------------------------- markdown
def _fence(text: str, lang: str = "") -> str:
    run = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, run + 1)
    return f"{ticks}{lang}\n{text.rstrip(chr(10))}\n{ticks}"


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("\n", " ").replace("|", "\\|")[:200]
                                 for c in cells) + " |"
    return "\n".join([line(head), "|" + "---|" * len(head), *map(line, rows)])


def _md_item(item: str, data: dict[str, Any], expand: bool) -> str:
    if item == "resume":
        return f"*{_resume_text(data)}.*"
    if item == "notice":
        return f"*{data['text']}*"
    if item == "user":
        turn = f" (turn {_text(data.get('turn'))})" if data.get("turn") is not None else ""
        return f"## User{turn}\n\n{_text(data.get('content'))}"
    if item == "assistant":
        if (f := data.get("footnoted")) is not None:
            return f"## Assistant\n\n{f.text}" + markdown_sources(f, _linked)
        return f"## Assistant\n\n{_text(data.get('content'))}"
    if item == "reasoning":
        return "\n".join("> " + line for line in (_text(data.get("content")) or " ").splitlines())
    if item == "tool":
        t = _tool_parts(data)
        status = f" ({t['status']})" if t["status"] else ""
        if t["anchor"]:  # where an answer's footnote links
            status += f' · cell {t["cell"]}<a id="{t["anchor"]}"></a>'
        if not expand:
            return f"- tool `{t['name']}`{status}"
        parts = [f"### Tool `{t['name']}`{status}"]
        if t["code"] is not None:
            parts.append(_fence(t["code"], "python"))
        elif t["args"]:
            parts.append(_fence(t["args"], "json"))
        if t["has_result"]:
            parts.append(("Result (error):" if t["error"] else "Result:") + "\n\n"
                         + _fence(t["output"]))
            if t["note"]:
                parts.append(f"*{t['note']}*")
        parts += [_md_item("artifact", a, expand) for a in data["artifacts"]]
        return "\n\n".join(parts)
    if item == "artifact":
        return f"![artifact]({_text(data.get('path'))})"
    if item == "attempts":
        rows = [[_text(a.get(k), True) for k in _ATTEMPT_COLS] for a in data["rows"]]
        return "### Attempts\n\n" + _md_table(["#", *_ATTEMPT_COLS[1:]], rows)
    if item == "hitl_request":
        reqs = "".join(f"\n- `{r}`" for r in _fmt_requests(data))
        return f"**Approval requested** ({_text(data.get('interrupt_id'))}):{reqs}"
    if item == "hitl_response":
        return f"**Approval decision** ({_text(data.get('interrupt_id'))}): {_fmt_decisions(data)}"
    if item == "error":
        where = f" in {_text(data.get('where'))}" if data.get("where") else ""
        return f"**Error**{where}: {_text(data.get('message'))}"
    return ""


def _linked(note: Note) -> bool:
    return note.anchor is not None  # every cell is in the transcript


def _footnoted(events: Sequence[Event], marker: Any) -> dict[int, Footnoted]:
    """Each turn's final answer with its numbers footnoted, by event id."""
    by_id = {e.id: e for e in events}
    return {i: footnote(_text(_data(by_id[i]).get("content")), prov, marker)
            for i, prov in turn_answers(events).items()}


def render_markdown(events: Sequence[Event], *, session_dir: Path | None = None,
                    expand_tools: bool = True) -> str:
    """Markdown transcript; assistant text is passed through as the model wrote it, each
    turn's final answer with a footnote after each number that links to the cell that
    printed it (``presentation/footnotes``)."""
    events = _redacted(events)
    notes = _footnoted(events, markdown_marker(_linked))
    out = [f"# Session {_session_id(events, session_dir)}"]
    for item, agent, data in _walk(events):
        if item == "header":
            out.append("\n".join(f"- **{k}**: {v}" for k, v in _header_fields(data)))
            continue
        if item == "assistant" and data.get("event_id") in notes:
            data = {**data, "footnoted": notes[data["event_id"]]}
        block = _md_item(item, data, expand_tools)
        if block and agent:  # subagent output: a labelled blockquote, set off from main
            block = "\n".join(f"> {line}".rstrip() for line in
                               f"**[{agent}]**\n\n{block}".splitlines())
        if block:
            out.append(block)
    line, tables = _usage(events)
    foot = ["## Usage", line] + [_md_table(head, rows) for head, rows in tables]
    out.append("\n\n".join(foot))
    return redact("\n\n".join(out) + "\n")


def _redacted(events: Sequence[Event]) -> list[Event]:
    """Events with secrets replaced, before any escaping could hide one from the match
    (a trace written before a key was known, or by an older simagent, may hold it)."""
    out = []
    for ev in events:
        text = json.dumps(ev.payload, default=str, ensure_ascii=False)
        clean = redact(text)
        out.append(ev if clean == text else Event(ev.id, ev.ts, ev.kind, json.loads(clean)))
    return out


# --------------------------------------------------------------------------- html
def _resolve(path_text: str, session_dir: Path | None) -> Path:
    path = Path(path_text)
    return path if path.is_absolute() or session_dir is None else session_dir / path


def _html_artifact(p: dict[str, Any], session_dir: Path | None, embed: bool) -> str:
    raw = _text(p.get("path"))
    if not raw:
        return '<div class="notice">artifact without a path</div>'
    path = _resolve(raw, session_dir)
    if embed and (session_dir is not None or path.is_absolute()):  # never guess from the cwd
        try:
            data = path.read_bytes()
        except OSError:
            data = b""
        if data.startswith(_PNG_MAGIC):
            b64 = base64.b64encode(data).decode("ascii")
            return (f'<figure><img alt="{html.escape(raw)}" src="data:image/png;base64,{b64}">'
                    f"<figcaption class=meta>{html.escape(raw)}</figcaption></figure>")
    href = path.as_uri() if path.is_absolute() else "./" + raw.lstrip("/")
    return f'<p>artifact: <a href="{html.escape(href)}">{html.escape(raw)}</a></p>'


def _html_item(item: str, data: dict[str, Any], sd: Path | None, embed: bool) -> str:
    e = html.escape
    if item == "header":
        rows = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in _header_fields(data))
        return f"<table>{rows}</table>"
    if item in ("resume", "notice"):
        text = _resume_text(data) if item == "resume" else data["text"]
        return f'<div class="notice">{e(text)}</div>'
    if item == "user":
        turn = f" (turn {e(_text(data.get('turn')))})" if data.get("turn") is not None else ""
        return (f'<div class="card user"><div class="label">User{turn}</div>'
                f"<pre>{e(_text(data.get('content')))}</pre></div>")
    if item == "assistant":
        if (f := data.get("footnoted")) is not None:
            return (f'<div class="card"><div class="label">Assistant</div>'
                    f"{_html_marked(safe_markdown(f.text), f)}{_html_sources(f)}</div>")
        return (f'<div class="card"><div class="label">Assistant</div>'
                f"{safe_markdown(_text(data.get('content')))}</div>")
    if item == "reasoning":
        return (f"<details><summary class=meta>reasoning</summary>"
                f"<pre>{e(_text(data.get('content')))}</pre></details>")
    if item == "tool":
        t = _tool_parts(data)
        anchor = f' id="{t["anchor"]}"' if t["anchor"] else ""
        cell = f" · cell {t['cell']}" if t["anchor"] else ""
        parts = [f'<div class="card tool{" err" if t["error"] else ""}"{anchor}>'
                 f'<div class="label">tool {e(t["name"])}{cell}</div>']
        if t["status"]:
            parts.append(f'<div class="meta">{e(t["status"])}</div>')
        if t["code"] is not None:
            parts.append(f'<pre class="code">{e(t["code"])}</pre>')
        elif t["args"]:
            parts.append(f"<pre>{e(t['args'])}</pre>")
        if t["has_result"]:
            parts.append(f'<div class="meta">result</div><pre>{e(t["output"])}</pre>')
            if t["note"]:
                parts.append(f'<div class="notice">{e(t["note"])}</div>')
        parts += [_html_artifact(a, sd, embed) for a in data["artifacts"]]
        return "".join(parts) + "</div>"
    if item == "artifact":
        return _html_artifact(data, sd, embed)
    if item == "attempts":
        rows = [[_text(a.get(k), True) for k in _ATTEMPT_COLS] for a in data["rows"]]
        return (f'<div class="card"><div class="label">Attempts</div>'
                f"{html_table(['#', *_ATTEMPT_COLS[1:]], rows)}</div>")
    if item == "hitl_request":
        reqs = "".join(f"<li><code>{e(r)}</code></li>" for r in _fmt_requests(data))
        return (f'<div class="card"><div class="label">Approval requested '
                f"({e(_text(data.get('interrupt_id')))})</div><ul>{reqs}</ul></div>")
    if item == "hitl_response":
        return (f'<div class="card"><div class="label">Approval decision '
                f"({e(_text(data.get('interrupt_id')))})</div>{e(_fmt_decisions(data))}</div>")
    if item == "error":
        where = f" in {e(_text(data.get('where')))}" if data.get("where") else ""
        return (f'<div class="card err"><div class="label">Error{where}</div>'
                f"<pre>{e(_text(data.get('message')))}</pre></div>")
    return ""


#: A marker's place in an answer while ``safe_markdown`` escapes it (private-use
#: characters: escaping leaves them, and no answer holds them), then a link.
_MARK = re.compile("\ue000([0-9]+)\ue001")


def _html_placeholder(note: Note) -> str:
    return f"\ue000{note.key}\ue001"


def _html_marked(body: str, f: Footnoted) -> str:
    """``body`` (escaped) with each placeholder a superscript link to its cell."""
    by_key = {str(n.key): n for n in f.notes}

    def link(m: re.Match[str]) -> str:
        n = by_key[m.group(1)]
        mark = f"[{n.key}]"
        return f'<sup><a href="#{n.anchor}">{mark}</a></sup>' if n.anchor else f"<sup>{mark}</sup>"
    return _MARK.sub(link, body)


def _html_sources(f: Footnoted) -> str:
    e = html.escape
    rows = []
    for n in f.notes:
        where = f'<a href="#{n.anchor}">{e(n.where)}</a>' if n.anchor else e(n.where)
        what = f"<code>{e(n.what)}</code>" if n.status in ("sourced", "input") else e(n.what)
        rows.append(f"<li>[{n.key}] {where}: {what}</li>" if where else
                    f"<li>[{n.key}] {what}</li>")
    if f.unsourced:
        rows.append(f"<li>{e(f.block()[-1])}</li>")
    return (f'<div class="meta">{SOURCES}</div><ul class="meta sources">{"".join(rows)}</ul>'
            if rows else "")


def render_html(events: Sequence[Event], *, session_dir: Path | None = None,
                embed_images: bool = True) -> str:
    """One self-contained HTML page; every payload string is escaped, PNGs are inlined;
    each turn's final answer has its numbers' footnotes, linked to their cells."""
    events = _redacted(events)
    notes = _footnoted(events, _html_placeholder)
    sid = html.escape(_session_id(events, session_dir))
    body = [f"<h1>Session {sid}</h1>"]
    if nb := next((_text(e.payload.get("path")) for e in reversed(events)
                   if e.kind == "notebook_written" and isinstance(e.payload, dict)), None):
        href = Path(nb).resolve().as_uri() if Path(nb).is_absolute() else nb
        body.append(f'<p class="meta">Notebook: <a href="{html.escape(href)}">'
                    f"{html.escape(nb)}</a> (simagent notebook)</p>")
    for item, agent, data in _walk(events):
        if item == "assistant" and data.get("event_id") in notes:
            data = {**data, "footnoted": notes[data["event_id"]]}
        block = _html_item(item, data, session_dir, embed_images)
        if block and agent:
            block = f'<div class="sub"><div class="label">{html.escape(agent)}</div>{block}</div>'
        if block:
            body.append(block)
    line, tables = _usage(events)
    body += ["<h2>Usage</h2>", f"<p>{line}</p>"] + [html_table(h, r) for h, r in tables]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{sid}</title><style>{CSS}</style></head><body>\n"
            + redact("\n".join(body)) + "\n</body></html>\n")
