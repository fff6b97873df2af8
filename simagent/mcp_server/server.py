"""``simagent mcp``: the kernel as an MCP server (FastMCP, ``mcp<2``), over stdio or HTTP.

The shell around :class:`~simagent.mcp_server.service.KernelService`:

* **One kernel per client session.** The server's lifespan opens one simagent session
  (trace, state folder, kernel started at the first cell) and closes it when the client
  goes. The SDK enters the lifespan once per ``Server.run``: once for stdio (the
  process is the session) and once per MCP session over streamable HTTP, so two HTTP
  clients get two kernels, and a client that ends its MCP session stops its kernel.
* **Nothing blocks the event loop.** Every tool body runs in a worker thread
  (``anyio.to_thread``); progress and cancellation stay live while a cell runs.
* **Progress.** The kernel's streamed output, reduced to the line a terminal shows last
  (``ops.progress_line``), goes out as MCP progress notifications when the host asked
  for them (a ``progressToken``), the newest line only when several queue up.
* **Cancellation.** A cancelled ``run_python`` interrupts its cell (SIGINT; state kept,
  the recovery ladder escalates for a cell that ignores it); the cell's end is still
  traced by the worker thread, which finishes on its own.
* **stdout is the protocol** on stdio: :func:`serve_stdio` moves file descriptor 1 to
  stderr before anything runs, so a stray ``print`` (or a C library's write) in this
  process cannot corrupt a response; the protocol writes to a private duplicate.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from io import TextIOWrapper
from typing import Any

import anyio
import uvicorn
from mcp.server.fastmcp import Context, FastMCP, Image
from mcp.server.fastmcp.exceptions import ResourceError, ToolError
from mcp.server.lowlevel.helper_types import ReadResourceContents
from mcp.server.stdio import stdio_server
from mcp.types import CallToolResult, TextContent
from pydantic import ValidationError

from simagent import __version__
from simagent.agent.tools import DEFAULT_RUN_TIMEOUT_S
from simagent.mcp_server import ops
from simagent.mcp_server.ops import McpToolError
from simagent.mcp_server.service import KernelService
from simagent.session import Session
from simagent.trace.redact import redact

INSTRUCTIONS = (
    "A persistent IPython kernel managed by simagent (working directory: the workspace). "
    "run_python returns capped output with a pointer to the full raw output; query that "
    "with output(n, op) instead of printing it again. state() lists what the kernel holds."
)


def _service(ctx: Context) -> KernelService:
    return ctx.request_context.lifespan_context


def _call_id(ctx: Context) -> str:
    return f"mcp-{ctx.request_id}"


def _tool_error(text: str) -> ToolError:
    """The error a host's model reads. The SDK already heads it ``Error executing tool
    NAME:``, so the service's own ``NAME:`` head is dropped (it would read twice)."""
    head, _, rest = text.partition(": ")
    return ToolError(rest if head in ops.TOOLS and rest else text)


async def _in_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` in a worker thread; a :class:`McpToolError` becomes the tool's error."""
    try:
        return await anyio.to_thread.run_sync(fn)
    except McpToolError as exc:
        raise _tool_error(str(exc)) from None


class _Server(FastMCP):
    """FastMCP that also traces the calls it refuses before a tool body runs, and says
    what was wrong with an argument in one line."""

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        try:
            return await super().call_tool(name, arguments)
        except Exception as exc:  # unknown tool, bad arguments (or a body's own error)
            error: Exception = exc
            tool = self._tool_manager.get_tool(name)
            if isinstance(exc.__cause__, ValidationError) and tool is not None:
                error = ToolError(f"Error executing tool {name}: "  # the SDK's own head
                                  f"{ops.argument_error(exc.__cause__.errors(), tool.parameters)}")
            ctx = self.get_context()
            await anyio.to_thread.run_sync(_service(ctx).note_rejected, _call_id(ctx), name,
                                           arguments, str(error))
            if error is exc:
                raise
            raise error from None

    async def list_resource_templates(self) -> list[Any]:
        """As FastMCP's, but the figure template names no one MIME type: figures are
        PNG, JPEG or SVG, and each read says which (:meth:`read_resource`)."""
        return [t.model_copy(update={"mimeType": None}) if t.uriTemplate == ops.FIGURE_URI
                else t for t in await super().list_resource_templates()]

    async def read_resource(self, uri: Any) -> Iterable[ReadResourceContents]:
        """As FastMCP's (which labels every read with the template's one MIME type), but
        a figure is labelled by what its bytes are, and a read that cannot be done says
        why once (the SDK wraps it twice in "Error creating resource from template")."""
        try:
            contents = list(await super().read_resource(uri))
        except Exception as exc:
            why = _reason(exc)
            if why is None:
                raise
            raise ResourceError(f"{uri}: {why}") from None
        if not str(uri).startswith(ops.FIGURE_URI.split("{", 1)[0]):
            return contents
        return [ReadResourceContents(c.content, ops.image_mime(c.content), c.meta)
                if isinstance(c.content, bytes) else c for c in contents]


def _reason(exc: BaseException | None) -> str | None:
    """Our own message in an exception's chain (a tool error or a refused call), if any."""
    while exc is not None:
        if isinstance(exc, (McpToolError, ToolError)):
            return str(exc)
        exc = exc.__cause__ or exc.__context__
    return None


def build_server(open_session: Callable[[], Session], *, host: str = ops.DEFAULT_HOST,
                 port: int = 8765) -> FastMCP:
    """The FastMCP server; ``open_session`` makes each client's session (in a thread)."""
    mcp = _Server(ops.SERVER_NAME, instructions=INSTRUCTIONS, lifespan=_lifespan(open_session),
                  log_level="WARNING", host=host, port=port)
    # initialize's serverInfo.version: FastMCP takes none and the SDK then says its own
    mcp._mcp_server.version = __version__

    def tool(fn: Callable[..., Any]) -> Callable[..., Any]:
        """Register ``fn``: its docstring on one line is the description (indentation
        would cost the host's model tokens on every request), plain text results."""
        text = " ".join((fn.__doc__ or "").split())
        return mcp.tool(description=text.format(timeout_s=f"{DEFAULT_RUN_TIMEOUT_S:g}"),
                        structured_output=False)(fn)

    @tool
    async def run_python(code: str, ctx: Context,
                         timeout_s: float | None = None) -> CallToolResult:
        """Run Python in the session's persistent kernel (cwd: the workspace); variables
        persist. Returns stdout/stderr as a terminal shows them (progress bars collapsed),
        `Out[n]`, figures with data summaries and errors; long output is capped to head,
        digest and tail with the raw file's path and its `_out[n]` number. Past
        `timeout_s` (default {timeout_s}) the cell is interrupted; state is kept."""
        text, completed = await _run_streamed(_service(ctx), _call_id(ctx), code, timeout_s,
                                              ctx)
        return CallToolResult(content=[TextContent(type="text", text=text)],
                              isError=not completed)

    @tool
    async def output(n: int, op: str, ctx: Context, arg: str | None = None) -> str:
        """Read execution n's full raw output without running code: op `head`/`tail`
        (arg: lines, default 20), `grep` (arg: regex), `slice` (arg: `START:END`, 1-based).
        n is the `_out[n]` number; -1 is the latest, -2 the one before."""
        service, call_id = _service(ctx), _call_id(ctx)
        return await _in_thread(lambda: service.output(call_id, n, op, arg))

    @tool
    async def state(ctx: Context) -> str:
        """The kernel state card: names with type and shape, imports, functions, figures,
        files written, read from the live kernel now."""
        service, call_id = _service(ctx), _call_id(ctx)
        return await _in_thread(lambda: service.state(call_id))

    @tool
    async def figure(n: str | int, ctx: Context) -> list[Any]:
        """A figure as an image with its data summary: n is a `fig-<hash>` id from a
        run_python result, or a number (1 = first, -1 = newest). Use the summary in the
        run_python text first; images cost many tokens."""
        service, call_id = _service(ctx), _call_id(ctx)
        text, blob, mime = await _in_thread(lambda: service.figure(call_id, n))
        if blob is None or mime is None:
            return [text]
        return [text, Image(data=blob, format=mime.split("/", 1)[1])]

    @tool
    async def interrupt(ctx: Context) -> str:
        """Interrupt the running cell (KeyboardInterrupt); variables are kept."""
        service, call_id = _service(ctx), _call_id(ctx)
        return await _in_thread(lambda: service.interrupt(call_id))

    @tool
    async def restore(ctx: Context) -> str:
        """Restart the kernel and replay the cells that defined its state (since the
        last reset); says what was replayed and what was not."""
        service, call_id = _service(ctx), _call_id(ctx)
        return await _in_thread(lambda: service.restore(call_id))

    @tool
    async def reset(ctx: Context) -> str:
        """Restart the kernel with nothing in it (every variable and import is lost)."""
        service, call_id = _service(ctx), _call_id(ctx)
        return await _in_thread(lambda: service.reset(call_id))

    _add_resources(mcp)
    return mcp


async def _run_streamed(service: KernelService, call_id: str, code: str,
                        timeout_s: float | None, ctx: Context) -> tuple[str, bool]:
    """``run_python`` in a worker thread (its text, and whether the cell completed), its
    output's progress lines sent to the host as progress notifications (the newest only,
    when they come faster than they go), and a cancel from the host passed to the kernel
    as an interrupt."""
    send, receive = anyio.create_memory_object_stream[str](max_buffer_size=64)

    def on_output(event: Any) -> None:  # the kernel's thread
        line = ops.progress_line(getattr(event, "text", None) or "")
        if line:
            try:
                anyio.from_thread.run_sync(send.send_nowait, redact(line))
            except Exception:  # full (dropped: a newer line follows) or closed
                pass

    async def pump() -> None:
        count = 0
        async with receive:
            async for line in receive:
                count += 1
                while True:  # only the newest of the lines that queued up
                    try:
                        line = receive.receive_nowait()
                        count += 1
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                await ctx.report_progress(count, None, message=line)

    def work() -> tuple[str, bool]:
        return service.run_python(call_id, code, timeout_s, on_output)

    reply, error = ("", False), None
    async with anyio.create_task_group() as tg:
        tg.start_soon(pump)
        try:
            reply = await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(service.cancel, call_id)
            raise
        except McpToolError as exc:
            error = str(exc)  # raised outside the group: not wrapped in an ExceptionGroup
        finally:
            send.close()
    if error is not None:
        raise _tool_error(error)
    return reply


def _add_resources(mcp: FastMCP) -> None:
    """The raw outputs, in pages (``ops.page_of`` says why), and saved figures, whole."""

    @mcp.resource(ops.OUTPUT_URI, mime_type="text/plain",
                  description=f"Execution n's raw output, uncapped: its first "
                              f"{ops.PAGE_BYTES // 1024} KB page; a longer one ends with a "
                              f"line naming the next page's URI")
    async def raw_output(n: str, ctx: Context) -> str:
        service, number = _service(ctx), ops.uri_number(n, "n")
        return await _in_thread(lambda: service.raw_output(number))

    @mcp.resource(ops.OUTPUT_PAGE_URI, mime_type="text/plain",
                  description=f"Page `page` (1-based, {ops.PAGE_BYTES // 1024} KB at most) "
                              f"of execution n's raw output; the pages join into the file")
    async def raw_output_page(n: str, page: str, ctx: Context) -> str:
        service = _service(ctx)
        number, page_no = ops.uri_number(n, "n"), ops.uri_number(page, "page")
        return await _in_thread(lambda: service.raw_output(number, page_no))

    @mcp.resource(ops.FIGURE_URI, mime_type="image/png",  # replaced per file: read_resource
                  description="A saved figure's image file (PNG, JPEG or SVG)")
    async def figure_file(figure_id: str, ctx: Context) -> bytes:
        service = _service(ctx)
        return await _in_thread(lambda: service.figure_file(figure_id))


def _lifespan(open_session: Callable[[], Session]) -> Callable[[FastMCP], Any]:
    """Each client's KernelService: its session opened in a thread, its kernel stopped
    when the client goes."""

    @asynccontextmanager
    async def lifespan(_app: FastMCP) -> AsyncIterator[KernelService]:
        service = KernelService(await anyio.to_thread.run_sync(open_session))
        try:
            yield service
        finally:
            with anyio.CancelScope(shield=True):  # stop the kernel even when cancelled
                await anyio.to_thread.run_sync(service.close)

    return lifespan


def serve_stdio(mcp: FastMCP) -> None:
    """Serve one client on stdin/stdout, with fd 1 moved to stderr first (module doc).

    SIGINT or SIGTERM (a host or a person stopping the server) ends the session as a
    client leaving does: the running cell is interrupted and traced, the kernel shut
    down. The process then exits at once with 128 + the signal: the SDK's stdin reader
    is a thread blocked in ``read`` that only the host closing stdin would end.
    """
    sys.stdout.flush()
    protocol = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything else written to fd 1 now lands in stderr
    sys.stdout = sys.stderr
    out = anyio.wrap_file(TextIOWrapper(protocol, encoding="utf-8"))
    stopped_by: list[int] = []

    async def stop_on_signal(scope: anyio.CancelScope) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                stopped_by.append(signum)
                print(f"simagent mcp: {signal.Signals(signum).name}: stopping the kernel "
                      f"and closing the session", file=sys.stderr, flush=True)
                scope.cancel()
                return

    async def run() -> None:
        async with stdio_server(stdout=out) as (read, write):
            async with anyio.create_task_group() as tg:
                tg.start_soon(stop_on_signal, tg.cancel_scope)
                server = mcp._mcp_server  # FastMCP.run_stdio_async, with our stdout (mcp<2)
                await server.run(read, write, server.create_initialization_options())
                tg.cancel_scope.cancel()
            if stopped_by:  # the session is closed; leaving stdio_server would wait for stdin
                sys.stderr.flush()
                os._exit(128 + stopped_by[0])

    anyio.run(run)


def listen(host: str, port: int) -> Any:
    """A socket bound and listening on HOST:PORT now, so that a port in use or a host
    that is not this machine's fails before the address and token are announced
    (raises ``OSError``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family)


def require_bearer(app: Any, token: str) -> Any:
    """ASGI wrapper: an HTTP request without ``Authorization: Bearer <token>`` gets 401
    and never reaches the server (the lifespan scope passes through)."""
    async def wrapped(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not ops.bearer_ok(
                dict(scope.get("headers") or []).get(b"authorization"), token):
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"www-authenticate", b"Bearer"),
                                    (b"content-type", b"application/json")]})
            await send({"type": "http.response.body",
                        "body": b'{"error": "unauthorized: send Authorization: Bearer <token>"}'})
            return
        await app(scope, receive, send)

    return wrapped


def serve_http(mcp: FastMCP, sock: Any, token: str) -> None:
    """Serve streamable HTTP at ``/mcp`` on ``sock`` (:func:`listen`) behind the token.

    uvicorn catches SIGINT and SIGTERM, shuts down, then restores the handlers it found
    and raises the signal again, so the exit status comes from those handlers. One
    inherited as ignored (a background job of a script, some test runners) would make
    a ctrl+C'ed server exit 0: the defaults go in first (KeyboardInterrupt, 130)."""
    logging.getLogger("mcp.server.streamable_http").addFilter(_closed_stream_noise)
    app = require_bearer(mcp.streamable_http_app(), token)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


def _closed_stream_noise(record: Any) -> bool:
    """Drop the SDK's ``Error in standalone SSE writer`` traceback that every client
    leaving logs (a stream closed under it, not an error); keep every other record."""
    exc = record.exc_info[1] if record.exc_info else None
    return not isinstance(exc, anyio.ClosedResourceError)
