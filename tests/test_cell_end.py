"""A cell whose iopub ``status: idle`` never comes still ends (simagent.kernel.cell_end).

The idle status is really lost: the cell replaces its own kernel's ``_publish_status`` so
that the next idle (its own) is never sent, as a PUB/SUB drop or a kernel bug would. The
wait loops under test are the real ones, on a real kernel; before the fix they waited for
that message forever (the thread joins below are the bound that turns a hang into a
failure).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from simagent.kernel import Kernel
from simagent.kernel.cell_end import IDLE_LOST_GRACE_S, IDLE_LOST_NOTICE
from simagent.paths import SessionPaths

#: the kernel process is what these tests are about (make test-real)
pytestmark = pytest.mark.real

#: Drops the kernel's next idle status (this cell's), then puts the real method back.
DROP_NEXT_IDLE = """\
def _drop_next_idle():
    k = get_ipython().kernel
    def publish(status, *args, **kwargs):
        if status == "idle":
            del k._publish_status
            return
        return type(k)._publish_status(k, status, *args, **kwargs)
    k._publish_status = publish
_drop_next_idle(); del _drop_next_idle
print("finished")
"""
#: Far beyond the grace: only a wait that never ends runs into it.
JOIN_S = IDLE_LOST_GRACE_S + 60


@pytest.fixture
def kernel(session_paths: SessionPaths, workspace: Path) -> Iterator[Kernel]:
    with Kernel(session_paths, cwd=workspace) as k:
        yield k


def _in_thread(fn) -> dict:
    box: dict = {}
    th = threading.Thread(target=lambda: box.update(r=fn()), daemon=True)
    th.start()
    th.join(JOIN_S)
    assert not th.is_alive(), "still waiting for an idle status that will never come"
    return box


def test_a_cell_whose_idle_status_is_lost_ends_after_its_reply(kernel: Kernel) -> None:
    r = _in_thread(lambda: kernel.execute(DROP_NEXT_IDLE))["r"]
    assert (r.status, r.stdout) == ("ok", "finished")
    assert r.output_maybe_incomplete
    assert IDLE_LOST_NOTICE in r.model_text()
    assert r.elapsed_s >= IDLE_LOST_GRACE_S  # ended by the grace, not by a message
    assert kernel.state == "idle"
    after = kernel.execute("print('next')")  # the kernel is fine; the next cell is whole
    assert (after.status, after.stdout) == ("ok", "next")
    assert not after.output_maybe_incomplete and IDLE_LOST_NOTICE not in after.model_text()


def test_a_cell_with_its_idle_status_is_not_marked_incomplete(kernel: Kernel) -> None:
    r = kernel.execute("print('whole')")
    assert (r.status, r.stdout, r.output_maybe_incomplete) == ("ok", "whole", False)


def test_a_replayed_cell_whose_idle_status_is_lost_replays_ok(kernel: Kernel) -> None:
    """The replay loop shares the rule: before, it interrupted the finished cell at its
    time limit and called it wedged."""
    box = _in_thread(lambda: kernel.run_quiet(DROP_NEXT_IDLE, timeout=20))
    assert box["r"] == ("ok", "")
    assert kernel.execute("print('next')").stdout == "next"
