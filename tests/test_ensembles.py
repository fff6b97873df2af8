"""``ensemble`` end to end: a real simagent kernel, a real Dask LocalCluster of 2 worker
processes, and a real external ``dask scheduler`` / ``dask worker`` on 127.0.0.1.

One kernel (and so one local cluster) serves the whole module, as in a session. The case
functions are defined in the kernel's ``__main__``, so the tests also prove they travel
to worker processes. Nothing here asserts on timing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import cli_fork
import pytest

from simagent.kernel import Kernel
from simagent.paths import SessionPaths

SETUP = r'''
import json, os, time
from simagent.kernel_api import ensemble
from simagent.kernel_api import cluster as _cluster

CALLS = os.path.abspath("calls.log")

OFFSET = 2

def cube(a):
    return a ** 3

def poly(a, b=0, fail_on=None):
    """Cheap and deterministic; fails for a == fail_on. Uses a kernel helper and constant."""
    import os
    if a == fail_on:
        raise ValueError(f"bad case a={a}")
    return {"v": cube(a) - OFFSET * b, "pid": os.getpid()}

def counted(x, delay=0.0):
    """Appends to CALLS on every call, so a test can count real executions."""
    import time
    with open(CALLS, "a") as fh:
        fh.write(f"{x}\n")
    time.sleep(delay)
    return {"y": x * x}

def n_calls():
    return len(open(CALLS).read().split()) if os.path.exists(CALLS) else 0

SLOW = os.path.abspath("slow.flag")

def napping(x):
    """Counts its calls; cases x >= 2 sleep a minute while the SLOW flag file exists."""
    import time
    with open(CALLS, "a") as fh:
        fh.write(f"{x}\n")
    if x >= 2 and os.path.exists(SLOW):
        time.sleep(60)
    return {"y": x * x}

def worker_pids():
    client = _cluster._local[1]
    return sorted(client.run(os.getpid).values())

def say(**kw):
    print("JSON " + json.dumps(kw, default=str))

_warm = ensemble(poly, [{"a": 1}, {"a": 2}], workers=2, name="warmup")
say(workers=len(_cluster._local[1].nthreads()), kernel_pid=os.getpid())
'''


def loads(result) -> dict:
    """The ``JSON {...}`` line a cell printed with ``say``."""
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("JSON ")]
    assert lines, result.model_text()[-3000:]
    return json.loads(lines[-1][5:])


class Box:
    kernel: Kernel
    session: Path
    ws: Path
    setup_events: list
    setup_text: str
    setup: dict


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ensembles")
    (tmp / "ws").mkdir()
    b = Box()
    b.session = tmp / "session"
    b.ws = tmp / "ws"
    env = {"SIMAGENT_DASK_SCHEDULER": ""}  # a developer's own cluster must not leak in
    b.kernel = Kernel(SessionPaths(b.session), cwd=tmp / "ws", env=env)
    try:  # a failed setup must not leave the kernel and its cluster running
        b.kernel.start()
        b.setup_events = []
        res = b.kernel.execute(SETUP, on_output=b.setup_events.append, timeout=120)
        assert res.ok, res.model_text()[-3000:]
        b.setup_text = res.model_text()
        b.setup = loads(res)
        b.setup_human = res.human
        yield b
    finally:
        if b.kernel.is_alive():
            b.kernel.execute("_cluster.close_all()", timeout=30)
        b.kernel.shutdown()


@pytest.fixture
def slow_flag(box) -> Path:
    """Makes ``napping`` cases x >= 2 sleep a minute while it exists; gone after the test
    whatever happened, so a failed test cannot slow the later ones."""
    flag = box.ws / "slow.flag"
    flag.write_text("")
    yield flag
    flag.unlink(missing_ok=True)


def slow_cases_started(box, since: int) -> int:
    """``napping`` cases x >= 2 that began after the first ``since`` calls (each then
    sleeps while the slow flag exists): read from the calls log the cases append to."""
    calls = box.ws / "calls.log"
    done = calls.read_text().split()[since:] if calls.exists() else []
    return sum(int(x) >= 2 for x in done)


def fast_cases_started(box, since: int) -> int:
    """``napping`` cases x < 2 (they return at once) that began after the first ``since``."""
    calls = box.ws / "calls.log"
    done = calls.read_text().split()[since:] if calls.exists() else []
    return sum(int(x) < 2 for x in done)


def calls_so_far(box) -> int:
    calls = box.ws / "calls.log"
    return len(calls.read_text().split()) if calls.exists() else 0


def run(box: Box, code: str, timeout: float = 120, **kw):
    res = box.kernel.execute(code, timeout=timeout, **kw)
    return res


# ------------------------------------------------------------------ local cluster
def test_local_cluster_has_two_workers_and_no_dashboard_unless_asked(box):
    """The dashboard (plain HTTP) is off by default; test_cluster_security turns it on
    and finds its link on the human channel only."""
    assert box.setup["workers"] == 2
    assert [e.text for e in box.setup_events if e.kind == "human"] == []
    assert box.setup_human == []
    assert "dashboard" not in box.setup_text.lower()


def test_results_equal_a_serial_loop_and_a_failure_is_recorded(box):
    res = run(box, """
cases = [{"a": a, "b": b, "fail_on": 5} for a in range(8) for b in (0, 1)]
df = ensemble(poly, cases, workers=2, name="poly")
serial = [poly(**c)["v"] for c in cases if c["a"] != 5]
ok = df[df.status == "ok"]
say(equal=ok.v.tolist() == serial, n=len(df), ok=len(ok), pids=sorted(set(ok.pid)),
    errors=df.loc[df.status == "error", "error"].tolist(),
    failed_a=df.loc[df.status == "error", "a"].tolist(), columns=list(df.columns),
    elapsed_all=bool(ok.elapsed_s.notna().all()))
""")
    assert res.ok, res.model_text()[-3000:]
    out = loads(res)
    assert out["equal"] and out["n"] == 16 and out["ok"] == 14
    assert out["errors"] == ["ValueError: bad case a=5"] * 2 and out["failed_a"] == [5, 5]
    assert out["columns"] == ["a", "b", "fail_on", "v", "pid", "status", "error", "elapsed_s",
                              "attempts", "cached"]
    assert out["elapsed_all"]
    assert 1 <= len(out["pids"]) <= 2 and box.setup["kernel_pid"] not in out["pids"]
    text = res.model_text()
    bars = [ln for ln in text.splitlines() if re.match(r"poly: +\d+%\|", ln)]
    assert bars == [bars[0]] and "16/16" in bars[0]  # one progress line, final state
    assert re.search(r"^ensemble 'poly': 16 cases: 14 ok, 2 failed; wall .* on 2 workers "
                     r"\(local cluster\); sum of case times .*, speed-up", text, re.M)
    folder = box.session / "ensembles" / "poly"
    assert f"table: {folder / 'results.csv'}" in text
    assert "first failure: a=5, b=0, fail_on=5 -> ValueError: bad case a=5 (+1 more)" in text
    assert "ValueError: bad case a=5" in (folder / "errors.txt").read_text()
    assert (folder / "results.csv").read_text().count("\n") == 17
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["ok"] == 14 and summary["failed"] == 2 and summary["workers"] == 2


def test_rerun_skips_cached_cases_and_a_changed_function_runs_again(box):
    res = run(box, """
def cheap(x):
    with open(CALLS, "a") as fh:
        fh.write(f"{x}\\n")
    return {"y": x * x}
n0 = n_calls()
cases = [{"x": x} for x in range(4)]
first = ensemble(cheap, cases, name="cached")
n1 = n_calls()
second = ensemble(cheap, cases + [{"x": 9}], name="cached")
say(n1=n1 - n0, n2=n_calls() - n0, cached=second.cached.tolist(), y=second.y.tolist())
""")
    assert res.ok, res.model_text()[-3000:]
    out = loads(res)
    assert out["n1"] == 4 and out["n2"] == 5  # only the new case ran
    assert out["cached"] == [True] * 4 + [False] and out["y"] == [0, 1, 4, 9, 81]
    assert "5 cases: 5 ok, 0 failed (4 from cache)" in res.model_text()

    res = run(box, """
def cheap(x):  # same name, new body: every case must run again
    with open(CALLS, "a") as fh:
        fh.write(f"{x}\\n")
    return {"y": -x}
n0 = n_calls()
third = ensemble(cheap, [{"x": x} for x in range(4)], name="cached")
n3 = n_calls() - n0
fourth = ensemble(cheap, [{"x": x} for x in range(4)], name="cached", cache=False)
say(n3=n3, n4=n_calls() - n0, y=third.y.tolist(),
    cached=third.cached.tolist() + fourth.cached.tolist())
""")
    assert res.ok, res.model_text()[-3000:]
    out = loads(res)
    assert out["n3"] == 4 and out["n4"] == 8
    assert out["y"] == [0, -1, -2, -3] and not any(out["cached"])


@pytest.mark.real
def test_interrupt_stops_running_cases_keeps_finished_rows_and_resumes(box, slow_flag):
    before = loads(run(box, "say(pids=worker_pids())"))["pids"]
    cases_dir = box.session / "ensembles" / "napping" / "cases"
    n0 = calls_so_far(box)

    saved_at_interrupt: list[int] = []

    def interrupt_when_the_rest_sleep():
        deadline = time.monotonic() + 60  # a bound, not a timing: the order is what counts
        saved = 0
        while time.monotonic() < deadline:
            # Both workers inside a minute-long case, and every fast case (x < 2) that
            # began is saved: nothing can finish now. Dask may queue case 1 behind a slow
            # case on one worker, so how many fast cases finished is read, not assumed.
            saved = len(list(cases_dir.glob("*.pkl"))) if cases_dir.is_dir() else 0
            if slow_cases_started(box, n0) >= 2 and saved == fast_cases_started(box, n0):
                break
            time.sleep(0.05)
        saved_at_interrupt.append(saved)
        box.kernel.interrupt()

    th = threading.Thread(target=interrupt_when_the_rest_sleep, daemon=True)
    th.start()
    res = run(box, "df = ensemble(napping, [{'x': i} for i in range(6)], name='napping')")
    th.join(60)
    assert not th.is_alive()
    assert res.status == "interrupted", res.model_text()[-3000:]
    text = res.model_text()
    k = saved_at_interrupt[0]
    assert 1 <= k <= 2, text  # case 0 is first in line, so at least it finished
    assert re.search(rf"^ensemble 'napping' INTERRUPTED: 6 cases: {k} ok, 0 failed, "
                     rf"{6 - k} cancelled", text, re.M), text
    assert "EnsembleInterrupted" in text and "run the same call again to resume" in text
    assert "note: stopped 2 worker processes still running cancelled cases" in text
    slow_flag.unlink()

    res = run(box, f"""
part = ensemble.last
_cluster.local_engine(2)
_deadline = time.monotonic() + 60  # wait (not a timing assertion) for the fresh workers
while time.monotonic() < _deadline and (len(worker_pids()) != 2
                                        or set(worker_pids()) & set({before!r})):
    time.sleep(0.1)
n0 = n_calls()
df = ensemble(napping, [{{'x': i}} for i in range(6)], name='napping')
say(status=part.status.tolist(), pids=worker_pids(), cached=df.cached.tolist(),
    ok=df.status.tolist(), y=df.y.tolist(), ran=n_calls() - n0,
    csv_rows=len(open(os.path.join(os.environ["SIMAGENT_SESSION_DIR"],
                                   "ensembles/napping/results.csv")).read().splitlines()) - 1)
""")
    assert res.ok, res.model_text()[-3000:]
    out = loads(res)
    assert out["status"] == ["ok"] * k + ["cancelled"] * (6 - k)
    assert len(out["pids"]) == 2 and not set(out["pids"]) & set(before)  # killed, replaced
    assert out["cached"] == [True] * k + [False] * (6 - k) and out["ran"] == 6 - k  # resumed
    assert out["ok"] == ["ok"] * 6 and out["y"] == [x * x for x in range(6)]
    assert out["csv_rows"] == 6


# real, not slow: the module's kernel (box) is made by whichever of its tests in the
# slow+real pool runs first on a worker; with every one of them real, it is a process
@pytest.mark.real
def test_an_error_of_the_sweep_itself_stops_its_cases(box, slow_flag):
    """Not a case's error: the kernel side fails mid-sweep (here the cache raises)."""
    before = loads(run(box, "say(pids=worker_pids())"))["pids"]
    res = run(box, """
from simagent.kernel_api.cache import CaseCache
_save = CaseCache.save
def _started_slow():
    return sum(int(x) >= 2 for x in open(CALLS).read().split()[n0:])
def _broken(self, key, record):
    _deadline = time.monotonic() + 60  # a bound: fail once both workers are in slow cases
    while _started_slow() < 2 and time.monotonic() < _deadline:
        time.sleep(0.05)
    raise RuntimeError("cache broke")
CaseCache.save = _broken
ensemble.last = "stale"
n0 = n_calls()
try:
    ensemble(napping, [{"x": i} for i in range(8)], name="broken")
finally:
    CaseCache.save = _save
""")
    assert res.status == "error" and "cache broke" in res.error.evalue
    assert "note: stopped 2 worker processes still running cancelled cases" in res.model_text()
    slow_flag.unlink()
    res = run(box, f"""
_cluster.local_engine(2)
_deadline = time.monotonic() + 60  # wait (not a timing assertion) for the fresh workers
while time.monotonic() < _deadline and (len(worker_pids()) != 2
                                        or set(worker_pids()) & set({before!r})):
    time.sleep(0.1)
say(last=ensemble.last, ran=n_calls() - n0, pids=worker_pids())
""")
    out = loads(res)
    assert out["last"] is None  # not the previous sweep's table
    assert out["ran"] <= 4 and not set(out["pids"]) & set(before)  # queued cases never ran


def test_a_case_calling_sys_exit_fails_alone(box):
    res = run(box, """
def leaver(x):
    import sys
    if x == 2:
        sys.exit(3)
    return {"y": x}
p0 = worker_pids()
df = ensemble(leaver, [{"x": x} for x in range(5)], name="leaver")
say(status=df.status.tolist(), error=df.error[2], same_workers=worker_pids() == p0)
""")
    assert res.ok, res.model_text()[-3000:]
    out = loads(res)
    assert out["status"] == ["ok", "ok", "error", "ok", "ok"]
    assert out["error"] == "SystemExit: 3" and out["same_workers"]


def test_the_function_is_pickled_once_per_sweep(box):
    res = run(box, """
PICKLED = []
class Payload:
    def __reduce__(self):
        PICKLED.append(1)
        return (Payload, ())
PAYLOAD = Payload()
def carries(x):
    return {"y": x, "kind": type(PAYLOAD).__name__}
df = ensemble(carries, [{"x": x} for x in range(8)], name="carries", cache=False)
say(pickled=len(PICKLED), ok=df.status.tolist(), kind=sorted(set(df.kind)))
""")
    assert res.ok, res.model_text()[-3000:]
    out = loads(res)
    assert out["ok"] == ["ok"] * 8 and out["kind"] == ["Payload"]
    assert out["pickled"] <= 2  # the identity hash and the one shipped copy, not 8 more


@pytest.mark.real
def test_an_edited_workspace_module_runs_again(box):
    for mod in ("wsmod", "wsinner"):
        (box.ws / f"{mod}.py").write_text("def g(x):\n    return x + 1\n")
    res = run(box, """
import importlib, wsmod
def via_global(x):
    return {"y": wsmod.g(x)}
def via_import(x):
    import wsinner
    return {"y": wsinner.g(x)}
a = ensemble(via_global, [{"x": 1}, {"x": 2}], name="wsmod")
b = ensemble(via_import, [{"x": 1}, {"x": 2}], name="wsinner")
say(a=a.y.tolist(), b=b.y.tolist())
""")
    assert res.ok, res.model_text()[-3000:]
    assert loads(res) == {"a": [2, 3], "b": [2, 3]}
    for mod in ("wsmod", "wsinner"):  # edited; only wsmod is reloaded in the kernel
        (box.ws / f"{mod}.py").write_text("def g(x):\n    return x + 100\n")
    res = run(box, """
importlib.reload(wsmod)
a = ensemble(via_global, [{"x": 1}, {"x": 2}], name="wsmod")
b = ensemble(via_import, [{"x": 1}, {"x": 2}], name="wsinner")
c = ensemble(via_import, [{"x": 1}, {"x": 2}], name="wsinner-uncached", cache=False)
say(y=[a.y.tolist(), b.y.tolist(), c.y.tolist()],
    cached=bool(a.cached.any() or b.cached.any()))
""")
    assert res.ok, res.model_text()[-3000:]
    out = loads(res)
    assert out["y"] == [[101, 102]] * 3 and out["cached"] is False


def test_a_function_that_cannot_reach_the_workers_fails_at_once_with_advice(box):
    res = run(box, """
import threading
LOCK = threading.Lock()
def locked(x):
    with LOCK:
        return x
ensemble(locked, [{"x": 1}], name="locked")
""")
    assert res.status == "error"
    assert "cannot be sent to the workers" in res.error.evalue
    assert "inside it" in res.error.evalue


# ------------------------------------------------------------- external scheduler
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def external(tmp_path_factory):
    """``dask scheduler`` and one ``dask worker`` (no nanny: its pid runs the cases)."""
    dask = str(Path(sys.executable).parent / "dask")
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    log_path = tmp_path_factory.mktemp("dask") / "dask.log"
    with open(log_path, "wb") as log:
        common = {"stdout": log, "stderr": log, "start_new_session": True}
        procs = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port",
                                   str(port), "--dashboard-address",
                                   f"127.0.0.1:{_free_port()}"], **common)]
        procs.append(subprocess.Popen([dask, "worker", address, "--nthreads", "1",
                                       "--no-nanny", "--host", "127.0.0.1", "--no-dashboard"],
                                      **common))
        try:
            yield address, procs[1].pid
        finally:
            for p in reversed(procs):
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in reversed(procs):
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=30)
    assert all(p.poll() is not None for p in procs)


@pytest.mark.real
def test_an_external_scheduler_runs_the_same_study(box, external):
    address, worker_pid = external
    # a workspace module the external worker cannot import: it travels by value
    (box.ws / "extmod.py").write_text("def shift(v):\n    return v + 0.5\n")
    res = run(box, f"""
import extmod
def shifted(a):
    return {{"v": extmod.shift(a)}}
remote = ensemble(shifted, [{{"a": 1}}, {{"a": 2}}], scheduler={address!r})
say(v=remote.v.tolist(), status=remote.status.tolist())
""")
    assert res.ok, res.model_text()[-3000:]
    assert loads(res) == {"v": [1.5, 2.5], "status": ["ok", "ok"]}
    # a scheduler reached without TLS: one line in the cell's output, once per connection
    warned = [ln for ln in res.stdout.splitlines() if "is not tls://" in ln]
    assert warned == [f"warning: the Dask scheduler {address} is not tls://: anyone who can "
                      "reach it can run code as its workers' user, and cases and results "
                      "travel unencrypted (Dask's TLS: a tls:// address with "
                      "distributed.comm.tls certificates)"], res.stdout
    res = run(box, f"""
cases = [{{"a": a, "b": 1}} for a in range(6)]
ext = ensemble(poly, cases, scheduler={address!r}, name="external")
os.environ["SIMAGENT_DASK_SCHEDULER"] = {address!r}
try:
    env = ensemble(poly, cases, cache=False, name="external-env")
finally:
    os.environ["SIMAGENT_DASK_SCHEDULER"] = ""
say(pids=sorted(set(ext.pid) | set(env.pid)),
    equal=ext.v.tolist() == [poly(**c)["v"] for c in cases],
    ok=int((ext.status == "ok").sum() + (env.status == "ok").sum()))
_cluster.close_all()
""")
    assert res.ok, res.model_text()[-3000:]
    out = loads(res)
    assert out["pids"] == [worker_pid]  # every case ran on the external worker
    assert out["equal"] and out["ok"] == 12
    assert f"on 1 worker ({address})" in res.model_text()


# ------------------------------------------------------------------ human channel
@pytest.mark.slow
def test_headless_run_shows_human_notices_on_stderr_not_to_the_model(workspace, tmp_path):
    steps = [{"tool": "run_python", "args": {"code": (
        "from simagent.kernel_api import notify_human\n"
        "notify_human('watch it at http://127.0.0.1:1/status')\nprint('for the model')")}},
        {"final": "saw: {out[-1]}"}]
    script = tmp_path / "steps.json"
    script.write_text(json.dumps(steps))
    env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_MODEL"}
    proc = cli_fork.run([sys.executable, "-m", "simagent", "run", "--model",
                         f"scripted:{script}", "--json", "go"], cwd=workspace, env=env,
                        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "  ↳ watch it at http://127.0.0.1:1/status" in proc.stderr.splitlines()
    data = json.loads(proc.stdout)
    assert data["final"] == "saw: for the model"
    import sqlite3

    db = sqlite3.connect(data["trace_path"])
    rows = {k: [json.loads(p) for (p,) in db.execute(
        "SELECT payload FROM events WHERE kind = ?", (k,))] for k in ("tool_result",
                                                                    "kernel_exec")}
    db.close()
    assert all("127.0.0.1:1" not in r["content"] for r in rows["tool_result"])
    assert [r.get("human") for r in rows["kernel_exec"] if not r.get("warmup")] == [
        ["watch it at http://127.0.0.1:1/status"]]
    md = cli_fork.run([sys.executable, "-m", "simagent", "transcript", data["session_id"]],
                      cwd=workspace, env=env, capture_output=True, text=True, timeout=60)
    assert "shown to the user: watch it at http://127.0.0.1:1/status" in md.stdout, md.stderr


# -------------------------------------------------------------------------- bench
@pytest.mark.real  # its cluster's workers are the kernel's children: in memory, ours, left
def test_bench_ensemble_reports_speedup_and_overhead():
    from simagent.bench.ensemble_bench import run_ensemble_bench

    out = run_ensemble_bench(cases=4, seconds=0.05, workers=2, rounds=1)
    assert set(out) >= {"speedup", "overhead_s", "serial_wall_s", "ensemble_wall_s",
                        "cluster_start_s", "cases", "workers"}
    assert out["cases"] == 4 and out["workers"] == 2 and out["results_match"] is True
    assert out["speedup"] > 0 and out["serial_wall_s"] > 0 and out["ensemble_wall_s"] > 0
