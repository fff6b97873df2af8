"""MCP servers' tools inside simagent (issue 28, part 2): ``[mcp.servers.NAME]`` in config.

``McpHub`` owns one asyncio loop on a thread of its own and, per server, one held-open
client session (a stdio server process, or a streamable-HTTP connection): each call
through langchain-mcp-adapters' ``get_tools()`` would start a new server process, and
its tools are async only while simagent's graph runs tools synchronously. The session
owns the hub (``Session.closers``): servers start with the session's first agent build
and stop when it closes; none is left behind.

A server's tools become ordinary langchain tools named ``NAME__tool`` (shown as
``NAME.tool``; ``context.tool_deferral`` says why), so they pass the same layers as the
built-in ones: per-tool cap, eviction, clearing, ledger, approval (an MCP call is an
external action: it waits in ``ask`` and ``workspace``). Whatever goes wrong on the
server's side (it cannot start, dies mid-call, hangs past ``timeout_s``, answers with
something that is not a tool result) gives the model one error it can read, a notice for
the person, and a trace event; the session goes on, and the next call starts the server
afresh. Tool errors the server reports itself (``isError``) are plain tool errors.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import tempfile
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import anyio
from langchain_core.tools import StructuredTool, ToolException
from langchain_mcp_adapters.sessions import create_session
from langchain_mcp_adapters.tools import load_mcp_tools
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from simagent.config import McpServer
from simagent.context.reporting import write_stream
from simagent.context.tool_deferral import exposed_name

if TYPE_CHECKING:
    from simagent.session import Session
    from simagent.trace.log import TraceLog

#: Seconds a server may take to start and list its tools.
START_TIMEOUT_S = 30.0
#: Seconds closing one server may take (the SDK's stdio client terminates, then kills,
#: a server that does not leave when its stdin closes).
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RemoteTool:
    """One tool of one server, as listed at start."""

    server: str
    remote: str  # the server's own name for it
    name: str  # what the model calls
    description: str
    schema: dict[str, Any]


class McpFault(Exception):
    """A server-side failure: ``what`` is failed | died | timeout | malformed."""

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(detail)
        self.what = what
        self.detail = detail


def fault_text(server: str, tool: str, fault: McpFault, timeout_s: float) -> str:
    """The one error the model reads for a server fault (and the person's notice)."""
    why = {"failed": f"could not be started ({fault.detail})",
           "died": f"stopped during the call ({fault.detail})",
           "timeout": f"gave no answer within {timeout_s:g} s and was stopped",
           "malformed": f"answered with something that is not a tool result ({fault.detail})",
           }.get(fault.what, fault.detail)
    return (f"MCP server {server!r} {why}; {server}.{tool} did not complete. The server is "
            "started afresh on the next call to one of its tools.")


class _Conn:
    """A held-open session: opened and closed by one task (anyio scopes need that)."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.session: ClientSession | None = None
        self.tools: dict[str, Any] = {}  # remote name -> adapter tool


class McpHub:
    """The session's MCP servers: started, listed, called and stopped from one loop."""

    def __init__(self, servers: Mapping[str, McpServer], *, cwd: Path, log_dir: Path,
                 trace: TraceLog | None = None) -> None:
        self.servers = dict(servers)
        self.cwd = cwd
        self.log_dir = log_dir
        self.trace = trace
        self.catalog: dict[str, RemoteTool] = {}  # by the name the model calls
        self.status: dict[str, str] = {}  # server -> ok | failed: <why>
        self._conns: dict[str, _Conn] = {}
        self._locks: dict[str, asyncio.Lock] = {}  # used on the loop only
        self._logs: dict[str, IO[str]] = {}
        self._pending: list[str] = []  # notices not yet shown in a turn's stream
        self._lock = threading.Lock()
        self.closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-hub",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ lifecycle
    def start_all(self) -> None:
        """Start every server and list its tools (in parallel); a server that cannot
        start is noted (``status``, a notice, the trace) and contributes no tools."""
        async def all_() -> list[Any]:
            return await asyncio.gather(*(self._ensure(n) for n in self.servers),
                                        return_exceptions=True)

        results = self._run(all_(), START_TIMEOUT_S + STOP_TIMEOUT_S + 5)
        for name, res in zip(self.servers, results, strict=True):
            if isinstance(res, BaseException):
                fault = res if isinstance(res, McpFault) else McpFault("failed", _why(res))
                self.status[name] = f"failed: {fault.detail}"
                self._note(name, "failed", f"MCP server {name!r} could not be started "
                           f"({fault.detail}); its tools are not available in this session "
                           "(`simagent doctor` checks it)", detail=fault.detail)
                continue
            self.status[name] = "ok"
            conn = self._conns[name]
            for remote, tool in conn.tools.items():
                rt = RemoteTool(name, remote, exposed_name(name, remote),
                                tool.description or "", _schema(tool))
                self.catalog[rt.name] = rt
            self._note(name, "started", "", tools=len(conn.tools))

    def close(self) -> None:
        """Stop every server and the loop; bounded, and safe to call twice."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):
            self._run(self._stop_all(), STOP_TIMEOUT_S * 2 + 5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=STOP_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()
        for f in self._logs.values():
            with contextlib.suppress(OSError):
                f.close()

    async def _stop_all(self) -> None:
        await asyncio.gather(*(self._stop(n) for n in list(self._conns)),
                             return_exceptions=True)

    def _run(self, coro: Any, timeout: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # ------------------------------------------------------------------ sessions
    def _transport(self, name: str) -> Any:
        spec = self.servers[name]
        if spec.command:
            log = self._logs.get(name)
            if log is None:  # its stderr: never the terminal (the TUI owns it)
                self.log_dir.mkdir(parents=True, exist_ok=True)
                log = self._logs[name] = open(  # noqa: SIM115 - closed in close()
                    self.log_dir / f"mcp-{name}.log", "a", encoding="utf-8")
            params = StdioServerParameters(command=spec.command, args=list(spec.args),
                                           env=dict(spec.env) or None, cwd=str(self.cwd))
            return _stdio_session(params, log)
        return create_session({"transport": "streamable_http", "url": spec.url,
                               "headers": dict(spec.headers) or None})

    async def _ensure(self, name: str) -> _Conn:
        """The server's live session, started if need be (parallel calls start it once)."""
        async with self._locks.setdefault(name, asyncio.Lock()):
            conn = self._conns.get(name)
            if conn is not None and conn.task is not None and not conn.task.done():
                return conn
            return await self._open(name)

    async def _open(self, name: str) -> _Conn:
        conn = self._conns[name] = _Conn()
        ready: asyncio.Future[None] = self._loop.create_future()

        async def hold() -> None:
            try:
                async with self._transport(name) as session:
                    await session.initialize()
                    tools = await load_mcp_tools(session, server_name=name,
                                                 handle_tool_errors=False)
                    conn.session, conn.tools = session, {t.name: t for t in tools}
                    ready.set_result(None)
                    await conn.stop.wait()
            except BaseException as exc:
                if not ready.done():
                    ready.set_exception(McpFault("failed", _why(exc)))
                if isinstance(exc, asyncio.CancelledError):
                    raise

        conn.task = self._loop.create_task(hold())
        try:
            await asyncio.wait_for(asyncio.shield(ready), START_TIMEOUT_S)
        except TimeoutError:
            await self._stop(name)
            raise McpFault("failed", f"no answer within {START_TIMEOUT_S:g} s") from None
        except McpFault:
            await self._stop(name)
            raise
        return conn

    async def _stop(self, name: str) -> None:
        conn = self._conns.pop(name, None)
        if conn is None or conn.task is None:
            return
        conn.stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(conn.task), STOP_TIMEOUT_S)
        except BaseException:
            conn.task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(conn.task, STOP_TIMEOUT_S)

    # ------------------------------------------------------------------ calls
    async def _call(self, server: str, remote: str, args: dict[str, Any]) -> tuple[str, bool]:
        """(text, is_error) of one call; raises ``McpFault`` for a server fault."""
        timeout = self.servers[server].timeout_s
        conn = await self._ensure(server)
        tool = conn.tools.get(remote)
        if tool is None:
            return (f"MCP server {server!r} no longer offers the tool {remote!r} (it was "
                    "listed when the session started)", True)
        try:
            content, _artifact = await asyncio.wait_for(tool.coroutine(**args), timeout)
        except ToolException as exc:  # the server's own isError result
            return str(exc) or f"{server}.{remote} reported an error", True
        except TimeoutError:
            await self._stop(server)
            raise McpFault("timeout", f"{timeout:g} s") from None
        except Exception as exc:
            died = conn.task is None or conn.task.done() or _closed(exc)
            await self._stop(server)
            raise McpFault("died" if died else "malformed", _why(exc)) from None
        return content_text(content), False

    def call(self, name: str, args: dict[str, Any]) -> str:
        """Run the tool the model knows as ``name``; any failure is a ``ToolException``
        whose text the model reads (the tool node turns it into an error result)."""
        rt = self.catalog[name]
        timeout = self.servers[rt.server].timeout_s
        if self.closed:
            raise ToolException(f"the MCP servers of this session are stopped; "
                                f"{rt.server}.{rt.remote} cannot run")
        try:
            try:
                text, is_error = self._run(self._call(rt.server, rt.remote, args),
                                           START_TIMEOUT_S + timeout + 3 * STOP_TIMEOUT_S)
            except concurrent.futures.TimeoutError:  # the hub's own bounds all failed
                raise McpFault("timeout", f"{timeout:g} s") from None
        except McpFault as fault:
            msg = fault_text(rt.server, rt.remote, fault, timeout)
            self._note(rt.server, fault.what, msg, detail=fault.detail, tool=rt.remote)
            raise ToolException(msg) from None
        if is_error:
            raise ToolException(text)
        return text

    # ------------------------------------------------------------------ notices
    def _note(self, server: str, what: str, notice: str, **extra: Any) -> None:
        payload = {"server": server, "what": what, "notice": notice, **extra}
        if self.trace is not None:
            with contextlib.suppress(Exception):  # a closed trace must not break a call
                self.trace.append("mcp_server", payload)
        if notice:
            with self._lock:
                self._pending.append(notice)
            self.flush_notices()

    def flush_notices(self) -> None:
        """Show pending notices in the running turn's stream (no-op outside one)."""
        with self._lock:
            pending, self._pending = self._pending, []
        for text in pending:
            write_stream({"type": "context", "kind": "mcp_server",
                          "detail": {"notice": text}})

    # ------------------------------------------------------------------ tools
    def tools(self) -> list[StructuredTool]:
        return [_tool(self, rt) for rt in self.catalog.values()]


def _tool(hub: McpHub, rt: RemoteTool) -> StructuredTool:
    def run(**kwargs: Any) -> str:
        return hub.call(rt.name, kwargs)

    async def arun(**kwargs: Any) -> str:
        return await asyncio.to_thread(hub.call, rt.name, kwargs)

    return StructuredTool(name=rt.name, description=rt.description or rt.remote,
                          args_schema=rt.schema, func=run, coroutine=arun,
                          handle_tool_error=True, metadata={"mcp_server": rt.server})


@contextlib.asynccontextmanager
async def _stdio_session(params: StdioServerParameters, errlog: IO[str]) -> Any:
    async with stdio_client(params, errlog=errlog) as (read, write), \
            ClientSession(read, write) as session:
        yield session


def _schema(tool: Any) -> dict[str, Any]:
    schema = tool.args_schema
    if isinstance(schema, dict):
        return schema
    return schema.model_json_schema() if schema is not None else {"type": "object"}


def _closed(exc: BaseException) -> bool:
    """Whether a failed call found the connection gone (the server died), not a bad answer."""
    return "closed" in str(exc).lower() or isinstance(exc, (
        anyio.ClosedResourceError, anyio.BrokenResourceError, BrokenPipeError, EOFError))


def _why(exc: BaseException) -> str:
    """One line for an exception (the first leaf of an exception group)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


def content_text(content: Any) -> str:
    """Adapter content (a string or content blocks) as the text the model gets: text
    blocks joined, an image or file named, never pasted as base64."""
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif isinstance(block, dict):
            kind = block.get("type", "block")
            mime = block.get("mime_type") or ""
            size = len(str(block.get("base64") or block.get("data") or ""))
            where = block.get("url") or (f"{size:,} chars of base64, not shown" if size else "")
            parts.append(f"[{kind} {mime}: {where}]".replace(" :", ":"))
        else:
            parts.append(json.dumps(block, default=str))
    return "\n".join(parts)


def probe_servers(servers: Mapping[str, McpServer], cwd: Path
                  ) -> dict[str, tuple[bool, str]]:
    """For ``simagent doctor``: start each server, count its tools, stop it. Per server:
    (reachable, a one-line detail; a failure quotes the last line of the server's stderr)."""
    out: dict[str, tuple[bool, str]] = {}
    with tempfile.TemporaryDirectory(prefix="simagent-mcp-") as logs:
        hub = McpHub(servers, cwd=cwd, log_dir=Path(logs))
        try:
            hub.start_all()
        finally:
            hub.close()
        for name, spec in servers.items():
            where = spec.url or " ".join([spec.command or "", *spec.args])
            status = hub.status.get(name, "failed: not started")
            if status == "ok":
                n = sum(1 for rt in hub.catalog.values() if rt.server == name)
                out[name] = (True, f"reachable ({spec.transport}: {where}), {n} tools")
                continue
            log = Path(logs) / f"mcp-{name}.log"
            tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()] \
                if log.is_file() else []
            said = f"; it said: {tail[-1].strip()[:200]}" if tail else ""
            out[name] = (False, f"{status[len('failed: '):]} ({spec.transport}: {where}){said}")
    return out


# ------------------------------------------------------------------ per session
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
            hub = McpHub(servers, cwd=session.workspace, log_dir=session.paths.root,
                         trace=session.trace)
            _HUBS[session] = hub
            session.closers.append(hub.close)
            hub.start_all()
    return hub


__all__ = ["McpFault", "McpHub", "RemoteTool", "content_text", "fault_text", "hub_for",
           "probe_servers"]
