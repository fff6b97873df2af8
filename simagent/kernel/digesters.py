"""Running a simulator's digester on a raw output file, for ``run_python`` results.

The pure core (shapes, tables, :class:`~simagent.kernel.digest.Rules`) is in
:mod:`simagent.kernel.digest`; this is the host side that touches files, imports the
module a ``simulator.toml`` names (``digest = "module:function"``), bounds the work by a
deadline in a worker thread, and turns every failure into plain head/tail plus a traced
``error``: a digest must never cost a tool call.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from simagent.kernel.digest import _READ_CHUNK, DIGEST_MIN_LINES, DIGEST_TIMEOUT_S, generic


class DigestTimeout(RuntimeError):
    """A digester ran past its deadline."""


def iter_raw_lines(path: str | Path, deadline: float | None = None) -> Iterator[str]:
    """The lines of a raw output file, streamed: memory holds one line (a line longer
    than 64 KiB yields its first 64 KiB, the rest is skipped). Past ``deadline``
    (``time.monotonic()``) it raises :class:`DigestTimeout`."""
    with open(path, encoding="utf-8", errors="replace", newline="\n") as f:
        n = 0
        while True:
            chunk = f.readline(_READ_CHUNK)
            if not chunk:
                return
            if not chunk.endswith("\n"):
                while (more := f.readline(_READ_CHUNK)) and not more.endswith("\n"):
                    pass
            yield chunk
            n += 1
            if deadline is not None and n % 256 == 0 and time.monotonic() > deadline:
                raise DigestTimeout("digest ran past its deadline")


DigestFn = Callable[..., str]
_LOADED: dict[tuple[str, str], DigestFn] = {}


def load_digester(simulator: Any) -> tuple[str, DigestFn]:
    """(name, function) of ``simulator``'s declared digester, else the generic one.

    ``simulator.toml`` names it as ``digest = "module:function"``: ``module.py`` in the
    simulator's folder, imported under a name of its own (two simulators never collide).
    Loading errors propagate: :func:`output_digester` turns them into plain head/tail.
    """
    spec = getattr(simulator, "digest", "") if simulator is not None else ""
    if not spec:
        return "generic", generic
    key = (str(simulator.root), spec)
    if key not in _LOADED:
        module_name, func = spec.split(":", 1)
        path = Path(simulator.root) / f"{module_name}.py"
        mod_spec = importlib.util.spec_from_file_location(
            f"simagent_digest_{simulator.name}_{module_name}", path)
        if mod_spec is None or mod_spec.loader is None:
            raise ImportError(f"cannot load digester {path}")
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
        _LOADED[key] = getattr(module, func)
    return simulator.name, _LOADED[key]


def run_digester(fn: DigestFn, raw_path: str | Path, max_chars: int,
                 timeout_s: float | None = None) -> tuple[str, int]:
    """(digest, lines read) of ``fn`` over the raw file, in a worker thread bounded by
    ``timeout_s`` (the line stream stops at the deadline too, so an abandoned worker
    ends soon after)."""
    timeout_s = DIGEST_TIMEOUT_S if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    box: dict[str, Any] = {}
    read = [0]

    def counted() -> Iterator[str]:
        for line in iter_raw_lines(raw_path, deadline):
            read[0] += 1
            yield line

    def work() -> None:
        try:
            box["text"] = fn(counted(), max_chars)
        except BaseException as exc:  # reported to the caller
            box["error"] = exc

    worker = threading.Thread(target=work, name="simagent-digest", daemon=True)
    worker.start()
    worker.join(timeout_s + 1.0)
    if worker.is_alive():
        raise DigestTimeout(f"digest took longer than {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    text = box.get("text")
    if not isinstance(text, str):
        raise TypeError(f"a digester returns str, not {type(text).__name__}")
    return text[:max_chars], read[0]


def output_digester(simulator: Any, raw_path: str | Path | None,
                    trace: Any = None) -> Callable[[int], tuple[str, str, int] | None] | None:
    """For ``ExecResult.model_text(digest=...)``: called with a char budget only when the
    output is over the cap; returns (digester name, digest, lines read), or None when
    there is no raw file, nothing to add, or the digester failed (traced as an ``error``
    event; a digest never breaks a tool call)."""
    if raw_path is None:
        return None

    def make(budget: int) -> tuple[str, str, int] | None:
        started = time.monotonic()
        name, error, text, lines = "generic", None, "", 0
        try:
            name, fn = load_digester(simulator)
            text, lines = run_digester(fn, raw_path, budget)
        except Exception as exc:
            text, error = "", f"{type(exc).__name__}: {exc}"[:300]
        if trace is not None and error is not None:
            try:
                trace.append("error", {"where": f"output digest ({name} digester)",
                                       "message": f"{error}; plain head/tail used for "
                                                  f"{raw_path} after "
                                                  f"{time.monotonic() - started:.1f} s"})
            except Exception:
                pass  # tracing must never break a tool call
        # a short output (a few huge lines) is better served by head and tail alone
        return (name, text, lines) if text.strip() and lines >= DIGEST_MIN_LINES else None

    return make
