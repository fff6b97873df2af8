"""The kernel recovery ladder and replay (issue 17, item 1).

Pure tests of which cells replay, then the real ipykernel: crashes, a segfault, a cell
that ignores SIGINT, a cell blocked on a child in its own session, a SIGSTOPped (frozen)
process, a replay budget, ``/reset`` lineage and ``/restore`` in a new process. Grace
periods and budgets are small so the file stays fast.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import write_config
from waiting import joined, run_until_output

from simagent.config import Config, ConfigError
from simagent.kernel import Kernel
from simagent.kernel.ladder import Recovery
from simagent.kernel.replay import (
    ReplayBudget,
    Skip,
    budget_of,
    defines_state,
    load_records,
    select,
)
from simagent.paths import SessionPaths
from simagent.session import Session

#: the kernel process is what these tests are about (make test-real)
pytestmark = pytest.mark.real


def rec(n: int, code: str, status: str = "ok", s: float = 0.01, lineage: int = 1) -> dict:
    return {"n": n, "code": code, "status": status, "elapsed_s": s, "lineage": lineage}


# ------------------------------------------------------------------ pure selection
def test_display_only_cells_are_skipped_and_defining_cells_kept_in_order() -> None:
    shows = ["print(x)", "plt.plot(t, np.sin(t))\nplt.show()", "x", "df.head()",
             "'a' in dir()", "x.shape", "%who", "!pip install foo", "fig.savefig('a.png')", ""]
    defines = ["x = 1", "import math", "def f():\n    return 1", "class A:\n    pass",
               "sim.solve()", "np.random.seed(0)", "%run setup.py", "print((y := 3))",
               "for i in range(3):\n    print(i)", "x = !ls", "lst.pop() + 1"]
    for code in shows:
        assert not defines_state(code), code
    for code in defines:
        assert defines_state(code), code
    records = [rec(i + 1, c) for i, c in enumerate(shows + defines)]
    plan = select(reversed(records))  # order comes from n, not the input
    assert [c.code for c in plan.run] == defines
    assert {s.kind for s in plan.skipped} == {"display"} and not plan.listed


def test_failed_cells_are_skipped_and_not_listed() -> None:
    plan = select([rec(1, "x = 1"), rec(2, "y = 1 / 0", "error"),
                   rec(3, "import os; os._exit(1)", "died"), rec(4, "z = 2", "interrupted")])
    assert [c.n for c in plan.run] == [1]
    assert [(s.n, s.kind) for s in plan.skipped] == [(2, "failed"), (3, "failed"),
                                                      (4, "failed")]
    assert plan.listed == []


def test_over_budget_cells_are_listed_with_number_line_seconds_and_why() -> None:
    budget = ReplayBudget(cell_s=60, total_s=100)
    plan = select([rec(1, "a = 1", s=10), rec(2, "big = simulate()\nmore()", s=75),
                   rec(3, "b = 2", s=50), rec(4, "c = 3", s=45), rec(5, "d = 4", s=1)],
                  budget)
    assert [c.n for c in plan.run] == [1, 3]  # 10 + 50; 45 more would pass 100
    listed = {s.n: s for s in plan.listed}
    assert set(listed) == {2, 4, 5}  # replay stops once the total would be passed
    assert listed[2].line == "big = simulate()" and listed[2].seconds == 75
    assert "60 s per-cell" in listed[2].why and listed[2].kind == "too-slow"
    assert "100 s total" in listed[4].why and listed[5].kind == "over-budget"
    off = select([rec(1, "a = 1")], ReplayBudget(enabled=False))
    assert off.run == [] and [s.kind for s in off.listed] == ["off"]


def test_only_the_current_lineage_replays() -> None:
    records = [rec(1, "a = 1", lineage=1), rec(2, "b = 2", lineage=1),
               rec(3, "c = 3", lineage=2), {"n": 4, "code": "old = 1", "status": "ok"}]
    assert [c.n for c in select(records, lineage=2).run] == [3]
    assert [c.n for c in select(records, lineage=1).run] == [1, 2]
    assert [c.n for c in select(records[:3]).run] == [3]  # None: the last record's
    assert select(records, lineage=None).run == []  # the last has no lineage: nothing


def test_config_kernel_table_sets_the_budget(workspace: Path) -> None:
    cfg = Config({"kernel": {"replay_cell_s": 5, "replay_total_s": 20.5}})
    assert budget_of(cfg) == ReplayBudget(cell_s=5.0, total_s=20.5)
    assert budget_of(Config()) == ReplayBudget()
    assert budget_of(Config({"kernel": {"replay": False}})).enabled is False
    with pytest.raises(ConfigError, match="replay_cell_s"):
        budget_of(Config({"kernel": {"replay_cell_s": "long"}}))


def test_a_bad_replay_key_names_the_file_that_set_it(workspace: Path, _state_home: Path
                                                    ) -> None:
    """The two files' [kernel] tables merge: the line names the one holding the bad key."""
    user = _state_home / "config.toml"
    user.write_text("[kernel]\nreplay = false\n")
    ws = write_config(workspace, '[kernel]\nreplay_total_s = "long"\n')
    with pytest.raises(ConfigError) as err:
        budget_of(Config.load(workspace))
    assert str(err.value) == f"{ws}: [kernel] replay_total_s must be a number of seconds >= 0"
    user.write_text('[kernel]\nreplay = "yes"\n')
    ws.write_text("[kernel]\nreplay_total_s = 9\n")
    with pytest.raises(ConfigError) as err:
        budget_of(Config.load(workspace, trust=True))
    assert str(err.value) == f"{user}: [kernel] replay must be true or false"


def test_the_message_names_what_came_back_and_what_did_not() -> None:
    r = Recovery("died", "the kernel was killed by SIGSEGV", restarted=True, restart_s=0.6,
                 replayed=[1, 3], names=["x", "math"],
                 skipped=[Skip(2, "big = simulate()", 75.0, "too-slow", "it took 75.0 s"),
                          Skip(4, "print(x)", 0.0, "display", "it only showed output")],
                 failed=[{"n": 5, "line": "y = big * 2", "error": "NameError: big"}])
    text = r.message()
    assert text.startswith("the kernel was killed by SIGSEGV; the kernel was restarted")
    assert "_out[1], _out[3]" in text and "names back: x, math" in text
    assert "_out[2] `big = simulate()` (75.0 s" in text and "_out[4]" not in text
    assert "failed when replayed: _out[5]" in text and "partly restored" in text
    assert not r.state_restored
    d = r.to_dict()
    assert d["state_restored"] is False and [s["n"] for s in d["skipped"]] == [2]


# --------------------------------------------------------------------- real kernel
@pytest.fixture
def kernel(session_paths: SessionPaths, workspace: Path) -> Iterator[Kernel]:
    with Kernel(session_paths, cwd=workspace, interrupt_grace_s=1.2,
                heartbeat_grace_s=1.0) as k:
        yield k


def _define(kernel: Kernel) -> None:
    assert kernel.execute("x = 41\nimport math").ok
    assert kernel.execute("print(x)").ok  # display only: not replayed
    assert kernel.execute("1 / 0").status == "error"  # failed: not replayed


def _assert_back(kernel: Kernel, r, trigger: str) -> None:
    assert r.ok and r.value == "42", r.notice
    assert not r.state_lost
    assert "restarted" in r.notice and "names back: x, math" in r.notice
    assert "earlier state is restored" in r.notice and "_out[1]" in r.notice
    assert r.recovery is not None and r.recovery["trigger"] == trigger
    assert r.recovery["replayed"] == [1] and r.recovery["state_restored"]
    assert r.recovery["survived"] and r.recovery["seconds"] > 0
    assert kernel.last_recovery is not None and kernel.last_recovery.trigger == trigger


def test_a_crash_is_recovered_at_the_next_execute_with_state_replayed(kernel: Kernel) -> None:
    _define(kernel)
    died = kernel.execute("import os\nos._exit(1)")
    assert died.status == "died" and died.state_lost and "exited with code 1" in died.notice
    r = kernel.execute("x + 1")
    _assert_back(kernel, r, "died")
    assert "exited with code 1" in r.notice
    # replay took no _out numbers: this was execution 5, its raw output is 0005.txt
    assert kernel.executions == 5 and r.raw_path is not None and r.raw_path.name == "0005.txt"
    assert [rec["n"] for rec in load_records(kernel.paths.outputs)] == [1, 2, 3, 4, 5]


def test_a_segfault_is_recovered_likewise(kernel: Kernel) -> None:
    _define(kernel)
    assert kernel.execute("import ctypes\nctypes.string_at(0)").status == "died"
    r = kernel.execute("x + 1")
    _assert_back(kernel, r, "died")
    assert "SIGSEGV" in r.notice
    from simagent.kernel.snapshot import kernel_part

    assert kernel_part(kernel)["replayed"] == {"cells": 1, "restored": True}
    kernel.restart()  # /reset: the state card must not claim a replay any more
    assert kernel.last_recovery is None and "replayed" not in kernel_part(kernel)


def test_a_cell_ignoring_sigint_climbs_the_ladder_and_state_comes_back(kernel: Kernel) -> None:
    _define(kernel)
    r = kernel.execute("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                       "time.sleep(60)", timeout=0.3)
    assert r.status == "timeout" and not r.state_lost, r.notice
    assert r.recovery is not None and r.recovery["trigger"] == "unresponsive"
    steps = [s["step"] for s in r.recovery["steps"]]
    assert steps == ["sigint", "control_interrupt", "term_children", "kill_children"]
    assert r.recovery["steps"][1]["reply"] == "ok"  # the control thread answered...
    assert "names back: x, math" in r.notice  # ...but only the restart stopped the cell
    assert r.recovery["restarted"] and r.elapsed_s >= kernel.interrupt_grace_s
    assert kernel.execute("x + 1").value == "42"


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid(1)")
def test_a_cell_blocked_on_a_child_in_its_own_session_is_freed_without_a_restart(
        kernel: Kernel) -> None:
    """os.system ignores SIGINT while it waits, and its child in a new session never
    sees the group's SIGINT; signalling the kernel's children frees the cell."""
    _define(kernel)
    generation = kernel.generation
    r = kernel.execute("import os\nrc = os.system('setsid sleep 100')", timeout=0.2)
    assert r.status == "timeout" and not r.state_lost
    assert r.recovery is not None and r.recovery["trigger"] == "interrupt"
    assert not r.recovery["restarted"] and r.recovery["steps"][-1]["step"] == "term_children"
    assert r.recovery["steps"][-1]["processes"] >= 1
    assert "stopped only after SIGTERM to its child processes" in r.notice
    assert kernel.generation == generation  # same process, state kept
    assert kernel.execute("x, rc != 0").value == "(41, True)"


def test_a_sigstopped_kernel_is_found_by_its_heartbeat_and_recovered(kernel: Kernel) -> None:
    _define(kernel)
    assert kernel.heartbeat_ok()
    os.kill(kernel.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while kernel.heartbeat_ok() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not kernel.heartbeat_ok() and kernel.is_alive()  # the process exists, frozen
    r = kernel.execute("x + 1")
    _assert_back(kernel, r, "frozen")
    assert "no heartbeat" in r.notice


def test_a_kernel_frozen_mid_cell_is_reported_then_recovered(kernel: Kernel) -> None:
    _define(kernel)
    th, box = run_until_output(
        kernel, "import time\nprint('running', flush=True)\ntime.sleep(30)", "running")
    os.kill(kernel.pid, signal.SIGSTOP)
    died = joined(th, box)  # a stopped kernel never ends the cell: only the heartbeat can
    assert died.status == "died" and "heartbeat" in died.notice
    assert died.elapsed_s >= kernel.heartbeat_grace_s
    _assert_back(kernel, kernel.execute("x + 1"), "frozen")


def test_a_slow_defining_cell_over_the_budget_is_listed_not_replayed(
        session_paths: SessionPaths, workspace: Path) -> None:
    with Kernel(session_paths, cwd=workspace, replay=ReplayBudget(cell_s=0.8)) as k:
        assert k.execute("fast = 1").ok
        assert k.execute("import time; time.sleep(1.0); slow = 2").ok
        assert k.execute("after = fast + 1").ok
        report = k.restore()
        assert report.replayed == [1, 3] and not report.state_restored
        assert [(s.n, s.kind) for s in report.listed] == [(2, "too-slow")]
        seconds = report.listed[0].seconds
        assert seconds >= 1.0
        text = report.message()
        assert f"_out[2] `import time; time.sleep(1.0); slow = 2` ({seconds:.1f} s" in text
        assert "0.8 s per-cell replay limit" in text and "partly restored" in text
        assert k.execute("fast, after, 'slow' in dir()").value == "(1, 2, False)"


def test_reset_starts_a_new_lineage_so_nothing_before_it_replays(workspace: Path) -> None:
    session = Session.create(workspace, approval="auto")
    session.simulator = None  # no warm-up cell: the numbering below is the test's own
    try:
        assert session.execute("a = 1").ok
        session.restart_kernel()  # /reset
        assert session.execute("'a' in dir()").value == "False"
        assert session.execute("b = 2").ok
        assert session.execute("import os\nos._exit(1)").status == "died"
        r = session.execute("'a' in dir(), b")
        assert r.value == "(False, 2)" and not r.state_lost
        assert r.recovery is not None and "names back: b" in r.notice
        report = session.restore_kernel()  # /restore replays the new lineage only
        codes = {r["n"]: r["code"] for r in load_records(session.paths.outputs)}
        replayed = [codes[n] for n in report.replayed]
        assert "b = 2" in replayed and "a = 1" not in replayed and report.state_restored
        assert session.execute("'a' in dir(), b").value == "(False, 2)"
        kinds = [e.payload["trigger"] for e in session.trace.events(["kernel_recovery"])]
        assert kinds == ["died", "restore"]
    finally:
        session.close()


def test_restore_in_a_new_process_brings_the_previous_state_back(workspace: Path) -> None:
    first = Session.create(workspace, approval="auto")
    assert first.execute("import math\nradius = 2.0\narea = math.pi * radius ** 2").ok
    assert first.execute("print(area)").ok
    sid = first.id
    first.close()  # the kernel goes with the process
    again = Session.resume(workspace, sid, approval="auto")
    try:
        assert again.kernel_state == "stopped"  # no kernel yet in this process
        report = again.restore_kernel()
        codes = {r["n"]: r["code"] for r in load_records(again.paths.outputs)}
        replayed = [codes[n] for n in report.replayed]
        assert report.state_restored and replayed[1].startswith("import math")
        assert "import numpy as np" in replayed[0]  # the simulator's warm-up came back too
        assert {"math", "radius", "area"} <= set(report.names)
        assert again.execute("round(area, 3)").value == "12.566"
    finally:
        again.close()


def test_an_interrupt_stops_a_long_replay(session_paths: SessionPaths,
                                          workspace: Path) -> None:
    with Kernel(session_paths, cwd=workspace) as k:
        # the cell is quick when run, and sleeps a minute only when replayed, so the
        # interrupt lands mid-replay however loaded the machine is
        slow = workspace / "replaying.flag"
        assert k.execute("import os, time\n"
                         f"time.sleep(60 if os.path.exists({str(slow)!r}) else 0)\n"
                         "a = 1").ok
        assert k.execute("b = 2").ok
        slow.write_text("")
        box: dict = {}
        th = threading.Thread(target=lambda: box.setdefault("rep", k.restore()))
        th.start()
        deadline = time.monotonic() + 10
        while not k.replaying and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)
        pid, generation = k.pid, k.generation  # the kernel the restore started
        k.interrupt()  # Ctrl+C during the replay: stop it, keep the kernel
        th.join(timeout=15)
        report = box["rep"]
        assert report.survived and not report.state_restored and report.replayed == []
        assert report.failed[0]["n"] == 1 and "interrupted" in report.failed[0]["error"]
        assert [(s.n, s.kind) for s in report.listed] == [(2, "stopped")]
        assert k.execute("'a' in dir(), 'b' in dir()").value == "(False, False)"
        assert (k.pid, k.generation) == (pid, generation)  # kept: not restarted again
