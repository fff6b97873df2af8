"""The supervised llama.cpp server behind a ``local:`` model.

One child process per resolved model, on a free loopback port. It never outlives
simagent: :meth:`LlamaServer.stop` ends it (``ResolvedModel.close`` and an ``atexit``
hook call it), and the child itself exits when its stdin, whose write end only simagent
holds, reaches end-of-file, which the OS does when simagent dies in any way. Its output
goes to a log file in the state home's logs, moved into the session's folder once a session
uses the model (:meth:`LlamaServer.move_log`); a start that fails shows that log's last
lines.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simagent.exit_codes import PROVIDER, USAGE
from simagent.local_model.serve import LOG_START, STOP_PATH
from simagent.models import ModelError, say_progress
from simagent.paths import private_dir, private_opener

HOST = "127.0.0.1"
#: How long a server may take to load its model and answer (seconds); a 1.5B model
#: loads in a few seconds on 2 cores, a busy machine takes longer.
READY_TIMEOUT_S = 180.0
#: How long a stopped server may take to exit before it is killed (seconds).
STOP_TIMEOUT_S = 10.0
#: Starts retried when another process took the chosen free port first.
PORT_TRIES = 3
#: Lines of the server's log shown when it fails to start.
LOG_TAIL = 4
POLL_S = 0.2
#: How long asking the server to stop a reply may take (seconds): it answers at once
#: (the stop is a flag its decode reads), so longer means it is gone or wedged.
STOP_REPLY_S = 2.0
#: How many times a session's server is started again after it stopped by itself (killed,
#: crashed); past that a turn ends with the reason and the log instead of a fourth start.
MAX_RESTARTS = 3
#: glibc's allocator for the server: a fixed mmap threshold gives every buffer of 1 MiB or
#: more (prompt-cache states, tens of MiB each) its own mapping, returned to the system
#: when the cache drops it; glibc's default raises the threshold as buffers are freed, and
#: then the states land in heaps that never shrink. Measured on the packaged 0.5B model,
#: 25 requests of a growing conversation (to 8k, the cache full): RSS 1.91 vs 2.05 GiB,
#: peak 2.18 vs 2.32 GiB, this setting (with two arenas) against the default.
SERVER_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20), "MALLOC_ARENA_MAX": "2"}
_ERROR_LINE = re.compile(r"^\w*(Error|Exception)\b|error|failed", re.IGNORECASE)

_LIVE: set[LlamaServer] = set()
_LIVE_LOCK = threading.Lock()


@dataclass(eq=False)
class LlamaServer:
    proc: subprocess.Popen[bytes]
    port: int
    alias: str
    log_path: Path
    props: dict[str, Any] = field(default_factory=dict)
    #: The command that started it: a restart runs it again, on the same port, so the
    #: chat client's URL stays right.
    argv: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        """End the server (idempotent): terminate, then kill after STOP_TIMEOUT_S."""
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT_S)
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()

    def death(self) -> str | None:
        """Why the server is gone, in words (None: it runs); reaps the process, so a dead
        server is no zombie while the session goes on."""
        code = self.proc.poll()
        if code is None:
            return None
        if code >= 0:
            return f"it exited with code {code}"
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        if -code == signal.SIGKILL:  # the kernel's OOM killer says so only in its own log
            return (f"it was killed by {name}, which is what the kernel's out-of-memory "
                    "killer sends")
        return f"it was killed by {name}"

    def stop_reply(self, timeout: float = STOP_REPLY_S) -> bool:
        """Stop the reply the server is computing (a cancelled turn's) within one step of
        llama.cpp's graph (``serve.stoppable``), so the next request does not wait behind
        it. False when the server did not take the stop (gone, or busy past ``timeout``)."""
        request = urllib.request.Request(f"http://{HOST}:{self.port}{STOP_PATH}", data=b"",
                                         method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                return reply.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def restart(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Start the same command again on the same port and wait until it answers;
        ``ModelError`` (nothing left running) when it does not come back."""
        self.stop()
        self.proc = _launch(self.argv, self.log_path, "restarting: ")
        with _LIVE_LOCK:
            _LIVE.add(self)
        try:
            _wait_ready(self, timeout)
        except BaseException:
            self.stop()
            raise

    def move_log(self, folder: Path) -> Path:
        """Keep the log in ``folder`` (the session's, once one is open): renamed, so the
        server, which writes to the open file, goes on writing to it there. Across
        filesystems it stays where it is; returns where it is."""
        target = folder / self.log_path.name
        try:
            private_dir(folder)
            os.replace(self.log_path, target)
        except OSError:
            return self.log_path
        self.log_path = target
        return target


class ServerWatch:
    """Brings a ``local:`` model's server back when it stopped by itself, at most
    :data:`MAX_RESTARTS` times a session.

    Called by the provider-retry layer when a model call could not connect: a server
    that still runs is not this watch's business (None: the usual retries decide); a dead
    one is started again on its port and the returned line, a notice for the person,
    says why it had stopped and where its log is. The conversation and the kernel are
    untouched: only the model server restarts. Thread-safe (subagents call in parallel).
    """

    def __init__(self, server: LlamaServer, name: str) -> None:
        self.server, self.name = server, name
        self.restarts = 0
        self._lock = threading.Lock()

    def __call__(self) -> str | None:
        with self._lock:
            why = self.server.death()
            if why is None:
                return None
            log = self.server.log_path
            if self.restarts >= MAX_RESTARTS:
                raise ModelError(
                    f"llama.cpp's server for {self.name} stopped again ({why}) after "
                    f"{self.restarts} restarts this session; simagent will not start it "
                    f"again: its log {log} ends: {log_tail(log)}", code=PROVIDER)
            self.restarts += 1
            started = time.monotonic()
            self.server.restart()
            return (f"llama.cpp's server for {self.name} had stopped ({why}); restarted "
                    f"it in {time.monotonic() - started:.1f} s ({self.restarts} of "
                    f"{MAX_RESTARTS} restarts this session), the conversation and the "
                    f"kernel untouched; its log: {log}")


def _stop_all() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for server in live:
        server.stop()


atexit.register(_stop_all)


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return True
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, lines: int = LOG_TAIL) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    kept = [line.strip() for line in text if line.strip()]
    # llama.cpp logs hundreds of loading lines: the errors say why it stopped
    errors = [line for line in kept if _ERROR_LINE.search(line)]
    return " | ".join((errors or kept)[-lines:]) or "(empty log)"


def get_props(port: int, timeout: float = 2.0) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/props", timeout=timeout) as r:
            found = json.loads(r.read(100_000))
            return found if isinstance(found, dict) else None
    except (OSError, ValueError, urllib.error.URLError):
        return None


def start_server(model: Path, *, alias: str, n_ctx: int, log_path: Path,
                 port: int | None = None, chat_format: str | None = None,
                 ready_timeout: float = READY_TIMEOUT_S,
                 threads: int | None = None, name: str | None = None) -> LlamaServer:
    """Start and wait for a server; ``ModelError`` (no process left) when it cannot.
    ``name``: the model as the person named it (``local:...``), in the progress lines."""
    if port is not None and port_in_use(port):
        raise ModelError(f"port {port} on {HOST} is in use: stop what listens there or "
                         "leave 'port' out of the [model] config to use a free one",
                         code=USAGE)
    name = name or str(model)
    # loading takes seconds to minutes, with nothing else to show: say what is waited for
    say_progress(f"starting llama.cpp's server for {name} (the first reply waits until "
                 "it has loaded the model)…")
    started = time.monotonic()
    for attempt in range(PORT_TRIES):
        chosen = port or free_port()
        server = _spawn(model, alias, n_ctx, chosen, log_path, chat_format, threads)
        try:
            _wait_ready(server, ready_timeout)
            say_progress(f"llama.cpp's server loaded {name} in "
                         f"{time.monotonic() - started:.1f} s")
            return server
        except _PortTaken:
            server.stop()
            if port is not None or attempt == PORT_TRIES - 1:
                raise ModelError(f"the llama.cpp server could not bind port {chosen}: "
                                 f"{log_tail(log_path)}") from None
        except BaseException:
            server.stop()
            raise
    raise AssertionError("unreachable")


class _PortTaken(Exception):
    pass


def _spawn(model: Path, alias: str, n_ctx: int, port: int, log_path: Path,
           chat_format: str | None, threads: int | None = None) -> LlamaServer:
    private_dir(log_path.parent)  # the state home's logs/: private, as all state
    cmd = [sys.executable, "-m", "simagent.local_model.serve", "--model", str(model),
           "--alias", alias, "--n-ctx", str(n_ctx), "--port", str(port)]
    if chat_format:
        cmd += ["--chat-format", chat_format]
    if threads:  # else every core: on a machine others share, fewer threads wait less
        cmd += ["--threads", str(threads)]
    server = LlamaServer(_launch(cmd, log_path), port, alias, log_path, argv=cmd)
    with _LIVE_LOCK:
        _LIVE.add(server)
    return server


def _launch(argv: list[str], log_path: Path, what: str = "") -> subprocess.Popen[bytes]:
    """The server process, its output appended to its log after a line naming the command;
    its stdin is the pipe whose end-of-file tells it simagent is gone (serve.py)."""
    with open(log_path, "ab", opener=private_opener) as log:
        log.write(f"{LOG_START}{what}{' '.join(argv)}\n".encode())
        log.flush()
        return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env=os.environ | SERVER_MALLOC)


def _wait_ready(server: LlamaServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = server.proc.poll()
        if code is not None:
            tail = log_tail(server.log_path)
            if "address already in use" in tail.lower():
                raise _PortTaken()
            raise ModelError(f"the llama.cpp server exited (code {code}) before it was "
                             f"ready; its log {server.log_path} ends: {tail}", code=PROVIDER)
        if (props := get_props(server.port, timeout=1.0)) is not None:
            server.props = props
            return
        time.sleep(POLL_S)
    raise ModelError(f"the llama.cpp server did not answer within {timeout:.0f} s; its log "
                     f"{server.log_path} ends: {log_tail(server.log_path)}", code=PROVIDER)
