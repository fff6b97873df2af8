"""simagent's own kernel process: started, signalled, restarted and shut down from here.

The supervisor (:mod:`simagent.kernel.supervisor`) talks to a kernel through a *link*:
this one for a kernel simagent starts, :mod:`simagent.kernel.attach` for one the person
already runs. Both give a jupyter_client ``BlockingKernelClient`` (``kc``); only this one
owns a process, so only it may signal, restart or shut the kernel down.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import psutil

from simagent.kernel.launcher import FLOW_ENV, FlowAck
from simagent.kernel.port import KernelStartError
from simagent.paths import (
    SESSION_DIR_ENV,
    SessionPaths,
    kernelspec_dir,
    private_dir,
    private_opener,
    write_private,
)
from simagent.trace.redact import looks_secret

STARTUP_TIMEOUT_S = 60.0
_READY_STEP_S = 5.0
#: Starts tried when the kernel's ports were taken between their pick and its bind.
_PORT_CLASH_TRIES = 3
DEFAULT_SPEC = "simagent-python"
#: Environment variables the kernel must not inherit: pytest's disables fd capture.
_SCRUB_ENV = ("PYTEST_CURRENT_TEST",)
#: ipykernel's start-up warning: in every log, never the cause (tokens the model pays for).
_LOG_NOISE = "running over TCP without encryption"




def default_kernelspec() -> Path:
    """Write the kernelspec of simagent's own Python kernel (this interpreter + launcher)."""
    spec_dir = kernelspec_dir() / DEFAULT_SPEC
    spec = {
        "argv": [sys.executable, "-m", "simagent.kernel.launcher", "-f", "{connection_file}"],
        "display_name": "Python (simagent)",
        "language": "python",
        "interrupt_mode": "signal",
        "metadata": {"debugger": False},
    }
    text = json.dumps(spec, indent=1)
    path = spec_dir / "kernel.json"
    if not path.exists() or path.read_text() != text:
        private_dir(spec_dir)
        write_private(path, text)
    return spec_dir.parent


def descendants(pid: int | None) -> list[Any]:
    """The kernel's child processes, recursively, in any process group (psutil)."""
    if pid is None:
        return []
    try:
        return psutil.Process(pid).children(recursive=True)
    except Exception:  # gone, or psutil unavailable: nothing to signal
        return []


def signal_descendants(pid: int | None, sig: int) -> int:
    """Send ``sig`` to every descendant of ``pid``; how many were signalled."""
    sent = 0
    for proc in descendants(pid):
        try:
            proc.send_signal(sig)
            sent += 1
        except Exception:
            pass
    return sent


def death_reason(code: int | None) -> str:
    """Why a kernel process is gone, from its exit code (None: it stopped answering)."""
    if code is None:
        return "the kernel process stopped responding"
    if code < 0:
        sig = -code
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        hint = {
            signal.SIGSEGV: " (segmentation fault in native code)",
            signal.SIGKILL: " (often the out-of-memory killer)",
            signal.SIGABRT: " (aborted by native code)",
            signal.SIGBUS: " (bus error in native code)",
        }.get(sig, "")
        return f"the kernel was killed by {name}{hint}"
    return f"the kernel process exited with code {code}"


def inherited_env(environ: Mapping[str, str], keep_secret: frozenset[str] | None
                  ) -> dict[str, str]:
    """What a kernel simagent starts inherits of ``environ``: all of it (but test
    markers), or with ``keep_secret`` (a kernel served to others: ``simagent mcp --http``,
    where whoever holds the token runs code) every secret-named variable
    (:func:`simagent.trace.redact.looks_secret`) left out but those it names."""
    return {k: v for k, v in environ.items() if k not in _SCRUB_ENV and (
        keep_secret is None or k in keep_secret or not looks_secret(k))}


class OwnedLink:
    """A kernel process simagent started (one per start; :meth:`close` ends it)."""

    owned = True

    def __init__(self, paths: SessionPaths, cwd: Path, kernel_name: str | None,
                 extra_env: dict[str, str], keep_secret_env: frozenset[str] | None = None
                 ) -> None:
        self.paths, self.cwd, self.kernel_name = paths, cwd, kernel_name
        self.extra_env = extra_env
        self.keep_secret_env = keep_secret_env
        self.km: Any = None
        self.kc: Any = None
        self._log: IO[bytes] | None = None
        self._flow: FlowAck | None = None
        #: simagent's own kernel installs ``_out`` itself (the launcher); others get it sent
        self.needs_helpers = bool(kernel_name)

    @property
    def where(self) -> str:
        return f"kernel {self.kernel_name or DEFAULT_SPEC!r}"

    def env(self) -> dict[str, str]:
        env = inherited_env(os.environ, self.keep_secret_env)
        env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
        env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
        env[SESSION_DIR_ENV] = str(self.paths.root)
        if self._flow is not None:
            env[FLOW_ENV] = str(self._flow.path)
        env.update(self.extra_env)
        return env

    def start(self) -> None:
        """Start the kernel and wait until it answers (raises :class:`KernelStartError`)."""
        from jupyter_client.kernelspec import KernelSpecManager  # heavy (zmq): not at TUI start
        from jupyter_client.manager import KernelManager  # heavy, as above

        if self._log is None:
            self._log = open(self.paths.kernel_log, "ab", buffering=0,  # noqa: SIM115 - kernel's life
                             opener=private_opener)
        if self.kernel_name:
            km = KernelManager(kernel_name=self.kernel_name)
        else:
            if self._flow is None:
                self._flow = FlowAck(self.paths.root / "kernel.flow")
            self._flow.reset()
            ksm = KernelSpecManager(kernel_dirs=[str(default_kernelspec())])
            km = KernelManager(kernel_name=DEFAULT_SPEC, kernel_spec_manager=ksm)
        for attempt in range(_PORT_CLASH_TRIES):
            log_at = self._log.tell()
            try:
                km.start_kernel(cwd=str(self.cwd), env=self.env(),
                                stdout=self._log, stderr=self._log)
                kc = km.client()
                kc.start_channels()
                self._wait_ready(kc, log_at)
                break
            except Exception as exc:
                try:
                    km.shutdown_kernel(now=True)
                except Exception:
                    pass
                if self._port_clash(log_at) and attempt + 1 < _PORT_CLASH_TRIES:
                    km = KernelManager(kernel_name=km.kernel_name,
                                       kernel_spec_manager=km.kernel_spec_manager)
                    continue  # new ports: another process took one between pick and bind
                raise KernelStartError(
                    f"kernel {self.kernel_name or DEFAULT_SPEC!r} could not start: {exc}; "
                    f"{self.log_hint()}") from exc
        self.km, self.kc = km, kc

    def _port_clash(self, log_at: int) -> bool:
        """Whether the kernel started at log offset ``log_at`` failed to bind a port.

        jupyter_client picks free TCP ports and the kernel binds them a moment later, so
        another process starting a kernel (a second test worker, a bench beside the
        session) can take one in between; the cure is fresh ports, not a failure."""
        try:
            with open(self.paths.kernel_log, "rb") as fh:
                fh.seek(log_at)
                return b"Address already in use" in fh.read()
        except OSError:
            return False

    def _wait_ready(self, kc: Any, log_at: int) -> None:
        """``wait_for_ready`` in short steps, so a kernel that failed to bind its ports
        (and lingers without answering) is retried at once instead of after the full
        start-up timeout."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            step = min(_READY_STEP_S, max(0.1, deadline - time.monotonic()))
            try:
                kc.wait_for_ready(timeout=step)
                return
            except RuntimeError as exc:  # died, or did not answer within the step
                if ("didn't respond" not in str(exc) or self._port_clash(log_at)
                        or time.monotonic() >= deadline):
                    raise

    def restart(self) -> bool:
        """Restart the process in place; False when that failed (start a fresh one)."""
        if self._flow is not None:
            self._flow.reset()
        # the restart kills the kernel's process group; children that left it would outlive it
        signal_descendants(self.pid, signal.SIGKILL)
        try:
            self.km.restart_kernel(now=True)
            self.kc.wait_for_ready(timeout=STARTUP_TIMEOUT_S)
            return True
        except Exception:
            return False

    def process(self) -> Any:
        """The kernel's Popen, where the provisioner is local (None otherwise)."""
        return getattr(getattr(self.km, "provisioner", None), "process", None)

    @property
    def pid(self) -> int | None:
        return getattr(self.process(), "pid", None)

    def is_alive(self) -> bool:
        proc = self.process()
        if proc is not None:  # what km.is_alive() asks, without its event loop (~25 us
            return proc.poll() is None  # before every execution)
        return self.km is not None and self.km.is_alive()

    def exit_reason(self) -> str:
        proc = self.process()
        return death_reason(None if proc is None else proc.poll())

    def interrupt(self) -> None:
        try:
            self.km.interrupt_kernel()
        except Exception:
            pass

    def kill(self) -> None:
        try:
            self.km.signal_kernel(signal.SIGKILL)
        except Exception:
            pass

    def ack(self, chars: int) -> None:
        """Flow control: stream characters consumed (simagent's own kernel only)."""
        if self._flow is not None:
            self._flow.ack(chars)

    def close(self) -> None:
        """Shut the kernel down and close its log."""
        km, kc = self.km, self.kc
        self.km = self.kc = None
        if kc is not None:
            try:
                kc.stop_channels()
            except Exception:
                pass
        if km is not None:
            try:
                km.shutdown_kernel(now=True)
            except Exception:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._flow is not None:
            self._flow.close()
            self._flow = None

    def log_hint(self) -> str:
        tail = _tail_lines(self.paths.kernel_log, 6)
        where = f"kernel log: {self.paths.kernel_log}"
        return f"{where}; last lines:\n{tail}" if tail else where


def _tail_lines(path: Path, n: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 8192))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [ln for ln in data.splitlines() if ln.strip() and _LOG_NOISE not in ln]
    return "\n".join(lines[-n:])
