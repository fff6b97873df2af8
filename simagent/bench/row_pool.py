"""Bench workflows in worker processes: ``make run`` on every core, same records.

A replayed row is CPU work in this process (the graph, the context layers, counting, the
oracle's repricing) and a recording is CPU work in a kernel; one process kept one core
busy. Rows of different workflows share nothing: each workflow records its own kernel
and replays into its own folders, and a row's figures depend only on the recording and
the script. So whole workflows go to ``workers`` processes, largest first so the last
one to finish is a short one. Workers are forked while the bench has started no thread
or kernel yet (they start at once, with everything imported), else spawned. Each worker
appends its rows to ``records.jsonl`` as they finish, under a file lock, so an
interrupted bench still resumes row by row; the caller gets the rows back in plan order,
as a serial run returns them. Progress lines reach the caller's callback through a
queue.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: ``--jobs`` when not given: one worker per core, at most this many (each worker holds
#: a graph and, while recording, a kernel with its simulator loaded).
MAX_DEFAULT_JOBS = 4

Say = Callable[[str], None]


@dataclass
class WorkflowJob:
    """One workflow's missing rows: (window, enforced, policy, epoch, progress label)."""

    wf: Any
    runs: list[tuple[int, bool, Any, int, str]]
    #: this workflow's rows already finished (an enforced run may reuse one: its twin)
    done: list[dict[str, Any]] = field(default_factory=list)

    @property
    def weight(self) -> int:
        """Rough cost for ordering: replayed steps (recording included)."""
        return (len(self.runs) + 1) * max(1, int(getattr(self.wf, "tool_steps", 1) or 1))


def default_jobs() -> int:
    return max(1, min(os.cpu_count() or 1, MAX_DEFAULT_JOBS))


def locked_append(append: Callable[[Path, dict[str, Any]], None], path: Path,
                  row: dict[str, Any]) -> None:
    """``append(path, row)`` under an exclusive lock on ``path``'s lock file: workers
    append to one records file, and a torn-tail check must not see another's half line."""
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            append(path, row)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


_QUEUE: Any = None  # in a worker: where its progress lines go


def _init_worker(queue: Any) -> None:
    global _QUEUE
    _QUEUE = queue


def _say_to_queue(message: str) -> None:
    _QUEUE.put(message)


def _run_in_worker(fn: Callable[[WorkflowJob, Say], list[dict[str, Any]]],
                   job: WorkflowJob) -> list[dict[str, Any]]:
    return fn(job, _say_to_queue)


def run_jobs(fn: Callable[[WorkflowJob, Say], list[dict[str, Any]]],
             jobs: Sequence[WorkflowJob], workers: int, say: Say) -> list[list[dict[str, Any]]]:
    """``fn(job, say)`` for every job (``fn`` picklable: a module-level function or a
    partial of one), in ``workers`` processes when there are several jobs; the results in
    ``jobs`` order. The first failure cancels the jobs not started and is raised."""
    workers = min(workers, len(jobs))
    if workers <= 1:
        return [fn(job, say) for job in jobs]
    ctx = multiprocessing.get_context(start_method())
    queue = ctx.Queue()
    relay = threading.Thread(target=_relay, args=(queue, say), daemon=True,
                             name="bench-progress")
    results: list[list[dict[str, Any]] | None] = [None] * len(jobs)
    order = sorted(range(len(jobs)), key=lambda i: -jobs[i].weight)
    try:
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                 initargs=(queue,)) as pool:
            try:
                futures = {pool.submit(_run_in_worker, fn, jobs[i]): i for i in order}
                relay.start()  # after the workers started: a fork copies no running thread
                done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            except BaseException:  # ctrl+C: no queued workflow may start after it
                pool.shutdown(wait=True, cancel_futures=True)
                raise
            failed = next((f for f in done if f.exception() is not None), None)
            if failed is not None:
                pool.shutdown(wait=True, cancel_futures=True)
                raise failed.exception()  # type: ignore[misc]
            for future, i in futures.items():
                results[i] = future.result()
    finally:
        if relay.is_alive():
            queue.put(None)
            relay.join(timeout=5)
    return [r or [] for r in results]


def start_method() -> str:
    """``fork`` on Linux while this process runs one thread (forking copies no other
    thread's locks); ``spawn`` otherwise (macOS frameworks are not fork-safe)."""
    return "fork" if sys.platform.startswith("linux") and threading.active_count() == 1 \
        else "spawn"


def _relay(queue: Any, say: Say) -> None:
    """Progress lines from the workers to ``say`` until the ``None`` that ends the pool."""
    while (message := queue.get()) is not None:
        try:
            say(message)
        except Exception:  # a progress display must not stop the bench
            pass
