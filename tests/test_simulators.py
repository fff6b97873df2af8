"""Simulators as data: bundled folders, extras, warm-ups in a real kernel, plug-ins, CLI.

Everything runs for real: the warm-up in an ipykernel, ``simagent init`` and ``doctor``
as processes, and a plug-in simulator pip-installed from a temp folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import cli_fork
import pytest
from conftest import write_config

from simagent.paths import content_dir
from simagent.session import Session
from simagent.simulators import DEFAULT_SIMULATOR, SimulatorError, discover, parse_simulator

BUNDLED = ("ase", "cantera", "fipy", "pybamm", "scipy", "simpy")
ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return cli_fork.run([sys.executable, "-m", "simagent", *args], capture_output=True,
                        text=True, timeout=600, env=env, cwd=cwd)


def test_the_five_simulators_are_bundled_and_scipy_is_the_default():
    sims = discover()
    assert set(BUNDLED) <= set(sims)
    assert DEFAULT_SIMULATOR == "scipy" in sims


@pytest.mark.parametrize("name", BUNDLED)
def test_simulator_toml_is_complete(name):
    sim = discover()[name]
    assert sim.root == content_dir("simulators") / name
    assert sim.packages and sim.pip and sim.warmup and sim.domain_hints
    assert len(sim.example_prompts) >= 3
    assert len(sim.skill_names()) >= 2
    assert any(s.endswith("-overview") for s in sim.skill_names())
    # domain hints go into every system prompt: they must stay terse
    assert len(sim.domain_hints) < 2500, f"{name} domain_hints is {len(sim.domain_hints)} chars"


def test_pyproject_extras_mirror_each_simulator_pip_list():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for name in BUNDLED:
        assert extras[name] == list(discover()[name].pip), name
    assert extras["simulators"] == ["simagent[pybamm,cantera,ase,simpy,scipy,fipy]"]


@pytest.mark.parametrize("name", BUNDLED)
def test_warmup_runs_in_the_session_kernel_with_the_simulator_env(workspace, name):
    session = Session.create(workspace, simulator=name, approval="auto")
    try:
        session.start_kernel()
        warm = [e.payload for e in session.trace.events(["kernel_exec"])
                if e.payload["warmup"]]
        assert len(warm) == 1 and warm[0]["status"] == "ok", warm
        out = Path(warm[0]["raw_path"]).read_text()
        assert "ready" in out.lower(), out[-500:]
        for key, value in session.simulator.env:
            res = session.execute(f"import os; print(os.environ.get({key!r}))")
            assert res.stdout.strip() == value
    finally:
        session.close()


def test_simulators_json_reports_installed_truthfully():
    r = cli("simulators", "--json")
    assert r.returncode == 0, r.stderr
    records = {rec["name"]: rec for rec in json.loads(r.stdout)}
    for name in BUNDLED:
        rec = records[name]
        assert rec["installed"] is True
        assert set(rec) >= {"name", "display_name", "installed", "packages", "skills",
                            "subagents"}
        assert {"source-explorer", "run-analyst"} <= set(rec["subagents"])
        assert all(v for v in rec["versions"].values()), rec["versions"]


def _plugin_folder(tmp_path: Path, package: str = "no_such_package_xyz") -> Path:
    src = tmp_path / "tinysim-src"
    pkg = src / "tinysim"
    (pkg / "skills" / "tiny-overview").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "simulator.toml").write_text(
        'name = "tiny"\ndisplay_name = "Tiny"\ndescription = "A plug-in for tests."\n'
        f'packages = ["{package}"]\npip = ["{package}"]\nwarmup = "print(\'tiny ready\')"\n')
    (pkg / "skills" / "tiny-overview" / "SKILL.md").write_text(
        "---\nname: tiny-overview\ndescription: How to use the tiny plug-in simulator.\n---\n"
        "Nothing to see.\n")
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
        '[project]\nname = "tinysim"\nversion = "0.1"\n'
        '[project.entry-points."simagent.simulators"]\ntiny = "tinysim"\n'
        '[tool.hatch.build.targets.wheel]\npackages = ["tinysim"]\n')
    return src


def _install_plugin(tmp_path: Path) -> Path:
    """pip-installs the tiny plug-in into a folder of its own; returns that folder."""
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--no-index", "--target", str(target),
                    str(_plugin_folder(tmp_path))], check=True, capture_output=True, timeout=300)
    return target


@pytest.mark.slow
def test_entry_point_plugin_is_discovered_and_its_missing_package_reported(tmp_path):
    target = _install_plugin(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(target)}
    r = cli("simulators", "--json", env=env)
    assert r.returncode == 0, r.stderr
    tiny = next(rec for rec in json.loads(r.stdout) if rec["name"] == "tiny")
    assert tiny["installed"] is False and tiny["skills"] == ["tiny-overview"]
    assert tiny["root"] == str(target / "tinysim")
    # init refuses it with the one-line fix, after writing the config
    ws = tmp_path / "ws"
    ws.mkdir()
    r = cli("init", "--sim", "tiny", "--workspace", str(ws), env=env)
    assert r.returncode == 1
    assert "fix: pip install no_such_package_xyz" in r.stderr  # a plug-in has no extra
    assert "FAIL import no_such_package_xyz" in r.stdout


def test_plugin_whose_package_exists_counts_as_installed(tmp_path):
    src = _plugin_folder(tmp_path, package="json")
    sim = parse_simulator(src / "tinysim")
    assert sim.installed() and sim.package_dirs()


def test_bad_simulator_toml_names_the_file(tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "simulator.toml").write_text('name = "bad"\npackages = "numpy"\n')
    with pytest.raises(SimulatorError, match=r"bad/simulator.toml: missing display_name"):
        parse_simulator(folder)
    (folder / "simulator.toml").write_text(
        'name = "bad"\ndisplay_name = "B"\ndescription = "d"\nenv = { X = 1 }\n')
    with pytest.raises(SimulatorError, match="env must be a table of strings"):
        parse_simulator(folder)
    # a digester must name a module file in the folder and a function (module:function)
    (folder / "simulator.toml").write_text(
        'name = "bad"\ndisplay_name = "B"\ndescription = "d"\ndigest = "missing:digest"\n')
    with pytest.raises(SimulatorError, match="digest must be"):
        parse_simulator(folder)


@pytest.mark.parametrize("name", BUNDLED)
def test_simulators_with_long_logs_declare_a_digester_file_beside_them(name):
    sim = discover()[name]
    if name in ("pybamm", "cantera", "ase"):
        module = sim.digest.split(":", 1)[0]
        assert (sim.root / f"{module}.py").is_file(), sim.digest
    else:
        assert sim.digest == ""  # the generic digester serves them


def test_init_writes_config_keeps_other_settings_and_checks_imports(tmp_path):
    ws = tmp_path / "ws"
    (ws / ".simagent").mkdir(parents=True)
    write_config(ws,
        '# mine\nsimulator = "scipy"\napproval = "auto"\n\n[context]\nclear_fraction = 0.5\n')
    r = cli("init", "--sim", "cantera", "--workspace", str(ws))
    assert r.returncode == 0, r.stderr
    assert "ok   import cantera" in r.stdout and "ok   warm-up" in r.stdout
    text = (ws / ".simagent" / "config.toml").read_text()
    data = tomllib.loads(text)
    assert data["simulator"] == "cantera" and data["approval"] == "auto"
    assert data["context"] == {"clear_fraction": 0.5} and text.startswith("# mine")
    # a new session in that workspace gets the simulator
    session = Session.create(ws)
    try:
        assert session.simulator.name == "cantera"
    finally:
        session.close()


def test_init_with_an_unknown_simulator_is_a_usage_error(tmp_path):
    r = cli("init", "--sim", "nope", "--workspace", str(tmp_path))
    assert r.returncode == 2
    assert "unknown simulator 'nope'" in r.stderr and "pybamm" in r.stderr
    assert not (tmp_path / ".simagent").exists()


@pytest.mark.slow
def test_doctor_checks_every_simulator_in_a_kernel(tmp_path):
    r = cli("doctor", "--json", "--workspace", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    checks = {c["name"]: c for c in json.loads(r.stdout)}
    assert checks["kernel"]["ok"] and checks["python"]["ok"] and checks["tokenizer"]["ok"]
    for name in BUNDLED:
        c = checks[f"sim {name}"]
        assert c["ok"], c
    assert checks["sim pybamm"]["detail"].startswith("pybamm 26.")
    assert checks["model"]["level"] == "warn" and checks["model"]["fix"]


@pytest.mark.slow
def test_doctor_fails_with_a_fix_when_the_workspace_simulator_is_missing(tmp_path):
    target = _install_plugin(tmp_path)
    ws = tmp_path / "ws"
    (ws / ".simagent").mkdir(parents=True)
    write_config(ws, 'simulator = "tiny"\n')
    r = cli("doctor", "--quick", "--workspace", str(ws),
            env={**os.environ, "PYTHONPATH": str(target)})
    assert r.returncode == 1
    assert "FAIL sim tiny (workspace)" in r.stdout
    assert "fix: pip install no_such_package_xyz" in r.stdout


def test_init_without_sim_keeps_the_workspace_simulator(tmp_path):
    ws = tmp_path / "ws"
    (ws / ".simagent").mkdir(parents=True)
    write_config(ws, 'simulator = "simpy"  # mine\n')
    r = cli("init", "--no-check", "--workspace", str(ws))
    assert r.returncode == 0, r.stderr
    assert tomllib.loads((ws / ".simagent" / "config.toml").read_text())["simulator"] == "simpy"
    bad = tmp_path / "bad"
    (bad / ".simagent").mkdir(parents=True)
    write_config(bad, "simulator = \n")
    r = cli("init", "--workspace", str(bad))
    assert r.returncode == 2 and "config.toml" in r.stderr and "invalid TOML" in r.stderr
