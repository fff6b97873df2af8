"""The wheel carries the content folders and works installed in a fresh venv."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_installs_and_finds_content_and_runs_its_kernel(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(dist), str(ROOT)], check=True, capture_output=True,
                   timeout=600)
    wheel = next(dist.glob("simagent-*.whl"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                   check=True, capture_output=True, timeout=600)
    # Dependencies come from this test's environment, after the fresh venv's own packages.
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True, timeout=120).stdout.strip()
    Path(site, "_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    probe = (
        "import simagent, simagent.paths as p\n"
        "print(simagent.__file__)\nprint(p.content_root())\n"
        "print(sorted(d.name for d in p.content_dir('skills').iterdir()))\n"
        "print(sorted(x.name for x in p.content_root().iterdir()))\n"
        "from simagent.kernel import Kernel\n"
        "with Kernel(p.SessionPaths(p.state_home() / 's'), cwd='.') as k:\n"
        "    r = k.execute('import simagent, sys\\nprint(sys.executable)\\nsimagent.__file__')\n"
        "print(r.status); print(r.stdout); print(r.value)\n"
        "from simagent.context.tokens import ENCODINGS_DIR, Ruler\n"
        "print(ENCODINGS_DIR); print(Ruler('o200k_base').count('hello world'))\n"
    )
    env = {**os.environ, "SIMAGENT_HOME": str(tmp_path / "home")}
    out = subprocess.run([py, "-c", probe], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(site)
    assert lines[1] == str(Path(site) / "simagent" / "_content")
    assert "python-and-kernel" in lines[2]
    assert lines[3] == "['bench', 'memory', 'simulators', 'skills', 'subagents']"
    assert lines[4] == "ok" and lines[5] == str(py)  # the kernel runs the wheel's interpreter
    assert site in lines[6]
    # the encoding files ship in the wheel: counting works installed, offline
    assert lines[-2] == str(Path(site) / "simagent" / "context" / "encodings")
    assert lines[-1] == "2"
    cli = subprocess.run([env_dir / "bin" / "simagent", "--version"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert cli.returncode == 0 and cli.stdout.startswith("simagent ")
    sims = subprocess.run([env_dir / "bin" / "simagent", "simulators", "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert sims.returncode == 0, sims.stderr
    listed = {r["name"]: r for r in json.loads(sims.stdout)}
    assert {"ase", "cantera", "pybamm", "scipy", "simpy"} <= set(listed)
    assert listed["pybamm"]["root"].startswith(site)
    assert {"source-explorer", "run-analyst"} <= set(listed["pybamm"]["subagents"])
