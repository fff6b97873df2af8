"""``ensemble(fn, cases)``: a parameter sweep or ensemble on Dask, as one call in the kernel.

Scientists outgrow one machine exactly when they sweep, so the sweep runs on Dask
distributed: a local cluster of worker processes by default, or any existing scheduler
(``scheduler=``, ``$SIMAGENT_DASK_SCHEDULER``, ``[ensembles] scheduler``) with no other
change to the study. The contract:

* ``fn(**case)`` runs once per case on a worker; a case that raises is a row with status
  ``error`` and its error text, never the end of the sweep (``retries`` more attempts
  first). A mapping result becomes columns, anything else one ``result`` column.
* Finished cases are cached under the session (``ensembles/<name>/cases/``), keyed by
  the case and the function's identity (``cases.function_key``), so running the same
  sweep again skips them, and changing the function runs everything again.
* Interrupting the cell (Ctrl+C, a ``run_python`` timeout) cancels the cases not yet
  finished, keeps and caches the finished ones, saves the partial table, prints the
  summary and raises :class:`EnsembleInterrupted` (a ``KeyboardInterrupt``), so the cell
  stops as an interrupted cell should; ``ensemble.last`` holds the partial table and
  re-running the call resumes.
* The cell shows one progress line (redrawn with ``\\r``; the capture keeps its final
  state) and ends with a one-line summary plus the path of the full table
  (``results.csv``, and ``results.parquet`` when pyarrow is installed); the model reads
  that, not the rows.

Only the standard library is imported here at module level: dask, distributed, pandas
and tqdm load on the first call.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from simagent.kernel_api.cache import CaseCache
from simagent.kernel_api.cases import (
    case_key,
    function_key,
    normalize_cases,
    safe_name,
    table_rows,
)
from simagent.kernel_api.summary import detail_lines, stats_of, summary_line
from simagent.paths import SESSION_DIR_ENV, SessionPaths


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


def _check_picklable(fn: Callable[..., Any]) -> None:
    import cloudpickle

    try:
        cloudpickle.dumps(fn)
    except Exception as exc:
        raise TypeError(
            f"the case function cannot be sent to the workers ({type(exc).__name__}: {exc}). "
            "Create what it needs inside it (imports, solvers, mechanisms) from plain "
            "parameters instead of reading such objects from kernel globals") from exc


def _collect(future: Any) -> dict[str, Any]:
    """A finished future's record; infrastructure failures become error records."""
    try:
        record = future.result()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # KilledWorker, a cancelled future (BaseException subclass)
        message = " ".join(str(exc).split())
        return {"status": "error", "attempts": 1, "elapsed_s": None, "traceback": "",
                "error": f"{type(exc).__name__}: {message}"[:500] if message
                else type(exc).__name__}
    return record if isinstance(record, dict) else {
        "status": "error", "error": f"unexpected worker reply {type(record).__name__}"}


def _save_table(columns: list[str], rows: list[dict[str, Any]], folder: Path
                ) -> tuple[Any, list[str], str]:
    """The DataFrame, the files it was saved to, and a note when Parquet was skipped."""
    import pandas as pd

    table = pd.DataFrame(rows, columns=columns)
    folder.mkdir(parents=True, exist_ok=True)
    csv = folder / "results.csv"
    table.to_csv(csv, index=False)
    paths, note = [str(csv)], ""
    parquet = folder / "results.parquet"
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        parquet.unlink(missing_ok=True)
        return table, paths, note
    try:
        table.to_parquet(parquet, index=False)
        paths.append(str(parquet))
    except Exception as exc:  # columns holding arrays or objects Parquet cannot store
        parquet.unlink(missing_ok=True)
        note = f"(no Parquet copy: {type(exc).__name__}; the CSV has every row)"
    return table, paths, note


def _write_errors(folder: Path, failures: list[tuple[dict[str, Any], str, str]]
                  ) -> str | None:
    path = folder / "errors.txt"
    if not failures:
        path.unlink(missing_ok=True)
        return None
    with open(path, "w", encoding="utf-8") as fh:
        for case, error, tb in failures:
            fh.write(f"=== case {json.dumps(case, default=repr)}\n{tb or error}\n\n")
    return str(path)


def ensemble(fn: Callable[..., Any], cases: Iterable[Mapping[str, Any]], *,
             workers: int | None = None, scheduler: str | None = None, retries: int = 0,
             cache: bool = True, name: str | None = None, progress: bool = True) -> Any:
    """Run ``fn(**case)`` for every case on Dask; return a pandas DataFrame, one row per case.

    Columns: the case parameters, the result fields (a dict result's keys, else
    ``result``), then ``status`` (ok | error | cancelled), ``error`` (one line),
    ``elapsed_s``, ``attempts`` and ``cached``. ``workers`` sizes the local cluster
    (default: one per core); ``scheduler="tcp://host:port"`` uses an existing cluster;
    ``retries`` re-runs a failing case that many more times; ``cache=False`` ignores and
    does not write cached results; ``name`` (default ``fn.__name__``) names the folder
    ``ensembles/<name>/`` holding the cache, ``results.csv``/``.parquet``,
    ``errors.txt`` and ``summary.json``. See the module docstring for interrupts.
    """
    if not callable(fn):
        raise TypeError("ensemble(fn, cases): fn must be a function taking the case's keys "
                        "as keyword arguments")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError("retries must be a non-negative integer")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise ValueError("workers must be a positive integer")
    case_list = normalize_cases(cases)
    name = safe_name(name or getattr(fn, "__name__", None) or type(fn).__name__)
    folder = ensembles_root() / name
    store = CaseCache(folder / "cases")
    store.clean_temporary()
    fn_key = function_key(fn)
    keys = [case_key(fn_key, c) for c in case_list]

    records: list[dict[str, Any] | None] = [None] * len(case_list)
    if cache:
        for i, key in enumerate(keys):
            hit = store.load(key)
            if hit is not None:
                records[i] = {**hit, "cached": True}
    todo = [i for i, r in enumerate(records) if r is None]

    interrupted = False
    wall = 0.0
    n_workers, label = 0, "cache"
    if todo:
        _check_picklable(fn)
        from simagent.kernel_api.cluster import engine
        from simagent.kernel_api.runner import portable_runner

        eng = engine(scheduler, workers)
        label = eng.label
        wall, interrupted = _run(eng.client, portable_runner(), fn, retries, case_list,
                                 todo, records, keys, store if cache else None, name,
                                 progress)
        n_workers = eng.workers
    for i, rec in enumerate(records):
        if rec is None:
            records[i] = {"status": "cancelled", "error": "", "elapsed_s": None,
                          "attempts": 0}

    done: list[dict[str, Any]] = [r for r in records if r is not None]
    columns, rows = table_rows(case_list, done)
    table, paths, note = _save_table(columns, rows, folder)
    failures = [(c, r.get("error", ""), r.get("traceback", ""))
                for c, r in zip(case_list, done, strict=True) if r.get("status") == "error"]
    errors_path = _write_errors(folder, failures)
    stats = stats_of(name, rows, wall, n_workers, label, interrupted)
    summary = summary_line(stats)
    lines = [summary, *detail_lines(stats, paths, len(columns),
                                    [(c, e) for c, e, _tb in failures], errors_path, note)]
    (folder / "summary.json").write_text(json.dumps(
        {**stats.as_dict(), "tables": paths, "errors": errors_path}, indent=1))
    print("\n".join(lines), flush=True)
    ensemble.last = table  # type: ignore[attr-defined]
    if interrupted:
        raise EnsembleInterrupted(
            f"sweep '{name}' interrupted after {stats.ok + stats.failed} of {stats.cases} "
            "cases; ensemble.last holds the partial table", table)
    return table


ensemble.last = None  # type: ignore[attr-defined]


def _run(client: Any, runner: Callable[..., Any], fn: Callable[..., Any], retries: int,
         cases: list[dict[str, Any]], todo: list[int], records: list[dict[str, Any] | None],
         keys: list[str], store: CaseCache | None, name: str, progress: bool
         ) -> tuple[float, bool]:
    """Submit ``todo``, collect results as they finish; (wall seconds, interrupted).

    On ``KeyboardInterrupt`` the unfinished futures are cancelled and the ones that
    finished meanwhile are still collected and cached.
    """
    from distributed import as_completed
    from tqdm import tqdm

    run_id = uuid.uuid4().hex[:8]
    t0 = time.perf_counter()
    futures = {}
    bar = None
    try:
        for i in todo:
            fut = client.submit(runner, fn, cases[i], retries, key=f"{name}-{run_id}-{i}",
                                pure=False)
            futures[fut] = i
        bar = tqdm(total=len(cases), initial=len(cases) - len(todo), desc=name,
                   unit="case", file=sys.stdout, ncols=80, mininterval=0.25,
                   disable=not progress)
        for fut in as_completed(list(futures), loop=client.loop):
            _keep(fut, futures[fut], records, keys, cases, store)
            bar.update(1)
    except KeyboardInterrupt:
        pending = [f for f in futures if not f.done()]
        if pending:
            client.cancel(pending)
        for fut, i in futures.items():
            if records[i] is None and fut.status == "finished":
                _keep(fut, i, records, keys, cases, store)
        return time.perf_counter() - t0, True
    finally:
        if bar is not None:
            bar.close()
    return time.perf_counter() - t0, False


def _keep(fut: Any, i: int, records: list[dict[str, Any] | None], keys: list[str],
          cases: list[dict[str, Any]], store: CaseCache | None) -> None:
    record = _collect(fut)
    records[i] = record
    if store is not None and record.get("status") == "ok":
        store.save(keys[i], {**record, "case": cases[i], "saved": time.time()})
