"""``simagent bench faults``: the fast subset runs for real and every row must hold.

The full run (``simagent bench faults``) is the figure for the closing note; here the
fast cases run against the real graph, kernel and HTTP stub, and the measurement
helpers are checked on their own so a bench that cannot see a loss is caught.
"""

from __future__ import annotations

import json
import sys

import cli_fork
import pytest

from simagent.bench import fault_cases
from simagent.bench.fault_bench import (
    FAULT_MARK,
    FaultRow,
    format_table,
    lab_home,
    lost_since,
    mark_lost,
    run_faults,
    snapshot,
)

#: the kernel process is what these tests are about (make test-real)
pytestmark = pytest.mark.real


def test_unknown_fault_ids_are_an_error_naming_the_known_ones():
    with pytest.raises(ValueError, match="kernel-exit"):
        fault_cases.select(["no-such-fault"])


def test_the_fast_subset_is_a_proper_subset_with_every_group():
    fast = fault_cases.select(fast=True)
    assert 0 < len(fast) < len(fault_cases.CASES)
    assert {c.group for c in fast} == {c.group for c in fault_cases.CASES}
    ids = [c.id for c in fault_cases.CASES]
    assert len(ids) == len(set(ids))


def test_lost_bytes_see_a_deleted_output_and_a_truncated_one(tmp_path):
    with lab_home() as lab:
        session = lab.session()
        session.execute("print('a' * 1000)")
        session.execute("print('b' * 500)")
        before = snapshot(session)
        assert lost_since(session, before) == (0, [])
        first, second = sorted(session.paths.outputs.glob("*.txt"))[-2:]
        first.unlink()
        second.write_text("b" * 10)
        lost, what = lost_since(session, before)
        assert lost == before.files[first.name][0] + before.files[second.name][0]
        assert len(what) == 2


def test_a_missing_fault_mark_counts_as_lost(tmp_path):
    raw = tmp_path / "0001.txt"
    raw.write_text(f"{FAULT_MARK}\nrest\n")
    assert mark_lost(raw) == 0
    raw.write_text("something else\n")
    assert mark_lost(raw) == len(FAULT_MARK) + 1
    assert mark_lost(None) == len(FAULT_MARK) + 1


def test_the_table_sums_what_failed():
    rows = [FaultRow("a", "kernel", "A", True, True, 1.0, 0, ""),
            FaultRow("b", "provider", "B", False, None, None, 12, "why")]
    text = format_table(rows)
    assert "1/2 survived" in text and "12 bytes lost" in text and "NO" in text


def test_the_fast_subset_survives_restores_state_and_loses_nothing():
    """Kernel death and a hang, provider faults over real HTTP, the REPL watchdog, a full
    disk and a planted secret; the SIGKILL series is the property test's own file."""
    cases = [c for c in fault_cases.select(fast=True) if c.id != "data-sigkill"]
    assert {c.group for c in cases} == {"kernel", "provider", "watchdog", "data"}
    rows = run_faults(cases, fast=True)
    for row in rows:
        assert row.survived, row
        assert row.restored in (True, None), row
        assert row.lost_bytes == 0, row
    assert sum(r.restored is True for r in rows) >= 4
    assert all(r.recover_s is not None and r.recover_s >= 0 for r in rows
               if r.group == "kernel")


def test_the_command_prints_json_rows_and_exits_zero_when_all_survive():
    proc = cli_fork.run([sys.executable, "-m", "simagent", "bench", "faults", "--json",
                         "--fast", "--only", "kernel-big-output"],
                        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert row["id"] == "kernel-big-output" and row["survived"] and row["lost_bytes"] == 0
