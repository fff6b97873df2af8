"""Simulators as data (design.md §8): discovery and parsing of ``simulator.toml`` folders.

A simulator is a folder: ``simulator.toml`` plus ``skills/`` and ``subagents/``. The
folders come from plugins' ``register_simulators`` hook (:mod:`simagent.hookspecs`): this
module's own adds the bundled ``simulators/`` content folder, then installed packages that
declare an entry point in the ``simagent.simulators`` group (the entry point resolves to
the folder path, or to a module whose directory holds ``simulator.toml``); a third-party
plugin's come after. A later simulator overrides an earlier one of the same name, so an
installed one overrides a bundled one. Adding a simulator never touches agent code.
"""

from __future__ import annotations

import importlib.util
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from simagent import plugins
from simagent.hookspecs import hookimpl
from simagent.paths import content_dir

ENTRY_POINT_GROUP = "simagent.simulators"
#: The simulator a workspace gets when none is chosen (when it is bundled).
DEFAULT_SIMULATOR = "scipy"

_REQUIRED = ("name", "display_name", "description")


class SimulatorError(ValueError):
    """A bad ``simulator.toml`` or an unknown simulator name; one line."""


@dataclass(frozen=True)
class Simulator:
    name: str
    display_name: str
    description: str
    root: Path
    packages: tuple[str, ...] = ()
    pip: tuple[str, ...] = ()
    domain_hints: str = ""
    warmup: str = ""
    example_prompts: tuple[str, ...] = ()
    #: ``digest = "module:function"``: the output digester in ``module.py`` of the folder
    #: (``simagent.kernel.digest``); empty: the generic one.
    digest: str = ""
    #: Environment variables for the kernel (e.g. opting out of an import-time prompt).
    env: tuple[tuple[str, str], ...] = ()
    #: ``[[state.registry]]``: the simulator's objects the kernel state card describes,
    #: each ``{"type": "pkg.Class", "label": str, "fields": {label: expression of obj}}``.
    state_registry: tuple[dict[str, Any], ...] = field(default=(), hash=False, compare=False)

    @property
    def skills_dir(self) -> Path:
        return self.root / "skills"

    @property
    def subagents_dir(self) -> Path:
        return self.root / "subagents"

    def skill_names(self) -> list[str]:
        d = self.skills_dir
        return sorted(p.parent.name for p in d.glob("*/SKILL.md")) if d.is_dir() else []

    def installed(self) -> bool:
        """True when every import package is found by this interpreter (not imported)."""
        return all(package_found(p) for p in self.packages)

    def versions(self) -> dict[str, str | None]:
        """Installed distribution version per pip name (None when not installed)."""
        out: dict[str, str | None] = {}
        for req in self.pip:
            name = re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0]
            try:
                out[name] = version(name)
            except PackageNotFoundError:
                out[name] = None
        return out

    def as_dict(self) -> dict[str, Any]:
        """The ``simagent simulators --json`` record (design.md §3)."""
        return {"name": self.name, "display_name": self.display_name,
                "installed": self.installed(), "packages": list(self.packages),
                "pip": list(self.pip), "versions": self.versions(),
                "skills": self.skill_names(),
                "subagents": sorted({p.stem for p in subagent_files(self)}),
                "root": str(self.root)}

    def package_dirs(self) -> list[Path]:
        """Source folders of the installed import packages (readable, never writable)."""
        return [d for pkg in self.packages for d in package_dirs(pkg)]


def package_found(pkg: str) -> bool:
    """Whether import package ``pkg`` is installed here (found, not imported)."""
    try:
        return importlib.util.find_spec(pkg) is not None
    except (ImportError, ValueError):
        return False


def package_dirs(pkg: str) -> list[Path]:
    """The installed folder(s) of import package ``pkg`` (empty when not installed)."""
    try:
        spec = importlib.util.find_spec(pkg)
    except (ImportError, ValueError):
        return []
    if spec and spec.submodule_search_locations:
        return [Path(p) for p in spec.submodule_search_locations]
    if spec and spec.origin:
        return [Path(spec.origin).parent]
    return []


def subagent_files(simulator: Simulator | None) -> list[Path]:
    """Subagent definitions a session with ``simulator`` gets: shared first, then its own
    (an own file overrides a shared one of the same name)."""
    shared = content_dir("subagents")
    files = sorted(shared.glob("*.md")) if shared.is_dir() else []
    if simulator is not None and simulator.subagents_dir.is_dir():
        files += sorted(simulator.subagents_dir.glob("*.md"))
    return [f for f in files if f.name.lower() != "readme.md"]


def _digest_spec(folder: Path, data: dict[str, Any]) -> str:
    """``digest = "module:function"``, checked: the module file must be in the folder."""
    spec = data.get("digest", "")
    if not spec:
        return ""
    module = str(spec).split(":", 1)[0]
    if not re.fullmatch(r"[A-Za-z_]\w*:[A-Za-z_]\w*", str(spec)) \
            or not (folder / f"{module}.py").is_file():
        raise SimulatorError(f"{folder / 'simulator.toml'}: digest must be \"module:function\" "
                             f"with module.py in {folder} (got {spec!r})")
    return str(spec)


def parse_simulator(folder: Path) -> Simulator:
    path = folder / "simulator.toml"
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SimulatorError(f"{path}: {exc}") from exc
    missing = [k for k in _REQUIRED if not data.get(k)]
    if missing:
        raise SimulatorError(f"{path}: missing {', '.join(missing)}")
    for key in ("packages", "pip", "example_prompts"):
        if not isinstance(data.get(key, []), list):
            raise SimulatorError(f"{path}: {key} must be a list")
    env = data.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise SimulatorError(f"{path}: env must be a table of strings")
    return Simulator(
        name=str(data["name"]), display_name=str(data["display_name"]),
        description=str(data["description"]).strip(), root=folder,
        packages=tuple(data.get("packages", [])), pip=tuple(data.get("pip", [])),
        digest=_digest_spec(folder, data),
        domain_hints=str(data.get("domain_hints", "")).strip(),
        warmup=str(data.get("warmup", "")).strip(),
        example_prompts=tuple(data.get("example_prompts", [])),
        env=tuple(sorted(env.items())), state_registry=_state_registry(path, data))


def _state_registry(path: Path, data: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    entries = (data.get("state") or {}).get("registry") or []
    out = []
    for entry in entries if isinstance(entries, list) else [None]:
        fields = entry.get("fields", {}) if isinstance(entry, dict) else None
        if (not isinstance(entry, dict) or "." not in str(entry.get("type", ""))
                or not isinstance(fields, dict)
                or not all(isinstance(v, str) for v in fields.values())):
            raise SimulatorError(f"{path}: each [[state.registry]] needs type = \"pkg.Class\" "
                                 f"and fields = {{label = \"expression of obj\"}}")
        out.append({"type": str(entry["type"]), "label": str(entry.get("label") or ""),
                    "fields": dict(fields)})
    return tuple(out)


def _entry_point_folders() -> list[Path]:
    folders = []
    for ep in plugins.entry_points_in(ENTRY_POINT_GROUP):
        try:
            target = ep.load()
        except Exception:  # a broken plug-in must not take simagent down
            continue
        if callable(target):
            target = target()
        if hasattr(target, "__file__") and target.__file__:
            target = Path(target.__file__).parent
        if isinstance(target, (str, Path)) and (Path(target) / "simulator.toml").is_file():
            folders.append(Path(target))
    return folders


@hookimpl
def register_simulators(register: Callable[[Path], None]) -> None:
    """The bundled simulators, then those of the ``simagent.simulators`` entry points."""
    bundled = content_dir("simulators")
    folders = sorted(p for p in bundled.iterdir() if (p / "simulator.toml").is_file()) \
        if bundled.is_dir() else []
    for folder in [*folders, *_entry_point_folders()]:
        register(folder)


@cache
def discover() -> dict[str, Simulator]:
    """Every simulator the plugins register, a later one overriding an earlier by name."""
    found: dict[str, Simulator] = {}
    for entry in plugins.collect("register_simulators"):
        if not isinstance(entry.item, (str, Path)):
            plugins.refuse(entry, "register_simulators", "a folder path")
            continue
        sim = parse_simulator(Path(entry.item))
        found[sim.name] = sim
    return found


def get_simulator(name: str | None) -> Simulator | None:
    """The named simulator, the default one when ``name`` is None, or None if not bundled."""
    sims = discover()
    if name is None:
        return sims.get(DEFAULT_SIMULATOR)
    if name not in sims:
        known = ", ".join(sorted(sims)) or "none bundled"
        raise SimulatorError(f"unknown simulator {name!r} (known: {known})")
    return sims[name]
