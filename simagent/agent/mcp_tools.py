"""MCP servers' tools inside simagent (issue 28, part 2): ``[mcp.servers.NAME]`` in config.

``McpHub`` owns one asyncio loop on its own thread and one held-open client session per
server (a stdio process or a streamable-HTTP connection): langchain-mcp-adapters'
``get_tools()`` would start a server per call, and its tools are async only. The session
owns the hub (``Session.closers``; ``agent.mcp_hubs`` makes it, and imports this module,
with the MCP SDK, only for a session whose config names a server): servers start with its
first agent build and stop when it closes; none is left behind.

A server's tools become langchain tools named ``NAME__tool`` (shown as ``NAME.tool``;
``context.deferral_policy`` says why), so they pass the built-in ones' layers: cap,
eviction, clearing, ledger, approval (an external action: it waits in ``ask`` and
``workspace``). A server that cannot start, dies mid-call, hangs past ``timeout_s`` or
answers with no tool result gives the model one readable error, the person a notice and
the trace an event; the next call starts it afresh. ``isError`` results are tool errors.

A server down at open is said once (:meth:`McpHub.start_notices`), retried when a turn
begins and waited for by ``find_tools``; its tools then join the catalog, which
``agent.tool_deferral`` serves to the running graph. Progress reaches the tool card
(``tool_output``); results are ``agent.mcp_results`` blocks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import queue
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.tools import StructuredTool, ToolException
from langchain_mcp_adapters.sessions import create_session
from langchain_mcp_adapters.tools import load_mcp_tools
from mcp import ClientSession, StdioServerParameters
from mcp import types as mcp_types

from simagent.agent import mcp_results
from simagent.agent.mcp_transport import McpFault, ServerLog, stdio_session, unless_gone
from simagent.agent.mcp_transport import closed_error as _closed
from simagent.agent.mcp_transport import why as _why
from simagent.config import McpServer
from simagent.context.deferral_policy import exposed_name
from simagent.context.reporting import write_stream
from simagent.paths import private_dir

if TYPE_CHECKING:
    from simagent.trace.log import TraceLog

#: Seconds closing one server may take (the SDK's stdio client then kills it).
STOP_TIMEOUT_S = 10.0

#: Seconds between checks, while a call runs, that the person has not cancelled it.
CANCEL_POLL_S = 0.2

#: (tool call id, stream writer) of the MCP call running in this context: set through
#: :meth:`McpHub.progress_to` by ``ToolDeferral.wrap_tool_call`` so a call's progress
#: reaches its tool card.
CALL_CONTEXT: contextvars.ContextVar[tuple[str, Callable[[Any], None]] | None] = \
    contextvars.ContextVar("simagent_mcp_call", default=None)


@dataclass(frozen=True)
class RemoteTool:
    """One tool of one server, as listed at start."""

    server: str
    remote: str  # the server's own name for it
    name: str  # what the model calls
    description: str
    schema: dict[str, Any]


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
                 trace: TraceLog | None = None, artifacts: Path | None = None) -> None:
        self.servers = dict(servers)
        self.cwd = cwd
        self.log_dir = log_dir
        self.trace = trace
        self.artifacts = artifacts or log_dir / "artifacts"  # where result images go
        self._retry: concurrent.futures.Future[Any] | None = None
        #: set when the person cancels the turn (``Session.cancel_requested``)
        self.cancel: threading.Event | None = None
        self.catalog: dict[str, RemoteTool] = {}  # by the name the model calls
        self.status: dict[str, str] = {}  # server -> ok | failed: <why>
        self._conns: dict[str, _Conn] = {}
        self._locks: dict[str, asyncio.Lock] = {}  # used on the loop only
        self._logs: dict[str, ServerLog] = {}
        self._noise: dict[str, list[str]] = {}  # per server: stdout lines that were not MCP
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
        start is noted (``status``, the trace; the front end says it at open, from
        :meth:`start_notices`) and is retried later (:meth:`retry_failed`)."""
        self._run(self._start(list(self.servers), first=True), self._start_bound())

    def _start_bound(self) -> float:
        """Seconds a start of any of the servers may take, its stop after a timeout included."""
        return max((s.start_timeout_s for s in self.servers.values()), default=0.0) \
            + STOP_TIMEOUT_S + 5

    async def _start(self, names: list[str], *, first: bool) -> list[str]:
        """Start ``names``; admit the tools of each that started; the names that did."""
        results = await asyncio.gather(*(self._ensure(n) for n in names),
                                       return_exceptions=True)
        up = []
        for name, res in zip(names, results, strict=True):
            if isinstance(res, BaseException):
                fault = res if isinstance(res, McpFault) else McpFault("failed", _why(res))
                self.status[name] = f"failed: {fault.detail}"
                if first:
                    self._note(name, "failed", self.failed_line(name), detail=fault.detail,
                               stream=False)
                continue
            self.status[name] = "ok"
            tools = {}
            for remote, tool in res.tools.items():
                rt = RemoteTool(name, remote, exposed_name(name, remote),
                                tool.description or "", _schema(tool))
                tools[rt.name] = rt
            self.catalog = {**self.catalog, **tools}  # replaced whole: read by other threads
            up.append(name)
            self._note(name, "started", "" if first else (
                f"MCP server {name!r} started on a retry: its {len(tools)} tools are "
                f"available now"), tools=len(tools))
        return up

    def failed_line(self, name: str) -> str:
        """One line for a server that could not start: why, what happens next, its log."""
        why = self.status.get(name, "").removeprefix("failed: ")
        log = self.log_dir / f"mcp-{name}.log"
        said = f"; its log: {log}" if log.is_file() and log.stat().st_size else ""
        if "/" in (cmd := self.servers[name].command or "") and not Path(cmd).is_absolute():
            why += f"; a relative command is run from the workspace, {self.cwd}"
        return (f"MCP server {name!r} could not be started ({why}); its tools are missing "
                f"until it starts: it is tried again at each turn and at find_tools{said}")

    def start_notices(self) -> list[str]:
        """What a front end tells the person at open: one line per server that failed."""
        return [self.failed_line(n) for n in self.failed()]

    def failed(self) -> list[str]:  # servers down (retried)
        return [n for n, s in self.status.items() if s != "ok"]

    def retry_failed(self, *, wait: bool) -> list[str]:
        """Retry each failed server, one retry at a time: with ``wait``, the names that came up."""
        if self.closed or not self.failed():
            return []
        fut, joined = self._retry_future()
        came = self._wait_retry(fut) if wait else []
        if wait and joined and self.failed():  # the joined one may predate the fix: once more
            came += self._wait_retry(self._retry_future()[0])
        return came

    def _retry_future(self) -> tuple[Any, bool]:
        with self._lock:  # (the retry in flight, True), else (a new one, False)
            if self._retry is not None and not self._retry.done():
                return self._retry, True
            self._retry = asyncio.run_coroutine_threadsafe(
                self._start(self.failed(), first=False), self._loop)
            return self._retry, False

    def _wait_retry(self, fut: Any) -> list[str]:
        with contextlib.suppress(Exception):  # a failed retry leaves the status as it was
            return list(fut.result(self._start_bound()))
        return []

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
        for log in self._logs.values():
            log.close()

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
                private_dir(self.log_dir)
                log = self._logs[name] = ServerLog(self.log_dir / f"mcp-{name}.log")
            params = StdioServerParameters(command=spec.command, args=list(spec.args),
                                           env=dict(spec.env) or None, cwd=str(self.cwd))
            return stdio_session(params, log, self._noise.setdefault(name, []))
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
        ready.add_done_callback(lambda f: f.cancelled() or f.exception())  # seen: no warning
        noise = self._noise[name] = []

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
        wait = self.servers[name].start_timeout_s
        try:
            await asyncio.wait_for(asyncio.shield(ready), wait)
        except TimeoutError:
            await self._stop(name)
            said = f"; it wrote this on stdout, which is not MCP: {noise[0]!r}" if noise else ""
            raise McpFault("failed", f"no answer within {wait:g} s{said}") from None
        except McpFault:
            await self._stop(name)
            raise
        return conn

    async def _stop(self, name: str) -> None:
        conn = self._conns.pop(name, None)
        if conn is None or conn.task is None:
            return
        conn.stop.set()
        if conn.session is not None:  # held open: it closes on ``stop``, in its own task
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(conn.task), STOP_TIMEOUT_S)
        if not conn.task.done():  # still starting (no answer: it never sees ``stop``) or stuck
            conn.task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(conn.task, STOP_TIMEOUT_S)

    # ------------------------------------------------------------------ calls
    async def _call(self, server: str, remote: str, args: dict[str, Any],
                    progress: Callable[[str], None] | None = None
                    ) -> tuple[list[dict[str, Any]], bool]:
        """(blocks, is_error) of one call; ``progress`` gets one line per progress
        notification; raises ``McpFault`` for a server fault."""
        timeout = self.servers[server].timeout_s
        conn = await self._ensure(server)
        if remote not in conn.tools or conn.session is None:
            return ([{"type": "text", "text": f"MCP server {server!r} no longer offers the "
                      f"tool {remote!r} (it was listed when the server started)"}], True)

        async def on_progress(done: float, total: float | None, message: str | None) -> None:
            if progress is not None:
                progress(mcp_results.progress_line(done, total, message))

        # the id the SDK gives this request (read with no await before it is sent), to
        # tell the server when the person cancels: the SDK does not
        rid = getattr(conn.session, "_request_id", None)
        calling = conn.session.call_tool(remote, args, progress_callback=on_progress)
        url = self.servers[server].url
        try:
            result = await asyncio.wait_for(
                unless_gone(url, calling) if url else calling, timeout)
        except asyncio.CancelledError:  # the person cancelled (``call``)
            if isinstance(rid, int):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conn.session.send_notification(
                        mcp_types.ClientNotification(mcp_types.CancelledNotification(
                            params=mcp_types.CancelledNotificationParams(
                                requestId=rid, reason="cancelled by the person")))),
                        STOP_TIMEOUT_S)
            raise
        except TimeoutError:
            await self._stop(server)
            raise McpFault("timeout", f"{timeout:g} s") from None
        except McpFault:
            await self._stop(server)
            raise
        except Exception as exc:
            died = conn.task is None or conn.task.done() or _closed(exc)
            await self._stop(server)
            raise McpFault("died" if died else "malformed", _why(exc)) from None
        return mcp_results.blocks_of(result.content), bool(result.isError)

    def call(self, name: str, args: dict[str, Any]) -> list[dict[str, Any]]:
        """Run the tool the model knows as ``name``: its result blocks; any failure is a
        ``ToolException`` whose text the model reads (the tool node makes it an error
        result). Progress goes to the running call's card (:data:`CALL_CONTEXT`)."""
        rt = self.catalog[name]
        spec = self.servers[rt.server]
        timeout = spec.timeout_s
        if self.closed:
            raise ToolException(f"the MCP servers of this session are stopped; "
                                f"{rt.server}.{rt.remote} cannot run")
        running = CALL_CONTEXT.get()
        lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        try:
            fut = asyncio.run_coroutine_threadsafe(
                self._call(rt.server, rt.remote, args, lines.put if running else None),
                self._loop)
            fut.add_done_callback(lambda _f: lines.put(None))
            # progress is written from this (the tool's) thread: the graph's stream
            # writer works only in the graph's context, not on the hub's loop
            deadline = time.monotonic() + spec.start_timeout_s + timeout + 3 * STOP_TIMEOUT_S
            while True:
                try:
                    line = lines.get(timeout=min(CANCEL_POLL_S,
                                                 max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    if self.cancel is not None and self.cancel.is_set():
                        fut.cancel()
                        raise ToolException(
                            f"cancelled: simagent stopped waiting for {rt.server}."
                            f"{rt.remote} and asked the server to cancel it (a server may "
                            "finish the work anyway)") from None
                    if time.monotonic() >= deadline:
                        raise
                    continue
                if line is None:
                    break
                if running is not None:  # a bar redrawn in place, as tqdm's is
                    call_id, write = running
                    with contextlib.suppress(Exception):
                        write({"type": "tool_output", "tool_call_id": call_id,
                               "kind": "stderr", "text": "\r" + line, "path": None})
            blocks, is_error = fut.result(0)  # done: its result or its McpFault
        except (McpFault, queue.Empty) as exc:  # Empty: the hub's own bounds all failed
            fault = exc if isinstance(exc, McpFault) else McpFault("timeout", f"{timeout:g} s")
            msg = fault_text(rt.server, rt.remote, fault, timeout)
            self._note(rt.server, fault.what, msg, detail=fault.detail, tool=rt.remote)
            raise ToolException(msg) from None
        if is_error:
            raise ToolException(mcp_results.text_of(blocks)
                                or f"{rt.server}.{rt.remote} reported an error")
        return blocks

    @contextlib.contextmanager
    def progress_to(self, call_id: str, write: Callable[[Any], None]) -> Iterator[None]:
        """While a tool call runs in this context, its MCP progress goes to ``write`` as
        that call's ``tool_output`` (:data:`CALL_CONTEXT`)."""
        token = CALL_CONTEXT.set((call_id, write))
        try:
            yield
        finally:
            CALL_CONTEXT.reset(token)

    # ------------------------------------------------------------------ notices
    def _note(self, server: str, what: str, notice: str, *, stream: bool = True,
              **extra: Any) -> None:
        payload = {"server": server, "what": what, "notice": notice, **extra}
        if self.trace is not None:
            with contextlib.suppress(Exception):  # a closed trace must not break a call
                self.trace.append("mcp_server", payload)
        if notice and stream:
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
    def tools(self, images: bool = False, why: str = "") -> list[StructuredTool]:
        """The catalog as langchain tools; ``images``: whether this agent's model takes
        images in tool results (``why``: the reason when not)."""
        return [self.tool(n, images, why) for n in self.catalog]

    def tool(self, name: str, images: bool = False, why: str = "") -> StructuredTool:
        return _tool(self, self.catalog[name], images, why)


def _tool(hub: McpHub, rt: RemoteTool, images: bool, why: str) -> StructuredTool:
    source = f"{rt.server}.{rt.remote}"

    def run(**kwargs: Any) -> str | list[dict[str, Any]]:
        return mcp_results.for_model(hub.call(rt.name, kwargs), images=images, why=why,
                                     folder=hub.artifacts, source=source)

    async def arun(**kwargs: Any) -> str | list[dict[str, Any]]:
        return await asyncio.to_thread(run, **kwargs)  # the context (CALL_CONTEXT) goes along

    return StructuredTool(name=rt.name, description=rt.description or rt.remote,
                          args_schema=rt.schema, func=run, coroutine=arun,
                          handle_tool_error=True, metadata={"mcp_server": rt.server})


def _schema(tool: Any) -> dict[str, Any]:
    schema = tool.args_schema
    if isinstance(schema, dict):
        return schema
    return schema.model_json_schema() if schema is not None else {"type": "object"}


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


__all__ = ["CALL_CONTEXT", "McpFault", "McpHub", "RemoteTool", "fault_text", "probe_servers"]
