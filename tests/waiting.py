"""Bounded waits shared by the tests: a cell run on a thread, started when its output says
so (an ordering, not a sleep), and joined with a deadline."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

#: Bound on waiting for a cell to start or end; far beyond any healthy wait on a loaded
#: machine, so only a hang reaches it.
WAIT_S = 60.0


def run_until_output(kernel: Any, code: str, ready: str,
                     **kw: Any) -> tuple[threading.Thread, dict]:
    """Run ``code`` on a thread and return once its live output contains ``ready`` (the
    cell printed it after its setup: a handler installed, a loop entered). The result
    lands in ``box["r"]``; join with :func:`joined`."""
    box: dict = {}
    seen = threading.Event()
    printed: list[str] = []

    def on_output(event: Any) -> None:
        printed.append(event.text)
        if ready in "".join(printed):
            seen.set()

    th = threading.Thread(target=lambda: box.setdefault(
        "r", kernel.execute(code, on_output=on_output, **kw)), daemon=True)
    th.start()
    assert seen.wait(WAIT_S), f"the cell never printed {ready!r}"
    return th, box


def joined(th: threading.Thread, box: dict, timeout: float = WAIT_S) -> Any:
    """The thread's result, once it ended within ``timeout``."""
    th.join(timeout)
    assert not th.is_alive(), f"still running after {timeout:g} s"
    return box["r"]


def stopped(proc: subprocess.Popen, grace_s: float = 60) -> None:
    """Stop a server process the test started: SIGTERM, then SIGKILL after ``grace_s``,
    each wait bounded, so a server that ignores SIGTERM cannot hang the suite."""
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


def until(check: Callable[[], Any], seconds: float, what: str) -> Any:
    """``check()``'s first true value, polled every 0.1 s; an ``AssertionError`` naming
    ``what`` after ``seconds`` (a bound on a wait, not a timing assertion)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds:g} s: {what}")
