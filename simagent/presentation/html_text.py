"""Escaped HTML from plain text for the HTML transcript (pure): the page's style, inline
`code` and **bold**, a small markdown subset and tables. Everything is built from
escaped text, so no markup in a payload reaches the page.
"""

from __future__ import annotations

import html
import re

CSS = """body{font:15px/1.5 system-ui,sans-serif;max-width:960px;margin:2em auto;padding:0 1em;
color:#1d1d1f;background:#fff}pre{background:#f5f5f7;padding:.6em;overflow-x:auto;
white-space:pre-wrap;word-break:break-word;border-radius:4px}code{background:#f0f0f2;
padding:0 .2em}.card{border:1px solid #ddd;border-radius:6px;padding:.5em 1em;margin:1em 0}
.user{background:#eef5ff}.tool{background:#fafafa}.err{border-color:#d33;background:#fff4f4}
.notice{color:#666;font-style:italic;margin:.5em 0}.sub{margin-left:2em;border-left:3px solid
#b9c;padding-left:.8em}.label{font-size:12px;color:#836;font-weight:bold}.meta{color:#666;
font-size:13px}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;
font-size:13px;vertical-align:top}img{max-width:100%}h1{font-size:1.5em}"""


def inline(text: str) -> str:
    """Escape, then apply `code` and **bold**; code spans are left alone inside."""
    parts = re.split(r"(`[^`\n]+`)", text)
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f"<code>{html.escape(part[1:-1])}</code>")
        else:
            out.append(re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(part)))
    return "".join(out)


def md_lines(lines: list[str]) -> list[str]:
    """One blank-line-separated block: headings, bullet/numbered lists, paragraphs."""
    out: list[str] = []
    para: list[str] = []
    items: list[str] = []

    def flush() -> None:
        if para:
            out.append("<p>" + "<br>".join(para) + "</p>")
            para.clear()
        if items:
            out.append("<ul>" + "".join(f"<li>{x}</li>" for x in items) + "</ul>")
            items.clear()

    for ln in lines:
        head = re.match(r"^(#{1,6})\s+(.*)$", ln)
        bullet = re.match(r"^\s*(?:[-*+]|\d+[.)])\s+(.*)$", ln)
        if head:
            flush()
            level = min(6, len(head.group(1)) + 2)
            out.append(f"<h{level}>{inline(head.group(2))}</h{level}>")
        elif bullet:
            if para:
                flush()
            items.append(inline(bullet.group(1)))
        else:
            if items:
                flush()
            para.append(inline(ln))
    flush()
    return out


def safe_markdown(text: str) -> str:
    """A tiny markdown subset built only from escaped text: no payload markup gets through."""
    out: list[str] = []
    chunks = re.split(r"^```[^\n]*\n(.*?)^```[ \t]*$", text, flags=re.M | re.S)
    for i, chunk in enumerate(chunks):
        if i % 2:
            out.append(f"<pre>{html.escape(chunk.rstrip(chr(10)))}</pre>")
            continue
        for block in re.split(r"\n\s*\n", chunk):
            out += md_lines([ln for ln in block.splitlines() if ln.strip()])
    return "\n".join(out)


def html_table(head: list[str], rows: list[list[str]]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><tr>{cells}</tr>{body}</table>"
