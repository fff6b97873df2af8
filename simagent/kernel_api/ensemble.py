"""``ensemble(fn, cases)``: a parameter sweep or ensemble on Dask, as one call in the kernel.

Scientists outgrow one machine exactly when they sweep, so the sweep runs on Dask
distributed: a local cluster of worker processes by default, or any existing scheduler
(``scheduler=``, ``$SIMAGENT_DASK_SCHEDULER``, ``[ensembles] scheduler``) with no other
change to the study. The contract:

* ``fn(**case)`` runs once per case on a worker; a case that raises (``sys.exit``
  included) is a row with status ``error`` and its error text, never the end of the
  sweep (``retries`` more attempts first). A mapping result becomes columns, anything
  else one ``result`` column.
* The function is pickled once per sweep and scattered to the cluster (``ship``).
* Finished cases are cached under the session (``ensembles/<folder>/cases/``), keyed by
  the case and the function's identity (``identity``: what the workers run, user
  modules included), so running the same sweep again skips them, and changing the
  function (or a module it uses) runs everything again. A hit is used only when the
  stored case equals the requested one. What cannot be hashed makes the sweep (or the
  case) uncacheable, with a note: never a stale reuse. The folder is ``name=`` when
  given, else the function's name plus 8 characters of its identity, so two different
  functions called ``run`` do not overwrite each other's tables.
* Interrupting the cell (Ctrl+C, a ``run_python`` timeout) ignores further SIGINTs
  while it cleans up: cancels the cases not yet finished (bounded calls: an unreachable
  scheduler cannot hold the cell past the kernel's grace period), keeps and caches the
  finished ones, saves the partial table, prints the summary, kills the local worker
  processes still running cancelled cases (cancelling does not stop a running case, and
  the next sweep would wait behind it; the nannies start fresh workers), and raises
  :class:`EnsembleInterrupted` (a ``KeyboardInterrupt``), so the cell stops as an
  interrupted cell should; ``ensemble.last`` holds the partial table and re-running the
  call resumes. On an external cluster the running cases finish there, unused.
* The cell shows one progress line (redrawn with ``\\r``; the capture keeps its final
  state) and ends with a one-line summary plus the path of the full table
  (``results.csv``, and ``results.parquet`` when pyarrow is installed); the model reads
  that, not the rows. A file that cannot be written is a note, not an error:
  ``ensemble.last`` is set before any file is written.

Only the standard library is imported here at module level: dask, distributed, pandas
and tqdm load on the first call.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simagent.kernel_api.cache import CaseCache
from simagent.kernel_api.case_runner import portable_runner
from simagent.kernel_api.cases import (
    case_key,
    normalize_cases,
    safe_name,
    same_case,
    table_rows,
)
from simagent.kernel_api.cluster import bounded, engine, kill_local_workers, running_on
from simagent.kernel_api.identity import Uncacheable, sha
from simagent.kernel_api.ship import prepare, require_packages
from simagent.kernel_api.sweep_summary import detail_lines, stats_of, summary_line
from simagent.paths import (
    SESSION_DIR_ENV,
    SessionPaths,
    private_dir,
    private_file,
    private_opener,
    write_private,
)

#: Seconds within which the interrupt cleanup (locating, cancelling, collecting) gives
#: up waiting on the scheduler; the kernel restarts a cell still busy 10 s after it.
CLEANUP_S = 4.0
#: Limit for one scheduler call during the cleanup.
CALL_S = 1.5


class EnsembleInterrupted(KeyboardInterrupt):
    """The sweep was interrupted; ``table`` holds every case (unfinished ones cancelled)."""

    def __init__(self, message: str, table: Any = None) -> None:
        super().__init__(message)
        self.table = table


def ensembles_root() -> Path:
    """``<session>/ensembles`` in a simagent kernel; ``./.simagent/ensembles`` elsewhere."""
    session = os.environ.get(SESSION_DIR_ENV)
    if session:
        return SessionPaths(Path(session)).ensembles
    return Path.cwd() / ".simagent" / "ensembles"


class SigintGuard:
    """Ignores SIGINT from :meth:`ignore` until :meth:`restore` (main thread only).

    The interrupt cleanup must not be cut short by a second Ctrl+C or by the resent
    SIGINT of a supervisor that waits for the cell to stop: that would lose the
    finished cases and leave cancelled ones running.
    """

    def __init__(self) -> None:
        self._old: Any = None
        self.active = False

    def ignore(self) -> None:
        if not self.active and threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, signal.SIG_IGN)
            self.active = True

    def restore(self) -> None:
        if self.active:
            signal.signal(signal.SIGINT, self._old if self._old is not None
                          else signal.default_int_handler)
            self.active = False


@dataclass
class _Outcome:
    wall: float = 0.0
    interrupted: bool = False
    #: Worker address -> cancelled cases it was running (None: unknown, all workers).
    running: dict[str, int] | None = field(default_factory=dict)


def ensemble(fn: Callable[..., Any], cases: Iterable[Mapping[str, Any]], *,
             workers: int | None = None, scheduler: str | None = None, retries: int = 0,
             cache: bool = True, name: str | None = None, progress: bool = True) -> Any:
    """Run ``fn(**case)`` for every case on Dask; return a pandas DataFrame, one row per case.

    Columns: the case parameters, the result fields (a dict result's keys, else
    ``result``), then ``status`` (ok | error | cancelled), ``error`` (one line),
    ``elapsed_s``, ``attempts`` and ``cached``. ``workers`` sizes the local cluster
    (default: one per core); ``scheduler="tcp://host:port"`` uses an existing cluster;
    ``retries`` re-runs a failing case that many more times; ``cache=False`` ignores and
    does not write cached results; ``name`` names the folder ``ensembles/<name>/``
    (default: the function's name and a short hash of it) holding the cache,
    ``results.csv``/``.parquet``, ``errors.txt`` and ``summary.json``. See the module
    docstring for interrupts.
    """
    if not callable(fn):
        raise TypeError("ensemble(fn, cases): fn must be a function taking the case's keys "
                        "as keyword arguments")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError("retries must be a non-negative integer")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise ValueError("workers must be a positive integer")

    require_packages()
    case_list = normalize_cases(cases)
    ident, blob = prepare(fn)
    label, folder = sweep_folder(fn, name, ident.key or sha(blob))
    store = CaseCache(folder / "cases")
    store.clean_temporary()
    notes: list[str] = []
    keys = _case_keys(ident.key, case_list, notes, ident.problems, cache)
    records = cached_records(store, keys, case_list) if cache else [None] * len(case_list)
    todo = [i for i, r in enumerate(records) if r is None]

    ensemble.last = None  # type: ignore[attr-defined]  # never a previous sweep's table
    guard = SigintGuard()
    try:
        outcome, n_workers, where, local = _Outcome(), 0, "cache", True
        if todo:
            eng = engine(scheduler, workers)
            # counted now: after an interrupt the scheduler may no longer answer
            where, local, n_workers = eng.label, eng.local, eng.workers
            outcome = _run(eng, blob, ident.fresh, retries, case_list, todo, records,
                           keys, store if cache else None, label, progress, guard)
        if store.failures:
            notes.append(store.note())
        table = _finish(label, folder, case_list, records, outcome, n_workers, where, notes)
        if outcome.interrupted:
            _stop_running(outcome.running, local, where)
            done = int((table.status != "cancelled").sum())
            raise EnsembleInterrupted(
                f"sweep '{label}' interrupted after {done} of {len(case_list)} cases; "
                "ensemble.last holds the partial table", table)
        return table
    finally:
        guard.restore()


ensemble.last = None  # type: ignore[attr-defined]


def sweep_folder(fn: Callable[..., Any], name: str | None, identity: str
                 ) -> tuple[str, Path]:
    """The sweep's label and folder: ``name``, else the function's name plus the first 8
    characters of its identity, so different functions with one name keep their tables."""
    label = safe_name(name or getattr(fn, "__name__", None) or type(fn).__name__)
    return label, ensembles_root() / (label if name else f"{label}-{identity[:8]}")


def cached_records(store: CaseCache, keys: list[str | None], cases: list[dict[str, Any]]
                   ) -> list[dict[str, Any] | None]:
    """Cached records by case; a stored record for another case (a collision, a foreign
    file) is a miss."""
    out: list[dict[str, Any] | None] = []
    for key, case in zip(keys, cases, strict=True):
        hit = store.load(key) if key is not None else None
        ok = hit is not None and same_case(hit.get("case"), case)
        out.append({**hit, "cached": True} if ok and hit is not None else None)
    return out


def _case_keys(fn_key: str | None, cases: list[dict[str, Any]], notes: list[str],
               problems: list[str], cache: bool) -> list[str | None]:
    """Each case's cache key, None where it cannot be computed (with a note)."""
    if fn_key is None:
        if cache:
            notes.append(f"note: nothing of this sweep is cached: {problems[0]}")
        return [None] * len(cases)
    keys: list[str | None] = []
    failed: list[str] = []
    for case in cases:
        try:
            keys.append(case_key(fn_key, case))
        except Uncacheable as exc:
            keys.append(None)
            failed.append(str(exc))
    if failed and cache:
        notes.append(f"note: {len(failed)} case{'s' * (len(failed) != 1)} not cached: "
                     f"{failed[0]}")
    return keys


def _finish(label: str, folder: Path, cases: list[dict[str, Any]],
            records: list[dict[str, Any] | None], outcome: _Outcome, n_workers: int,
            where: str, notes: list[str]) -> Any:
    """Table, ``ensemble.last``, files (a failure there is a note) and the printed text."""
    import pandas as pd  # heavy: loads with the first ensemble, not with kernel_api

    done = [r if r is not None else {"status": "cancelled", "error": "", "elapsed_s": None,
                                     "attempts": 0} for r in records]
    columns, rows = table_rows(cases, done)
    table = pd.DataFrame(rows, columns=columns)
    ensemble.last = table  # type: ignore[attr-defined]
    failures = [(c, r.get("error", ""), r.get("traceback", ""))
                for c, r in zip(cases, done, strict=True) if r.get("status") == "error"]
    stats = stats_of(label, rows, outcome.wall, n_workers, where, outcome.interrupted)
    paths, errors_path = [], None
    try:
        private_dir(folder)
        paths, note = _write_tables(table, folder)
        if note:
            notes.append(note)
        errors_path = _write_errors(folder, failures)
        write_private(folder / "summary.json", json.dumps(
            {**stats.as_dict(), "tables": paths, "errors": errors_path}, indent=1))
    except OSError as exc:
        notes.append(f"note: could not write the sweep's files in {folder} "
                     f"({type(exc).__name__}: {exc.strerror or exc}); the table is "
                     "`ensemble.last`")
    lines = [summary_line(stats), *detail_lines(stats, paths, len(columns),
                                                [(c, e) for c, e, _tb in failures],
                                                errors_path, "\n".join(notes))]
    print("\n".join(lines), flush=True)
    return table


def _write_tables(table: Any, folder: Path) -> tuple[list[str], str]:
    """The files the table was saved to, and a note when Parquet was skipped."""
    csv = folder / "results.csv"
    with open(csv, "w", encoding="utf-8", newline="", opener=private_opener) as fh:
        table.to_csv(fh, index=False)
    paths = [str(csv)]
    parquet = folder / "results.parquet"
    try:
        import pyarrow  # noqa: F401  (the optional [parquet] extra: is it installed?)
    except ImportError:
        parquet.unlink(missing_ok=True)
        return paths, ""
    try:
        private_file(parquet)
        with open(parquet, "r+b") as fh:  # truncated by the writer; the mode stays 0600
            fh.truncate()
            table.to_parquet(fh, index=False)
        paths.append(str(parquet))
    except Exception as exc:  # columns holding arrays or objects Parquet cannot store
        with contextlib.suppress(OSError):
            parquet.unlink(missing_ok=True)
        return paths, f"(no Parquet copy: {type(exc).__name__}; the CSV has every row)"
    return paths, ""


def _write_errors(folder: Path, failures: list[tuple[dict[str, Any], str, str]]
                  ) -> str | None:
    path = folder / "errors.txt"
    if not failures:
        path.unlink(missing_ok=True)
        return None
    with open(path, "w", encoding="utf-8", opener=private_opener) as fh:
        for case, error, tb in failures:
            fh.write(f"=== case {json.dumps(case, default=repr)}\n{tb or error}\n\n")
    return str(path)


def _stop_running(running: dict[str, int] | None, local: bool, where: str) -> None:
    """After an interrupt: stop cancelled cases still running (local), or say so."""
    if running is not None and not running:
        return
    if local:
        n = kill_local_workers(set(running) if running is not None else None)
        if n:
            print(f"note: stopped {n} worker process{'es' * (n != 1)} still running "
                  "cancelled cases; fresh workers start in the background", flush=True)
        return
    n = sum(running.values()) if running else 0
    what = f"{n} cancelled case{'s' * (n != 1)}" if n else "cancelled cases"
    print(f"note: {what} already running on {where} continue there until they finish "
          "(their results are not used)", flush=True)


def _run(eng: Any, blob: bytes, fresh: dict[str, str], retries: int,
         cases: list[dict[str, Any]], todo: list[int], records: list[dict[str, Any] | None],
         keys: list[str | None], store: CaseCache | None, name: str, progress: bool,
         guard: SigintGuard) -> _Outcome:
    """Submit ``todo``, collect results as they finish.

    On ``KeyboardInterrupt`` (see the module docstring) the unfinished futures are
    cancelled and the finished ones still collected and cached; on any other error the
    unfinished futures are cancelled (and local workers running them stopped) before it
    propagates, so no case keeps running for a sweep that is gone.
    """
    from distributed import as_completed  # heavy: loads with the first ensemble
    from tqdm import tqdm  # with the first ensemble, as above


    client = eng.client
    runner = portable_runner()
    run_id = uuid.uuid4().hex[:8]
    t0 = time.perf_counter()
    futures: dict[Any, int] = {}
    bar = None
    shipped = None
    completed = False
    try:
        shipped = client.scatter(blob, hash=False)
        for i in todo:
            fut = client.submit(runner, shipped, cases[i], retries, fresh,
                                key=f"{name}-{run_id}-{i}", pure=False)
            futures[fut] = i
        bar = tqdm(total=len(cases), initial=len(cases) - len(todo), desc=name,
                   unit="case", file=sys.stdout, ncols=80, mininterval=0.25,
                   disable=not progress)
        for fut in as_completed(list(futures), loop=client.loop):
            _keep(fut, futures[fut], records, keys, cases, store)
            bar.update(1)
        completed = True
    except KeyboardInterrupt:
        guard.ignore()
        completed = True  # the cleanup cancels what is left
        running = after_interrupt(client, futures, records, keys, cases, store)
        return _Outcome(time.perf_counter() - t0, True, running)
    finally:
        if bar is not None:
            bar.close()
        open_futures = [] if completed else [f for f in futures if not f.done()]
        if open_futures:
            running = running_on(client, {f.key for f in open_futures}, CALL_S)
            bounded(lambda: client.cancel(open_futures), CALL_S)
            _stop_running(running, eng.local, eng.label)
        if shipped is not None:
            with contextlib.suppress(Exception):
                shipped.release()
    return _Outcome(time.perf_counter() - t0, False, {})


def after_interrupt(client: Any, futures: dict[Any, int],
                    records: list[dict[str, Any] | None], keys: list[str | None],
                    cases: list[dict[str, Any]], store: CaseCache | None
                    ) -> dict[str, int] | None:
    """Cancel the open futures, keep every one that finished or failed (a KilledWorker
    is an error, not a cancellation); return where cancelled cases were running.

    Statuses are read right before the cancel, so only a case finishing during the
    cancel's round trip to the scheduler is lost (Dask drops a cancelled key's result);
    its row says ``cancelled``, which is true of its result.
    """
    deadline = time.monotonic() + CLEANUP_S
    open_keys = {f.key for f in futures if f.status not in ("finished", "error")}
    running = running_on(client, open_keys, CALL_S) if open_keys else {}
    pending = [f for f in futures if f.status not in ("finished", "error")]
    if pending:
        bounded(lambda: client.cancel(pending), CALL_S)
    for fut, i in futures.items():
        left = deadline - time.monotonic()
        if records[i] is None and fut.status in ("finished", "error") and left > 0:
            _keep(fut, i, records, keys, cases, store, timeout=left)
    return running


def _collect(future: Any, timeout: float | None = None) -> dict[str, Any] | None:
    """A finished future's record; infrastructure failures become error records; None
    when it could not be fetched within ``timeout`` (the case counts as cancelled)."""
    try:
        record = future.result(timeout=timeout)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # KilledWorker, a cancelled future (BaseException subclass)
        if timeout is not None and isinstance(exc, TimeoutError):
            return None
        message = " ".join(str(exc).split())
        return {"status": "error", "attempts": 1, "elapsed_s": None, "traceback": "",
                "error": f"{type(exc).__name__}: {message}"[:500] if message
                else type(exc).__name__}
    return record if isinstance(record, dict) else {
        "status": "error", "error": f"unexpected worker reply {type(record).__name__}"}


def _keep(fut: Any, i: int, records: list[dict[str, Any] | None], keys: list[str | None],
          cases: list[dict[str, Any]], store: CaseCache | None,
          timeout: float | None = None) -> None:
    record = _collect(fut, timeout)
    records[i] = record
    if record is None or store is None or keys[i] is None or record.get("status") != "ok":
        return
    if record.get("uncacheable"):
        store.failures[record["uncacheable"]] = store.failures.get(record["uncacheable"], 0) + 1
        return
    store.save(keys[i], {**record, "case": cases[i], "saved": time.time()})
