"""The checkers other tests take their verdicts from, each fed known-bad input (issue 27):
a planted orphan, a corrupted or truncated database, a deleted event, a leftover process,
a lost byte, a state that was not restored. A checker that passes these would pass a
broken product, so each must say what is wrong."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from simagent.bench.fault_bench import lab_home, lost_since, snapshot
from simagent.bench.kill_child import (
    ChildReport,
    alive,
    integrity,
    processes_with_env,
    request_problems,
    state_problems,
)
from simagent.bench.kill_series import check_left_on_disk
from simagent.context.boundaries import orphans
from simagent.paths import SessionPaths
from simagent.trace.log import TraceLog

H, T = ("human", [], None), ("ai", [], None)


def ai(*ids: str) -> tuple:
    return ("ai", list(ids), None)


def tool(cid: str) -> tuple:
    return ("tool", [], cid)


# ------------------------------------------------------------------- request_problems
def test_request_problems_passes_a_well_formed_request():
    assert request_problems([H, ai("a", "b"), tool("a"), tool("b"), T, H]) == []


@pytest.mark.parametrize("req, expected", [
    ([H, ai("a", "b"), tool("a"), H], ["message 3: tool call(s) ['b'] have no result"]),
    ([H, tool("z")], ["message 1: tool result for 'z' answers no open call"]),
    ([ai("a"), tool("a"), tool("a")], ["message 2: tool result for 'a' answers no open call"]),
    ([ai("a"), H, tool("a")], ["message 1: tool call(s) ['a'] have no result",
                               "message 2: tool result for 'a' answers no open call"]),
    ([H, ai("a")], ["end: tool call(s) ['a'] have no result"]),
    ([ai("a"), tool("a"), ai("b"), tool("a")],
     ["message 3: tool result for 'a' answers no open call",
      "end: tool call(s) ['b'] have no result"]),
])
def test_request_problems_catches_what_a_provider_refuses(req, expected):
    assert request_problems(req) == expected


# --------------------------------------------------------------------- state_problems
def test_state_problems_catches_an_orphaned_result_and_open_calls():
    assert state_problems([H, ai("a"), tool("a")], allow_open=False) == []
    assert state_problems([H, tool("x"), ai("a")], allow_open=True) == [
        "message 1: orphaned tool result 'x'"]
    assert state_problems([H, ai("a", "b"), tool("a")], allow_open=True) == []
    assert state_problems([H, ai("a", "b"), tool("a")], allow_open=False) == [
        "unanswered tool calls ['b']"]
    # a result before its call is an orphan too
    assert state_problems([tool("a"), ai("a")], allow_open=True) == [
        "message 0: orphaned tool result 'a'"]


# --------------------------------------------------------------------------- orphans
def _call(cid: str) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": "run_python", "args": {}, "id": cid}])


def _result(cid: str) -> ToolMessage:
    return ToolMessage("out", tool_call_id=cid)


def test_orphans_catches_a_planted_orphan_in_each_position():
    good = [HumanMessage("q"), _call("a"), _result("a"), AIMessage("done")]
    assert orphans(good) == []
    assert orphans([*good, _result("ghost")]) == ["result ghost at 4 has no earlier call"]
    assert orphans([HumanMessage("q"), _call("a")]) == ["call a at 1 has no result"]
    assert orphans([_result("a"), _call("a")]) == ["result a at 0 has no earlier call",
                                                    "call a at 1 has no result"]
    # a recurring id: the second call is answered only once both results are there
    twice = [_call("a"), _result("a"), _call("a")]
    assert orphans(twice) == ["call a at 2 has no result"]
    assert orphans([*twice, _result("a")]) == []
    assert orphans([_call("a"), _result("a"), _result("a")]) == [
        "result a at 2 has no earlier call"]


# ---------------------------------------------------------------- check_left_on_disk
def _session_on_disk(tmp_path: Path) -> tuple[SessionPaths, ChildReport]:
    """A real trace database with committed events, and the report a child made of them."""
    paths = SessionPaths(tmp_path / "s").ensure()
    log = TraceLog(paths.trace)
    ids = [log.append("error", {"message": f"event {i} " + "x" * 200, "where": "test"})
           for i in range(40)]
    log.close()
    conn = sqlite3.connect(paths.checkpoints)
    conn.execute("CREATE TABLE t (v TEXT)")
    conn.executemany("INSERT INTO t VALUES (?)", [("y" * 500,)] * 200)
    conn.commit()
    conn.close()
    report = ChildReport(events=ids, event_bytes={i: 220 for i in ids},
                         requests=[[H, ai("a"), tool("a")]])
    return paths, report


def test_check_left_on_disk_passes_a_sound_session(tmp_path):
    paths, report = _session_on_disk(tmp_path)
    assert check_left_on_disk(paths, report) == ([], 0)


def test_check_left_on_disk_catches_a_deleted_committed_event(tmp_path):
    paths, report = _session_on_disk(tmp_path)
    conn = sqlite3.connect(paths.trace)
    conn.execute("DELETE FROM events WHERE id = ?", (report.events[7],))
    conn.commit()
    conn.close()
    problems, lost = check_left_on_disk(paths, report)
    assert lost == 220
    assert problems == [f"committed trace events missing after the kill: "
                        f"[{report.events[7]}] (220 bytes)"]


def test_check_left_on_disk_catches_a_trace_that_is_gone(tmp_path):
    paths, report = _session_on_disk(tmp_path)
    for p in paths.trace.parent.glob(paths.trace.name + "*"):
        p.unlink()
    problems, lost = check_left_on_disk(paths, report)
    assert "trace.sqlite is gone but events were committed" in problems
    assert lost == 220 * len(report.events)


def _corrupt(db: Path, how: str) -> None:
    data = bytearray(db.read_bytes())
    if how == "truncated":
        db.write_bytes(bytes(data[: len(data) // 2]))
    else:  # scribble over the middle pages (the header stays valid)
        mid = len(data) // 2
        data[mid: mid + 3000] = os.urandom(3000)
        db.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncated", "scribbled"])
@pytest.mark.parametrize("which", ["trace", "checkpoints"])
def test_check_left_on_disk_catches_a_damaged_database(tmp_path, which, how):
    paths, report = _session_on_disk(tmp_path)
    db = getattr(paths, which)
    _corrupt(db, how)
    assert integrity(db) != "ok"
    problems, _lost = check_left_on_disk(paths, report)
    assert any(p.startswith(f"{db.name}: integrity_check = ") for p in problems), problems


def test_check_left_on_disk_catches_bad_requests_and_states(tmp_path):
    paths, report = _session_on_disk(tmp_path)
    report.requests.append([H, ai("a")])
    report.state_before = [H, tool("x")]
    report.state_after = [H, ai("b")]
    report.last_kind = "kernel_exec"
    problems, _ = check_left_on_disk(paths, report)
    assert problems[:3] == ["request 1: end: tool call(s) ['a'] have no result",
                            "resumed state: message 1: orphaned tool result 'x'",
                            "repaired state: unanswered tool calls ['b']"]
    assert problems[3].startswith("state at resume: ") and "kernel_exec" in problems[3]


# -------------------------------------------------------------- leftover processes
@pytest.mark.slow
def test_a_leftover_process_is_found_and_alive_until_reaped(tmp_path):
    prefix = str(tmp_path / "sessions")
    env = {**os.environ, "SIMAGENT_SESSION_DIR": f"{prefix}/abc"}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)
    try:
        assert alive(proc.pid)
        # Popen returns once exec has closed its error pipe, which the kernel does before it
        # sets up the new environment: on a loaded machine /proc/<pid>/environ can still be
        # empty then (a loaded test run saw []), so wait for it, boundedly
        deadline = time.monotonic() + 30
        while proc.pid not in processes_with_env("SIMAGENT_SESSION_DIR", prefix) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.pid in processes_with_env("SIMAGENT_SESSION_DIR", prefix)
        assert proc.pid not in processes_with_env("SIMAGENT_SESSION_DIR", prefix + "-other")
        proc.kill()
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # dead, not yet reaped
        assert not alive(proc.pid)  # a zombie is not a leftover
        assert proc.pid not in processes_with_env("SIMAGENT_SESSION_DIR", prefix)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert not alive(proc.pid)


@pytest.mark.slow
def test_the_fork_row_counts_and_ends_forked_children_left_running(tmp_path):
    from simagent.bench.fault_cases import _children_left

    assert _children_left(tmp_path) == -1  # nothing recorded: the check says so
    kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
            for _ in range(2)]
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait(timeout=30)
    (tmp_path / "fault_kids.txt").write_text(" ".join(str(p.pid) for p in [*kids, done]))
    try:
        assert _children_left(tmp_path) == 2
        for k in kids:
            assert k.wait(timeout=30) == -9  # it ended them
    finally:
        for k in kids:
            k.kill()
            k.wait(timeout=30)


# --------------------------------------------------------------------- lost bytes
def test_lost_since_catches_one_changed_byte_and_one_deleted_event():
    with lab_home() as lab:
        session = lab.session()
        out = session.paths.outputs / "0001.txt"
        out.write_text("z" * 4000)
        session.trace.append("error", {"message": "kept", "where": "test"})
        before = snapshot(session)
        assert lost_since(session, before) == (0, [])
        with out.open("a") as fh:
            fh.write("more")  # appending loses nothing
        assert lost_since(session, before) == (0, [])
        data = bytearray(out.read_bytes())
        data[1234] ^= 1  # one flipped bit, same size
        out.write_bytes(bytes(data))
        assert lost_since(session, before) == (4000, ["raw output 0001.txt"])
        out.write_text("z" * 4000)
        last = max(before.events)
        conn = sqlite3.connect(session.paths.trace)
        conn.execute("DELETE FROM events WHERE id = ?", (last,))
        conn.commit()
        conn.close()
        assert lost_since(session, before) == (before.events[last], ["1 trace events"])


# ------------------------------------------------------------ survived and restored
def test_a_fault_row_sees_state_that_was_not_restored_and_an_orphan():
    """``kernel_fault`` grades ``restored`` from the check cell and ``survived`` from the
    turns and the checkpoint: a cell that silently drops the set-up state must give
    restored=False, and a planted orphan in the checkpoint survived=False."""
    from simagent.bench.fault_bench import no_orphans
    from simagent.bench.fault_cases import kernel_fault

    with lab_home() as lab:
        lost = kernel_fault(lab, "del x, params\nprint('dropped')")
        assert lost.restored is False and lost.survived is True, lost
        kept = kernel_fault(lab, "print('harmless')")
        assert kept.restored is True and kept.survived is True, kept
        session = lab.session()
        runner = lab.scripted(session, [{"final": "hello"}])
        assert runner.run("hi").status == "done"
        assert no_orphans(runner)
        runner.agent.graph.update_state(session.thread_config,
                                        {"messages": [_result("planted")]})
        assert not no_orphans(runner)
