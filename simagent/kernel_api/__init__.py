"""Helpers for code running *inside* the session's kernel (``from simagent.kernel_api import ...``).

* :func:`ensemble` maps a function over a list of case dicts on Dask (a local cluster
  started once per kernel, or an existing scheduler) and returns a pandas table.
* :func:`notify_human` shows a line to the person at the screen, never to the model.

Importing this package is cheap (standard library only): dask, distributed and pandas
load on the first ``ensemble`` call, and Dask's worker processes import
``simagent.kernel_api.worker_setup`` through this package.
"""

from __future__ import annotations

from simagent.kernel_api.ensemble import EnsembleInterrupted, ensemble
from simagent.kernel_api.human import notify_human

__all__ = ["EnsembleInterrupted", "ensemble", "notify_human"]
