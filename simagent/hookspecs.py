"""simagent's extension points, each one small hook (pluggy, as ``llm`` plugins use it).

A plugin is a module with ``@hookimpl`` functions named after the hooks below; each hook
hands it a ``register`` callable and the plugin calls it once per thing it adds. simagent's
own model kinds, simulators, bench policies and workflow folders come in through the same
hooks (:data:`simagent.plugins.BUILTIN`), so a third-party package can do anything a
built-in can, and a later registration of the same name replaces an earlier one: third-
party plugins are called after the built-ins. :mod:`simagent.plugins` loads them.

An implementation may take fewer arguments than its spec (pluggy passes only the ones it
names), so ``register_tools(register)`` is a valid implementation of the tools hook.
Types named here live in layers above this one; they are named in words, not imported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

#: The project name of the markers, and the entry-point group third-party plugins use.
PROJECT = "simagent"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_model_kinds(register: Callable[[Any], None]) -> None:
    """Add ``--model`` kinds: call ``register(simagent.models.ModelKind(...))`` for each.

    The kind's ``prefix`` is what a spec starts with (``mykind:NAME``); its ``build``
    returns a ``simagent.models.KindModel`` holding a langchain chat model.
    """


@hookspec
def register_simulators(register: Callable[[Any], None]) -> None:
    """Add simulators: call ``register(folder)`` with each folder that holds a
    ``simulator.toml`` (a ``str`` or ``pathlib.Path``; see docs/simulators)."""


@hookspec
def register_tools(register: Callable[[Any], None], session: Any) -> None:
    """Add tools the agent may call: call ``register(tool)`` with a langchain tool, or a
    plain function with type hints and a docstring (langchain's ``@tool`` makes it one).

    ``session`` is the ``simagent.session.Session`` the agent is built for (its workspace,
    kernel and trace). A tool whose name simagent already uses is left out. Every plugin
    tool waits for approval in the ``ask`` and ``workspace`` modes (it is not classified).
    """


@hookspec
def register_bench_policies(register: Callable[[Any], None]) -> None:
    """Add context policies to the bench: call ``register(simagent.bench.policies.Policy(
    ...))``; ``simagent bench run --policy NAME`` runs it."""


@hookspec
def register_workflow_sources(register: Callable[[Any], None]) -> None:
    """Add bench workflows: call ``register(folder)`` with a folder of workflow ``*.toml``
    files; each is known by its file name, as the bundled ones are."""
