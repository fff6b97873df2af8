"""``simagent acp``'s stdio: the protocol on the real stdout, everything else on stderr.

The SDK's ``run_agent`` reads stdin and writes stdout as it finds them. Here stdout is
taken for the protocol alone first: its file descriptor is duplicated for the protocol
and fd 1 then points at stderr, so a stray ``print``, a library's banner or a child
process (kernel, MCP server, local model server) can never write into the JSON-RPC
stream. A line that is not a JSON object gets a JSON-RPC error (the SDK would log it and
say nothing to the client), and the agent stays up. When stdin closes or SIGTERM/SIGINT
arrives, running turns are cancelled and every session closed (``SimagentAgent.close``).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from typing import Any, NoReturn

from acp import RequestError, run_agent

from simagent.acp.agent import AcpOptions, SimagentAgent, say

#: The largest line the reader takes (an image pasted into a prompt is one line).
LINE_LIMIT = 50 * 1024 * 1024


class _OneLine(logging.Filter):
    """The SDK logs a traceback for each error a handler raises on purpose (an unknown
    session, a busy one); the client got the error, so stderr gets one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, RequestError):
            record.msg, record.args = f"answered with error {exc.code}: {exc}", ()
            record.exc_info, record.levelno, record.levelname = None, logging.INFO, "INFO"
        return True


class _Out(asyncio.streams.FlowControlMixin, asyncio.Protocol):
    """Write-side protocol for the protocol's pipe (``drain`` needs the mixin)."""


def _error_line(code: int, message: str, detail: str) -> bytes:
    return (json.dumps({"jsonrpc": "2.0", "id": None, "error": {
        "code": code, "message": message, "data": {"details": detail}}}) + "\n").encode()


async def _filter(source: asyncio.StreamReader, sink: asyncio.StreamReader,
                  out: asyncio.StreamWriter) -> None:
    """Pass JSON object lines on to the SDK; answer any other line with an error."""
    try:
        while True:
            try:
                line = await source.readuntil(b"\n")
            except asyncio.IncompleteReadError as exc:
                line = exc.partial
            except asyncio.LimitOverrunError:
                out.write(_error_line(-32600, "Invalid request", f"a line over {LINE_LIMIT} "
                                      "bytes was dropped"))
                while True:  # skip to the end of that line
                    chunk = await source.read(65536)
                    if not chunk or b"\n" in chunk:
                        break
                continue
            if not line:
                break
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError as exc:
                say(f"malformed JSON-RPC line ignored: {exc}")
                out.write(_error_line(-32700, "Parse error", f"not JSON: {exc}"))
                continue
            if not isinstance(message, dict):
                out.write(_error_line(-32600, "Invalid request",
                                      "a JSON-RPC message is a JSON object"))
                continue
            sink.feed_data(line if line.endswith(b"\n") else line + b"\n")
    finally:
        sink.feed_eof()


async def _streams() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    loop = asyncio.get_running_loop()
    protocol_fd = os.dup(1)
    os.dup2(2, 1)  # fd 1 is stderr from now on: only the protocol writes to protocol_fd
    sys.stdout = sys.stderr
    raw = asyncio.StreamReader(limit=LINE_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(raw), sys.stdin)
    transport, proto = await loop.connect_write_pipe(_Out, os.fdopen(protocol_fd, "wb", 0))
    writer = asyncio.StreamWriter(transport, proto, None, loop)
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    task = loop.create_task(_filter(raw, reader, writer))
    _keep.add(task)
    return reader, writer


_keep: set[asyncio.Task[Any]] = set()


async def _serve(agent: SimagentAgent) -> None:
    loop = asyncio.get_running_loop()
    reader, writer = await _streams()
    main = loop.create_task(run_agent(agent, writer, reader))
    signalled: list[int] = []

    def stop(sig: int) -> None:
        signalled.append(sig)
        main.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop, sig)
    with contextlib.suppress(asyncio.CancelledError):
        await main
    # the handlers stay: JupyterLab sends SIGINT then SIGTERM, and the second must not
    # end the process before its sessions are closed
    await _close_off_loop(agent, bool(signalled))


async def _close_off_loop(agent: SimagentAgent, signalled: bool) -> None:
    """Close on a thread, so the loop (and a turn's last sends) keep moving meanwhile."""
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def work() -> None:
        try:
            agent.close(signalled=signalled)
        finally:
            loop.call_soon_threadsafe(done.set)

    threading.Thread(target=work, name="simagent-acp-close", daemon=True).start()
    await done.wait()


def serve(opts: AcpOptions) -> NoReturn:
    """Serve one client on stdin/stdout until it goes, then exit 0.

    Every session is closed by then (``SimagentAgent.close``) and the exit handlers run;
    the interpreter's own teardown of the agent stack is skipped: it takes 1.5-2.5 s on
    a loaded machine, and a client waits about 2 s (the SDK's ``spawn_agent_process``)
    before it sends SIGTERM to an agent whose stdin it closed."""
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="simagent acp: %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_OneLine())
    asyncio.run(_serve(SimagentAgent(opts)))
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stderr.flush()
    os._exit(0)
