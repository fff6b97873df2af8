"""``find_tools`` and the middleware that sends only loaded MCP tool schemas (issue 28.3).

The policy (names, search, what counts as loaded, the ``/context`` view) is pure and lives
in ``simagent.context.tool_deferral``; the share of the window above which deferral is on
lives with the other thresholds (``thresholds.defer_tools``). This module wires them:
``ToolDeferral`` sits outermost in an agent's stack, so every layer inside it (the
context budget, the trace recorder, the model) sees the request with the deferred
schemas left out, and it records the schema bill per server as ``tool_schemas`` trace
events, which ``/context`` reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.tools import BaseTool, tool

from simagent.agent.mcp_tools import McpHub, hub_for
from simagent.context import thresholds as th
from simagent.context.counting import count_tools
from simagent.context.middleware import current_view
from simagent.context.tool_deferral import (
    FIND_TOOLS,
    find_tools_text,
    loaded_names,
    search,
)

if TYPE_CHECKING:
    from simagent.context.thresholds import ContextSettings
    from simagent.context.tokens import Ruler
    from simagent.session import Session


def make_find_tools(hub: McpHub) -> BaseTool:
    @tool(FIND_TOOLS)
    def find_tools(query: str) -> str:
        """Find tools of the connected MCP servers by what they do (a few words, or a
        tool's exact name). Returns up to 5 matching tools, each with its name and a
        one-line description, and loads their schemas so you can call them from your next
        reply on. Their schemas stay loaded while this result is in your context."""
        catalog = {name: rt.description for name, rt in hub.catalog.items()}
        return find_tools_text(query, search(query, catalog), catalog)

    return find_tools


def _name(t: Any) -> str:
    if isinstance(t, dict):
        return str(t.get("name") or (t.get("function") or {}).get("name") or "")
    return str(getattr(t, "name", ""))


class ToolDeferral(AgentMiddleware):
    """Leaves deferred MCP schemas out of each request until ``find_tools`` loads them;
    records the schema bill (``tool_schemas``) whenever what is loaded changes."""

    def __init__(self, hub: McpHub, *, deferred: bool, payload: dict[str, Any],
                 agent: str, trace: Any) -> None:
        super().__init__()
        self.hub = hub
        self.deferred = deferred
        self.deferrable = frozenset(hub.catalog)
        self.tools = [make_find_tools(hub)] if deferred else []
        self._payload = payload
        self._agent = agent
        self._trace = trace
        self._last: tuple[str, ...] | None = None

    @property
    def name(self) -> str:
        return "ToolDeferral"

    def _filter(self, request: Any) -> Any:
        self.hub.flush_notices()
        loaded: set[str] = set()
        if self.deferred:
            state = dict(request.state or {})
            state["messages"] = list(request.messages)
            loaded = loaded_names(current_view(state), self.deferrable)
            keep = [t for t in request.tools or []
                    if _name(t) not in self.deferrable or _name(t) in loaded]
            request = request.override(tools=keep)
        now = tuple(sorted(loaded))
        if now != self._last and self._trace is not None:
            self._last = now
            self._trace.append("tool_schemas", {**self._payload, "loaded": list(now),
                                                "agent": self._agent})
        return request

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return handler(self._filter(request))

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return await handler(self._filter(request))


@dataclass
class McpTooling:
    """What one session's MCP servers add to an agent build: tools and a middleware."""

    hub: McpHub
    tools: list[BaseTool]

    def middleware(self, *, agent: str, window: int, ruler: Ruler | None,
                   settings: ContextSettings) -> list[AgentMiddleware]:
        """The ``ToolDeferral`` layer for one agent, deferral decided for its window."""
        servers: dict[str, dict[str, Any]] = {}
        for name, status in self.hub.status.items():
            mine = [t for t in self.tools if self.hub.catalog[t.name].server == name]
            servers[name] = {"tools": len(mine), "tokens": count_tools(mine, ruler),
                             "status": status}
        total = sum(s["tokens"] for s in servers.values())
        deferred = bool(self.tools) and th.defer_tools(total, window, settings)
        payload = {"servers": servers, "deferred": deferred, "deferred_tokens": total,
                   "limit": th.defer_tools_limit(window, settings)}
        return [ToolDeferral(self.hub, deferred=deferred, payload=payload, agent=agent,
                             trace=self.hub.trace)]


def mcp_tooling(session: Session) -> McpTooling | None:
    """The session's MCP tools (servers started on first use); None without servers."""
    hub = hub_for(session)
    return McpTooling(hub, hub.tools()) if hub is not None else None
