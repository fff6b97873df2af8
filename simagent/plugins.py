"""The plugin manager: simagent's built-ins and third-party packages, loaded once, lazily.

Every extension point is a hook of :mod:`simagent.hookspecs`. simagent's own modules that
implement one are named in :data:`BUILTIN` and loaded by name, the way an entry point is,
so this bottom-layer module imports no layer above it; third-party packages declare an
entry point in the ``simagent`` group (``[project.entry-points.simagent]``), naming a
module with ``@hookimpl`` functions.

Nothing loads until a hook is first called (a model spec resolved, ``simagent plugins``):
scanning the installed distributions for entry points takes about 0.1 s, which
``simagent --help`` must not pay. A plugin that cannot be loaded (an import error, a
hook with a wrong name or signature) or whose hook raises is reported, one line on
stderr naming it and why, and left out: it never takes simagent down.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pluggy

from simagent import hookspecs

#: The entry-point group a third-party plugin declares.
GROUP = hookspecs.PROJECT
#: simagent's own plugins: each module's ``@hookimpl`` functions are its contributions.
#: Only light modules (the standard library at import), since a model spec loads them all.
BUILTIN = (
    "simagent.models",  # provider:model and openai-compatible:
    "simagent.agent.scripted_kind",  # scripted:
    "simagent.bench.replay_kind",  # replay:
    "simagent.local_model.kind",  # local:
    "simagent.simulators",  # the bundled simulators and the simagent.simulators group
    "simagent.bench.workflow",  # the bundled bench workflows
    "simagent.bench.policy_plugin",  # the bench's context policies
)


@dataclass(frozen=True)
class PluginInfo:
    """A loaded plugin, or one that could not be (``error`` says why, in one line)."""

    name: str
    #: The distribution that declared its entry point; None for a built-in.
    distribution: str | None = None
    version: str | None = None
    hooks: tuple[str, ...] = ()
    error: str | None = None

    @property
    def source(self) -> str:
        """Where it comes from, in words: ``built-in`` or ``DIST VERSION``."""
        if self.distribution is None:
            return "built-in"
        return f"{self.distribution} {self.version}" if self.version else self.distribution

    def as_dict(self) -> dict[str, Any]:
        """The ``simagent plugins --json`` record."""
        return {"name": self.name, "builtin": self.distribution is None,
                "distribution": self.distribution, "version": self.version,
                "hooks": list(self.hooks), **({"error": self.error} if self.error else {})}


@dataclass
class Plugins:
    """The loaded plugin manager and what loading it found."""

    manager: pluggy.PluginManager
    loaded: list[PluginInfo] = field(default_factory=list)
    failed: list[PluginInfo] = field(default_factory=list)


_lock = threading.RLock()
_plugins: Plugins | None = None
_loading = False


def plugins() -> Plugins:
    """The process's plugins, loaded on the first call (thread-safe). A plugin that asks
    for them while it is being imported fails to load, rather than loading them twice."""
    global _plugins, _loading
    with _lock:
        if _plugins is None:
            if _loading:
                raise RuntimeError("a plugin used simagent's plugins while they were loading "
                                   "(at its import)")
            _loading = True
            try:
                _plugins = _load()
            finally:
                _loading = False
        return _plugins


@cache
def entry_points_in(group: str) -> tuple[importlib.metadata.EntryPoint, ...]:
    """The installed entry points of ``group``; every group comes from one scan."""
    return tuple(_all_entry_points().select(group=group))


@cache
def _all_entry_points() -> importlib.metadata.EntryPoints:
    return importlib.metadata.entry_points()


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``: how a plugin's failure is reported."""
    text = " ".join((str(exc).splitlines() or [""])[0].split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def report(line: str) -> None:
    """Say a plugin problem on stderr: one line, never an exception."""
    print(f"simagent: {line}", file=sys.stderr)


def _load() -> Plugins:
    pm = pluggy.PluginManager(GROUP)
    pm.add_hookspecs(hookspecs)
    found = Plugins(pm)
    # Registered first so they are called last: a plugin's registration of a name the
    # built-ins also register replaces theirs (pluggy calls the newest plugin first).
    for ep in entry_points_in(GROUP):
        dist = getattr(ep, "dist", None)
        meta = (dist.metadata["Name"] if dist is not None else None, getattr(dist, "version", None))
        _register(found, ep.name, meta, ep.load)
    for module in BUILTIN:
        _register(found, module, (None, None), lambda m=module: importlib.import_module(m))
    return found


def _register(found: Plugins, name: str, dist: tuple[str | None, str | None],
              load: Any) -> None:
    """Load one plugin and register it; a failure is recorded and reported, not raised."""
    pm = found.manager
    try:
        if pm.has_plugin(name):
            raise ValueError(f"a plugin named {name!r} is already loaded")
        plugin = load()
        pm.register(plugin, name=name)
    except Exception as exc:  # a broken plugin must not take simagent down
        info = PluginInfo(name, *dist, error=one_line(exc))
        found.failed.append(info)
        report(f"plugin {name} ({info.source}) not loaded: {info.error}")
        return
    try:  # a @hookimpl whose name is no hook of simagent's: a typo, refused
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        pm.unregister(name=name)
        info = PluginInfo(name, *dist, error=one_line(exc))
        found.failed.append(info)
        report(f"plugin {name} ({info.source}) not loaded: {info.error}")
        return
    hooks = tuple(sorted(h.name for h in pm.get_hookcallers(plugin) or ()))
    found.loaded.append(PluginInfo(name, *dist, hooks=hooks))


@dataclass(frozen=True)
class Registered:
    """One thing a plugin registered through a hook."""

    plugin: str
    item: Any


def collect(hook: str, **kwargs: Any) -> list[Registered]:
    """Call ``hook`` on every plugin with a ``register`` that gathers what it adds, in
    call order (built-ins first, so a later item of the same name is the plugin's).

    Each implementation is called on its own, so one that raises is reported and the
    rest still count.
    """
    pm = plugins().manager
    out: list[Registered] = []
    for impl in reversed(getattr(pm.hook, hook).get_hookimpls()):  # pluggy's call order
        def register(item: Any, _plugin: str = impl.plugin_name) -> None:
            out.append(Registered(_plugin, item))

        given = {"register": register, **kwargs}
        try:
            impl.function(*[given[arg] for arg in impl.argnames])
        except Exception as exc:  # a plugin's bug must not take simagent down
            report(f"plugin {impl.plugin_name}: {hook} failed: {one_line(exc)}")
    return out


def refuse(entry: Registered, hook: str, what: str) -> None:
    """Report an item a plugin registered that is not what ``hook`` takes (``what``)."""
    report(f"plugin {entry.plugin}: {hook} registered {type(entry.item).__name__!s}, "
           f"not {what}; left out")


def listing() -> list[PluginInfo]:
    """Every plugin, loaded or not: the built-ins, then third-party ones by name."""
    found = plugins()
    everything: Iterable[PluginInfo] = [*found.loaded, *found.failed]
    return sorted(everything, key=lambda p: (p.distribution is not None, p.name))
