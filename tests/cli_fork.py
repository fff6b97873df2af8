"""``simagent`` as a real process that skips the interpreter's start: the suite's CLI seam.

A test that runs ``python -m simagent ...`` pays about 2.5 s of CPU before simagent's own
code does anything: the interpreter, langchain, langgraph, deepagents, pydantic's model
classes, the tokenizer, and the default simulator's warm-up imports (numpy, scipy). The
slow suite runs the CLI a few hundred times, so that start was most of its CPU.

Here each pytest process keeps one **fork server**: a plain Python process, started on
first use, that imports all that once and then forks a child per command. The child is a
real process running the real ``simagent`` entry point: its own pid, exit status,
signals, process group, working folder, environment, and standard streams (the test's
pipes or files, passed over a Unix socket). What it does not share with a fresh
interpreter is the import phase, so the tests of start-up itself (``simagent --help``
speed, what gets imported, packaging) still start a real interpreter; so does any command
this module cannot serve (interpreter options such as ``-X``, a ``preexec_fn``).

:class:`ForkedPopen` is ``subprocess.Popen`` with only the launch and the wait replaced,
so ``communicate``, timeouts, text mode and ``send_signal`` are the standard library's.
:func:`run` and :func:`popen` take the same arguments as ``subprocess.run``/``Popen`` and
fall back to them for anything else.

The server is single-threaded and forks from its main loop, so no lock is held by
another thread at a fork. A child reseeds ``random`` and numpy and rebuilds its standard
streams from its own environment, as a fresh interpreter would.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Imported by the server before its first fork (what ``simagent run`` and the default
#: simulator's warm-up load); a child imports anything else itself.
PRELOAD = (
    "simagent.cli", "simagent.cli.arguments", "simagent.headless", "simagent.session",
    "simagent.agent.builder", "simagent.agent.turn_setup", "simagent.agent.scripted",
    "simagent.agent.scripted_kind", "simagent.agent.resume_repair", "simagent.kernel.memory",
    "simagent.kernel.supervisor", "simagent.notebooks.export", "jupyter_client.manager",
    "langgraph.checkpoint.sqlite", "IPython.core.interactiveshell",
    "numpy", "scipy", "scipy.integrate", "scipy.optimize", "matplotlib",
)
#: How long a test waits for the server to start (imports on a loaded machine).
START_WAIT_S = 120.0
#: The longest request the server reads (argv, working folder, environment): more than
#: an ``exec`` takes (2 MiB on Linux), as JSON.
_MAX_REQUEST = 8 << 20
#: How long the server waits for the rest of a request it has begun to read.
_REQUEST_WAIT_S = 30.0
_SERVER: dict[str, Any] = {}
_SERVER_LOCK = threading.Lock()


# ----------------------------------------------------------------------------- server
def _serve(sock_path: str) -> dict[str, Any] | None:
    """Accept requests and fork; return the request in a child, ``None`` when told to
    stop. Exit statuses go back on each request's connection."""
    sys.modules.setdefault("rfc3987_syntax", None)  # as simagent.cli.entry does
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(name)
    with contextlib.suppress(Exception):  # a cold child is slower, not wrong
        from simagent.context.tokens import encoding

        encoding()
    # A child's garbage collections, and the one at its exit, would walk every object
    # imported here and write to each one's page (copy-on-write): 0.7 CPU-s per command,
    # most of a usage error's cost. Frozen, they are left out of the child's collections.
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(64)
    print("ready", flush=True)
    waiting: dict[int, socket.socket] = {}
    while True:
        _reap(waiting)
        ready, _, _ = select.select([listener, *waiting.values()], [], [], 0.05)
        for pid, conn in list(waiting.items()):
            if conn in ready and not _peek(conn):  # its client is gone: so is the command
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        if listener not in ready:
            continue
        conn, _ = listener.accept()
        try:
            request, fds = _read_request(conn)
        except (OSError, ValueError):
            conn.close()
            continue
        if request.get("stop"):
            conn.close()
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            listener.close()
            for other in waiting.values():
                other.close()
            request["fds"] = fds
            request["conn"] = conn
            return request
        for fd in fds:
            os.close(fd)
        waiting[pid] = conn  # the child says its pid once it is set up (_become)


def _send_request(conn: socket.socket, request: dict[str, Any], fds: Sequence[int]) -> None:
    """One JSON line, the streams with its first bytes: a long one (a big prompt given as
    arguments) takes more than one read."""
    data = json.dumps(request).encode() + b"\n"
    sent = socket.send_fds(conn, [data], fds)
    conn.sendall(data[sent:])


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    conn.settimeout(_REQUEST_WAIT_S)
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    try:
        while not data.endswith(b"\n"):
            chunk = conn.recv(1 << 16)
            if not chunk or len(data) > _MAX_REQUEST:
                raise ValueError("a cut or oversized request")
            data += chunk
        conn.settimeout(None)
        return json.loads(data), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _peek(conn: socket.socket) -> bool:
    """Whether a readable connection is still open (clients send nothing after asking)."""
    try:
        return bool(conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except BlockingIOError:
        return True
    except OSError:
        return False


def _reap(waiting: dict[int, socket.socket]) -> None:
    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"status": status}).encode() + b"\n")
            conn.close()


def _become(request: dict[str, Any]) -> None:
    """In the child: take the test's streams, folder, environment and arguments, then tell
    the client its pid. ``Popen`` returns once its child has its session and streams (it
    waits for the exec), so a test may look at the process group at once: the pid goes
    back only when this child is as far along."""
    if request["new_session"]:
        os.setsid()
    for target, fd in enumerate(request["fds"]):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    import random

    random.seed()
    if np := sys.modules.get("numpy"):
        np.random.seed()
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    sys.stdin, sys.stdout, sys.stderr = _fresh_stdio()
    sys.argv = [request["argv0"], *request["args"]]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    with request["conn"] as conn, contextlib.suppress(OSError):  # the server sends the rest
        conn.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")


def _fresh_stdio() -> tuple[Any, Any, Any]:
    """Standard streams as a fresh interpreter builds them from this environment: the
    encoding from ``PYTHONIOENCODING`` or UTF-8, line-buffered on a terminal, written
    through with ``PYTHONUNBUFFERED``."""
    import io

    spec = os.environ.get("PYTHONIOENCODING", "")
    encoding, _, errors = spec.partition(":")
    encoding = encoding or "utf-8"
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))

    def stream(fd: int, mode: str, errs: str) -> io.TextIOWrapper:
        raw = open(fd, mode + "b", buffering=0 if unbuffered and mode == "w" else -1,  # noqa: SIM115
                   closefd=False)
        tty = os.isatty(fd)
        return io.TextIOWrapper(raw, encoding=encoding, errors=errors or errs,
                                line_buffering=tty or (mode == "w" and fd == 2),
                                write_through=unbuffered and mode == "w")

    return (stream(0, "r", "strict"), stream(1, "w", "strict"),
            stream(2, "w", "backslashreplace"))


def _server_main(sock_path: str) -> None:
    request = _serve(sock_path)
    if request is None:
        return
    _become(request)
    from simagent.cli import entry

    entry()  # raises SystemExit: the interpreter ends as a fresh one would


# ----------------------------------------------------------------------------- client
def _server() -> str:
    """This process's server's socket, started on first use."""
    with _SERVER_LOCK:
        proc = _SERVER.get("proc")
        if proc is not None and proc.poll() is None:
            return _SERVER["sock"]
        folder = tempfile.mkdtemp(prefix="simagent-clifork-")
        sock = os.path.join(folder, "s")
        env = dict(os.environ)
        env.pop("SIMAGENT_TEST_KERNEL", None)  # each request brings its own environment
        proc = subprocess.Popen([sys.executable, __file__, sock], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=None, env=env)
        deadline = time.monotonic() + START_WAIT_S
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                break
            if proc.poll() is not None:
                break
        line = proc.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            proc.kill()
            proc.wait(10)
            raise RuntimeError(f"the CLI fork server did not start: {line!r}")
        _SERVER.update(proc=proc, sock=sock, folder=folder)
        return sock


def stop() -> None:
    """Stop this process's server (the suite's leak check runs after)."""
    with _SERVER_LOCK:
        proc = _SERVER.pop("proc", None)
        if proc is None:
            return
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
            s.connect(_SERVER["sock"])
            _send_request(s, {"stop": True}, [])
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()
        with contextlib.suppress(OSError):
            os.unlink(_SERVER["sock"])
            os.rmdir(_SERVER["folder"])


def simagent_args(args: Sequence[Any]) -> list[str] | None:
    """The simagent arguments of a command line this module can serve, else ``None``:
    ``python -m simagent ...`` with this interpreter, or the venv's ``simagent``."""
    args = [os.fsdecode(a) for a in args]  # bytes as a fresh interpreter's sys.argv has them
    if args[:3] == [sys.executable, "-m", "simagent"]:
        return args[3:]
    if args and args[0] == str(Path(sys.executable).with_name("simagent")):
        return args[1:]
    return None


def _request(args: list[str], cwd: Any, env: Any, new_session: bool) -> dict[str, Any]:
    """What the server needs to fork ``simagent ARGS``: folder and environment as a fresh
    interpreter's ``os.getcwd()``/``os.environ`` hold them (bytes surrogate-escaped)."""
    return {"args": args, "argv0": str(Path(sys.executable).with_name("simagent")),
            "cwd": os.fsdecode(cwd),
            "env": {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()},
            "new_session": new_session}


class ForkedPopen(subprocess.Popen):
    """``subprocess.Popen`` whose child forks from the server (module docstring)."""

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env,
                       startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread,
                       c2pwrite, errread, errwrite, restore_signals, gid, gids, uid,
                       umask, start_new_session, process_group):
        simagent = simagent_args(args)
        if simagent is None or preexec_fn or pass_fds or shell or executable or any(
                x not in (None, -1) for x in (gid, uid, process_group)) or gids or \
                umask != -1:
            raise ValueError("ForkedPopen serves simagent commands only; use popen()")
        fds = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1,
               errwrite if errwrite != -1 else 2]
        request = _request(simagent, os.getcwd() if cwd is None else cwd,
                           os.environ if env is None else env, bool(start_new_session))
        self._buf, self._eof, self._status_lock = b"", False, threading.Lock()
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._conn.connect(_server())
            _send_request(self._conn, request, fds)
            first = self._line(START_WAIT_S)
            if first is None:
                raise OSError("the CLI fork server did not answer")
            answer = json.loads(first)
            if "pid" not in answer:  # it ended before it was set up: its stderr says why
                raise OSError(f"simagent could not start in the CLI fork server: {answer}")
            self.pid = answer["pid"]
        except BaseException:
            self._conn.close()
            raise
        finally:  # the child has its own copies
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
        self._child_created = True

    def _line(self, timeout: float | None) -> bytes | None:
        """The server's next line, waiting up to ``timeout`` (``None``: for ever); ``None``
        on a timeout or once the connection is closed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf and not self._eof:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._conn], [], [], left)
            if not ready:
                return None
            chunk = self._conn.recv(4096)
            self._buf += chunk
            self._eof = not chunk
        if b"\n" not in self._buf:
            return None
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def _status(self, timeout: float | None) -> int | None:
        """The child's exit code, waiting up to ``timeout``; ``None`` while it runs."""
        with self._status_lock:
            if self.returncode is not None:
                return self.returncode
            line = self._line(timeout)
            if line is None and not self._eof:
                return None
            self._conn.close()
            # no line: the server is gone, and its children with it
            status = json.loads(line)["status"] if line else signal.SIGKILL
            self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def _internal_poll(self, _deadstate=None, **_: Any) -> int | None:
        return self._status(0)

    def _wait(self, timeout: float | None) -> int:
        code = self._status(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return code


#: ``PYTHON*`` variables a child may set to other values than the server's: read when its
#: streams are built (:func:`_fresh_stdio`), or ``sys.dont_write_bytecode``, which a child
#: sets from its own environment (an environment built from scratch, as the attack bench's
#: lab does, leaves it out). Any other (``PYTHONPATH``, ``PYTHONWARNINGS``,
#: ``PYTHONHASHSEED``...) acts at an interpreter's start, so a command that changes one
#: gets a fresh interpreter.
_PER_CHILD = frozenset({"PYTHONIOENCODING", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE"})


def _python_vars(env: Any) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("PYTHON") and k not in _PER_CHILD}


def servable(args: Sequence[Any], **kwargs: Any) -> bool:
    """Whether :func:`popen` forks this command from the server."""
    env = kwargs.get("env")
    return simagent_args(args) is not None and not any(
        kwargs.get(k) for k in ("preexec_fn", "pass_fds", "shell", "executable", "user",
                                "group", "extra_groups", "process_group")) and (
        env is None or _python_vars(env) == _python_vars(os.environ))


def popen(args: Sequence[Any], **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen(args, **kwargs)``, forked from the server when it can be."""
    if servable(args, **kwargs):
        return ForkedPopen(list(args), **kwargs)
    return subprocess.Popen(args, **kwargs)


def run(args: Sequence[Any], *, input: Any = None, capture_output: bool = False,
        timeout: float | None = None, check: bool = False,
        **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run`` over :func:`popen`."""
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    with popen(args, **kwargs) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        except BaseException:
            proc.kill()
            raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


# ------------------------------------------------------------------------ trampoline
#: What a trampoline passes on to its command.
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
              signal.SIGUSR2, signal.SIGWINCH)


def command(args: Sequence[str]) -> list[str]:
    """A command line that runs ``simagent ARGS`` forked from this process's server, for
    whatever starts its commands itself (the MCP SDK's stdio client, acpx): a bare
    interpreter (the standard library's few imports) that hands the server its own
    streams, folder and environment, lives as long as the command, passes signals on and
    ends as the command did. Run where a ``PYTHON*`` variable acting at an interpreter's
    start differs from the suite's (``PYTHONPATH=plugins simagent ...``), it becomes a
    fresh ``python -m simagent`` instead, as :func:`popen` does."""
    return [sys.executable, os.path.abspath(__file__), "exec", _server(),
            json.dumps(_python_vars(os.environ)), *map(str, args)]


def _exec(sock_path: str, suite_vars: str, args: list[str]) -> None:
    if _python_vars(os.environ) != json.loads(suite_vars):
        os.execv(sys.executable, [sys.executable, "-m", "simagent", *args])
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(sock_path)
    _send_request(conn, _request(args, os.getcwd(), os.environ, False), [0, 1, 2])
    lines = conn.makefile("rb")
    line = lines.readline()
    answer = json.loads(line) if line else {}
    if "pid" in answer:  # else it ended before it was set up (its stderr says why)
        pid = answer["pid"]
        for sig in _FORWARDED:
            signal.signal(sig, lambda signum, _frame: os.kill(pid, signum))
        line = lines.readline()
    code = os.waitstatus_to_exitcode(json.loads(line)["status"]) if line else -signal.SIGKILL
    if code < 0:  # end as the command did: by its signal
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(5)
    sys.exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    if sys.argv[1] == "exec":
        _exec(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        _server_main(sys.argv[1])
