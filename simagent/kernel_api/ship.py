"""Getting a case function to the workers: its identity and one pickle of it.

``prepare`` keys the function (``identity.identify``), registers the user modules it
reaches with ``cloudpickle.register_pickle_by_value`` (so workers run the kernel's
loaded code even when they hold an older copy or no copy of the file), and pickles the
function once; ``ensemble`` scatters those bytes to the cluster once per sweep instead
of letting Dask pickle the function again for every case (a 40 MB closure times 200
cases). If pickling by value fails (a user module holds something cloudpickle cannot
copy), every user module is used by import instead, keyed by its file, and the runner
re-imports stale copies (``identity`` module docstring). If even that fails the
function cannot reach the workers, and the error says what to change.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

from simagent.kernel_api.identity import Identity, identify

#: Import name -> what to pip install for it.
REQUIRED = {"cloudpickle": "cloudpickle", "dask": "dask", "distributed": "distributed",
            "pandas": "pandas", "tqdm": "tqdm"}


def require_packages() -> None:
    """Import what a sweep needs now, so a kernel without it fails before any case runs."""
    missing = []
    for module, package in REQUIRED.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(package)
    if missing:
        raise ImportError(
            f"ensemble() needs {', '.join(missing)} in the kernel's Python "
            f"({sys.executable}); install with: {sys.executable} -m pip install "
            f"{' '.join(missing)}")


def _set_by_value(ident: Identity) -> None:
    import cloudpickle  # with the first ensemble: kernel_api imports stay stdlib-only

    registered = cloudpickle.list_registry_pickle_by_value()
    for name in ident.user_modules:
        mod = sys.modules.get(name)
        if mod is None:
            continue
        if name in ident.by_value and name not in registered:
            cloudpickle.register_pickle_by_value(mod)
        elif name not in ident.by_value and name in registered:
            cloudpickle.unregister_pickle_by_value(mod)


def prepare(fn: Callable[..., Any]) -> tuple[Identity, bytes]:
    """The function's identity and its cloudpickle bytes (raises TypeError with advice)."""
    import cloudpickle  # with the first ensemble: kernel_api imports stay stdlib-only

    ident = identify(fn)
    _set_by_value(ident)
    try:
        return ident, cloudpickle.dumps(fn)
    except Exception:
        if not ident.by_value:
            first_error = sys.exc_info()[1]
        else:  # by import instead of by value
            ident = identify(fn, by_value=False)
            _set_by_value(ident)
            try:
                return ident, cloudpickle.dumps(fn)
            except Exception as exc:
                first_error = exc
    raise TypeError(
        f"the case function cannot be sent to the workers ({type(first_error).__name__}: "
        f"{first_error}). Create what it needs inside it (imports, solvers, mechanisms) "
        "from plain parameters instead of reading such objects from kernel globals"
    ) from first_error
