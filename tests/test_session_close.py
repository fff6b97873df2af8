"""Closing a session ends its kernel whatever else fails: a kernel left running is a
process nobody will stop (the suite's leak check found one left by the fault bench)."""

from __future__ import annotations

import sqlite3

import psutil
import pytest

from simagent.session import Session


@pytest.mark.real
def test_a_close_whose_trace_cannot_be_written_still_shuts_the_kernel_down(workspace):
    session = Session.create(workspace, approval="auto")
    session._warmed = True  # no simulator warm-up: one plain cell
    assert session.execute("x = 1").status == "ok"
    kernel = psutil.Process(session.kernel.pid)
    session.trace.close()  # as a caller that closed it early (the secrets fault case)
    with pytest.raises(sqlite3.ProgrammingError):
        session.close()  # the failure is still reported ...
    assert session.kernel.state == "stopped"  # ... after the kernel was shut down
    assert not kernel.is_running()  # gone and reaped
