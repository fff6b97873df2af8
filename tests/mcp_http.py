"""``simagent mcp --http`` for a test: started on a free loopback port, used once it
answers, stopped after (each wait bounded), with its stderr kept in a file the test names
when the server dies early."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import cli_fork
import httpx
from waiting import stopped

from simagent.mcp_server import ops

SIMAGENT = str(Path(sys.executable).parent / "simagent")
#: Bound on the server's start (a loaded machine; the kernel starts with the first session).
START_S = 240


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def serving(workspace: Path, log: Path, token: str, *args: str,
            env: Mapping[str, str] | None = None) -> Iterator[str]:
    """The URL of a running ``simagent mcp --http`` in ``workspace`` with bearer ``token``
    (``args``: more options), its stderr in ``log``; it answers HTTP when this yields."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    with open(log, "w") as err:
        server = cli_fork.popen(
            [SIMAGENT, "mcp", "--workspace", str(workspace), "--http", str(port), *args],
            env={**(os.environ if env is None else env), ops.TOKEN_ENV: token},
            stdout=subprocess.DEVNULL, stderr=err)
        try:
            deadline = time.monotonic() + START_S
            while True:
                try:
                    httpx.get(url, timeout=5)
                    break
                except httpx.ConnectError:
                    assert server.poll() is None, log.read_text()
                    assert time.monotonic() < deadline, f"no answer in {START_S} s"
                    time.sleep(0.2)
            yield url
        finally:
            stopped(server)
