"""``find_tools`` and the middleware that sends only loaded MCP tool schemas (issue 28.3).

The policy (names, search, what counts as loaded, the ``/context`` view) is pure and lives
in ``simagent.context.deferral_policy``; the share of the window above which deferral is on
lives with the other thresholds (``thresholds.defer_tools``). This module wires them:
``ToolDeferral`` sits outermost in an agent's stack, so every layer inside it (the
context budget, the trace recorder, the model) sees the request with the deferred
schemas left out, and it records the schema bill per server as ``tool_schemas`` trace
events, which ``/context`` reads.

A server that could not start when the session opened is retried (``McpHub.retry_failed``)
and its tools join later: the graph's tool node knows only the tools it was built with,
so this middleware also offers the late ones to the model (by the same deferral rule,
recomputed on the grown catalog) and runs their calls (``wrap_tool_call``), asking for
approval itself where the mode says an MCP call waits, with the same request and
decisions as the built-in approval. ``find_tools`` is offered whenever a server is down,
so the model always has a way to reach a server that comes back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool, tool
from langgraph.types import interrupt

from simagent.agent.approval import DECISIONS, waits
from simagent.agent.mcp_hubs import hub_for
from simagent.context import thresholds as th
from simagent.context.counting import count_tools
from simagent.context.deferral_policy import (
    FIND_TOOLS,
    find_tools_text,
    loaded_names,
    search,
)
from simagent.context.state import current_view

if TYPE_CHECKING:
    from simagent.agent.mcp_tools import McpHub
    from simagent.context.settings import ContextSettings
    from simagent.context.tokens import Ruler
    from simagent.session import Session


def make_find_tools(hub: McpHub) -> BaseTool:
    @tool(FIND_TOOLS)
    def find_tools(query: str) -> str:
        """Find tools of the connected MCP servers by what they do (a few words, or a
        tool's exact name). Returns up to 5 matching tools, each with its name and a
        one-line description, and loads their schemas so you can call them from your next
        reply on. Their schemas stay loaded while this result is in your context."""
        hub.retry_failed(wait=True)  # a server down at open may be up now
        catalog = {name: rt.description for name, rt in hub.catalog.items()}
        text = find_tools_text(query, search(query, catalog), catalog)
        down = [f"MCP server {n!r} is not running ({hub.status[n].removeprefix('failed: ')}"
                "); its tools cannot be found until it starts (tried again at each "
                f"{FIND_TOOLS})" for n in hub.failed()]
        return "\n".join([*down, text])

    return find_tools


def _name(t: Any) -> str:
    if isinstance(t, dict):
        return str(t.get("name") or (t.get("function") or {}).get("name") or "")
    return str(getattr(t, "name", ""))


class ToolDeferral(AgentMiddleware):
    """Leaves deferred MCP schemas out of each request until ``find_tools`` loads them;
    records the schema bill (``tool_schemas``) whenever what is loaded changes."""

    def __init__(self, hub: McpHub, *, deferred: bool, payload: dict[str, Any],
                 agent: str, trace: Any, bill: Callable[[], tuple[bool, dict[str, Any]]]
                 | None = None, late: LateTools | None = None) -> None:
        super().__init__()
        self.hub = hub
        self.deferred = deferred
        self.deferrable = frozenset(hub.catalog)
        # find_tools: when deferring, or while a server is down (it retries that server)
        self.tools = [make_find_tools(hub)] if deferred or hub.failed() else []
        self._payload = payload
        self._agent = agent
        self._trace = trace
        self._bill = bill  # (deferred, payload) for the catalog as it is now
        self._late = late
        self._catalog = hub.catalog
        self._last: tuple[Any, ...] | None = None

    @property
    def name(self) -> str:
        return "ToolDeferral"

    def _grown(self) -> None:
        """The catalog grew (a server came up late): its tools become deferrable, and
        deferral is decided again for all of them (the same rule as at build)."""
        if self.hub.catalog is self._catalog:
            return
        self._catalog = self.hub.catalog
        self.deferrable = frozenset(self._catalog)
        if self._bill is not None:
            deferred, self._payload = self._bill()
            self.deferred = deferred and bool(self.tools)  # deferring needs find_tools

    def _filter(self, request: Any) -> Any:
        self.hub.flush_notices()
        self._grown()
        offered = list(request.tools or [])
        if self._late is not None:  # tools of a server that started after the build
            have = {_name(t) for t in offered}
            offered += [self._late.get(n) for n in self.deferrable if n not in have]
        loaded: set[str] = set()
        if self.deferred:
            state = dict(request.state or {})
            state["messages"] = list(request.messages)
            loaded = loaded_names(current_view(state), self.deferrable)
            offered = [t for t in offered
                       if _name(t) not in self.deferrable or _name(t) in loaded]
        request = request.override(tools=offered)
        now = (tuple(sorted(loaded)), self.deferred, self._payload.get("deferred_tokens"))
        if now != self._last and self._trace is not None:
            self._last = now
            self._trace.append("tool_schemas", {**self._payload, "deferred": self.deferred,
                                                "loaded": list(now[0]),
                                                "agent": self._agent})
        return request

    def before_agent(self, state: Any, runtime: Any) -> None:
        """A turn begins: retry, in the background, any server that is down."""
        self.hub.retry_failed(wait=False)

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return handler(self._filter(request))

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return await handler(self._filter(request))

    def _tool_call(self, request: Any) -> tuple[Any, ToolMessage | None]:
        """(the request to run, or the message to answer with instead): a late tool is
        supplied (after approval where it waits); an MCP call gets its progress sink."""
        call = request.tool_call
        name = call["name"]
        if request.tool is None and self._late is not None and name in self.hub.catalog:
            call, answer = self._late.approve(call)
            if answer is not None:
                return request, answer
            request = request.override(tool=self._late.get(name), tool_call=call)
        return request, None

    def _sink(self, request: Any) -> contextlib.AbstractContextManager[None]:
        """Where an MCP call's progress goes while it runs: its tool card."""
        writer = getattr(request.runtime, "stream_writer", None)
        if request.tool_call["name"] in self.hub.catalog and callable(writer):
            return self.hub.progress_to(request.tool_call["id"], writer)
        return contextlib.nullcontext()

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        request, answer = self._tool_call(request)
        if answer is not None:
            return answer
        with self._sink(request):
            return handler(request)

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        request, answer = self._tool_call(request)
        if answer is not None:
            return answer
        with self._sink(request):
            return await handler(request)


@dataclass
class LateTools:
    """Tools of servers that started after the graph was built: made on first use for
    this agent's model, and gated by the session's approval mode as at build time."""

    hub: McpHub
    images: tuple[bool, str]
    approval: Callable[[], str]  # the session's mode now
    workspace: Any
    made: dict[str, BaseTool] = field(default_factory=dict)

    def get(self, name: str) -> BaseTool:
        if name not in self.made:
            self.made[name] = self.hub.tool(name, *self.images)
        return self.made[name]

    def approve(self, call: dict[str, Any]) -> tuple[dict[str, Any], ToolMessage | None]:
        """Ask the person, as the built-in approval does, when the mode says this call
        waits: (the call to run, edited if so, or the answer when rejected)."""
        name, args = call["name"], call.get("args") or {}
        if not waits(self.approval(), name, args, self.workspace):
            return call, None
        answer = interrupt({
            "action_requests": [{"name": name, "args": args, "description":
                                 f"Tool execution requires approval\n\nTool: {name}\n"
                                 f"Args: {args}"}],
            "review_configs": [{"action_name": name, "allowed_decisions": list(DECISIONS)}]})
        decision = ((answer or {}).get("decisions") or [{}])[0]
        kind = decision.get("type")
        if kind == "approve":
            return call, None
        if kind == "edit":
            edited = decision.get("edited_action") or {}
            return {**call, "args": edited.get("args", args)}, None
        if kind == "respond":
            return call, ToolMessage(str(decision.get("message") or ""), name=name,
                                     tool_call_id=call["id"])
        why = decision.get("message")
        text = (f"User rejected the tool call for `{name}` with reason: {why}" if why else
                f"User rejected the tool call for `{name}` with id {call['id']}. The tool "
                "was not executed. Do not retry this tool call unless the user explicitly "
                "requests it.")
        return call, ToolMessage(text, name=name, tool_call_id=call["id"], status="error")


@dataclass
class McpTooling:
    """What one session's MCP servers add to an agent build: tools and a middleware."""

    hub: McpHub
    tools: list[BaseTool]
    late: LateTools | None = None

    def middleware(self, *, agent: str, window: int, ruler: Ruler | None,
                   settings: ContextSettings) -> list[AgentMiddleware]:
        """The ``ToolDeferral`` layer for one agent, deferral decided for its window."""
        counted: dict[str, int] = {}  # tokens per tool, counted once

        def bill() -> tuple[bool, dict[str, Any]]:
            late = self.late
            servers: dict[str, dict[str, Any]] = {}
            for name, status in self.hub.status.items():
                mine = [n for n, rt in self.hub.catalog.items() if rt.server == name]
                for n in mine:
                    if n not in counted:
                        t = next((t for t in self.tools if t.name == n), None) or (
                            late.get(n) if late else self.hub.tool(n))
                        counted[n] = count_tools([t], ruler)
                servers[name] = {"tools": len(mine), "status": status,
                                 "tokens": sum(counted[n] for n in mine)}
            total = sum(s["tokens"] for s in servers.values())
            deferred = bool(self.hub.catalog) and th.defer_tools(total, window, settings)
            return deferred, {"servers": servers, "deferred": deferred,
                              "deferred_tokens": total,
                              "limit": th.defer_tools_limit(window, settings)}

        deferred, payload = bill()
        return [ToolDeferral(self.hub, deferred=deferred, payload=payload, agent=agent,
                             trace=self.hub.trace, bill=bill, late=self.late)]


def mcp_tooling(session: Session, images: tuple[bool, str] = (False, "")
                ) -> McpTooling | None:
    """The session's MCP tools (servers started on first use) for a model that takes
    images in tool results or not (``images``: ``simagent.models.image_support``'s
    answer); None without servers."""
    hub = hub_for(session)
    if hub is None:
        return None
    late = LateTools(hub, images, lambda: session.approval, session.workspace)
    return McpTooling(hub, hub.tools(*images), late)
