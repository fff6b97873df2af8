"""Plugins from outside the package (issue 42): a tiny installed distribution adds a model
kind, a tool, a simulator, a bench workflow and a bench policy through the hooks of
``simagent.hookspecs``, and real ``simagent`` processes find them.

The plugin is installed the way pip leaves one, minus pip: a package and its
``.dist-info`` (METADATA, entry_points.txt) in a folder put on ``PYTHONPATH``, so
``importlib.metadata`` finds its entry points exactly as it finds an installed wheel's.
Beside it, a plugin that fails to import and one whose hook raises: both are reported in
one line and simagent goes on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SIMAGENT = [sys.executable, "-m", "simagent"]

DEMO = '''
from pathlib import Path

from simagent.hookspecs import hookimpl

HERE = Path(__file__).parent
STEPS = [{"tool": "demo_greet", "args": {"name": "Ada"}},
         {"final": "the plugin tool said: {out[-1]}"}]


def build(spec, cfg, env):
    from simagent.agent.scripted import ScriptedChatModel
    from simagent.models import KindModel

    return KindModel(ScriptedChatModel.from_steps(STEPS, name="demo:" + spec.name))


@hookimpl
def register_model_kinds(register):
    from simagent.models import ModelKind

    register(ModelKind("demo", build, "demo:NAME"))


@hookimpl
def register_tools(register, session):
    def demo_greet(name: str) -> str:
        """Greet someone by name."""
        return f"hello {name} in {session.workspace.name}"

    def recall(query: str) -> str:
        """A name simagent's approval already decides about: refused."""
        return "borrowed"

    register(demo_greet)
    register(recall)


@hookimpl
def register_simulators(register):
    register(HERE / "demo_sim")


@hookimpl
def register_workflow_sources(register):
    register(HERE / "workflows")


@hookimpl
def register_bench_policies(register):
    from dataclasses import replace

    from simagent.bench.policies import POLICIES

    register(replace(POLICIES["raw"], name="demo-raw", summary="raw, from a plugin"))
'''

WORKFLOW = '''id = "demo-wf"
title = "A workflow from a plugin"
simulator = "demo-sim"
prompt = "Say hello."

[[steps]]
final = "hello"
'''


def _dist(site: Path, dist: str, version: str, entry_points: str) -> None:
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(entry_points)


def _simulator(folder: Path, name: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "simulator.toml").write_text(
        f'name = "{name}"\ndisplay_name = "{name} (test)"\ndescription = "from a plugin"\n')


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A folder holding three installed plugin distributions: one working (with a
    simulator also offered the old way, a ``simagent.simulators`` entry point), one that
    fails to import, one whose hook raises."""
    site = tmp_path / "site"
    pkg = site / "simagent_demo_plugin"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(DEMO)
    _simulator(pkg / "demo_sim", "demo-sim")
    (pkg / "workflows").mkdir()
    (pkg / "workflows" / "demo-wf.toml").write_text(WORKFLOW)
    _simulator(pkg / "legacy_sim", "legacy-sim")
    (pkg / "legacy_sim" / "__init__.py").write_text("")
    _dist(site, "simagent-demo-plugin", "0.1",
          "[simagent]\ndemo = simagent_demo_plugin\n\n"
          "[simagent.simulators]\nlegacy = simagent_demo_plugin.legacy_sim\n")
    (site / "simagent_broken_plugin.py").write_text("import simagent_no_such_module\n")
    _dist(site, "simagent-broken-plugin", "0.2", "[simagent]\nbroken = simagent_broken_plugin\n")
    (site / "simagent_raising_plugin.py").write_text(
        "from simagent.hookspecs import hookimpl\n\n\n@hookimpl\n"
        "def register_model_kinds(register):\n    raise RuntimeError('no kinds today')\n")
    _dist(site, "simagent-raising-plugin", "0.3", "[simagent]\nraising = simagent_raising_plugin\n")
    return site


def cli(cwd: Path, *args: str, site: Path | None = None,
        timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SIMAGENT_MODEL", "PYTHONPATH")}
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return subprocess.run([*SIMAGENT, *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)


BROKEN_LINE = ("simagent: plugin broken (simagent-broken-plugin 0.2) not loaded: "
               "ModuleNotFoundError: No module named 'simagent_no_such_module'")
RAISING_LINE = ("simagent: plugin raising: register_model_kinds failed: "
                "RuntimeError: no kinds today")


@pytest.mark.slow
def test_plugins_lists_each_plugin_its_source_and_hooks_and_the_broken_one(workspace, site):
    proc = cli(workspace, "plugins", "--json", site=site)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    loaded = {p["name"]: p for p in data["plugins"]}
    assert loaded["demo"] == {
        "name": "demo", "builtin": False, "distribution": "simagent-demo-plugin",
        "version": "0.1", "hooks": ["register_bench_policies", "register_model_kinds",
                                    "register_simulators", "register_tools",
                                    "register_workflow_sources"]}
    assert loaded["simagent.agent.scripted_kind"]["builtin"] is True
    assert loaded["simagent.agent.scripted_kind"]["hooks"] == ["register_model_kinds"]
    (failed,) = data["failed"]
    assert failed["name"] == "broken" and failed["distribution"] == "simagent-broken-plugin"
    assert failed["error"] == "ModuleNotFoundError: No module named 'simagent_no_such_module'"
    assert proc.stderr.splitlines() == [BROKEN_LINE]  # one line, no traceback

    text = cli(workspace, "plugins", site=site)
    assert text.returncode == 0, text.stderr
    rows = {line.split()[0]: line for line in text.stdout.splitlines()}
    assert "simagent-demo-plugin 0.1" in rows["demo"] and "register_tools" in rows["demo"]
    assert "not loaded: ModuleNotFoundError" in rows["broken"]
    assert "built-in" in rows["simagent.models"]


@pytest.mark.slow
def test_a_plugin_model_kind_calls_a_plugin_tool_in_a_real_run(workspace, site):
    proc = cli(workspace, "run", "--model", "demo:hello", "--approval", "auto", "--json",
               "greet Ada", site=site)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    # the final answer quotes the tool result in the request: the tool was offered and ran
    assert data["final"] == f"the plugin tool said: hello Ada in {workspace.name}"
    assert data["tool_calls"] == 1
    errors = proc.stderr.splitlines()
    assert BROKEN_LINE in errors and RAISING_LINE in errors  # reported, and the run went on
    assert ("simagent: plugin demo: tool 'recall' is already taken; left out"
            in errors)  # a plugin cannot borrow a name approval lets through


@pytest.mark.slow
def test_a_plugin_tool_waits_for_approval_in_workspace_mode(workspace, site):
    proc = cli(workspace, "run", "--model", "demo:hello", "--approval", "workspace",
               "--json", "greet Ada", site=site)
    assert proc.returncode == 3, proc.stderr  # held for approval (exit_codes.APPROVAL)
    assert json.loads(proc.stdout)["status"] == "paused"
    assert "waiting for approval: demo_greet" in proc.stderr


@pytest.mark.slow
def test_plugin_simulators_workflows_and_policies_are_known(workspace, site):
    sims = cli(workspace, "simulators", "--json", site=site)
    assert sims.returncode == 0, sims.stderr
    names = {s["name"] for s in json.loads(sims.stdout)}
    assert {"demo-sim", "legacy-sim", "scipy"} <= names  # hook, old entry-point group, bundled
    listed = cli(workspace, "bench", "list", "--json", site=site)
    assert listed.returncode == 0, listed.stderr
    rows = {r["id"]: r for r in json.loads(listed.stdout)}
    assert rows["demo-wf"]["simulator"] == "demo-sim" and "canary" in rows
    policy = subprocess.run(
        [sys.executable, "-c", "from simagent.bench.policies import resolve_policies; "
         "print(resolve_policies('demo-raw,raw')[0].summary)"],
        env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True,
        timeout=120)
    assert policy.returncode == 0, policy.stderr
    assert policy.stdout.strip() == "raw, from a plugin"


@pytest.mark.slow
def test_help_loads_no_plugin_machinery(workspace):
    """Plugins load when a hook is first called, never for ``--help``: pluggy and the
    entry-point scan (about 0.1 s) stay off start-up."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "simagent", "--help"],
                          capture_output=True, text=True, timeout=60, cwd=workspace)
    assert proc.returncode == 0, proc.stderr
    loaded = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()}
    assert not loaded & {"pluggy", "simagent.plugins", "simagent.models"}


@pytest.mark.slow
def test_without_plugins_the_builtins_are_listed(workspace):
    proc = cli(workspace, "plugins", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    from simagent.plugins import BUILTIN

    assert [p["name"] for p in data["plugins"]] == sorted(BUILTIN)
    assert data["failed"] == [] and proc.stderr == ""
