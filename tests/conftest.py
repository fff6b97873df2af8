"""Shared fixtures: every test gets its own state home; a test marked real, kernel processes.

Also the suite's guards against itself: tests marked slow get a longer per-test timeout
(pytest-timeout's default is in pyproject.toml), no test sees another's registered
secrets, and a worker that leaves a kernel, server or worker process alive (or a dead
one unreaped) fails at its end, naming each.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import longest_first
import psutil
import pytest
from longest_first import (  # noqa: F401 (hooks: pytest finds them here)
    pytest_addoption,
    pytest_runtest_logreport,
    pytest_sessionfinish,
)

from simagent import workspace_trust
from simagent.kernel.memory import SEAM_ENV
from simagent.paths import SessionPaths, workspace_config_path
from simagent.trace import redact

#: Per-test limit for tests marked ``slow`` (wheel builds, whole bench runs).
SLOW_TIMEOUT_S = 900
#: ``make test-deep`` (CI runs it after ``make test``) sets it: the tests marked ``deep``
#: (the second and third workflow of a claim ``make test`` shows with one) run, and
#: those marked ``sampled`` take their larger samples (:func:`sample`).
DEEP = os.environ.get("SIMAGENT_TEST_DEEP") == "1"
#: Set to a fresh value in each pytest process (each xdist worker), inherited by what
#: its tests start: finds their kernels and servers even once they were reparented.
RUN_TAG_ENV = "SIMAGENT_TEST_RUN"
#: Command-line parts of the processes a test may start and must stop.
LEAK_PATTERNS = ("simagent.kernel.launcher", "ipykernel", "-m simagent", "bin/simagent",
                 "openai_stub", "dask", "distributed", "mcp_servers/")
#: Helpers multiprocessing keeps for the life of the process: not a test's leak.
_KEPT = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
#: How long a process being torn down may take to go before it counts as left behind.
_LEAK_SETTLE_S = 10.0
#: (pid, start time) of each process seen after a test -> that test, to name the leaker.
_started_during: dict[tuple[int, float], str] = {}


def sample(usual: int, deep: int) -> int:
    """A property test's sample size: ``usual`` in ``make test``, ``deep`` in test-deep."""
    return deep if DEEP else usual


def pytest_configure(config: pytest.Config) -> None:
    os.environ[RUN_TAG_ENV] = uuid.uuid4().hex


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    longest_first.reorder(config, items)
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """A test marked ``real`` runs without :data:`SEAM_ENV`, so its kernels (and those of
    the processes it starts) are processes even in a run that sets it for the rest: `make
    test` runs the slow and real tests in one pool. Read at kernel start, the variable is
    off from the test's setup to its teardown."""
    if not item.get_closest_marker("real") or SEAM_ENV not in os.environ:
        return (yield)
    saved = os.environ.pop(SEAM_ENV)
    try:
        return (yield)
    finally:
        os.environ[SEAM_ENV] = saved


@pytest.fixture(autouse=True)
def _state_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path_factory.mktemp("simagent-home")
    monkeypatch.setenv("SIMAGENT_HOME", str(home))
    return home


@contextlib.contextmanager
def _own_secrets() -> Iterator[None]:
    """Secrets registered inside (``Session.create`` registers its config's) are
    forgotten after: the redaction registry is process-wide by design."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(redact, "_registered", dict(redact._registered))
        mp.setattr(redact, "_named_vars", set(redact._named_vars))
        yield


@pytest.fixture(autouse=True, scope="module")
def _module_secrets() -> Iterator[None]:
    with _own_secrets():
        yield


@pytest.fixture(autouse=True)
def _test_secrets() -> Iterator[None]:
    with _own_secrets():
        yield


@pytest.fixture(autouse=True)
def _note_started_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """Notes the processes alive after each test, so a leak names the test it outlived."""
    yield
    with contextlib.suppress(psutil.Error):
        for p in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                _started_during.setdefault((p.pid, p.create_time()), request.node.nodeid)


def _during(p: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        if test := _started_during.get((p.pid, p.create_time())):
            return f" [there after {test}]"
    return ""


def left_behind(tag: str, me: psutil.Process | None = None) -> list[str]:
    """What this process's tests started and left: live descendants (but multiprocessing's
    own helpers), unreaped (zombie) children, and kernel/server/worker processes carrying
    ``tag`` in their environment (reparented after their parent died)."""
    me = me or psutil.Process()
    found: dict[int, str] = {}
    for p in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.status() == psutil.STATUS_ZOMBIE:
                found[p.pid] = (f"pid {p.pid} ({p.name()}): a zombie, exited but never "
                                f"reaped{_during(p)}")
                continue
            cmd = " ".join(p.cmdline())
            if not any(k in cmd for k in _KEPT):
                found[p.pid] = f"pid {p.pid}: {cmd[:200]}{_during(p)}"
    for p in psutil.process_iter(["pid", "cmdline"]):
        if p.pid in found or p.pid == me.pid:
            continue
        with contextlib.suppress(psutil.Error):
            cmd = " ".join(p.info["cmdline"] or ())
            if any(k in cmd for k in LEAK_PATTERNS) and p.environ().get(RUN_TAG_ENV) == tag:
                found[p.pid] = f"pid {p.pid} (orphaned): {cmd[:200]}{_during(p)}"
    return [found[pid] for pid in sorted(found)]


@pytest.fixture(autouse=True, scope="session")
def _nothing_left_behind() -> Iterator[None]:
    """Fails the worker's last test if a process its tests started outlives them all."""
    yield
    if fork := sys.modules.get("cli_fork"):  # the CLI fork server (tests/cli_fork.py)
        fork.stop()
    gc.collect()  # a dropped Popen reaps its exited process when collected
    tag = os.environ[RUN_TAG_ENV]
    deadline = time.monotonic() + _LEAK_SETTLE_S
    while (left := left_behind(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, "processes started by the tests are still there:\n" + "\n".join(left)


def write_config(workspace: Path, text: str, *, trusted: bool = True) -> Path:
    """Write ``workspace``'s ``.simagent/config.toml`` as its person would, trusted (as
    ``simagent trust`` records it) unless ``trusted`` is False: the state home is the
    test's own, so a test that wants the file read says so, as a person must."""
    path = workspace_config_path(workspace)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if trusted:
        workspace_trust.trust(workspace)
    return path


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace"
    ws.mkdir()
    return ws


@pytest.fixture
def session_paths(tmp_path: Path) -> SessionPaths:
    return SessionPaths(tmp_path / "session").ensure()
