"""Bench workflows as data (design.md §9.1): parse, validate, and find them.

Every error names the file and the field, because a workflow is hand-written TOML and a
vague "invalid workflow" wastes an afternoon. Steps are validated by the scripted model's
own ``flatten_steps`` (one home for the step format). Workflows are found in the folders
plugins register (``register_workflow_sources``, :mod:`simagent.hookspecs`); this module is
the built-in plugin that registers the bundled folder.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simagent import plugins
from simagent.hookspecs import hookimpl
from simagent.paths import content_dir

DEFAULT_WINDOW = 128_000
SCORER_FIELDS: dict[str, tuple[set[str], set[str]]] = {
    # kind: (required fields, optional fields)
    "numeric": ({"answer_regex"}, {"expected", "expected_from", "rel_tol", "abs_tol"}),
    "value": ({"expected"}, {"near", "rel_tol", "abs_tol"}),
    "cites": ({"from_step", "regex"}, set()),
    "tool_used": ({"tool"}, {"min", "agent"}),
    "tool_avoided": ({"tool"}, set()),
    "artifact": (set(), {"min", "suffix"}),
    "file_exists": ({"path"}, {"contains"}),
    "subagent": ({"name"}, {"min"}),
    "task_record": ({"field"}, {"expected", "unit", "contains", "source", "rel_tol",
                                "abs_tol"}),
    "supported_numbers": (set(), {"max"}),
}
_TOP = {"id", "title", "simulator", "prompt", "long", "window", "windows", "tags", "fixtures",
        "budgets", "steps", "probes", "scorers", "description", "held_out"}
_BUDGETS = {"model_calls", "tokens", "seconds"}


class WorkflowError(ValueError):
    """A workflow file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Probe:
    fact: str
    from_step: int


@dataclass(frozen=True)
class Workflow:
    id: str
    title: str
    prompt: str
    steps: list[dict[str, Any]]  # flattened, in play order
    path: Path
    simulator: str | None = None
    long: bool = False
    window: int = DEFAULT_WINDOW
    #: Windows a sweep replays this workflow at, each enforced like a provider (``--window``
    #: overrides); empty: the declared ``window``, not enforced.
    windows: tuple[int, ...] = ()
    tags: tuple[str, ...] = ()
    fixtures: dict[str, dict[str, str]] = field(default_factory=dict)
    budgets: dict[str, float] = field(default_factory=dict)
    probes: tuple[Probe, ...] = ()
    scorers: tuple[dict[str, Any], ...] = ()
    #: Written apart from the tuning (issue 31): no threshold is fitted on it, and the
    #: report shows it as a group of its own.
    held_out: bool = False
    #: Flattened indices of the steps a subagent plays (the oracle's view skips them).
    subagent_steps: frozenset[int] = frozenset()

    @property
    def tool_steps(self) -> int:
        return sum(len(s["tools"]) if "tools" in s else 1 for s in self.steps
                   if "tool" in s or "tools" in s)

    def write_fixtures(self, workspace: Path, *, keep_existing: bool = False) -> None:
        """The workflow's input files in ``workspace``; ``keep_existing`` never overwrites
        (a replay demo in someone's real workspace)."""
        for rel, spec in self.fixtures.items():
            dest = workspace / rel
            if keep_existing and dest.exists():
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            if "text" in spec:
                dest.write_text(spec["text"], encoding="utf-8")
            else:
                dest.write_bytes(fixture_path(spec["path"], self.path).read_bytes())


def fixture_path(name: str, workflow_path: Path) -> Path:
    """A fixture next to the workflow's folder (``../fixtures``), else the bundled one."""
    local = workflow_path.parent.parent / "fixtures" / name
    return local if local.is_file() else content_dir("bench") / "fixtures" / name


_PKG = re.compile(r"\{pkg:([A-Za-z_][\w.]*)\}")


def package_dir(name: str) -> str:
    """The installed folder of import package ``name`` (for ``{pkg:NAME}`` in steps)."""
    from simagent.simulators import package_dirs  # not at CLI start (replay: kind)

    dirs = package_dirs(name)
    if not dirs:
        raise WorkflowError(f"package {name!r} is not installed")
    return str(dirs[0].resolve())


def expand_packages(value: Any) -> Any:
    """``{pkg:cantera}`` in any string of a step -> that package's installed folder, so a
    trajectory that reads installed source works on every machine."""
    if isinstance(value, str):
        return _PKG.sub(lambda m: package_dir(m.group(1)), value)
    if isinstance(value, dict):
        return {k: expand_packages(v) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_packages(v) for v in value]
    return value


def _need(cond: bool, where: str, msg: str) -> None:
    if not cond:
        raise WorkflowError(f"{where}: {msg}")


def load_workflow(path: str | Path) -> Workflow:
    """A workflow file, checked field by field (each error names the file and field)."""
    path = Path(path)
    data = _read_toml(path)
    where = str(path)
    unknown = sorted(set(data) - _TOP)
    _need(not unknown, where, f"unknown field(s) {unknown}")
    for key in ("id", "title", "prompt"):
        _need(isinstance(data.get(key), str) and data[key].strip(), where,
              f"`{key}` must be a non-empty string")
    _need(data["id"] == path.stem, where, f"`id` {data['id']!r} must equal the file name "
                                          f"{path.stem!r}")
    sim = data.get("simulator")
    if sim is not None:
        from simagent.simulators import SimulatorError, get_simulator  # not at CLI start

        try:
            get_simulator(sim)
        except SimulatorError as exc:
            raise WorkflowError(f"{where}: `simulator`: {exc}") from exc
    steps = _steps(data.get("steps"), where)
    window, windows = _windows(data, where)
    fixtures = data.get("fixtures", {})
    _check_fixtures(fixtures, path)
    budgets = data.get("budgets", {})
    _need(isinstance(budgets, dict) and set(budgets) <= _BUDGETS, where,
          f"`budgets` keys must be among {sorted(_BUDGETS)}")
    _need(isinstance(data.get("held_out", False), bool), where, "`held_out` must be true/false")
    inside = _subagent_steps(data["steps"])
    return Workflow(
        id=data["id"], title=data["title"], prompt=data["prompt"], steps=steps, path=path,
        simulator=sim, long=bool(data.get("long", False)), window=window,
        windows=windows, tags=tuple(data.get("tags", ())),
        fixtures=fixtures, budgets=budgets,
        probes=_probes(data.get("probes", []), len(steps), inside, where),
        scorers=_scorers(data.get("scorers", []), len(steps), where),
        held_out=bool(data.get("held_out", False)), subagent_steps=frozenset(inside))


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise WorkflowError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise WorkflowError(f"{path}: invalid TOML: {exc}") from exc


def _steps(steps_raw: Any, where: str) -> list[dict[str, Any]]:
    """The flattened steps, ``{pkg:...}`` expanded, checked to end in a final answer and
    never to template kernel code."""
    from simagent.agent.scripted import ScriptError, flatten_steps  # langchain: heavy

    _need(isinstance(steps_raw, list) and steps_raw, where, "`steps` must be a non-empty list")
    try:
        steps = flatten_steps(steps_raw, where=f"{where}: steps")
        steps = expand_packages(steps)
    except ScriptError as exc:
        raise WorkflowError(str(exc)) from exc
    except WorkflowError as exc:
        raise WorkflowError(f"{where}: steps: {exc}") from exc
    _need(any("final" in s for s in steps), where, "`steps` need a `final` step")
    for i, st in enumerate(steps):
        calls = st.get("tools") or ([st] if "tool" in st else [])
        _need(not (st.get("fill") or any(c.get("fill") for c in calls)) or all(
            c.get("tool") != "run_python" for c in calls), where,
            f"steps[{i}]: `fill` cannot template run_python code (replay records each "
            "kernel step once, before any model runs); write the values into the code")
    return steps


def _windows(data: dict[str, Any], where: str) -> tuple[int, tuple[int, ...]]:
    window = data.get("window", DEFAULT_WINDOW)
    _need(isinstance(window, int) and window > 1000, where, "`window` must be an integer "
                                                          "> 1000")
    windows = data.get("windows", [])
    _need(isinstance(windows, list) and all(isinstance(w, int) and not isinstance(w, bool)
                                            and w > 1000 for w in windows), where,
          "`windows` must be a list of integers > 1000 (tokens), e.g. [128000, 32000]")
    return window, tuple(dict.fromkeys(windows))


def _check_fixtures(fixtures: Any, path: Path) -> None:
    _need(isinstance(fixtures, dict), str(path), "`fixtures` must be a table")
    for rel, spec in fixtures.items():
        w = f"{path}: fixtures.{rel!r}"
        _need(isinstance(spec, dict) and len(set(spec) & {"text", "path"}) == 1, w,
              "needs exactly one of `text` or `path`")
        _need(not Path(rel).is_absolute() and ".." not in Path(rel).parts, w,
              "must be a workspace-relative path")
        if "path" in spec:
            _need(fixture_path(spec["path"], path).is_file(), w,
                  f"fixture file {spec['path']!r} not found in bench/fixtures")


def _probes(raw: list[Any], n_steps: int, inside: set[int], where: str
            ) -> tuple[Probe, ...]:
    probes = []
    for i, p in enumerate(raw):
        w = f"{where}: probes[{i}]"
        _need(isinstance(p, dict) and isinstance(p.get("fact"), str) and p["fact"], w,
              "needs a non-empty `fact`")
        _need(isinstance(p.get("from_step"), int) and 0 <= p["from_step"] < n_steps, w,
              f"`from_step` must be a step index 0..{n_steps - 1}")
        _need(p["from_step"] not in inside, w,
              f"step {p['from_step']} runs inside a subagent, whose results never reach the "
              "main agent's request; probe the `task` step's report instead")
        probes.append(Probe(p["fact"], p["from_step"]))
    return tuple(probes)


def _scorers(raw: list[Any], n_steps: int, where: str) -> tuple[dict[str, Any], ...]:
    scorers = []
    for i, sc in enumerate(raw):
        w = f"{where}: scorers[{i}]"
        _need(isinstance(sc, dict) and sc.get("kind") in SCORER_FIELDS, w,
              f"`kind` must be one of {sorted(SCORER_FIELDS)}")
        required, optional = SCORER_FIELDS[sc["kind"]]
        missing = sorted(required - set(sc))
        _need(not missing, w, f"{sc['kind']} needs {missing}")
        extra = sorted(set(sc) - required - optional - {"kind"})
        _need(not extra, w, f"unknown field(s) {extra} for {sc['kind']}")
        if sc["kind"] == "numeric":
            _need(("expected" in sc) != ("expected_from" in sc), w,
                  "numeric needs exactly one of `expected` or `expected_from`")
        if sc["kind"] == "task_record":
            from simagent.context.task_records import GRADED_FIELDS  # not at CLI start

            f = sc["field"]
            _need(isinstance(f, str) and (f in GRADED_FIELDS or f.startswith("key_values.")),
                  w, f"`field` must be one of {list(GRADED_FIELDS)} or 'key_values.<name>'")
            _need(not {"expected", "unit"} & set(sc) or f.startswith("key_values."), w,
                  "`expected` and `unit` grade a key value: field = 'key_values.<name>'")
        if "from_step" in sc:
            _need(isinstance(sc["from_step"], int) and 0 <= sc["from_step"] < n_steps, w,
                  "`from_step` must be a step index")
        scorers.append(dict(sc))
    return tuple(scorers)


def _subagent_steps(steps: list[dict[str, Any]]) -> set[int]:
    """Flattened indices of steps that a subagent plays (nested under a ``task`` step)."""
    inside: set[int] = set()
    pos = 0

    def walk(items: list[dict[str, Any]], nested: bool) -> None:
        nonlocal pos
        for st in items:
            if nested:
                inside.add(pos)
            pos += 1
            if isinstance(st, dict) and isinstance(st.get("steps"), list):
                walk(st["steps"], True)

    walk(steps, False)
    return inside


def bundled_workflows() -> dict[str, Path]:
    return _workflows_in(content_dir("bench") / "workflows")


def _workflows_in(folder: Path) -> dict[str, Path]:
    return {p.stem: p for p in sorted(folder.glob("*.toml"))} if folder.is_dir() else {}


@hookimpl
def register_workflow_sources(register: Callable[[Path], None]) -> None:
    register(content_dir("bench") / "workflows")


def known_workflows() -> dict[str, Path]:
    """Every workflow by id, from the folders plugins register: the bundled ones first, a
    plugin's workflow replacing one of the same id."""
    found: dict[str, Path] = {}
    for entry in plugins.collect("register_workflow_sources"):
        if isinstance(entry.item, (str, Path)):
            found.update(_workflows_in(Path(entry.item)))
        else:
            plugins.refuse(entry, "register_workflow_sources", "a folder path")
    return found


def resolve_workflows(names: list[str] | None) -> list[Workflow]:
    """Known ids or paths (every known workflow when ``names`` is empty)."""
    known = known_workflows()
    if not names:
        return [load_workflow(p) for p in known.values()]
    out = []
    for name in names:
        if name in known:
            out.append(load_workflow(known[name]))
        elif Path(name).is_file():
            out.append(load_workflow(name))
        else:
            ids = ", ".join(known) or "none bundled"
            raise WorkflowError(f"unknown workflow {name!r} (known: {ids}; or give a path)")
    return out
