"""The session's local Dask cluster cannot be used by anyone else on the machine.

A real simagent kernel starts its cluster through the real code (``ensemble``); another
process then attacks every address the cluster listens on (scheduler, nannies, workers)
the way a local user would: a plain ``distributed.Client`` or ``rpc`` over tcp, and over
TLS with a certificate of its own, each trying to run ``os.getuid`` (a scheduler task, a
worker's or nanny's ``run`` handler). It runs once as root (this process's user) and once
as another uid (``setpriv``), the shared-login-node case. Before TLS every probe ran its
function as the session's user. Also proved: the session's own sweep still runs, nothing
but TLS comm ports and the kernel's own ports listen (no dashboard), the certificate's
key is on no command line or environment, the dashboard serves only when asked for, and
an external scheduler without ``tls://`` gets a one-line warning. Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
import pytest
from test_ensembles import loads

from simagent.bench.attack_cases_reach import OTHER_UID, second_uid_missing
from simagent.config import Config, ConfigError
from simagent.kernel import Kernel
from simagent.kernel_api.cluster import plain_warning
from simagent.paths import SessionPaths

NOBODY = OTHER_UID
PROBE_S = 90

SETUP = r'''
import json, os
from simagent.kernel_api import ensemble
from simagent.kernel_api import cluster as _cluster

def cube(a):
    return {"v": a ** 3}

_table = ensemble(cube, [{"a": a} for a in range(4)], workers=1, name="secure", cache=False)
_c = _cluster._local[0]
print("JSON " + json.dumps({
    "scheduler": _c.scheduler_address,
    "workers": list(_c.scheduler_info["workers"]),
    "nannies": [w["nanny"] for w in _c.scheduler_info["workers"].values()],
    "services": sorted(_c.scheduler.services),
    "link": _cluster.local_engine(1).client.dashboard_link,
    "key": _c.security.tls_scheduler_key or "",  # PEM text: the certificate's key
    "v": _table.v.tolist(), "status": _table.status.tolist()}))
'''

#: The attacker: every address, plain tcp and TLS with its own certificate, each trying
#: to run os.getuid there. Prints {probe: "ran: <uid>" | "refused: <error>"}.
PROBE = r'''
import asyncio, json, os, sys
from distributed import Client
from distributed.core import rpc
from distributed.protocol.pickle import dumps
from distributed.security import Security

target = json.loads(sys.argv[1])
own = Security.temporary()
results = {}

def hostport(address):
    return address.split("://", 1)[1]

def attempt(name, call):
    try:
        results[name] = "ran: " + repr(call())
    except BaseException as exc:
        results[name] = "refused: " + type(exc).__name__

def submit(address, security):
    with Client(address, security=security, timeout=5, set_as_default=False) as client:
        return client.submit(os.getuid, pure=False).result(timeout=5)

def handler_run(address, security):
    async def go():
        args = security.get_connection_args("client") if security else {}
        async with rpc(address, connection_args=args, timeout=5) as remote:
            reply = await asyncio.wait_for(remote.run(function=dumps(os.getuid)), 5)
        return reply.get("result", reply)
    return asyncio.run(go())

for scheme, security in (("tcp", None), ("tls", own)):
    attempt(f"scheduler submit over {scheme}",
            lambda: submit(f"{scheme}://" + hostport(target["scheduler"]), security))
    for role in ("workers", "nannies"):
        for address in target[role]:
            attempt(f"{role[:-1]} run over {scheme} {address}",
                    lambda: handler_run(f"{scheme}://" + hostport(address), security))
print(json.dumps(results))
'''


class Box:
    kernel: Kernel
    ws: Path
    setup: dict
    human: list
    pid: int
    before: set[int]  # ports the kernel listened on before its cluster existed


def _listening(pid: int) -> set[int]:
    root = psutil.Process(pid)
    return {c.laddr.port for p in [root, *root.children(recursive=True)]
            for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("secure-cluster")
    (tmp / "ws").mkdir()
    b = Box()
    b.ws = tmp / "ws"
    env = {"SIMAGENT_DASK_SCHEDULER": "", "SIMAGENT_DASK_DASHBOARD": ""}  # the defaults
    b.kernel = Kernel(SessionPaths(tmp / "session"), cwd=b.ws, env=env)
    try:  # a failed setup must not leave the kernel and its cluster running
        b.kernel.start()
        b.pid = int(b.kernel.execute("import os; print(os.getpid())").stdout.strip())
        b.before = _listening(b.pid)
        res = b.kernel.execute(SETUP, timeout=120)
        assert res.ok, res.model_text()[-3000:]
        b.setup, b.human = loads(res), res.human
        yield b
    finally:
        if b.kernel.is_alive():
            b.kernel.execute("_cluster.close_all()", timeout=30)
        b.kernel.shutdown()


def _probe(box: Box, *prefix: str) -> dict[str, str]:
    target = {k: box.setup[k] for k in ("scheduler", "workers", "nannies")}
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIMAGENT_")}
    proc = subprocess.run([*prefix, sys.executable, "-c", PROBE, json.dumps(target)],
                          capture_output=True, text=True, timeout=PROBE_S, cwd="/",
                          env={**env, "HOME": "/nonexistent"} if prefix else env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _assert_refused(results: dict[str, str], box: Box) -> None:
    n = len(box.setup["workers"]) + len(box.setup["nannies"]) + 1
    assert len(results) == 2 * n, results  # tcp and TLS, every address
    ran = {probe: r for probe, r in results.items() if not r.startswith("refused: ")}
    assert not ran, ran


@pytest.mark.slow
def test_the_sessions_own_sweep_runs_on_a_tls_cluster(box):
    assert box.setup["status"] == ["ok"] * 4 and box.setup["v"] == [0, 1, 8, 27]
    for address in [box.setup["scheduler"], *box.setup["workers"], *box.setup["nannies"]]:
        assert re.fullmatch(r"tls://127\.0\.0\.1:\d+", address), address


@pytest.mark.slow
def test_another_process_cannot_run_a_task_on_it(box):
    _assert_refused(_probe(box), box)


@pytest.mark.slow
def test_another_user_cannot_run_a_task_on_it(box):
    if (why := second_uid_missing()) is not None:
        pytest.skip(why)
    as_nobody = [shutil.which("setpriv"), f"--reuid={NOBODY}", f"--regid={NOBODY}",
                 "--clear-groups"]
    whoami = subprocess.run([*as_nobody, sys.executable, "-c", "import os; print(os.getuid())"],
                            capture_output=True, text=True, timeout=60)
    assert whoami.stdout.strip() == str(NOBODY), whoami.stderr  # the probe really is them
    _assert_refused(_probe(box, *as_nobody), box)


def test_only_tls_ports_listen_and_the_key_is_on_no_command_line(box):
    """No dashboard: the kernel's process tree listens on its own ZMQ ports and the
    cluster's TLS comm ports, nothing else; the certificate's key stays in memory."""
    comm = {int(a.rsplit(":", 1)[1]) for a in [box.setup["scheduler"], *box.setup["workers"],
                                               *box.setup["nannies"]]}
    assert "dashboard" not in box.setup["services"]
    assert not box.setup["link"]  # no stale link to a port someone else may take
    assert _listening(box.pid) - box.before == comm
    assert box.human == []  # no dashboard link to show
    secret = box.setup["key"].splitlines()[5]  # a line of base64 inside the PEM block
    assert len(secret) > 40
    root = psutil.Process(box.pid)
    for p in [root, *root.children(recursive=True)]:
        assert secret not in " ".join(p.cmdline())
        assert not any(secret in v for v in p.environ().values())


@pytest.mark.slow
def test_the_dashboard_serves_only_when_asked_for(box):
    res = box.kernel.execute("""
_cluster.close_local()
os.environ["SIMAGENT_DASK_DASHBOARD"] = "1"
try:
    _t = ensemble(cube, [{"a": 5}], workers=1, name="dash", cache=False)
finally:
    os.environ["SIMAGENT_DASK_DASHBOARD"] = ""
print("JSON " + json.dumps({"status": _t.status.tolist(),
                            "address": _cluster._local[0].scheduler_address}))
""", timeout=120)
    assert res.ok, res.model_text()[-3000:]
    assert loads(res) == {"status": ["ok"], "address": loads(res)["address"]}
    assert loads(res)["address"].startswith("tls://")
    assert len(res.human) == 1, res.human
    link = re.fullmatch(r"Dask dashboard: (http://127\.0\.0\.1:\d+/status)", res.human[0])
    assert link, res.human
    with urllib.request.urlopen(link.group(1), timeout=30) as page:
        assert page.status == 200


def test_the_dashboard_setting_reaches_the_kernel_and_is_checked():
    assert Config(data={"ensembles": {"dashboard": True}}).ensemble_kernel_env({}) == {
        "SIMAGENT_DASK_DASHBOARD": "1"}
    assert Config(data={}).ensemble_kernel_env({}) == {}
    # a variable already set wins, as for the other ensemble settings
    assert Config(data={"ensembles": {"dashboard": True}}).ensemble_kernel_env(
        {"SIMAGENT_DASK_DASHBOARD": "0"}) == {}
    with pytest.raises(ConfigError, match=r"\[ensembles\] dashboard must be true or false"):
        Config(data={"ensembles": {"dashboard": "yes"}}).ensemble_dashboard()


@pytest.mark.parametrize("address, warned", [
    ("tcp://10.0.0.5:8786", True), ("10.0.0.5:8786", True), ("ws://h:8786", True),
    ("tls://10.0.0.5:8786", False), ("TLS://h:1", False), ("inproc://h/1/2", False)])
def test_a_scheduler_without_tls_gets_a_warning(address, warned):
    line = plain_warning(address)
    assert (line is not None) == warned
    if line:
        assert "\n" not in line and address in line and "not tls://" in line
