"""The person's kernels as every layer may know them, without attaching: by connection file.

A front end checks ``--kernel EXISTING`` before it opens a session (:func:`check`),
``simagent doctor`` lists the kernels it could attach to (:func:`running_kernels`), and on
the way out a front end says whether the person's kernel still runs (:func:`left_running`).
None of that needs a client of the kernel, so it lives here and not beside the link that
talks to one (:mod:`simagent.kernel.attach`, which the layers above may not import: above
the kernel layer a kernel is a :class:`~simagent.kernel.port.KernelPort`). The words every
front end says about a kernel simagent does not own live here too (:data:`GONE`,
:data:`MODEL_MAY_NOT_RESET`).

EXISTING is what ``jupyter console --existing`` takes: a connection file's path, a kernel
id (or a file name) in the Jupyter runtime directory, or ``latest``.
"""

from __future__ import annotations

import json
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_core.paths import jupyter_runtime_dir

from simagent.kernel.port import KernelStartError

#: A port check (doctor, ``latest``) waits this long for a TCP connection.
_PORT_CHECK_S = 0.3
LATEST = "latest"
#: The ACP ``_meta`` key (on ``session/new`` or ``session/prompt``) naming the person's
#: kernel for ``simagent acp`` to attach to: a connection file, a kernel id or ``latest``,
#: as ``--kernel`` takes. Two front ends that never import each other speak it: the ACP
#: agent reads it, the JupyterLab persona sends it (on the prompt: it learns the
#: notebook's kernel only then).
KERNEL_META = "simagent.kernel"
#: What is said of an attached kernel whose process ended (its ports refuse connections):
#: not "left running", not "variables untouched".
GONE = "{where} is gone: its process ended, and its variables with it"
#: What the model's ``reset_kernel`` gets on the person's kernel: only they may restart it.
MODEL_MAY_NOT_RESET = (
    "Not restarted: this kernel is the person's (simagent attached to it), and only they "
    "may restart it. Its variables are untouched. If it really needs a restart, ask them to "
    "type /reset or to restart it where it runs; otherwise carry on in it.")


@dataclass(frozen=True)
class Found:
    """A connection file in the runtime directory, and whether its kernel listens."""

    path: Path
    kernel_id: str
    running: bool
    mtime: float


def runtime_dir() -> Path:
    """The Jupyter runtime directory (``jupyter --runtime-dir``; ``$JUPYTER_RUNTIME_DIR``)."""
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


def _read(path: Path, existing: str = "") -> dict[str, Any]:
    said = f"--kernel {existing}: " if existing else ""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise KernelStartError(f"{said}cannot read {path} ({exc.strerror or exc})") from exc
    except ValueError as exc:
        raise KernelStartError(f"{said}{path} is not a kernel connection file (not JSON: "
                               f"{exc})") from exc
    if not isinstance(data, dict) or "shell_port" not in data:
        raise KernelStartError(f"{said}{path} is not a kernel connection file (no "
                               f"shell_port)")
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


def still_listening(path: Path) -> bool:
    """Whether the kernel of the connection file ``path`` still listens: one whose process
    ended (shut down, SIGKILLed) refuses at once, or its file went with it."""
    try:
        return listening(_read(path))
    except KernelStartError:
        return False


def left_running(path: Path, resume: str, prompt: str = "") -> str:
    """How simagent left the person's kernel and how to go on, said on the way out (true
    at that moment). ``resume`` is the command that resumes the session (``simagent
    --resume ID``), ``prompt`` what follows ``--kernel`` in it: the same kernel again while
    it runs; once it has ended, a kernel of simagent's own or another of the person's."""
    if still_listening(path):
        return (f"the kernel it attached to ({path}) is still running; resume with: "
                f"{resume} --kernel {shlex.quote(str(path))}{prompt}")
    return (f"the kernel it attached to ({path}) is no longer running; resume with: "
            f"{resume}{prompt} (a kernel of simagent's own), or with --kernel and one "
            "that runs")


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
    if path.is_dir():
        raise KernelStartError(f"--kernel {existing}: that is a folder; name a connection "
                               f"file in it (kernel-<id>.json) or a kernel id")
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


def check(existing: str) -> Path:
    """The connection file of a running kernel EXISTING names, or :class:`KernelStartError`
    (one line): what a front end checks before it opens a session for it."""
    path = resolve(existing)
    if not listening(_read(path, existing)):
        raise KernelStartError(f"--kernel {existing}: no kernel is running at {path} (a "
                               f"stale connection file: its kernel stopped)")
    return path
