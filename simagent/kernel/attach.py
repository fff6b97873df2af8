"""Attaching to a kernel the person already runs (``--kernel EXISTING``).

EXISTING is what ``jupyter console --existing`` takes: a connection file's path, a kernel
id (or a file name) in the Jupyter runtime directory, or ``latest``. simagent does not own
that kernel, so this link never signals, restarts or shuts it down on its own: closing
it closes simagent's sockets and nothing else, whatever way simagent ends (a SIGKILLed
simagent leaves no process to stop it). A restart happens only with the person's consent
(:meth:`Recoverable.may_restart`), as the kernel protocol's ``shutdown_request`` with
``restart``, which the kernel's own manager (jupyter_server, JupyterLab) acts on.

Other clients (JupyterLab) share the kernel's iopub broadcast; the supervisor keeps only
messages whose parent header is one of its own requests, and the shell channel is
simagent's own socket, so their cells and outputs never reach the model.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simagent.kernel.ladder import control_request
from simagent.kernel.process import KernelStartError

#: How long an attach waits for the kernel to answer ``kernel_info``.
ATTACH_READY_S = 10.0
#: How long a consented restart waits for the kernel's manager to bring it back.
RESTART_BACK_S = 30.0
#: A port check (doctor, ``latest``) waits this long for a TCP connection.
_PORT_CHECK_S = 0.3
LATEST = "latest"


@dataclass(frozen=True)
class Found:
    """A connection file in the runtime directory, and whether its kernel listens."""

    path: Path
    kernel_id: str
    running: bool
    mtime: float


def runtime_dir() -> Path:
    """The Jupyter runtime directory (``jupyter --runtime-dir``; ``$JUPYTER_RUNTIME_DIR``)."""
    from jupyter_core.paths import jupyter_runtime_dir

    return Path(jupyter_runtime_dir())


def listening(info: dict[str, Any]) -> bool:
    """Whether something accepts TCP connections on the kernel's heartbeat port: a kernel
    that stopped (a stale file) refuses at once, without the client's second of waiting."""
    if info.get("transport", "tcp") != "tcp":
        return True  # ipc: let the heartbeat tell
    try:
        with socket.create_connection((info.get("ip") or "127.0.0.1", int(info["hb_port"])),
                                      timeout=_PORT_CHECK_S):
            return True
    except (OSError, KeyError, ValueError):
        return False


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise KernelStartError(f"{path} is not a kernel connection file "
                               f"({getattr(exc, 'strerror', None) or exc})") from exc
    if not isinstance(data, dict) or "shell_port" not in data:
        raise KernelStartError(f"{path} is not a kernel connection file (no shell_port)")
    return data


def running_kernels(folder: Path | None = None) -> list[Found]:
    """The connection files in the runtime directory, newest first (``simagent doctor``)."""
    folder = folder or runtime_dir()
    found = []
    for path in folder.glob("kernel-*.json") if folder.is_dir() else ():
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
            mtime = path.stat().st_mtime
        except (OSError, ValueError):
            continue
        kid = path.stem.removeprefix("kernel-")
        found.append(Found(path, kid, isinstance(info, dict) and listening(info), mtime))
    return sorted(found, key=lambda f: f.mtime, reverse=True)


def resolve(existing: str) -> Path:
    """The connection file EXISTING names; :class:`KernelStartError` (one line) if none.

    A path (it has a ``/`` or ends in ``.json``) must exist; otherwise the runtime
    directory is searched for ``kernel-<id>.json``, then for one id starting with it.
    ``latest`` is the newest file whose kernel listens."""
    folder = runtime_dir()
    hint = "simagent doctor lists the kernels it can attach to"
    if existing == LATEST:
        kernels = running_kernels(folder)
        live = [k for k in kernels if k.running]
        if not live:
            stale = f" ({len(kernels)} stale connection file(s))" if kernels else ""
            raise KernelStartError(
                f"--kernel latest: no running kernel in the Jupyter runtime directory "
                f"{folder}{stale}; start one (jupyter lab, jupyter kernel) or name its "
                f"connection file")
        return live[0].path
    path = Path(existing).expanduser()
    if "/" in existing or existing.endswith(".json"):
        if path.is_file():
            return path.resolve()
        if (folder / existing).is_file():
            return folder / existing
        raise KernelStartError(f"--kernel {existing}: no such connection file; {hint}")
    exact = folder / f"kernel-{existing}.json"
    if exact.is_file():
        return exact
    matches = sorted(folder.glob(f"kernel-{existing}*.json")) if folder.is_dir() else []
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise KernelStartError(f"--kernel {existing}: {len(matches)} kernels match in "
                               f"{folder}; give more of the id")
    raise KernelStartError(f"--kernel {existing}: no kernel with that id in the Jupyter "
                           f"runtime directory {folder}; {hint}")


class AttachedLink:
    """simagent's client of a kernel it does not own."""

    owned = False
    needs_helpers = True
    pid = None  # not simagent's process: never signalled

    def __init__(self, existing: str) -> None:
        self.existing = existing
        self.path: Path | None = None
        self.kc: Any = None

    @property
    def where(self) -> str:
        return f"the attached kernel ({self.path or self.existing})"

    def start(self) -> None:
        """Connect and wait until the kernel answers (:class:`KernelStartError` if not)."""
        from jupyter_client import BlockingKernelClient

        self.path = resolve(self.existing)
        info = _read(self.path)
        if not listening(info):
            raise KernelStartError(f"--kernel {self.existing}: no kernel is running at "
                                   f"{self.path} (a stale connection file: its kernel "
                                   f"stopped)")
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

    def restart(self) -> bool:
        """Ask the kernel to restart (the person consented); True once it answers again.
        A kernel with no manager to restart it (``jupyter kernel``) just stops."""
        if control_request(self.kc, "shutdown_request", 5.0, {"restart": True}) is None:
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
