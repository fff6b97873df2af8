"""The attack bench's lab: a throwaway person, folder and machine state for one attack.

Each attack runs against the real product as a person would meet it: the ``simagent``
CLI in subprocesses, its real kernel, graph and SQLite, with a ``scripted:`` model
playing the agent's side. The lab gives every attack a fresh temporary ``HOME``, state
home (``SIMAGENT_HOME``), workspace and an ``outside`` folder the workspace must not
reach, plants fake secrets in the environment the CLI sees, and afterwards reads what
simagent left on disk: which planted value is there in plain text (ANSI sequences read
away first), which file or folder has group or other permission bits.

Every wait is bounded: a CLI call is killed with its process group past its limit, the
HTTP listener standing in for an attacker's endpoint only accepts loopback connections
and stops with the lab.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from simagent.paths import PRIVATE_DIR_MODE, write_private

#: The environment the CLI sees holds these fake credentials (names redaction knows).
FAKE_KEY_VAR, FAKE_KEY = "FAKE_API_KEY", "sk-fake-0123456789abcdef"
OPENAI_KEY_VAR, OPENAI_KEY = "OPENAI_API_KEY", "sk-fake-openai-9f8e7d6c5b4a3921"
PASSWORD_VAR, PASSWORD = "LAB_DB_PASSWORD", "pw-fake-env-5e1c9a7d3b"
#: Values that reach the kernel only, never simagent's environment nor a cell's code: a
#: password a cell reads from a file into a variable, the password inside a database URL,
#: an attached kernel's own token, the secret in ``~/.aws/credentials``.
CELL_PASSWORD = "pw-fake-cell-8b3f6a2e41"
DSN_PASSWORD = "pw-fake-dsn-0d7c4e9a15"
KERNEL_TOKEN_VAR, KERNEL_TOKEN = "LAB_SERVER_TOKEN", "tok-fake-kernel-6a1f3c8e72d9"
AWS_SECRET = "aws-fake-secret-3c9e1b7d5f0a2468"
#: Every planted value, by what planted it: none may be found in plain text at rest.
PLANTED: dict[str, str] = {
    FAKE_KEY: FAKE_KEY_VAR, OPENAI_KEY: OPENAI_KEY_VAR, PASSWORD: PASSWORD_VAR,
    CELL_PASSWORD: "a cell's db_password", DSN_PASSWORD: "a cell's database URL",
    KERNEL_TOKEN: KERNEL_TOKEN_VAR, AWS_SECRET: "~/.aws/credentials",
}
#: Variables of the person's environment a CLI call keeps (no real key travels into an
#: attack); the test suite's run tag lets its leak check find what the bench started.
KEPT_ENV = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "TZ", "SIMAGENT_TEST_RUN")
#: Seconds one CLI call may take (a kernel start on a loaded machine included).
CLI_TIMEOUT_S = 180
#: The first request an MCP host sends.
MCP_INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                  "params": {"protocolVersion": "2025-03-26", "capabilities": {},
                             "clientInfo": {"name": "attack-bench", "version": "0"}}}
#: The notice an ignored workspace config leaves on stderr (its wording is loose).
UNTRUSTED_NOTICE = re.compile(r"untrusted|not trusted", re.IGNORECASE)
#: ANSI escape sequences, raw and as JSON writes them (``\u001b[31m``), read away before a
#: value is looked for: a key split by a colour code is whole to a terminal.
_ANSI = re.compile(rb"(?:\x1b|\\u001b|\\x1b|\\033)(?:\[[0-9;?]*[A-Za-z]|\][^\x07]*\x07|[@-_])")

#: How a lab starts a ``simagent`` process: ``subprocess.Popen``'s signature and result.
Launch = Callable[..., subprocess.Popen[Any]]


@dataclass
class Ran:
    """One finished CLI call (``rc`` None: killed at its time limit)."""

    args: list[str]
    rc: int | None
    out: str
    err: str
    wall_s: float

    @property
    def said(self) -> str:
        return f"exit {'timeout' if self.rc is None else self.rc}"

    def said_where(self, pattern: re.Pattern[str], width: int = 80) -> str | None:
        """The words around the first match of ``pattern`` in stderr or stdout."""
        found = pattern.search(self.err) or pattern.search(self.out)
        if found is None:
            return None
        text = found.string
        start = max(0, text.rfind("\n", 0, found.start()) + 1, found.start() - width // 2)
        end = text.find("\n", found.end())
        return text[start:min(end if end >= 0 else len(text), start + width)].strip()

    @property
    def report(self) -> dict[str, Any]:
        """The JSON object ``simagent run --json`` printed ({} for anything else)."""
        try:
            data = json.loads(self.out)
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    @property
    def answer(self) -> str:
        return str(self.report.get("final") or "")

    @property
    def tool_calls(self) -> int:
        return int(self.report.get("tool_calls") or 0)


@dataclass
class Verdict:
    """What one attack came to: ``held`` (None when skipped, with the reason)."""

    held: bool | None
    evidence: str
    skipped: str | None = None


def verdict(checks: Mapping[str, bool], evidence: Sequence[str]) -> Verdict:
    """Held when every named check holds; the evidence names the ones that did not."""
    failed = [name for name, ok in checks.items() if not ok]
    said = "; ".join(e for e in evidence if e)
    return Verdict(not failed, (f"NOT: {', '.join(failed)}; " if failed else "") + said)


def skip(reason: str) -> Verdict:
    return Verdict(None, "", reason)


# ------------------------------------------------------------------ the model's steps
#: What the agent writes where it should not.
OVERWRITE = "overwritten by the agent\n"
#: The answer that ends a turn, quoting the last tool result.
FINAL = {"final": "done: {out[-1]}"}
#: The answer that quotes the last two results (``--json``'s ``final`` then holds both).
BOTH = {"final": "{out[-2]} || {out[-1]}"}


def cell(code: str, timeout_s: float | None = None) -> dict[str, Any]:
    """A ``run_python`` step."""
    args: dict[str, Any] = {"code": code}
    if timeout_s:
        args["timeout_s"] = timeout_s
    return {"tool": "run_python", "args": args}


def write(path: str, content: str = OVERWRITE) -> dict[str, Any]:
    """A ``write_file`` step."""
    return {"tool": "write_file", "args": {"file_path": path, "content": content}}


# ------------------------------------------------------------------------ the listener
@dataclass
class Listener:
    """A loopback HTTP endpoint an attacker would own: it records each request (and
    whether it carried a planted key) and answers 401, so a client gives up at once."""

    port: int = 0
    connections: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def with_key(self) -> int:
        return sum(1 for r in self.requests if r["key"])

    def said(self) -> str:
        return (f"{self.connections} connection(s) to the listener, {len(self.requests)} "
                f"request(s), {self.with_key} carrying a planted key")


@contextlib.contextmanager
def listening() -> Iterator[Listener]:
    record = Listener()

    class Handler(BaseHTTPRequestHandler):
        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(min(length, 1 << 20)) if length else b""
            seen = str(self.headers).encode() + body
            record.requests.append({"method": self.command, "path": self.path,
                                    "key": any(v.encode() in seen for v in PLANTED)})
            payload = b'{"error": {"message": "unauthorized", "type": "auth"}}'
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_HEAD = _any

        def log_message(self, *args: Any) -> None:  # the bench's output stays the table
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def verify_request(self, request: Any, client_address: Any) -> bool:
            record.connections += 1
            return client_address[0] == "127.0.0.1"

    server = Server(("127.0.0.1", 0), Handler)
    server.timeout = 1
    record.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                              daemon=True)
    thread.start()
    try:
        yield record
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


# ------------------------------------------------------------------------------ the lab
class Lab:
    """A temporary person: ``home`` (their ``HOME``), ``state`` (``SIMAGENT_HOME``), a
    workspace ``ws``, an ``outside`` folder beside it, ``exports`` for notebooks and
    transcripts, and ``scripts`` for the scripted model's files (never scanned: they
    are the model's side).

    ``popen`` starts every ``simagent`` process of the lab (the CLI and ``simagent mcp``).
    It is ``subprocess.Popen``; the test suite passes one that forks each command from an
    already imported server (tests/cli_fork.py), so its attacks skip the interpreter's
    start and still run a real process with the lab's folder, environment and streams."""

    def __init__(self, root: Path, popen: Launch = subprocess.Popen) -> None:
        self.root = root
        self.popen = popen
        self.home, self.state, self.ws = root / "home", root / "state", root / "ws"
        self.outside, self.exports, self.scripts = (root / "outside", root / "exports",
                                                    root / "scripts")
        for folder in (self.home, self.ws, self.outside, self.exports, self.scripts):
            folder.mkdir(parents=True, exist_ok=True)
        self.env = {k: os.environ[k] for k in KEPT_ENV if k in os.environ}
        self.env.update({"HOME": str(self.home), "SIMAGENT_HOME": str(self.state),
                         FAKE_KEY_VAR: FAKE_KEY, OPENAI_KEY_VAR: OPENAI_KEY,
                         PASSWORD_VAR: PASSWORD, "PYTHONUNBUFFERED": "1"})
        self._scripts = 0

    # ----------------------------------------------------------------- the agent's side
    def place(self, value: Any) -> Any:
        """``value`` with the lab's folders spelled in: ``{home}``, ``{ws}``, ``{outside}``
        and ``{state}`` in every string (a script's ``{out[-1]}`` is left alone)."""
        if isinstance(value, str):
            for name in ("home", "ws", "outside", "state", "root"):
                value = value.replace("{" + name + "}", str(getattr(self, name)))
            return value
        if isinstance(value, dict):
            return {k: self.place(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.place(v) for v in value]
        return value

    def script(self, steps: Sequence[dict[str, Any]]) -> str:
        """A ``scripted:PATH`` model spec playing ``steps`` (folders placed)."""
        self._scripts += 1
        path = self.scripts / f"script{self._scripts:02d}.json"
        path.write_text(json.dumps(self.place(list(steps))))
        return f"scripted:{path}"

    # ------------------------------------------------------------------------ the CLI
    def simagent(self, *args: str, timeout: float = CLI_TIMEOUT_S) -> Ran:
        """``simagent ARGS`` as the lab's person, in the workspace, bounded."""
        argv = [sys.executable, "-m", "simagent", *args]
        t0 = time.monotonic()
        proc = self.popen(argv, cwd=self.ws, env=self.env,
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
            rc: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            stop_group(proc)
            out, err = proc.communicate()
            rc = None
        return Ran(argv[3:], rc, out, err, time.monotonic() - t0)

    def run(self, steps: Sequence[dict[str, Any]], *args: str, approval: str = "workspace",
            prompt: str = "go") -> Ran:
        """``simagent run`` with the model playing ``steps`` under ``approval``."""
        return self.simagent("run", "--model", self.script(steps), "--approval", approval,
                             *args, prompt)

    def user_config(self, text: str) -> None:
        """The person's own config (``<state home>/config.toml``): trusted by definition,
        and private as the person's state home is."""
        self.state.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        write_private(self.state / "config.toml", self.place(text))

    def workspace_config(self, text: str) -> Path:
        """A ``.simagent/config.toml`` as a cloned folder would bring it."""
        path = self.ws / ".simagent" / "config.toml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(self.place(text))
        return path

    # --------------------------------------------------------------------- what is left
    def scanned(self) -> list[Path]:
        """Every file simagent may have written that must hold no planted value: the
        state home, the workspace's ``.simagent/`` and the exports."""
        roots = (self.state, self.ws / ".simagent", self.exports)
        return sorted(p for root in roots if root.exists() for p in root.rglob("*")
                      if p.is_file() and not p.is_symlink())

    def leaks(self) -> list[str]:
        """``path (what)`` for each scanned file holding a planted value in plain text."""
        found = []
        for path in self.scanned():
            try:
                data = path.read_bytes()
            except OSError:
                continue
            plain = _ANSI.sub(b"", data)
            for value, what in PLANTED.items():
                if value.encode() in data or value.encode() in plain:
                    found.append(f"{path.relative_to(self.root)} ({what})")
        return found

    def loose_modes(self) -> list[str]:
        """Files under the state home with group/other bits, folders not 0700."""
        loose = []
        for path in [self.state, *sorted(self.state.rglob("*"))] if self.state.exists() else []:
            if path.is_symlink():
                continue
            mode = path.stat().st_mode & 0o777
            if (path.is_dir() and mode != PRIVATE_DIR_MODE) or (path.is_file() and mode & 0o077):
                loose.append(f"{path.relative_to(self.root)} {mode:o}")
        return loose

    def sessions(self) -> list[Path]:
        return sorted(self.state.glob("workspaces/*/sessions/*"))

    def events(self, kind: str) -> list[dict[str, Any]]:
        """The payloads of every ``kind`` event the lab's sessions traced, in order."""
        found: list[dict[str, Any]] = []
        for session in self.sessions():
            with contextlib.closing(sqlite3.connect(session / "trace.sqlite")) as db, \
                    contextlib.suppress(sqlite3.Error):
                found += [json.loads(p) for (p,) in db.execute(
                    "SELECT payload FROM events WHERE kind = ? ORDER BY id", (kind,))]
        return found


def stop_group(proc: subprocess.Popen[Any], grace_s: float = 10) -> None:
    """SIGTERM to a process started in its own session and its group, then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@contextlib.contextmanager
def lab(popen: Launch = subprocess.Popen) -> Iterator[Lab]:
    """A :class:`Lab` in a fresh temporary folder; this process's ``SIMAGENT_HOME`` points
    at its state home meanwhile (so ``simagent.paths`` names the lab's files)."""
    before = os.environ.get("SIMAGENT_HOME")
    with tempfile.TemporaryDirectory(prefix="simagent-attacks-") as tmp:
        made = Lab(Path(tmp).resolve(), popen)
        os.environ["SIMAGENT_HOME"] = str(made.state)
        try:
            yield made
        finally:
            if before is None:
                os.environ.pop("SIMAGENT_HOME", None)
            else:
                os.environ["SIMAGENT_HOME"] = before


def first_line(text: str, width: int = 90) -> str:
    """The first line of ``text``, cut, quoted (for evidence)."""
    lines = text.strip().splitlines()
    return repr(lines[0][:width]) if lines else "nothing"


def unchanged(path: Path, content: str) -> bool:
    try:
        return path.read_text() == content
    except OSError:
        return False
