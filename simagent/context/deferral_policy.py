"""Tool schemas on demand: the pure policy behind ``find_tools`` (issue 28, part 3).

Every request carries every tool schema it offers, so one MCP server with dozens of tools
would make schemas the largest layer on every call. simagent's core tools are always
sent; MCP tools are *deferrable*: when their schemas together pass a share of the window
(``thresholds.defer_tools``) they are sent only after ``find_tools(query)`` has named
them. Which tools are loaded is read from the conversation itself: the names listed in
``find_tools`` results the model can still see. So a loaded tool unloads exactly when
its ``find_tools`` result is cleared or summarized away, like any other result, and a
resumed session loads what its view shows without extra state.

Tool names: providers accept ``[A-Za-z0-9_-]`` only (OpenAI and Anthropic both refuse
``.``), so the tool a person calls ``NAME.tool`` is sent as ``NAME__tool``
(:func:`exposed_name`); ``/context`` and ``simagent doctor`` show the dotted form.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage, ToolMessage

#: The one tool that loads deferred schemas (never waits for approval: it only reads).
FIND_TOOLS = "find_tools"
#: Between a server's name and its tool's in the name sent to the model.
SEP = "__"
#: Longest tool name OpenAI accepts (Anthropic takes 128).
MAX_NAME = 64
#: Most tools one ``find_tools`` call names and loads.
FIND_LIMIT = 5
#: The line of a ``find_tools`` result that lists what it loaded (parsed back).
LOADED_PREFIX = "Schemas loaded: "
_WORD = re.compile(r"[a-z0-9]+")


def exposed_name(server: str, tool: str) -> str:
    """The name the model calls: ``server__tool``, other characters as ``_``."""
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", tool) or "tool"
    return f"{server}{SEP}{clean}"[:MAX_NAME]


def display_name(name: str) -> str:
    """``server__tool`` -> ``server.tool`` (what a person reads)."""
    server, sep, tool = name.partition(SEP)
    return f"{server}.{tool}" if sep else name


def server_of(name: str) -> str | None:
    server, sep, _tool = name.partition(SEP)
    return server if sep else None


def one_line(description: str, limit: int = 120) -> str:
    """The first sentence or line of a tool description, at most ``limit`` chars."""
    text = " ".join((description or "").strip().split("\n\n", 1)[0].split())
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text or "(no description)"


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower().replace("_", " ")))


def search(query: str, catalog: Mapping[str, str], limit: int = FIND_LIMIT) -> list[str]:
    """Names from ``catalog`` (name -> description) best matching ``query``: an exact
    or dotted name first, then by the query words found in name and description
    (name words weigh double), ties by name. No match: an empty list."""
    q = query.strip()
    for name in catalog:
        if q and q in (name, display_name(name)):
            return [name]
    words = _words(q)
    scored = []
    for name, desc in catalog.items():
        in_name, in_desc = _words(name) & words, _words(desc) & words
        score = 2 * len(in_name) + len(in_desc - in_name)
        if score:
            scored.append((-score, name))
    return [name for _s, name in sorted(scored)[:limit]]


def find_tools_text(query: str, found: Sequence[str], catalog: Mapping[str, str]) -> str:
    """The ``find_tools`` result the model reads; its last line is parsed back by
    :func:`loaded_names`."""
    if not found:
        servers = sorted({s for n in catalog if (s := server_of(n))})
        return (f"No tool matches {query!r}. Try other words (tools come from the MCP "
                f"servers {', '.join(servers) or '(none)'}); nothing was loaded.")
    lines = [f"{len(found)} tool{'s' if len(found) != 1 else ''} for {query!r}; their schemas "
             "are loaded for your next calls (call them by the name given):"]
    lines += [f"- {name}: {one_line(catalog[name])}" for name in found]
    lines.append(LOADED_PREFIX + ", ".join(found))
    return "\n".join(lines)


def loaded_names(messages: Iterable[BaseMessage], known: Iterable[str]) -> set[str]:
    """Tools whose schemas the model has loaded: those named on the loaded line of a
    ``find_tools`` result still in ``messages`` (the model's view)."""
    known = set(known)
    out: set[str] = set()
    for m in messages:
        if not isinstance(m, ToolMessage) or m.name != FIND_TOOLS:
            continue
        text = m.text if isinstance(m.content, list) else str(m.content)
        for line in text.splitlines():
            if line.startswith(LOADED_PREFIX):
                out |= {n.strip() for n in line[len(LOADED_PREFIX):].split(",")} & known
    return out


# --------------------------------------------------------------------- /context view
@dataclass(frozen=True)
class ServerRow:
    """One MCP server as ``/context`` lists it."""

    name: str
    tools: int
    tokens: int  # its tool schemas, with the session's ruler
    status: str  # ok | failed: <why>


@dataclass(frozen=True)
class ToolsView:
    """MCP tool schemas of the session: per server, and loaded vs deferred."""

    servers: tuple[ServerRow, ...] = ()
    deferred: bool = False
    limit: int = 0  # schema tokens above which deferral is on by default
    deferred_tokens: int = 0  # all MCP schemas together
    loaded: tuple[str, ...] = ()  # names find_tools loaded (while deferred)
    notices: tuple[str, ...] = field(default_factory=tuple)  # server faults, oldest first

    @property
    def total_tools(self) -> int:
        return sum(s.tools for s in self.servers)


def tools_view_from_events(events: Iterable[Any]) -> ToolsView | None:
    """The latest ``tool_schemas`` event of the main agent (and the server notices since
    the session began); None when the session has no MCP servers."""
    latest: dict[str, Any] | None = None
    notices: list[str] = []
    for ev in events:
        p = getattr(ev, "payload", None)
        if not isinstance(p, dict):
            continue
        if ev.kind == "tool_schemas" and (p.get("agent") or "main") == "main":
            latest = p
        elif ev.kind == "mcp_server" and p.get("notice") and p.get("what") != "started":
            notices.append(str(p["notice"]))
    if latest is None:
        return None
    rows = tuple(ServerRow(str(n), int(s.get("tools") or 0), int(s.get("tokens") or 0),
                           str(s.get("status") or "ok"))
                 for n, s in sorted((latest.get("servers") or {}).items()))
    return ToolsView(rows, bool(latest.get("deferred")), int(latest.get("limit") or 0),
                     int(latest.get("deferred_tokens") or 0),
                     tuple(latest.get("loaded") or ()), tuple(notices[-3:]))


def tools_lines(view: ToolsView) -> list[str]:
    """The ``/context`` section (plain text; the panel wraps it)."""
    how = (f"deferred behind {FIND_TOOLS} (their schemas pass {view.limit:,} tokens)"
           if view.deferred else f"all sent (deferral starts above {view.limit:,} tokens)")
    lines = [f"MCP tools: {view.total_tools} from {len(view.servers)} server"
             f"{'s' if len(view.servers) != 1 else ''}, {view.deferred_tokens:,} schema "
             f"tokens, {how}"]
    for s in view.servers:
        state = "" if s.status == "ok" else f" — {s.status}"
        lines.append(f"  {s.name}: {s.tools} tools, {s.tokens:,} tokens{state}")
    if view.deferred:
        names = ", ".join(display_name(n) for n in view.loaded) or "none"
        lines.append(f"  loaded: {len(view.loaded)} ({names}); deferred: "
                     f"{view.total_tools - len(view.loaded)}")
    lines += [f"  ! {n}" for n in view.notices]
    return lines
