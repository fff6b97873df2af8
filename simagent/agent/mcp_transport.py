"""The transport side of simagent's MCP client (``agent.mcp_tools``): what a server fault
is, a stdio session whose stderr goes to a private, redacted log, and a watch on an HTTP
server's address.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import urllib.parse
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from simagent.paths import private_opener
from simagent.trace.redact import Redactor, StreamRedactor

# The SDK's client logs (a traceback per stray stdout line, HTTP session warnings) must not
# reach the terminal: the TUI owns it, and each fault is reported by simagent itself.
_SDK_LOG = logging.getLogger("mcp.client")
_SDK_LOG.addHandler(logging.NullHandler())
_SDK_LOG.propagate = False

#: Seconds between checks that an HTTP server's address still takes connections, while
#: one of its calls runs (see ``unless_gone``).
PROBE_S = 1.0
#: Seconds one connection attempt of that check may take.
PROBE_CONNECT_S = 10.0
#: Longest piece of a server's stderr read at once (a longer line comes in pieces; a key
#: split between two is still caught).
LOG_PIECE = 64 * 1024
#: Seconds closing a log waits for the last of a server's stderr.
LOG_DRAIN_S = 2.0


class McpFault(Exception):
    """A server-side failure: ``what`` is failed | died | timeout | malformed."""

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(detail)
        self.what = what
        self.detail = detail


class ServerLog:
    """``mcp-NAME.log``: a stdio server's stderr, created 0600 and redacted before any of
    it is written (a server may print its environment, a key included).

    The server writes into a pipe (:meth:`fileno`: what its process gets as stderr); a
    thread reads it in pieces of at most :data:`LOG_PIECE` (a line at a time) through a
    :class:`~simagent.trace.redact.StreamRedactor` into the file. simagent's own lines
    come through :meth:`write`. Kept open across restarts of the server.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "a", encoding="utf-8", opener=private_opener)  # noqa: SIM115 - closed by close()
        self._lock = threading.Lock()
        self._secrets = StreamRedactor(Redactor())  # the environment, as it is now
        read, self._write_end = os.pipe()
        self._reader = threading.Thread(target=self._pump, args=(read,), daemon=True,
                                        name=f"mcp-log-{path.stem}")
        self._reader.start()

    def fileno(self) -> int:
        return self._write_end

    def write(self, text: str) -> int:
        with self._lock, contextlib.suppress(OSError, ValueError):  # closed, or disk full
            self._file.write(self._secrets.redactor(text))
            self._file.flush()
        return len(text)

    def flush(self) -> None:
        pass  # every write is flushed

    def _pump(self, read: int) -> None:
        with open(read, "rb", buffering=0) as pipe:
            while piece := pipe.readline(LOG_PIECE):
                with self._lock, contextlib.suppress(OSError, ValueError):
                    self._file.write(self._secrets.feed(piece.decode("utf-8", "replace")))
                    self._file.flush()
        with self._lock, contextlib.suppress(OSError, ValueError):
            self._file.write(self._secrets.flush())

    def close(self) -> None:
        """Stop taking stderr and write what came (bounded: a server's child that keeps
        the pipe open is not waited for)."""
        with contextlib.suppress(OSError):
            os.close(self._write_end)
        self._reader.join(LOG_DRAIN_S)
        with self._lock, contextlib.suppress(OSError):
            self._file.close()


@contextlib.asynccontextmanager
async def stdio_session(params: StdioServerParameters, errlog: ServerLog,
                        noise: list[str]) -> Any:
    """A client session on a stdio server; its stderr goes to ``errlog``, and so does
    each stdout line that is not MCP (also kept in ``noise``: a start that times out
    names it). The SDK logs those lines with a traceback; that never reaches the
    terminal, which the TUI owns."""
    async def on_message(message: Any) -> None:
        if isinstance(message, Exception):
            errors = getattr(message, "errors", None)
            line = str(errors()[0].get("input", ""))[:200] if callable(errors) else why(message)
            noise.append(line)
            with contextlib.suppress(OSError, ValueError):
                errlog.write(f"[simagent] not an MCP message on stdout: {line!r}\n")
                errlog.flush()

    async with stdio_client(params, errlog=errlog) as (read, write), \
            ClientSession(read, write, message_handler=on_message) as session:
        yield session


def closed_error(exc: BaseException) -> bool:
    """Whether a failed call found the connection gone (the server died), not a bad answer."""
    return "closed" in str(exc).lower() or isinstance(exc, (
        anyio.ClosedResourceError, anyio.BrokenResourceError, BrokenPipeError, EOFError))


def why(exc: BaseException) -> str:
    """One line for an exception (the first leaf of an exception group)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


async def unless_gone(url: str, call: Any) -> Any:
    """``call``'s result, unless the HTTP server's address stops taking connections
    first. The SDK's streamable-HTTP client waits forever when the server dies during
    a call (the response stream just ends), so the address is probed while it runs."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)

    async def gone() -> str:
        while True:
            await asyncio.sleep(PROBE_S)
            try:
                _r, w = await asyncio.wait_for(asyncio.open_connection(host, port),
                                               PROBE_CONNECT_S)
            except TimeoutError:  # slow is not gone
                continue
            except OSError as exc:
                return f"its address {host}:{port} refuses connections ({why(exc)})"
            w.close()

    task, watch = asyncio.ensure_future(call), asyncio.ensure_future(gone())
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        raise McpFault("died", watch.result())
    finally:
        for t in (task, watch):
            t.cancel()
