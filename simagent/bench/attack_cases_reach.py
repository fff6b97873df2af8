"""Attacks that reach in from beside the session: MCP tool servers that misbehave, a
request to ``simagent mcp --http`` from someone without the token or from a web page,
and a second local user reaching the session's Dask cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import anyio
import httpx
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client

from simagent import exit_codes
from simagent.bench.attack_bench import AttackCase
from simagent.bench.attack_lab import (
    BOTH,
    FAKE_KEY,
    FAKE_KEY_VAR,
    FINAL,
    KEPT_ENV,
    MCP_INITIALIZE,
    Lab,
    Ran,
    Verdict,
    cell,
    first_line,
    skip,
    stop_group,
    verdict,
)
from simagent.context.thresholds import TOOL_CAP_CHARS

#: The hostile server's per-call limit in the person's config (seconds): short where
#: the attack is a hang, generous where 10 MB must arrive on a loaded machine.
HANG_TIMEOUT_S, SERVER_TIMEOUT_S = 5, 120
#: What a cell prints after a fault to show the session goes on.
ALIVE_CODE, ALIVE = "print('alive', 6 * 7)", "alive 42"
#: A bound on one MCP-over-HTTP request (a kernel start included) and on a server start.
HTTP_CALL_S, HTTP_START_S = 180, 90
#: The second local user, and how long its attack may take.
OTHER_UID, ATTACK_S = 65534, 90


# ------------------------------------------------------------------- MCP tool servers
def hostile_server(lab: Lab, *flags: str, timeout_s: float = SERVER_TIMEOUT_S) -> None:
    """The person's config (trusted) declares the hostile server as ``lab``."""
    env = {k: os.environ[k] for k in ("SIMAGENT_TEST_RUN",) if k in os.environ}
    lab.user_config(
        f"[mcp.servers.lab]\ncommand = {json.dumps(sys.executable)}\n"
        f"args = {json.dumps(['-m', 'simagent.bench.attack_mcp_server', *flags])}\n"
        f"timeout_s = {timeout_s}\n"
        f"env = {{ {', '.join(f'{k} = {json.dumps(v)}' for k, v in env.items())} }}\n")


def _call(tool: str) -> dict[str, Any]:
    return {"tool": f"lab__{tool}", "args": {}}


def misbehaving(lab: Lab, tool: str, *, flags: tuple[str, ...] = (), beside: bool = False,
                timeout_s: float = SERVER_TIMEOUT_S) -> tuple[Ran, str]:
    """The model calls the server's ``tool``, then a cell (``beside``: both in one step,
    so the answer's request is the first to hold the tool's result, before any clearing);
    the answer quotes both results (``tool result || cell result``)."""
    hostile_server(lab, *flags, timeout_s=timeout_s)
    calls = [{"tools": [_call(tool), cell(ALIVE_CODE)]}] if beside else \
        [_call(tool), cell(ALIVE_CODE)]
    ran = lab.run([*calls, BOTH], "--json", approval="auto")
    return ran, ran.answer


def _survives(ran: Ran, answer: str) -> dict[str, bool]:
    return {"the session goes on (a cell runs after it)": ran.rc == exit_codes.OK
            and answer.endswith(ALIVE)}


def _first_line(answer: str) -> str:
    return first_line(answer.split(" || ")[0])


def _hang(lab: Lab) -> Verdict:
    ran, answer = misbehaving(lab, "hang", timeout_s=HANG_TIMEOUT_S)
    return verdict(_survives(ran, answer), [f"the call gave {_first_line(answer)}",
                                            ran.said, f"{ran.wall_s:.0f} s in all"])


def _crash(lab: Lab) -> Verdict:
    ran, answer = misbehaving(lab, "crash")
    return verdict(_survives(ran, answer), [f"the call gave {_first_line(answer)}", ran.said])


def _flood(lab: Lab) -> Verdict:
    ran, answer = misbehaving(lab, "flood", beside=True)
    got = len(answer.split(" || ")[0])
    status = [e.get("status") for e in lab.events("tool_result") if e.get("name") == "lab__flood"]
    checks = {**_survives(ran, answer), "the call succeeded": status == ["success"],
              "the model gets at most twice the tool cap": got <= 2 * TOOL_CAP_CHARS}
    return verdict(checks, [f"the model got {got:,} chars of 10,000,000: {_first_line(answer)}",
                            ran.said])


def _inject(lab: Lab) -> Verdict:
    ran, answer = misbehaving(lab, "inject")
    shown = FAKE_KEY in answer or FAKE_KEY in ran.err
    checks = {**_survives(ran, answer),
              "the key is redacted in what the model and the terminal get": not shown
              and "[redacted" in answer}
    return verdict(checks, ["the key " + ("SHOWN" if shown else "redacted") + " in the result",
                            ran.said])


def mcp_log(lab: Lab) -> Verdict:
    """A server that writes a key to its stderr, and answers an image."""
    ran, answer = misbehaving(lab, "picture", flags=("--stderr-key",))
    logs = [p for s in lab.sessions() for p in s.glob("mcp-*.log")]
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in logs}
    return verdict({**_survives(ran, answer), "the server's log was kept": bool(logs),
                    "the log is 0600": bool(logs) and all(m == "0o600" for m in modes.values())},
                   [f"logs {modes or 'none'}", ran.said])


# ------------------------------------------------------------------ MCP over HTTP
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def mcp_http(lab: Lab, *extra: str) -> Iterator[tuple[str, str, subprocess.Popen[Any] | None]]:
    """``simagent mcp --http 127.0.0.1:PORT`` with a token: (url, token, the process, or
    None when it did not come up within :data:`HTTP_START_S`)."""
    token, port = "tok-bench-" + os.urandom(8).hex(), _free_port()
    log = open(lab.root / "mcp-http.err", "w")  # noqa: SIM115 - closed below
    proc = lab.popen([sys.executable, "-m", "simagent", "mcp", "--http",
                      f"127.0.0.1:{port}", *extra], cwd=lab.ws,
                     env={**lab.env, "SIMAGENT_MCP_TOKEN": token},
                     stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    try:
        deadline, up = time.monotonic() + HTTP_START_S, False
        while not up and proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                up = True
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/mcp", token, proc if up else None
    finally:
        stop_group(proc)
        log.close()


_RUN_MARKER = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
               "params": {"name": "run_python",
                          "arguments": {"code": "open('ran-over-http.txt', 'w').write('x')"}}}
_ACCEPT = {"Accept": "application/json, text/event-stream"}


def _not_up(lab: Lab) -> Verdict:
    err = (lab.root / "mcp-http.err").read_text()[-200:].strip().replace("\n", " ")
    return Verdict(False, f"simagent mcp --http did not come up: {err!r}")


def _http_token(lab: Lab) -> Verdict:
    with mcp_http(lab) as (url, token, proc):
        if proc is None:
            return _not_up(lab)
        none = httpx.post(url, json=_RUN_MARKER, headers=_ACCEPT, timeout=30).status_code
        wrong = httpx.post(url, json=_RUN_MARKER, timeout=30,
                           headers={**_ACCEPT, "Authorization": f"Bearer {token}x"}).status_code
    ran = (lab.ws / "ran-over-http.txt").exists()
    return verdict({"no token: 401": none == 401, "a wrong token: 401": wrong == 401,
                    "nothing ran": not ran},
                   [f"no token {none}", f"wrong token {wrong}",
                    "the cell " + ("RAN" if ran else "did not run")])


def _http_origin(lab: Lab) -> Verdict:
    """A web page the person visits posts to the server (a foreign Origin), or a DNS
    rebinding name reaches it (a foreign Host); both bear the token, as a leaked one."""
    with mcp_http(lab) as (url, token, proc):
        if proc is None:
            return _not_up(lab)
        auth = {**_ACCEPT, "Authorization": f"Bearer {token}"}
        origin = httpx.post(url, json=MCP_INITIALIZE, timeout=30,
                            headers={**auth, "Origin": "http://evil.example"}).status_code
        host = httpx.post(url, json=MCP_INITIALIZE, timeout=30,
                          headers={**auth, "Host": "evil.example"}).status_code
    return verdict({"a foreign Origin is refused": 400 <= origin < 500,
                    "a foreign Host is refused": 400 <= host < 500},
                   [f"Origin http://evil.example: {origin}", f"Host evil.example: {host}"])


ENV_PROBE = f"import os\nprint('has the key:', {FAKE_KEY_VAR!r} in os.environ)"


async def _run_over_http(url: str, token: str, code: str) -> str:
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                 timeout=httpx.Timeout(30, read=HTTP_CALL_S)) as http, \
            streamable_http_client(url, http_client=http) as (read, write, _), \
            ClientSession(read, write, read_timeout_seconds=timedelta(seconds=HTTP_CALL_S)) as s:
        with anyio.fail_after(HTTP_CALL_S):
            await s.initialize()
            result = await s.call_tool("run_python", {"code": code})
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


def _served_env(lab: Lab, *extra: str) -> str:
    """What the served kernel says about the key (or why it could not say)."""
    with mcp_http(lab, *extra) as (url, token, proc):
        if proc is None:
            err = (lab.root / "mcp-http.err").read_text().strip().splitlines()
            return f"no server ({err[-1][:80] if err else 'no output'})"
        try:
            return anyio.run(_run_over_http, url, token, ENV_PROBE).strip()
        except Exception as exc:  # the row reports it; the harness goes on
            return f"call failed: {type(exc).__name__}"


def _http_env(lab: Lab) -> Verdict:
    plain = _served_env(lab)
    passed = _served_env(lab, "--pass-env", FAKE_KEY_VAR)
    return verdict({f"the served kernel has no {FAKE_KEY_VAR}": plain.endswith("False"),
                    f"--pass-env {FAKE_KEY_VAR} passes it": passed.endswith("True")},
                   [f"plain: {plain!r}", f"--pass-env: {passed!r}"])


# ----------------------------------------------------------------- Dask, another uid
#: The cell: a sweep on the session's local cluster, then the cluster's addresses for
#: the attacker, then a bounded wait while the attack runs.
CLUSTER_CELL = """import json, pathlib, time
from simagent.kernel_api import ensemble
from simagent.kernel_api.cluster import local_engine

def double(x):
    return 2 * x

table = ensemble(double, [{'x': 1}], workers=1, cache=False)
client = local_engine(1).client
try:
    dashboard = client.dashboard_link
except Exception:
    dashboard = None
pathlib.Path(r'{root}/cluster.json').write_text(json.dumps(
    {'scheduler': client.scheduler_info()['address'], 'dashboard': dashboard}))
deadline = time.monotonic() + WAIT_S
while time.monotonic() < deadline and not pathlib.Path(r'{root}/attack-done').exists():
    time.sleep(0.2)
print('cases ok:', int((table['status'] == 'ok').sum()))
""".replace("WAIT_S", str(ATTACK_S + 30))
#: The other user's attack: connect as a Dask client (plain and TLS without the
#: certificate), run a task that reports who it runs as; fetch the dashboard.
ATTACKER = """import json, os, sys, urllib.request
from distributed import Client
port = sys.argv[1].rsplit(':', 1)[1]
out = {'uid': os.getuid(), 'tries': [], 'dashboard': None}
for scheme in ('tcp', 'tls'):
    url = f'{scheme}://127.0.0.1:{port}'
    try:
        with Client(url, timeout=5) as c:
            got = c.submit(lambda: [os.getuid(), 'FAKE_API_KEY' in os.environ],
                           pure=False).result(timeout=20)
        out['tries'].append([url, 'RAN', got])
    except Exception as exc:
        out['tries'].append([url, 'refused', type(exc).__name__])
if len(sys.argv) > 2 and sys.argv[2]:
    try:
        out['dashboard'] = urllib.request.urlopen(sys.argv[2], timeout=5).status
    except Exception as exc:
        out['dashboard'] = type(exc).__name__
print(json.dumps(out))
"""


def second_uid_missing() -> str | None:
    """Why uid ``OTHER_UID`` cannot run this Python with Dask, or None when it can.

    Becoming that uid needs root and ``setpriv``; running as it needs this interpreter and
    its packages readable by others. A checkout under a 0700 folder (``mktemp -d``) hides
    the venv, and the attack would fail for that reason, not because the cluster refused.
    """
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed: no second uid to attack from"
    if os.geteuid() != 0:
        return "not root: the bench cannot become a second uid"
    try:
        probe = subprocess.run(
            ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups",
             sys.executable, "-c", "import distributed"],
            capture_output=True, text=True, timeout=60, cwd="/")
    except (OSError, subprocess.SubprocessError) as exc:
        return f"uid {OTHER_UID} cannot start this Python ({type(exc).__name__})"
    if probe.returncode != 0:
        said = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return (f"uid {OTHER_UID} cannot import distributed from {sys.executable} "
                f"({said}); a folder above the checkout is closed to other users")
    return None


def _dask_other_uid(lab: Lab) -> Verdict:
    if (why := second_uid_missing()) is not None:
        return skip(why)
    result: dict[str, Any] = {}
    attack = threading.Thread(target=_attack_cluster, args=(lab, result), daemon=True)
    attack.start()
    ran = lab.run([cell(CLUSTER_CELL, timeout_s=ATTACK_S + 120), FINAL], approval="auto")
    attack.join(timeout=ATTACK_S + 30)
    seen = result.get("seen")
    if not seen:
        return Verdict(False, f"the attack did not run: {result.get('error', 'no cluster')}; "
                              f"{ran.said}")
    ran_tasks = [t for t in seen["tries"] if t[1] == "RAN"]
    dashboard = seen.get("dashboard")
    tries = ", ".join(f"{t[0].split(':')[0]} {t[1]} ({t[2]})" for t in seen["tries"])
    return verdict({f"uid {OTHER_UID} runs no task on the cluster": not ran_tasks,
                    f"uid {OTHER_UID} cannot read the dashboard": dashboard != 200},
                   [f"uid {seen['uid']} -> {result['scheduler']}: {tries}",
                    "dashboard " + ("off" if dashboard is None else "answered" if dashboard
                                    == 200 else f"unreachable ({dashboard})"), ran.said])


def _attack_cluster(lab: Lab, result: dict[str, Any]) -> None:
    """Waits (bounded) for the cell to publish the cluster, attacks it as the other uid,
    then lets the cell finish."""
    published, done = lab.root / "cluster.json", lab.root / "attack-done"
    try:
        deadline = time.monotonic() + ATTACK_S + 60
        while not published.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if not published.exists():
            result["error"] = "the cell never published its cluster"
            return
        cluster = json.loads(published.read_text())
        result["scheduler"] = cluster["scheduler"]
        with tempfile.TemporaryDirectory(prefix="attacker-") as home:
            os.chmod(home, 0o777)  # the other uid's HOME (dask writes its config there)
            env = {k: os.environ[k] for k in KEPT_ENV if k in os.environ} | {"HOME": home}
            proc = subprocess.run(
                ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups",
                 sys.executable, "-c", ATTACKER, cluster["scheduler"],
                 cluster.get("dashboard") or ""],
                env=env, capture_output=True, text=True, timeout=ATTACK_S, cwd=home)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if lines:
            result["seen"] = json.loads(lines[-1])
        else:
            result["error"] = f"attacker said: {proc.stderr.strip()[-200:]!r}"
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        done.write_text("done")


CASES = [
    AttackCase("mcp-hang", "mcp-client", "an MCP tool server never answers a call",
               "the call ends at its timeout with an error; the session goes on", _hang),
    AttackCase("mcp-flood", "mcp-client", "an MCP tool answers 10 MB",
               "the model gets a capped result or a line naming the saved file; the "
               "session goes on", _flood),
    AttackCase("mcp-crash", "mcp-client", "an MCP tool server dies during a call",
               "the call ends with an error; the session goes on", _crash),
    AttackCase("mcp-inject", "mcp-client",
               "an MCP tool answers 'ignore previous instructions' and a key",
               "the key is redacted before the model, the terminal or any file gets it",
               _inject, fast=True),
    AttackCase("mcp-http-token", "mcp-http",
               "requests to `simagent mcp --http` without the token or with a wrong one",
               "401; nothing runs", _http_token, fast=True),
    AttackCase("mcp-http-origin", "mcp-http",
               "a web page (foreign Origin) or a rebinding name (foreign Host) posts to "
               "`simagent mcp --http` with the token", "refused", _http_origin, fast=True),
    AttackCase("mcp-http-env", "mcp-http",
               f"a token holder reads the served kernel's environment for ${FAKE_KEY_VAR}",
               "absent unless `--pass-env` names it", _http_env),
    AttackCase("dask-other-uid", "dask",
               f"uid {OTHER_UID} connects to the session's ensemble() cluster and its "
               "dashboard", "no connection, no task runs, no dashboard", _dask_other_uid,
               fast=True),
]
