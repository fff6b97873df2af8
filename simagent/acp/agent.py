"""``SimagentAgent``: the ACP agent ``simagent acp`` serves, as the protocol sees it.

``initialize`` answers at once: the agent stack (langchain, the graph, the kernel layer;
3-15 s to import on a loaded machine) loads on a thread from the moment the client
connects, and each session method waits for it, then hands over to
``acp.sessions.Host``. A client that opens a session right after ``initialize`` waits no
longer than before; one that only asks what the agent is gets its answer without it.

Every method of ``acp.Agent`` is implemented or refused here on purpose: a subclass of
the SDK's ``Agent`` protocol otherwise answers with silent stubs (``{}`` for
``session/load``), which a client takes for success.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import acp
from acp import PROTOCOL_VERSION, RequestError
from acp.schema import (
    AgentCapabilities,
    Implementation,
    InitializeResponse,
    LoadSessionResponse,
    McpCapabilities,
    NewSessionResponse,
    PromptCapabilities,
    PromptResponse,
    SetSessionModeResponse,
)

from simagent import __version__

#: The module behind the session methods (imported on a thread: see the module doc).
HOST_MODULE = "simagent.acp.sessions"


def say(line: str) -> None:
    """One line for the person running the agent: stderr, since stdout is the protocol."""
    print(f"simagent acp: {line}", file=sys.stderr, flush=True)


@dataclass
class AcpOptions:
    """``simagent acp``'s flags: what every session of this process starts from."""

    model: str | None = None
    approval: str | None = None
    kernel: str | None = None
    trust_workspace: bool = False


def in_thread(fn: Callable[[], Any]) -> asyncio.Future[Any]:
    """``fn()`` on a daemon thread, awaited from the loop. Not ``asyncio.to_thread``: the
    loop's executor is joined at exit, and a turn that does not stop must not hold the
    process after its client has gone."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, exc: BaseException | None) -> None:
        if fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(value)

    def work() -> None:
        try:
            value = fn()
        except BaseException as exc:  # handed to the awaiting coroutine
            with contextlib.suppress(RuntimeError):  # the loop has closed
                loop.call_soon_threadsafe(settle, None, exc)
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, value, None)

    thread = threading.Thread(target=work, name="simagent-acp-work", daemon=True)
    thread.start()
    fut.thread = thread  # type: ignore[attr-defined]  # for a bounded join at close
    return fut


class SimagentAgent(acp.Agent):
    """The ACP agent: ``run_agent(SimagentAgent(opts))`` serves it (``acp.server``)."""

    def __init__(self, opts: AcpOptions) -> None:
        self.opts = opts
        self.conn: Any = None
        self.host: Any = None  # acp.sessions.Host, once loaded
        self.client_capabilities: Any = None  # what initialize said the client offers
        self._loading: asyncio.Future[Any] | None = None

    def on_connect(self, conn: Any) -> None:
        self.conn = conn
        with contextlib.suppress(RuntimeError):  # no running loop: loaded at first use
            self._loading = in_thread(lambda: importlib.import_module(HOST_MODULE))

    async def _host(self) -> Any:
        if self.host is None:
            if self._loading is None:
                self._loading = in_thread(lambda: importlib.import_module(HOST_MODULE))
            module = await asyncio.shield(self._loading)
            if self.host is None:
                self.host = module.Host(self.opts, self.conn,
                                        capabilities=self.client_capabilities)
        return self.host

    # ------------------------------------------------ answered without the stack
    async def initialize(self, protocol_version: int, client_capabilities: Any = None,
                         client_info: Any = None, **kw: Any) -> InitializeResponse:
        if client_info is not None:
            say(f"client {client_info.name} {client_info.version or ''}".rstrip())
        self.client_capabilities = client_capabilities
        if self.host is not None:  # a second initialize: later sessions follow it
            self.host.capabilities = client_capabilities
        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(
                load_session=True,
                prompt_capabilities=PromptCapabilities(image=True, embedded_context=True),
                mcp_capabilities=McpCapabilities(http=True)),
            agent_info=Implementation(name="simagent", title="simagent",
                                      version=__version__),
            auth_methods=[])

    async def authenticate(self, method_id: str, **kw: Any) -> None:
        raise RequestError(-32602, f"simagent takes no authentication (asked for "
                                   f"{method_id!r}); model keys come from its config")

    async def list_sessions(self, cwd: str | None = None, cursor: str | None = None,
                            **kw: Any) -> Any:
        raise RequestError.method_not_found("session/list")

    async def set_config_option(self, config_id: str, session_id: str, value: Any,
                                **kw: Any) -> Any:
        raise RequestError.method_not_found("session/set_config_option")

    # ------------------------------------------------------- the session methods
    async def new_session(self, cwd: str, additional_directories: list[str] | None = None,
                          mcp_servers: list[Any] | None = None, **kw: Any
                          ) -> NewSessionResponse:
        host = await self._host()
        return await host.new_session(cwd, additional_directories, mcp_servers, **kw)

    async def load_session(self, cwd: str, session_id: str,
                           mcp_servers: list[Any] | None = None,
                           additional_directories: list[str] | None = None, **kw: Any
                           ) -> LoadSessionResponse:
        host = await self._host()
        return await host.load_session(cwd, session_id, mcp_servers, additional_directories,
                                       **kw)

    async def set_session_mode(self, session_id: str, mode_id: str, **kw: Any
                               ) -> SetSessionModeResponse:
        return await (await self._host()).set_session_mode(session_id, mode_id, **kw)

    async def prompt(self, session_id: str, prompt: list[Any], **kw: Any) -> PromptResponse:
        return await (await self._host()).prompt(session_id, prompt, **kw)

    async def cancel(self, session_id: str, **kw: Any) -> None:
        if self.host is not None:  # no host yet: no session, nothing runs
            await self.host.cancel(session_id, **kw)

    def close(self, *, signalled: bool = False) -> None:
        """The client has gone: every session closed (``Host.close``)."""
        if self.host is not None:
            self.host.close(signalled=signalled)
