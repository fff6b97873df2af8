"""The function a Dask worker runs for one case: load, call, time, catch, retry.

Workers of an existing cluster (an HPC queue, Kubernetes) need the study's own packages
but not simagent, so the runner travels *by value*: :func:`portable_runner` returns a
copy of :func:`run_case` whose module cannot be imported, which makes pickle fail and
Dask fall back to cloudpickle, which then ships the code itself. ``run_case`` therefore
uses nothing but builtins and standard-library imports made inside its body.

The case function arrives as the bytes of one ``cloudpickle.dumps`` (scattered to the
cluster once per sweep, not pickled again for every case) and is loaded per case,
*after* the user modules named in ``fresh`` are brought up to date: a long-lived worker
that imported an older ``mysim.py`` drops it, so the import inside the case (or the
unpickling of a function referenced by module name) reads the current file, the one
the cache key was computed from. A module that changed on disk during the case makes
the record ``uncacheable``.
"""

from __future__ import annotations

import builtins
import types
from collections.abc import Callable
from typing import Any

#: Module name given to the shipped copy; deliberately not importable.
PORTABLE_MODULE = "simagent_case_runner_by_value"
#: Attribute a worker's copy of a user module gets: the sha256 of the source it ran.
STAMP = "__simagent_source_sha256__"


def run_case(fn: Callable[..., Any] | bytes, case: dict[str, Any], retries: int,
             fresh: dict[str, str] | None = None) -> dict[str, Any]:
    """``fn(**case)`` with up to ``retries`` more attempts; never raises for the case's errors.

    ``fn`` may be a ``cloudpickle.dumps`` of the function. ``fresh`` maps user module
    names to the sha256 of their source as the kernel keyed them. Returns ``status``
    (ok | error), ``result`` or ``error`` (one line) and ``traceback``, ``elapsed_s``
    (all attempts), ``attempts``, ``worker`` (host:pid) and, when a user module changed
    on disk while the case ran, ``uncacheable``. ``SystemExit`` and ``KeyboardInterrupt``
    raised by the case are errors of the case too: letting them through would end the
    worker process and fail every case it held.
    """
    import hashlib  # in the body: the by-value copy a worker runs has no module globals
    import os  # in the body, as above
    import pickle  # in the body, as above
    import socket  # in the body, as above
    import sys  # in the body, as above
    import time  # in the body, as above
    import traceback  # in the body, as above

    def source_sha(mod: Any) -> str | None:
        try:
            with open(mod.__file__, "rb") as fh:
                return hashlib.sha256(fh.read()).hexdigest()
        except Exception:
            return None

    stamp = "__simagent_source_sha256__"  # == STAMP; a literal, the copy has no globals
    fresh = fresh or {}
    for name, digest in fresh.items():  # drop copies older than what the key saw
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, stamp, None) != digest:
            for other in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                sys.modules.pop(other, None)
    start = time.perf_counter()
    attempts = 0
    where = f"{socket.gethostname()}:{os.getpid()}"
    record: dict[str, Any]
    while True:
        attempts += 1
        try:
            func = pickle.loads(fn) if isinstance(fn, (bytes, bytearray, memoryview)) else fn
            result = func(**case)
        except BaseException as exc:  # SystemExit too: see the docstring
            if attempts <= retries:
                continue
            message = " ".join(str(exc).split())
            record = {"status": "error",
                      "error": f"{type(exc).__name__}: {message}"[:500] if message
                      else type(exc).__name__,
                      "traceback": traceback.format_exc(),
                      "elapsed_s": time.perf_counter() - start, "attempts": attempts,
                      "worker": where}
            break
        record = {"status": "ok", "result": result, "elapsed_s": time.perf_counter() - start,
                  "attempts": attempts, "worker": where}
        break
    for name, digest in fresh.items():
        mod = sys.modules.get(name)
        if mod is None or getattr(mod, stamp, None) == digest:
            continue
        if source_sha(mod) == digest:
            setattr(mod, stamp, digest)
        else:
            record["uncacheable"] = f"module {name} changed on disk while the case ran"
    return record


def portable_runner() -> Callable[..., dict[str, Any]]:
    """A copy of :func:`run_case` that pickles by value (see the module docstring)."""
    code = run_case.__code__
    fn = types.FunctionType(code, {"__builtins__": builtins, "__name__": PORTABLE_MODULE},
                            "run_case", run_case.__defaults__)
    fn.__module__ = PORTABLE_MODULE
    fn.__qualname__ = "run_case"
    return fn
