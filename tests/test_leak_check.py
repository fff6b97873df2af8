"""The end-of-session leak check (conftest.left_behind) on processes really left behind:
a live child, an exited child nobody reaped, and an orphan that carries the run's tag."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
from conftest import RUN_TAG_ENV, left_behind, write_config

#: Bound on waiting for a process to reach the state a case needs.
WAIT_S = 30.0


def _until(check) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, "the process never got there"
        time.sleep(0.05)


def test_a_live_child_is_named() -> None:
    p = subprocess.Popen(["sleep", "60"])
    try:
        _until(lambda: any(f"pid {p.pid}:" in line and "sleep 60" in line
                           for line in left_behind(os.environ[RUN_TAG_ENV])))
    finally:
        p.kill()
        p.wait(WAIT_S)
    assert not any(f"pid {p.pid}" in line for line in left_behind(os.environ[RUN_TAG_ENV]))


def test_an_unreaped_child_is_named_as_a_zombie() -> None:
    p = subprocess.Popen(["true"])
    try:
        _until(lambda: psutil.Process(p.pid).status() == psutil.STATUS_ZOMBIE)
        assert any(f"pid {p.pid}" in line and "zombie" in line
                   for line in left_behind(os.environ[RUN_TAG_ENV]))
    finally:
        p.wait(WAIT_S)


def test_an_orphaned_kernel_carrying_the_tag_is_named_and_another_runs_is_not() -> None:
    """The shell starts a 'kernel' in the background and exits: it is reparented, no
    longer a descendant, and found by the tag it inherited."""
    code = "import time; time.sleep(60)"
    started = []
    for tag in (os.environ[RUN_TAG_ENV], "another-run"):
        sh = subprocess.run(
            ["sh", "-c", f"{sys.executable} -c '{code}' ipykernel_launcher >/dev/null 2>&1 &"
                         " echo $!"],
            env={**os.environ, RUN_TAG_ENV: tag}, capture_output=True, text=True,
            timeout=WAIT_S)
        started.append(int(sh.stdout.strip()))
    try:
        ours, theirs = started
        _until(lambda: psutil.Process(ours).ppid() != os.getpid())
        left = left_behind(os.environ[RUN_TAG_ENV])
        assert any(f"pid {ours} (orphaned)" in line for line in left)
        assert not any(f"pid {theirs}" in line for line in left)
    finally:
        for pid in started:
            psutil.Process(pid).kill()


# ------------------------------------------------- secrets do not outlive their test
#: Registered by the first test below; the second (run after it, in file order) must
#: not redact it: the registry is process-wide, the conftest gives each test its own.
_PLANTED = "planted-secret-value-0123456789"


def test_a_session_registers_its_config_secrets(workspace) -> None:
    from simagent.session import Session
    from simagent.trace.redact import redact

    (workspace / ".simagent").mkdir()
    write_config(workspace,
        f'[model]\nname = "scripted"\napi_key = "{_PLANTED}"\n')
    session = Session.create(workspace, approval="auto")
    session.close()
    assert redact(_PLANTED) != _PLANTED  # registered for the rest of this test


def test_a_later_test_does_not_see_an_earlier_tests_secrets() -> None:
    from simagent.trace.redact import redact

    assert redact(_PLANTED) == _PLANTED
