"""The slow pool's order: longest first, so no worker starts a long test while the others
finish theirs (a pool's tail is its longest test started last).

``make test`` runs the slow+real pool with ``--dist loadscope --no-loadscope-reorder
--longest-first``: a worker takes a whole module, the next from the front of the
collection when it has two tests left, and this orders the collection by module, the
longest module first. The last modules to start are then short ones (the
longest-processing-time rule, by module). A module runs on one worker in its file's
order, as it was written: a module-scoped fixture (a kernel, a cluster, a server) is set
up once, and tests that share one session (``test_ensembles``: one kernel, one cluster,
a module one test writes and the next imports) see each other's state.

The durations are measured, not guessed: ``tests/durations.json`` holds seconds per test
id (setup, call and teardown) from a pool run with :data:`OUT_ENV` set (``make
test-durations``). A test it does not name counts :data:`DEFAULT_S`, so a new test runs
among the short ones until the file is refreshed; a stale file costs time, never a result.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
#: What a test the file does not name counts, in seconds.
DEFAULT_S = 1.0
#: Where a run writes the durations it measured (``make test-durations``).
OUT_ENV = "SIMAGENT_TEST_DURATIONS_OUT"
#: Tests shorter than this are left out of the file (they count :data:`DEFAULT_S`).
KEPT_FROM_S = 0.5

_measured: dict[str, float] = defaultdict(float)


def order(ids: Sequence[str], durations: Mapping[str, float]) -> list[int]:
    """The indices of ``ids`` (pytest node ids) in run order: modules by their summed
    duration, longest first, each module's tests in the collection's order; ties keep the
    collection's order too (so every xdist worker orders alike)."""
    modules = [test.split("::", 1)[0] for test in ids]
    module_s: dict[str, float] = defaultdict(float)
    first: dict[str, int] = {}
    for i, (test, module) in enumerate(zip(ids, modules, strict=True)):
        module_s[module] += durations.get(test, DEFAULT_S)
        first.setdefault(module, i)
    return sorted(range(len(ids)),
                  key=lambda i: (-module_s[modules[i]], first[modules[i]], i))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--longest-first", action="store_true",
                     help="run the longest modules and tests first (tests/durations.json)")


def reorder(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``items`` in :func:`order` when ``--longest-first`` is given."""
    if not config.getoption("longest_first"):
        return
    durations = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    items[:] = [items[i] for i in order([it.nodeid for it in items], durations)]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if os.environ.get(OUT_ENV):
        _measured[report.nodeid] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The controller (or a run without workers) writes what it measured."""
    out = os.environ.get(OUT_ENV)
    if not out or hasattr(session.config, "workerinput") or not _measured:
        return
    kept: dict[str, Any] = {k: round(v, 1) for k, v in sorted(_measured.items())
                            if v >= KEPT_FROM_S}
    Path(out).write_text(json.dumps(kept, indent=0) + "\n")
