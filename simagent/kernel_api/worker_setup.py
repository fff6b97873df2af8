"""Preloaded into every worker process of the session's local Dask cluster.

jupyter_client interrupts a kernel by sending SIGINT to its whole process group, and the
local cluster's worker processes belong to that group. Python's default SIGINT handler
would raise ``KeyboardInterrupt`` in a worker's event loop and kill it, so one Ctrl+C
(or a ``run_python`` timeout) would leave the cluster without workers, and the results
they hold but the kernel has not fetched yet would be lost. Workers ignore SIGINT
instead; the interrupted sweep collects those results, cancels the rest and then kills
only the workers still running cancelled cases (see ``ensemble``), whose nannies start
fresh ones. Shutdown still works: the kernel's SIGTERM/SIGKILL reach them as before.

Each worker also stops the HTTP server Dask starts in it (metrics and info pages over
plain HTTP, readable by any local user; the worker's own comm port speaks TLS): here,
so a worker a nanny restarts is covered too.
"""

from __future__ import annotations

import signal
import threading

from simagent.kernel_api.cluster import close_http


def ignore_sigint() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


ignore_sigint()  # at import: the worker imports preloads in its main thread


def dask_setup(worker: object) -> None:
    """Dask's preload hook (also covers a module imported before the worker existed)."""
    ignore_sigint()
    close_http(worker)
