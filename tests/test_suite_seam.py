"""The suite's own kernel switch: `make test` runs the slow and the real tests in one pool
with ``SIMAGENT_TEST_KERNEL=memory`` set, and conftest takes it away for each test marked
``real``, so what those tests prove is proven on a kernel process."""

from __future__ import annotations

import os

import psutil
import pytest

from simagent.kernel import Kernel
from simagent.kernel.memory import SEAM_ENV


@pytest.mark.real
def test_a_real_test_gets_a_kernel_process(session_paths, workspace) -> None:
    assert SEAM_ENV not in os.environ
    with Kernel(session_paths, cwd=workspace) as k:
        r = k.execute("import os; print(os.getpid())", timeout=120)
        pid = k.status().pid
    assert r.status == "ok" and pid is not None
    assert int(r.stdout) == pid != os.getpid()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_an_unmarked_test_keeps_the_runs_choice(session_paths, workspace) -> None:
    """With memory set (`make test-fast`), a test not marked real runs its kernel here."""
    if os.environ.get(SEAM_ENV) != "memory":
        pytest.skip(f"this run does not set {SEAM_ENV}=memory")
    with Kernel(session_paths, cwd=workspace) as k:
        r = k.execute("import os; print(os.getpid())", timeout=120)
    assert r.status == "ok" and int(r.stdout) == os.getpid()
