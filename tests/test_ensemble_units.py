"""The pure parts of ensembles: cache keys, cache files, tables, summaries, config, the
human-only output channel and the portable case runner. No cluster, no kernel."""

from __future__ import annotations

import functools
import io
import json
import os
import pickle
import signal
import subprocess
import sys

import cli_fork
import pytest
from conftest import write_config

from simagent.agent.events import ToolOutput
from simagent.agent.prompts import RuntimeContext, runtime_section
from simagent.config import SCHEDULER_ENV, WORKERS_ENV, Config, ConfigError
from simagent.headless import StreamPrinter
from simagent.kernel import HUMAN_MIME
from simagent.kernel.capture import Capture
from simagent.kernel_api.cache import CaseCache
from simagent.kernel_api.case_runner import portable_runner, run_case
from simagent.kernel_api.cases import (
    case_key,
    normalize_cases,
    result_columns,
    safe_name,
    table_rows,
)
from simagent.kernel_api.identity import Uncacheable, function_key, identify
from simagent.kernel_api.sweep_summary import detail_lines, stats_of, summary_line
from simagent.paths import SESSION_DIR_ENV, SessionPaths

# ------------------------------------------------------------------------ cache keys
SCALE = 2.0


def scaled(x):
    return {"y": SCALE * x}


def test_case_key_ignores_key_order_and_sees_values():
    fk = function_key(scaled)
    assert case_key(fk, {"a": 1, "b": 2.5}) == case_key(fk, {"b": 2.5, "a": 1})
    assert case_key(fk, {"a": 1, "b": 2.5}) != case_key(fk, {"a": 1, "b": 2.6})
    assert case_key(fk, {"a": 1}) != case_key(function_key(safe_name), {"a": 1})


def test_case_key_treats_numpy_scalars_like_python_numbers():
    np = pytest.importorskip("numpy")
    fk = function_key(scaled)
    assert case_key(fk, {"n": np.int64(3), "x": np.float64(0.5)}) == \
        case_key(fk, {"n": 3, "x": 0.5})


def _make(src: str, env: dict | None = None):
    ns: dict = dict(env or {})
    exec(compile(src, "<cell>", "exec"), ns)
    return ns["f"]


def test_function_key_changes_with_the_code_and_what_it_reads():
    base = _make("def f(x):\n    return x + K\n", {"K": 1})
    assert function_key(base) == function_key(_make("def f(x):\n    return x + K\n", {"K": 1}))
    assert function_key(base) != function_key(_make("def f(x):\n    return x - K\n", {"K": 1}))
    # a plain global it reads, a default, a closure value, a helper's code
    assert function_key(base) != function_key(_make("def f(x):\n    return x + K\n", {"K": 2}))
    assert function_key(_make("def f(x, k=1):\n    return x\n")) != \
        function_key(_make("def f(x, k=2):\n    return x\n"))
    c1 = _make("def g(k):\n    def f(x):\n        return k * x\n    return f\nf = g(1)\n")
    c2 = _make("def g(k):\n    def f(x):\n        return k * x\n    return f\nf = g(2)\n")
    assert function_key(c1) != function_key(c2)
    h1 = _make("def h(x):\n    return x\ndef f(x):\n    return h(x)\n")
    h2 = _make("def h(x):\n    return -x\ndef f(x):\n    return h(x)\n")
    assert function_key(h1) != function_key(h2)
    assert function_key(functools.partial(scaled, 1)) != function_key(
        functools.partial(scaled, 2))


def test_function_key_survives_recursion_and_refuses_what_it_cannot_hash():
    rec = _make("def f(n):\n    return 1 if n < 1 else f(n - 1)\n")
    assert function_key(rec) == function_key(rec)
    locked = _make("import threading\nLOCK = threading.Lock()\n"
                   "def f(n):\n    with LOCK:\n        return n\n")
    with pytest.raises(Uncacheable, match=r"LOCK holds a _thread\.lock that cannot be pickled"):
        function_key(locked)
    assert identify(locked).key is None  # uncacheable, never keyed by the type alone


def test_cases_must_be_dicts_of_argument_names():
    assert normalize_cases(({"a": 1}, {"a": 2})) == [{"a": 1}, {"a": 2}]
    with pytest.raises(TypeError, match="list of dicts"):
        normalize_cases({"a": 1})
    with pytest.raises(TypeError, match="case 1 is a int"):
        normalize_cases([{"a": 1}, 5])
    with pytest.raises(TypeError, match="valid argument names"):
        normalize_cases([{"not a name": 1}])
    for meta in ("status", "error", "elapsed_s", "attempts", "cached"):
        with pytest.raises(ValueError, match=f"case 1: parameter name '{meta}' is reserved"):
            normalize_cases([{"a": 1}, {"a": 2, meta: 0}])
    assert safe_name("<lambda>") == "lambda" and safe_name("a/b c") == "a_b_c"


# --------------------------------------------------------------------------- tables
def test_result_columns_from_mappings_and_scalars():
    assert result_columns({"y": 1, "x": 2}, ["x"]) == {"y": 1, "result_x": 2}
    assert result_columns({"status": "mine"}, []) == {"result_status": "mine"}
    assert result_columns(3.5, ["x"]) == {"result": 3.5}


def test_table_rows_put_parameters_results_and_meta_in_order():
    cases = [{"a": 1}, {"a": 2}, {"a": 3, "b": 0}]
    records = [{"status": "ok", "result": {"y": 10}, "elapsed_s": 0.5, "attempts": 1},
               {"status": "error", "error": "ValueError: no", "elapsed_s": 0.1, "attempts": 2},
               {"status": "cancelled", "attempts": 0}]
    columns, rows = table_rows(cases, records)
    assert columns == ["a", "b", "y", "status", "error", "elapsed_s", "attempts", "cached"]
    assert rows[0]["y"] == 10 and rows[0]["status"] == "ok" and rows[0]["cached"] is False
    assert "y" not in rows[1] and rows[1]["error"] == "ValueError: no"
    assert rows[2]["status"] == "cancelled" and rows[2]["b"] == 0


def test_summary_counts_speed_and_interrupt():
    rows = [{"status": "ok", "cached": False, "elapsed_s": 2.0},
            {"status": "ok", "cached": True, "elapsed_s": 9.0},
            {"status": "error", "cached": False, "elapsed_s": 1.0},
            {"status": "cancelled", "cached": False, "elapsed_s": None}]
    st = stats_of("sweep", rows, wall_s=1.5, workers=2, engine="local cluster",
                  interrupted=True)
    assert (st.ok, st.failed, st.cancelled, st.cached, st.case_s) == (2, 1, 1, 1, 3.0)
    line = summary_line(st)
    assert line.startswith("ensemble 'sweep' INTERRUPTED: 4 cases: 2 ok, 1 failed, "
                           "1 cancelled (1 from cache)")
    assert "on 2 workers (local cluster)" in line and "speed-up 2.00x" in line
    assert "\n" not in line
    details = detail_lines(st, ["/s/ensembles/sweep/results.csv", "/s/ensembles/sweep/r.pq"],
                           7, [({"a": 1}, "ValueError: no")], "/s/errors.txt")
    assert details[0] == "table: /s/ensembles/sweep/results.csv + r.pq (4 rows x 7 columns)"
    assert details[1] == "first failure: a=1 -> ValueError: no; tracebacks: /s/errors.txt"
    assert "run the same call again to resume" in details[2]
    all_cached = stats_of("s", [rows[1]], 0.0, 0, "cache")
    assert summary_line(all_cached).endswith("nothing to run")


# ---------------------------------------------------------------------------- cache
def test_cache_round_trip_and_atomic_files(tmp_path):
    cache = CaseCache(tmp_path / "cases")
    assert cache.load("k1") is None
    assert cache.save("k1", {"status": "ok", "result": {"y": [1, 2]}})
    assert cache.load("k1") == {"status": "ok", "result": {"y": [1, 2]}}
    # a write killed before its rename leaves only a temporary file: not an entry
    (tmp_path / "cases" / ".tmp-dead").write_bytes(b"\x80partial")
    assert cache.keys() == {"k1"}
    cache.clean_temporary()
    assert sorted(p.name for p in (tmp_path / "cases").iterdir()) == ["k1.pkl"]
    # a foreign or corrupt file is a miss and goes away
    cache.path("bad").write_bytes(b"not a pickle")
    assert cache.load("bad") is None and not cache.path("bad").exists()
    # failures are never served from the cache; unpicklable records are not stored
    cache.path("err").write_bytes(pickle.dumps({"status": "error"}))
    assert cache.load("err") is None
    assert cache.save("lam", {"status": "ok", "result": lambda: 1}) is False
    assert not cache.path("lam").exists()


def test_cache_save_reports_a_full_disk_instead_of_raising(tmp_path, monkeypatch):
    import errno

    from simagent.kernel_api import cache as cache_mod

    def full(*_a):
        raise OSError(errno.ENOSPC, "No space left on device")

    cache = CaseCache(tmp_path / "cases")
    monkeypatch.setattr(cache_mod.os, "replace", full)
    assert cache.save("k", {"status": "ok", "result": 1}) is False
    assert cache.save("k2", {"status": "ok", "result": 2}) is False
    monkeypatch.undo()
    assert cache.save("lam", {"status": "ok", "result": lambda: 1}) is False
    assert list((tmp_path / "cases").iterdir()) == []  # no temporary file left behind
    note = cache.note()
    assert note.startswith("note: 3 results not cached (")
    assert "2 x OSError: No space left on device" in note
    assert "1 x the result cannot be pickled" in note


def _cached_sweep(tmp_path, monkeypatch, fn, cases, name="pre"):
    """A sweep whose cases are all in the cache already: runs without any cluster."""
    from simagent.kernel_api.cases import case_key as ck

    monkeypatch.setenv(SESSION_DIR_ENV, str(tmp_path / "session"))
    store = CaseCache(tmp_path / "session" / "ensembles" / name / "cases")
    for case in cases:
        store.save(ck(function_key(fn), case), {"status": "ok", "result": {"y": 1},
                                                "elapsed_s": 0.1, "attempts": 1, "case": case})
    return tmp_path / "session" / "ensembles" / name


def test_unwritable_results_are_a_note_and_the_table_is_still_returned(
        tmp_path, monkeypatch, capsys):
    from simagent.kernel_api import ensemble

    folder = _cached_sweep(tmp_path, monkeypatch, scaled, [{"x": 1}, {"x": 2}])
    (folder / "results.csv").mkdir(parents=True)  # writing the CSV now fails
    ensemble.last = None
    df = ensemble(scaled, [{"x": 1}, {"x": 2}], name="pre")
    assert ensemble.last is df and df.cached.tolist() == [True, True]
    out = capsys.readouterr().out
    assert "2 cases: 2 ok, 0 failed (2 from cache); nothing to run" in out
    assert "table: not saved; `ensemble.last` (2 rows" in out
    assert "note: could not write the sweep's files" in out and "IsADirectoryError" in out


def test_a_stored_record_of_another_case_is_a_miss(tmp_path):
    from simagent.kernel_api.ensemble import cached_records

    store = CaseCache(tmp_path / "cases")
    store.save("k1", {"status": "ok", "result": 1, "case": {"x": 1}})
    store.save("k2", {"status": "ok", "result": 2, "case": {"x": 999}})  # a collision
    hits = cached_records(store, ["k1", "k2", None], [{"x": 1}, {"x": 2}, {"x": 3}])
    assert hits[0]["result"] == 1 and hits[0]["cached"] is True
    assert hits[1] is None and hits[2] is None


def test_a_derived_folder_name_tells_functions_apart(tmp_path, monkeypatch):
    from simagent.kernel_api.ensemble import sweep_folder

    monkeypatch.setenv(SESSION_DIR_ENV, str(tmp_path))
    run_a = _make("def run(x):\n    return x\nf = run\n")
    run_b = _make("def run(x):\n    return -x\nf = run\n")
    label_a, folder_a = sweep_folder(run_a, None, function_key(run_a))
    label_b, folder_b = sweep_folder(run_b, None, function_key(run_b))
    assert label_a == label_b == "run" and folder_a != folder_b
    assert folder_a.name == f"run-{function_key(run_a)[:8]}"
    assert sweep_folder(run_a, "mine", function_key(run_a))[1].name == "mine"


def test_missing_packages_fail_before_any_case_runs(monkeypatch):
    from simagent.kernel_api import cluster, ensemble

    monkeypatch.setitem(sys.modules, "pandas", None)
    monkeypatch.setitem(sys.modules, "tqdm", None)
    with pytest.raises(ImportError, match=r"needs pandas, tqdm .* -m pip install pandas tqdm"):
        ensemble(scaled, [{"x": 1}])
    assert cluster._local is None  # no cluster was started for it


# ---------------------------------------------------------------------------- runner
def test_run_case_records_errors_and_retries():
    calls = []

    def flaky(x):
        calls.append(x)
        if len(calls) < 2:
            raise RuntimeError("transient\nfailure")
        return x * 2

    ok = run_case(flaky, {"x": 4}, retries=1)
    assert ok["status"] == "ok" and ok["result"] == 8 and ok["attempts"] == 2
    calls.clear()
    bad = run_case(flaky, {"x": 4}, retries=0)
    assert bad["status"] == "error" and bad["error"] == "RuntimeError: transient failure"
    assert "Traceback" in bad["traceback"] and bad["attempts"] == 1


def test_run_case_records_sys_exit_as_the_case_error():
    def leaves(x):
        sys.exit(x)

    rec = run_case(leaves, {"x": 3}, retries=1)
    assert rec["status"] == "error" and rec["error"] == "SystemExit: 3"
    assert rec["attempts"] == 2


def test_run_case_loads_a_pickled_function():
    import cloudpickle

    rec = run_case(cloudpickle.dumps(lambda x: x + 1), {"x": 1}, 0)
    assert rec["status"] == "ok" and rec["result"] == 2


def test_the_portable_runner_does_not_need_simagent_on_the_worker():
    from distributed.protocol.pickle import dumps

    blob = dumps((portable_runner(), dict, {"a": 1}))
    assert b"simagent.kernel_api" not in blob
    probe = ("import pickle, sys\n"
             "sys.modules['simagent'] = None  # any import of simagent now fails\n"
             "runner, fn, case = pickle.loads(sys.stdin.buffer.read())\n"
             "print(runner(fn, case, 0)['result'])\n")
    out = subprocess.run([sys.executable, "-c", probe], input=blob, capture_output=True,
                         check=True, timeout=120)
    assert out.stdout.decode().strip() == "{'a': 1}"


# ------------------------------------------------------------------------- interrupt
class _FakeFuture:
    def __init__(self, key, status, result=None, error=None):
        self.key, self.status, self._result, self._error = key, status, result, error

    def result(self, timeout=None):
        if self._error is not None:
            raise self._error
        return self._result

    def done(self):
        return self.status in ("finished", "error", "cancelled")


class _FakeClient:
    def __init__(self, processing):
        self._processing = processing
        self.cancelled: list = []

    def processing(self):
        return self._processing

    def cancel(self, futures):
        self.cancelled += [f.key for f in futures]
        for f in futures:
            f.status = "cancelled"


def test_after_an_interrupt_failed_futures_are_errors_and_running_ones_are_located(tmp_path):
    from simagent.kernel_api.ensemble import after_interrupt

    class KilledWorker(Exception):  # as distributed raises it, without a real worker
        pass

    futures = {_FakeFuture("s-0", "finished", {"status": "ok", "result": 1}): 0,
               _FakeFuture("s-1", "error", error=KilledWorker("s-1 lost its worker")): 1,
               _FakeFuture("s-2", "pending"): 2, _FakeFuture("s-3", "pending"): 3}
    client = _FakeClient({"tcp://w1": ("s-2", "other"), "tcp://w2": ()})
    records: list = [None] * 4
    store = CaseCache(tmp_path / "cases")
    cases = [{"x": i} for i in range(4)]
    running = after_interrupt(client, futures, records, ["k0", "k1", "k2", "k3"], cases, store)
    assert running == {"tcp://w1": 1}
    assert sorted(client.cancelled) == ["s-2", "s-3"]  # only what had not finished
    assert records[0]["status"] == "ok" and store.keys() == {"k0"}
    assert records[1]["status"] == "error" and "KilledWorker" in records[1]["error"]
    assert records[2] is None and records[3] is None  # cancelled


def test_cases_running_on_an_external_cluster_are_reported_not_killed(capsys, monkeypatch):
    from simagent.kernel_api.ensemble import _stop_running

    ensemble_mod = sys.modules[_stop_running.__module__]  # the package's name is the function

    monkeypatch.setattr(ensemble_mod, "kill_local_workers", lambda _a: pytest.fail("killed"))
    _stop_running({"tcp://w1": 2, "tcp://w2": 1}, local=False, where="tcp://hpc:8786")
    assert capsys.readouterr().out == (
        "note: 3 cancelled cases already running on tcp://hpc:8786 continue there until "
        "they finish (their results are not used)\n")


def test_the_interrupt_cleanup_ignores_further_sigints():
    from simagent.kernel_api.ensemble import SigintGuard

    before = signal.getsignal(signal.SIGINT)
    guard = SigintGuard()
    guard.ignore()
    os.kill(os.getpid(), signal.SIGINT)  # would raise KeyboardInterrupt here
    guard.restore()
    assert signal.getsignal(signal.SIGINT) is before


def test_bench_kernel_always_uses_the_local_cluster(monkeypatch):
    from simagent.bench import ensemble_bench
    from simagent.bench.ensemble_bench import run_ensemble_bench

    seen = {}

    class Stop(Exception):
        pass

    class FakeKernel:
        def __init__(self, paths, cwd=None, env=None, **kw):
            seen["env"] = env

        def start(self):
            raise Stop

    monkeypatch.setenv(SCHEDULER_ENV, "tcp://somewhere:8786")
    monkeypatch.setattr(ensemble_bench, "Kernel", FakeKernel)
    with pytest.raises(Stop):
        run_ensemble_bench(cases=1, seconds=0.01, workers=1, rounds=1)
    assert seen["env"][SCHEDULER_ENV] == ""


# ---------------------------------------------------------------------------- config
def test_scheduler_comes_from_env_then_config(tmp_path):
    ws = tmp_path / "ws"
    (ws / ".simagent").mkdir(parents=True)
    write_config(ws,
        '[ensembles]\nscheduler = "tcp://cfg:8786"\nworkers = 3\n')
    cfg = Config.load(ws)
    assert cfg.ensemble_scheduler({}) == ("tcp://cfg:8786", "config [ensembles] scheduler")
    assert cfg.ensemble_scheduler({SCHEDULER_ENV: "tcp://env:1"})[0] == "tcp://env:1"
    assert cfg.ensemble_kernel_env({}) == {SCHEDULER_ENV: "tcp://cfg:8786", WORKERS_ENV: "3"}
    assert cfg.ensemble_kernel_env({SCHEDULER_ENV: "tcp://env:1"}) == {WORKERS_ENV: "3"}
    # the environment wins for the workers too, as it does for the scheduler
    assert cfg.ensemble_kernel_env({WORKERS_ENV: "5"}) == {SCHEDULER_ENV: "tcp://cfg:8786"}
    assert Config().ensemble_scheduler({}) == (None, "unset")
    with pytest.raises(ConfigError, match="workers"):
        Config({"ensembles": {"workers": 0}}).ensemble_workers()
    with pytest.raises(ConfigError, match="scheduler"):
        Config({"ensembles": {"scheduler": 8786}}).ensemble_scheduler({})


def test_session_kernel_gets_the_cluster_and_session_folder(tmp_path, monkeypatch):
    from simagent.session import Session

    monkeypatch.delenv(SCHEDULER_ENV, raising=False)
    ws = tmp_path / "ws"
    (ws / ".simagent").mkdir(parents=True)
    write_config(ws, '[ensembles]\nscheduler = "tcp://h:1"\n')
    with Session.create(ws) as session:
        env = session.kernel._kernel_env()  # the environment the kernel is started with
        assert env[SCHEDULER_ENV] == "tcp://h:1"
        assert env[SESSION_DIR_ENV] == str(session.paths.root)
        assert SessionPaths(env[SESSION_DIR_ENV]).ensembles == session.paths.root / "ensembles"


def test_runtime_prompt_names_the_cluster_only_when_configured(tmp_path):
    ctx = dict(workspace=tmp_path, session_dir=tmp_path, artifacts_dir=tmp_path,
               outputs_dir=tmp_path, memory_dir=tmp_path, python="3.11")
    assert "Dask" not in runtime_section(RuntimeContext(**ctx))
    text = runtime_section(RuntimeContext(**ctx, cluster="tcp://hpc:8786"))
    line = next(ln for ln in text.splitlines() if "Dask" in ln)
    assert "tcp://hpc:8786" in line and "`ensembles` skill" in line


# ---------------------------------------------------------------------- human channel
def test_capture_keeps_human_notices_out_of_the_model_text(tmp_path):
    events = []
    cap = Capture(tmp_path / "raw.txt", tmp_path, "0001", events.append)
    cap.handle("stream", {"name": "stdout", "text": "for the model\n"})
    cap.handle("display_data", {"data": {HUMAN_MIME: {"text": "Dask dashboard: http://x"},
                                         "text/plain": "Dask dashboard: http://x"}})
    cap.handle("display_data", {"data": {"text/plain": "a normal display"}})
    res = cap.result("ok", 0.1)
    assert res.human == ["Dask dashboard: http://x"]
    assert [d.text for d in res.displays] == ["a normal display"]
    assert "dashboard" not in res.model_text()
    assert "dashboard" not in (tmp_path / "raw.txt").read_text()
    assert [(e.kind, e.text) for e in events if e.kind == "human"] == [
        ("human", "Dask dashboard: http://x")]


def test_stream_printer_shows_human_notices_on_stderr_only():
    out, err = io.StringIO(), io.StringIO()
    printer = StreamPrinter(out, err, stream_text=True)
    printer(ToolOutput("c1", "human", "Dask dashboard: http://x"))
    printer(ToolOutput("c1", "stdout", "model output"))
    assert err.getvalue() == "  ↳ Dask dashboard: http://x\n"
    assert out.getvalue() == ""


# ------------------------------------------------------------------------------ cli
@pytest.mark.parametrize("argv", [["--help"], ["bench", "ensemble", "--help"]])
def test_help_does_not_import_dask_or_pandas(argv):
    probe = ("import sys\nfrom simagent.cli import main\n"
             f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in ('dask', 'distributed', 'pandas', 'tqdm') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=120)
    assert "usage: simagent" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_kernel_api_import_is_light():
    probe = ("import sys, simagent.kernel_api, simagent.kernel_api.worker_setup\n"
             "print(sorted(m for m in ('dask', 'distributed', 'pandas', 'jupyter_client') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=120)
    assert json.loads(out.stdout.strip().replace("'", '"')) == []


def test_bench_ensemble_rejects_bad_arguments():
    out = cli_fork.run([sys.executable, "-m", "simagent", "bench", "ensemble", "--cases", "0"],
                       capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--cases" in out.stderr


def test_default_workers_honour_the_cpu_quota_and_the_env(monkeypatch):
    """A container or job step may use fewer cores than the host has; Dask's count
    (affinity and cgroup quota) is the one the local cluster sizes itself by."""
    import dask.system

    from simagent.config import WORKERS_ENV
    from simagent.kernel_api import cluster

    monkeypatch.delenv(WORKERS_ENV, raising=False)
    monkeypatch.setattr(dask.system, "CPU_COUNT", 3)
    assert cluster.default_workers() == 3
    monkeypatch.setenv(WORKERS_ENV, "5")
    assert cluster.default_workers() == 5
    monkeypatch.setenv(WORKERS_ENV, "zero")
    assert cluster.default_workers() == 3
