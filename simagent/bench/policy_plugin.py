"""The bench's context policies as a built-in plugin (the ``register_bench_policies`` hook).

A module of its own, not a hook in :mod:`simagent.bench.policies`, because every model
spec loads all built-in plugins and the policies import langchain: here they are imported
when the bench asks for policies, not when plugins load.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simagent.hookspecs import hookimpl


@hookimpl
def register_bench_policies(register: Callable[[Any], None]) -> None:
    from simagent.bench.policies import POLICIES  # langchain: loaded when the bench asks

    for policy in POLICIES.values():
        register(policy)
