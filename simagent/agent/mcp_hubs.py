"""Each session's MCP hub (``agent.mcp_tools.McpHub``): made on first use, and only for a
session whose config names a server.

Every agent build asks for the hub and every front end asks for its notices, but most
sessions have no ``[mcp.servers]``: the MCP SDK and langchain-mcp-adapters (about half a
CPU-second to import) load only when a server is to be started, so this module, which the
build and the front ends import, does not import them.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simagent.agent.mcp_tools import McpHub
    from simagent.session import Session

_HUBS: weakref.WeakKeyDictionary[Any, McpHub] = weakref.WeakKeyDictionary()
_HUBS_LOCK = threading.Lock()


def hub_for(session: Session) -> McpHub | None:
    """The session's hub, started on first use (its servers listed); None when the
    config names no server. The session closes it (``Session.closers``)."""
    servers = session.mcp_servers
    if not servers:
        return None
    with _HUBS_LOCK:
        hub = _HUBS.get(session)
        if hub is None:
            from simagent.agent.mcp_tools import McpHub  # the MCP SDK: start-up speed

            hub = McpHub(servers, cwd=session.workspace, log_dir=session.paths.root,
                         trace=session.trace, artifacts=session.paths.artifacts)
            hub.cancel = session.cancel_requested
            _HUBS[session] = hub
            session.closers.append(hub.close)
            hub.start_all()
    return hub


def open_notices(session: Session) -> list[str]:
    """For a front end once the agent is built: one line per MCP server that could not
    start (what the person is told when the session opens)."""
    with _HUBS_LOCK:
        hub = _HUBS.get(session)
    return hub.start_notices() if hub is not None else []


__all__ = ["hub_for", "open_notices"]
