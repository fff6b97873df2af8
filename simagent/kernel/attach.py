"""Attaching to a kernel the person already runs (``--kernel EXISTING``).

EXISTING names a connection file (:mod:`simagent.kernel.connection` finds it and checks
that its kernel listens: what the layers above may know without a client). simagent does not own
that kernel, so this link never signals, restarts or shuts it down on its own: closing
it closes simagent's sockets and nothing else, whatever way simagent ends (a SIGKILLed
simagent leaves no process to stop it). A restart happens only with the person's consent
(:func:`simagent.kernel.ladder.consents`), as the kernel protocol's ``shutdown_request`` with
``restart``, which the kernel's own manager (jupyter_server, JupyterLab) acts on.

Other clients (JupyterLab) share the kernel's iopub broadcast; the supervisor keeps only
messages whose parent header is one of its own requests, and the shell channel is
simagent's own socket, so their cells and outputs never reach the model.
"""

from __future__ import annotations

import re
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from simagent.kernel.connection import check, runtime_dir, still_listening
from simagent.kernel.ladder import control_request
from simagent.kernel.port import KernelStartError

#: How long an attach waits for the kernel to answer ``kernel_info``.
ATTACH_READY_S = 10.0
#: How long a consented restart waits for the kernel's manager to bring it back.
RESTART_BACK_S = 30.0
#: How long a standalone kernel told to shut down may take before it is killed.
STOP_WAIT_S = 5.0
#: How long asking a Jupyter server whether it manages the kernel may take.
_SERVER_ASK_S = 2.0


@dataclass(frozen=True)
class Manager:
    """What would restart an attached kernel, as far as simagent can tell: a Jupyter
    server (JupyterLab, Notebook) restarts it in place; ``jupyter kernel`` does not, so a
    restart stops it. The person is told which before they allow a restart."""

    kind: str  # "server", "standalone" or "unknown"
    name: str = ""
    url: str = ""
    token: str = ""
    pid: int | None = None  # the kernel's process, where simagent found it

    def on_restart(self) -> str:
        """What a restart will do to this kernel, in words (said before they answer)."""
        if self.kind == "server":
            return (f"{self.name[0].upper()}{self.name[1:]} restarts it in place: it comes "
                    "back empty, every variable lost.")
        if self.kind == "standalone":
            return (f"It was started with {self.name}, which does not restart kernels: y "
                    "STOPS it (its process ends, every variable lost) and simagent has no "
                    "kernel until you start one and attach again (simagent --kernel latest).")
        return ("Every variable is lost; a kernel a Jupyter server runs comes back empty, "
                "one started with `jupyter kernel` stops instead.")


def find_manager(path: Path) -> Manager:
    """Who runs the kernel of connection file ``path``: a Jupyter server that lists its id
    (``jpserver-*.json`` in the runtime directory, as ``jupyter server list`` reads), else
    the parent of the local process started with that file (``jupyter kernel``)."""
    kid = path.stem.removeprefix("kernel-")
    try:
        from jupyter_server.serverapp import list_running_servers  # heavy (tornado); attach only

        servers = list(list_running_servers(str(runtime_dir())))
    except Exception:  # no jupyter_server, or an unreadable file: ask the processes
        servers = []
    for server in servers:
        url, token = str(server.get("url", "")), str(server.get("token", ""))
        try:
            req = urllib.request.Request(f"{url}api/kernels/{kid}",
                                         headers={"Authorization": f"token {token}"})
            with urllib.request.urlopen(req, timeout=_SERVER_ASK_S) as resp:
                if resp.status == 200:
                    return Manager("server", f"its Jupyter server ({url})", url, token)
        except (OSError, ValueError):
            continue
    targets = {str(path), str(path.resolve())}
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if not targets.intersection(proc.info["cmdline"] or ()):
                continue
            parent = proc.parent()
            words = " ".join(parent.cmdline()) if parent else ""
        except (psutil.Error, OSError):
            continue
        if "jupyter-kernel" in words or "kernelapp" in words or \
                re.search(r"jupyter\S*\s+kernel(\s|$)", words):
            return Manager("standalone", f"`jupyter kernel` (pid {parent.pid})",
                           pid=proc.pid)
        if "jupyter" in words:
            return Manager("server", f"its Jupyter process (pid {parent.pid})")
        break
    return Manager("unknown")


class AttachedLink:
    """simagent's client of a kernel it does not own."""

    owned = False
    needs_helpers = True
    pid = None  # not simagent's process: never signalled

    def __init__(self, existing: str) -> None:
        self.existing = existing
        self.path: Path | None = None
        self.kc: Any = None
        #: what restarts this kernel (found once attached; asked before a restart)
        self.manager = Manager("unknown")

    @property
    def where(self) -> str:
        return f"the attached kernel ({self.path or self.existing})"

    def start(self) -> None:
        """Connect and wait until the kernel answers (:class:`KernelStartError` if not)."""
        from jupyter_client import BlockingKernelClient  # heavy; loads when a kernel starts

        self.path = check(self.existing)
        kc = BlockingKernelClient(connection_file=str(self.path))
        kc.load_connection_file()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=ATTACH_READY_S)
        except RuntimeError as exc:
            kc.stop_channels()
            raise KernelStartError(f"--kernel {self.existing}: the kernel at {self.path} "
                                   f"does not answer ({exc})") from exc
        self.kc = kc
        self.manager = find_manager(self.path)

    def on_restart(self) -> str:
        """What a restart will do to this kernel (the consent question says it)."""
        return self.manager.on_restart()

    def restart(self) -> bool:
        """Restart the kernel (the person consented); True once it answers again.

        A Jupyter server's kernel is restarted by the server (``POST .../restart``: it
        stops even a cell that ignores interrupts); any other is sent the protocol's
        ``shutdown_request`` with ``restart``, which one nothing manages obeys by stopping,
        and a kernel stuck in a cell that ignores interrupts may not obey at all."""
        if self.manager.kind == "server" and self.manager.url:
            try:
                req = urllib.request.Request(
                    f"{self.manager.url}api/kernels/{self.path.stem.removeprefix('kernel-')}"
                    "/restart", data=b"", method="POST",
                    headers={"Authorization": f"token {self.manager.token}"})
                urllib.request.urlopen(req, timeout=RESTART_BACK_S).close()
            except (OSError, ValueError):
                return False
        elif control_request(self.kc, "shutdown_request", 5.0, {"restart": True}) is None:
            return False
        if self.manager.kind == "standalone":  # nothing brings it back; it must stop, as
            self._stop(self.manager.pid)        # the person was told and agreed
            return False
        deadline = time.monotonic() + RESTART_BACK_S
        time.sleep(1.0)  # the old process answers heartbeats until it exits
        while time.monotonic() < deadline:
            try:
                self.kc.wait_for_ready(timeout=max(0.5, deadline - time.monotonic()))
                return True
            except RuntimeError:
                time.sleep(0.2)
        return False

    @staticmethod
    def _stop(pid: int | None) -> None:
        """End a standalone kernel's process the person agreed to stop: it had its
        ``shutdown_request``; one stuck in a cell that ignores interrupts is killed."""
        try:
            proc = psutil.Process(pid) if pid else None
            if proc is not None:
                try:
                    proc.wait(timeout=STOP_WAIT_S)
                except psutil.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=STOP_WAIT_S)
        except (psutil.Error, OSError):  # gone already, or not ours to signal
            pass

    def attached_line(self) -> str:
        """What the person is told once simagent is attached to their kernel."""
        by = {"server": f", run by {self.manager.name.removeprefix('its ')}",
              "standalone": f", started with {self.manager.name}"}.get(self.manager.kind, "")
        return (f"simagent is attached to your kernel ({self.path}){by}: your variables are "
                "there; simagent adds only `_out` and a figure summary formatter "
                "(`_out.remove()` takes both away), restarts the kernel only if "
                "you agree, and leaves it running when you quit")

    def not_back(self) -> tuple[str, str]:
        """After a restart that did not bring the kernel back: (its state, what simagent
        knows and what the person can do), told apart by whether it still listens."""
        if self.path is not None and still_listening(self.path) and self.kc is not None \
                and self.kc.is_alive():
            return "busy", (f"{self.where} did not restart: it is still running (the cell "
                            "it runs keeps it from stopping) and its variables are untouched; "
                            "stop that cell where it runs (if interrupts do not, end the "
                            "kernel's process); simagent goes on when it answers")
        then = ("start a kernel and attach to it (simagent --kernel latest), or quit"
                if self.manager.kind != "server" else
                "restart it from JupyterLab, or start another and attach to it")
        return "dead", (f"{self.where} stopped and did not come back (nothing restarted it; "
                        f"its variables are gone): simagent has no kernel now; {then}")

    def gone(self) -> bool:
        """Whether the kernel's process ended (its ports refuse), not merely silent."""
        return self.path is not None and not still_listening(self.path)

    def is_alive(self) -> bool:
        """An attached kernel counts as alive until its heartbeat fails for the grace
        (the supervisor's heartbeat check; there is no process to poll)."""
        return self.kc is not None

    def exit_reason(self) -> str:
        return (f"{self.where} stopped answering (it was shut down, or its machine or "
                f"process is stuck)")

    def interrupt(self) -> None:
        """A control-channel ``interrupt_request`` (no signal: not simagent's process)."""
        control_request(self.kc, "interrupt_request", 0.0)

    def kill(self) -> None:
        """Nothing: simagent never kills a kernel it does not own."""

    def ack(self, chars: int) -> None:
        """No flow control: the kernel is not simagent's launcher."""

    def close(self) -> None:
        """Close simagent's sockets; the kernel and its variables stay."""
        kc, self.kc = self.kc, None
        if kc is not None:
            try:
                kc.stop_channels()
            except Exception:
                pass

    def log_hint(self) -> str:
        return f"connection file: {self.path or self.existing}"
