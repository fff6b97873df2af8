"""The function a Dask worker runs for one case: call, time, catch, retry.

Workers of an existing cluster (an HPC queue, Kubernetes) need the study's own packages
but not simagent, so the runner travels *by value*: :func:`portable_runner` returns a
copy of :func:`run_case` whose module cannot be imported, which makes pickle fail and
Dask fall back to cloudpickle, which then ships the code itself. ``run_case`` therefore
uses nothing but builtins and standard-library imports made inside its body.
"""

from __future__ import annotations

import builtins
import types
from collections.abc import Callable
from typing import Any

#: Module name given to the shipped copy; deliberately not importable.
PORTABLE_MODULE = "simagent_case_runner_by_value"


def run_case(fn: Callable[..., Any], case: dict[str, Any], retries: int) -> dict[str, Any]:
    """``fn(**case)`` with up to ``retries`` more attempts; never raises for the case's errors.

    Returns ``status`` (ok | error), ``result`` or ``error`` (one line) and ``traceback``,
    ``elapsed_s`` (all attempts), ``attempts`` and ``worker`` (host:pid).
    """
    import os
    import socket
    import time
    import traceback

    start = time.perf_counter()
    attempts = 0
    while True:
        attempts += 1
        try:
            result = fn(**case)
        except Exception as exc:
            if attempts <= retries:
                continue
            message = " ".join(str(exc).split())
            return {"status": "error",
                    "error": f"{type(exc).__name__}: {message}"[:500] if message
                    else type(exc).__name__,
                    "traceback": traceback.format_exc(),
                    "elapsed_s": time.perf_counter() - start, "attempts": attempts,
                    "worker": f"{socket.gethostname()}:{os.getpid()}"}
        return {"status": "ok", "result": result, "elapsed_s": time.perf_counter() - start,
                "attempts": attempts, "worker": f"{socket.gethostname()}:{os.getpid()}"}


def portable_runner() -> Callable[..., dict[str, Any]]:
    """A copy of :func:`run_case` that pickles by value (see the module docstring)."""
    code = run_case.__code__
    fn = types.FunctionType(code, {"__builtins__": builtins, "__name__": PORTABLE_MODULE},
                            "run_case")
    fn.__module__ = PORTABLE_MODULE
    fn.__qualname__ = "run_case"
    return fn
