"""Which Dask cluster a sweep runs on, started or connected once per kernel and reused.

Order: the ``scheduler=`` argument, then ``$SIMAGENT_DASK_SCHEDULER`` (the session sets
it from ``[ensembles] scheduler`` in the workspace config), then a
``dask.distributed.LocalCluster`` of this kernel: worker *processes*, one per core (or
``workers=`` / ``[ensembles] workers``), one thread each, so CPU-bound Python cases run
in parallel and the kernel itself only waits. An existing cluster (dask-jobqueue on an
HPC system, dask-kubernetes, ``dask scheduler`` + ``dask worker``) is used as it is;
the study does not change.

The local cluster binds to 127.0.0.1 only and speaks TLS with a certificate made for it
alone (``Security.temporary()``: in memory, handed to the worker processes through their
start-up pipe, never on a command line or in a file): on a shared login node any user
can reach 127.0.0.1, and a scheduler that accepts them runs their tasks as this session's
user, with its environment and keys. Only the kernel's client and the cluster's own
workers hold the certificate. The dashboard (plain HTTP, no login) is off unless asked for
(``[ensembles] dashboard = true`` or ``$SIMAGENT_DASK_DASHBOARD=1``); its link then goes
to the human channel once per kernel. An external scheduler is used as it is, with a
warning when its address is not ``tls://`` (:func:`plain_warning`).

The cluster keeps Dask's logs below ERROR out of the cell's output, gives workers a
non-interactive matplotlib backend, and preloads ``worker_setup`` so a kernel interrupt
does not kill its workers. A cluster that lost its workers anyway is replaced on the
next call.

Cancelling a Dask future does not stop a case that is already running: its worker
thread goes on, and the next sweep's cases queue behind it. After an interrupt the
sweep therefore kills the local worker processes that held its running cases
(:func:`kill_local_workers`; their nannies start fresh ones at once). Workers of an
external cluster are not ours to kill: their running cases finish there, unused.
Calls that talk to the scheduler during that cleanup are bounded (:func:`bounded`),
since the kernel restarts a cell that has not stopped 10 s after an interrupt.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from simagent.config import DASHBOARD_ENV, SCHEDULER_ENV, WORKERS_ENV
from simagent.kernel_api.human import notify_human

DASHBOARD_PORT = 8787
CONNECT_TIMEOUT_S = 10
WORKER_START_TIMEOUT_S = 60
_PRELOAD = "simagent.kernel_api.worker_setup"
#: Values of ``$SIMAGENT_DASK_DASHBOARD`` that turn the dashboard on.
ON_WORDS = ("1", "true", "yes", "on")
#: Schemes that encrypt and authenticate (``inproc://`` never leaves the process).
SECURE_SCHEMES = ("tls://", "inproc://")


@dataclass
class Engine:
    """A connected client and how to describe it in the summary."""

    client: Any
    label: str  # "local cluster" or the scheduler address
    local: bool

    @property
    def workers(self) -> int:
        try:
            return len(self.client.nthreads())
        except Exception:
            return 0


_local: tuple[Any, Any] | None = None  # (LocalCluster, Client)
_remote: dict[str, Any] = {}


def default_workers() -> int:
    """``$SIMAGENT_DASK_WORKERS``, else the cores this process may use.

    Dask's own count honours CPU affinity *and* a cgroup CPU quota (a container or a
    Slurm job step given 2 of 64 cores), so a sweep does not oversubscribe them.
    """
    env = os.environ.get(WORKERS_ENV, "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    from dask.system import CPU_COUNT  # heavy: dask loads with the first ensemble

    return max(1, int(CPU_COUNT))


def resolve_scheduler(scheduler: str | None) -> str | None:
    return scheduler or os.environ.get(SCHEDULER_ENV) or None


def dashboard_wanted() -> bool:
    """``$SIMAGENT_DASK_DASHBOARD`` (the session sets it from ``[ensembles] dashboard``)."""
    return os.environ.get(DASHBOARD_ENV, "").strip().lower() in ON_WORDS


def plain_warning(address: str) -> str | None:
    """The one-line warning for an external scheduler reached without TLS (None: TLS)."""
    if address.strip().lower().startswith(SECURE_SCHEMES):
        return None
    return (f"warning: the Dask scheduler {address} is not tls://: anyone who can reach it "
            "can run code as its workers' user, and cases and results travel unencrypted "
            "(Dask's TLS: a tls:// address with distributed.comm.tls certificates)")


def close_http(node: Any) -> None:
    """Stop a Dask node's HTTP server (Dask starts one in every scheduler and worker,
    dashboard or not: metrics, info and log pages over plain HTTP that any local user
    can read). Idempotent, and Dask's own close stops it again harmlessly; called on the
    node's event loop."""
    server = getattr(node, "http_server", None)
    if server is not None:
        server.stop()
    getattr(node, "services", {}).pop("dashboard", None)


async def _close_http_async(node: Any) -> None:
    close_http(node)


def _dashboard_address() -> str:
    """127.0.0.1:8787 when free (the port people know), else any free port."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", DASHBOARD_PORT))
        except OSError:
            return "127.0.0.1:0"
    return f"127.0.0.1:{DASHBOARD_PORT}"


def _start_local(n: int) -> tuple[Any, Any]:
    import dask  # heavy: loads with the first ensemble
    from distributed import Client, LocalCluster  # likewise
    from distributed.security import Security  # likewise

    dashboard = dashboard_wanted()
    # no HTTP routes while the servers Dask always starts still listen (closed below;
    # the workers' by the preload, which also covers a worker a nanny restarts)
    quiet = {"distributed.worker.http.routes": []} | (
        {} if dashboard else {"distributed.scheduler.http.routes": []})
    cluster = None
    try:  # TLS (Security.temporary) for scheduler, nannies, workers; the client inherits it
        with dask.config.set(quiet):
            cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                   host="127.0.0.1", security=Security.temporary(),
                                   dashboard_address=_dashboard_address() if dashboard
                                   else None, silence_logs=logging.ERROR,
                                   preload=[_PRELOAD], env={"MPLBACKEND": "Agg"})
        if not dashboard:  # nor does the cluster's copy of the services name a link
            cluster.sync(_close_http_async, cluster.scheduler)
            cluster.scheduler_info.get("services", {}).pop("dashboard", None)
        client = Client(cluster, set_as_default=False)
    except BaseException:
        if cluster is not None:
            with contextlib.suppress(BaseException):
                cluster.close()
        raise
    return cluster, client


def _healthy(cluster: Any, client: Any, n: int) -> bool:
    """True when the local cluster runs and has its ``n`` workers (waits briefly)."""
    if getattr(getattr(cluster, "status", None), "name", "") != "running":
        return False
    try:
        if len(client.nthreads()) >= n:
            return True
        client.wait_for_workers(n, timeout=5)
        return True
    except Exception:
        return False


def close_local() -> None:
    """Stop this kernel's local cluster (a later sweep starts a new one)."""
    global _local
    if _local is not None:
        cluster, client = _local
        _local = None
        with contextlib.suppress(Exception):
            client.close()
        with contextlib.suppress(Exception):
            cluster.close()


def close_all() -> None:
    """Stop the local cluster and disconnect from every external scheduler."""
    close_local()
    while _remote:
        _address, client = _remote.popitem()
        with contextlib.suppress(Exception):
            client.close()


def local_engine(workers: int | None = None) -> Engine:
    """The kernel's LocalCluster, started on first use and resized to ``workers``."""
    global _local
    n = workers or default_workers()
    if _local is not None:
        cluster, client = _local
        if _healthy(cluster, client, len(cluster.workers)):
            if len(cluster.workers) != n:
                cluster.scale(n)
                client.wait_for_workers(n, timeout=WORKER_START_TIMEOUT_S)
            return Engine(client, "local cluster", True)
        close_local()
    _local = _start_local(n)
    _show_dashboard(_local[0].dashboard_link)  # "" unless asked for (close_http)
    return Engine(_local[1], "local cluster", True)


def remote_engine(address: str) -> Engine:
    """A client of an existing scheduler, connected once per kernel."""
    from distributed import Client  # heavy: loads with the first ensemble

    client = _remote.get(address)
    if client is not None and client.status == "running":
        return Engine(client, address, False)
    if client is not None:  # a dead connection: release it before opening a new one
        with contextlib.suppress(Exception):
            client.close(timeout=2)
        _remote.pop(address, None)
    try:
        client = Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
    except Exception as exc:
        where = "scheduler=" if os.environ.get(SCHEDULER_ENV) != address else f"${SCHEDULER_ENV}"
        raise ConnectionError(f"cannot reach the Dask scheduler at {address} (from {where}): "
                              f"{type(exc).__name__}: {exc}") from exc
    _remote[address] = client
    if warning := plain_warning(address):  # once per connection, in the cell's output
        print(warning, flush=True)
    with contextlib.suppress(Exception):  # only a scheduler that serves one has a dashboard
        if "dashboard" in (client.scheduler_info().get("services") or {}):
            _show_dashboard(client.dashboard_link)
    return Engine(client, address, False)


def bounded(call: Callable[[], Any], timeout: float) -> tuple[bool, Any]:
    """``(True, call())`` if it returns within ``timeout`` s, else ``(False, error|None)``.

    The call goes on in a daemon thread when it takes longer (a scheduler that stopped
    answering); the caller moves on.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # reported to the caller
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True, name="simagent-bounded")
    thread.start()
    thread.join(timeout)
    if thread.is_alive() or "error" in box:
        return False, box.get("error")
    return True, box.get("value")


def running_on(client: Any, keys: set[str], timeout: float = 2.0) -> dict[str, int] | None:
    """Worker address -> how many of ``keys`` it is processing; None if unknown."""
    ok, processing = bounded(client.processing, timeout)
    if not ok or not isinstance(processing, dict):
        return None
    out = {}
    for address, held in processing.items():
        n = sum(1 for key in held if key in keys)
        if n:
            out[address] = n
    return out


def kill_local_workers(addresses: set[str] | None) -> int:
    """Kill this kernel's local worker processes at ``addresses`` (all when None).

    Their nannies notice and start fresh worker processes in the background, which the
    next sweep waits for (``local_engine``). Returns how many processes were killed.
    """
    if _local is None:
        return 0
    killed = 0
    for nanny in list(_local[0].workers.values()):
        try:
            address, pid = nanny.worker_address, nanny.pid
        except Exception:
            continue
        if pid and (addresses is None or address in addresses):
            with contextlib.suppress(OSError):
                os.kill(pid, getattr(signal, "SIGKILL", signal.SIGTERM))
                killed += 1
    return killed


def engine(scheduler: str | None = None, workers: int | None = None) -> Engine:
    address = resolve_scheduler(scheduler)
    return remote_engine(address) if address else local_engine(workers)


def _show_dashboard(link: str | None) -> None:
    if link:
        notify_human(f"Dask dashboard: {link}", once=True)
