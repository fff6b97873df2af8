"""Which notebook's kernel a JupyterLab chat works in: a pure choice, no server.

jupyter-ai hands a persona neither the notebook beside the chat nor its kernel, so the
persona asks the server's session manager which notebooks run a kernel and picks one for
the message, in this order:

1. a notebook the person attached to the message, or named in it (``fit.ipynb``);
2. the notebook JupyterLab says is active (the one open beside the chat), when it lies in
   the chat's folder;
3. the one notebook of the chat's folder that runs a kernel.

Anything else (several running notebooks and none named, none running, a named notebook
without a kernel) is no choice, with a line that says why; ``simagent acp`` then keeps
the kernel it has, or starts its own and says so. Paths are the server's API paths
(relative to its root, ``/``-separated), as ``list_sessions()`` gives them.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KernelChoice:
    """The notebook chosen and its kernel id (both None when there is no choice), and
    one line saying how it was chosen or why none was."""

    notebook: str | None
    kernel_id: str | None
    why: str
    ambiguous: bool = False  # several notebooks could be meant: naming one decides


@dataclass(frozen=True)
class Running:
    """A notebook session of the server: its API path and its kernel's id."""

    path: str
    kernel_id: str


def running_notebooks(sessions: Iterable[Mapping[str, Any]]) -> list[Running]:
    """The notebooks with a kernel among ``SessionManager.list_sessions()``'s entries
    (consoles and files are left out; a session whose kernel is gone too)."""
    found = []
    for s in sessions:
        path = str(s.get("path") or (s.get("notebook") or {}).get("path") or "")
        kernel = s.get("kernel") or {}
        kid = kernel.get("id") if isinstance(kernel, Mapping) else None
        if path.endswith(".ipynb") and s.get("type", "notebook") == "notebook" and kid:
            found.append(Running(_norm(path), str(kid)))
    return found


def choose(sessions: Iterable[Mapping[str, Any]], chat_path: str, *,
           attached: Sequence[str] = (), message: str = "",
           active: str | None = None) -> KernelChoice:
    """The kernel for a message of the chat at ``chat_path``: see the module docstring.
    ``attached`` are the API paths of the message's attachments, ``message`` its text,
    ``active`` the notebook JupyterLab reports active (None when it did not say)."""
    running = running_notebooks(sessions)
    folder = posixpath.dirname(_norm(chat_path))
    by_path = {r.path: r for r in running}

    notebooks = [_norm(a) for a in attached if a.endswith(".ipynb")]
    if notebooks:
        return _pick(by_path, notebooks[0], "attached to the message")
    named = _named(message, running, folder)
    if named is not None:
        return named
    if active and posixpath.dirname(_norm(active)) == folder and _norm(active) in by_path:
        return _pick(by_path, _norm(active), "open beside the chat")
    here = [r for r in running if posixpath.dirname(r.path) == folder]
    where = f"the chat's folder ({folder or 'the root'})"
    if len(here) == 1:
        return KernelChoice(here[0].path, here[0].kernel_id,
                            f"{here[0].path}: the one notebook running in {where}")
    if not here:
        return KernelChoice(None, None, f"no notebook runs a kernel in {where}")
    listed = ", ".join(r.path for r in here)
    return KernelChoice(None, None, f"{len(here)} notebooks run in {where} ({listed}) and "
                                    "none is named or open beside the chat", ambiguous=True)


def _named(message: str, running: Sequence[Running], folder: str) -> KernelChoice | None:
    """The running notebook the message names by its path, or by its file name when one
    notebook has it (the chat's folder's first); None when it names none."""
    text = message.replace("\\", "/")
    full = [r for r in running if r.path in text]
    if full:
        best = max(full, key=lambda r: len(r.path))
        return KernelChoice(best.path, best.kernel_id, f"{best.path}: named in the message")
    by_name = [r for r in running if posixpath.basename(r.path) in text]
    if not by_name:
        return None
    local = [r for r in by_name if posixpath.dirname(r.path) == folder]
    pool = local or by_name
    if len(pool) == 1:
        return KernelChoice(pool[0].path, pool[0].kernel_id,
                            f"{pool[0].path}: named in the message")
    listed = ", ".join(r.path for r in pool)
    return KernelChoice(None, None, f"the message names a notebook that {len(pool)} "
                                    f"running notebooks share ({listed}) without its folder",
                        ambiguous=True)


def _pick(by_path: Mapping[str, Running], path: str, how: str) -> KernelChoice:
    r = by_path.get(path)
    if r is None:
        return KernelChoice(path, None, f"{path} ({how}) runs no kernel")
    return KernelChoice(path, r.kernel_id, f"{path}: {how}")


def _norm(path: str) -> str:
    return posixpath.normpath(path.replace("\\", "/")).lstrip("/") if path else ""
