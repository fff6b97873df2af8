"""A client nobody here wrote: ``acpx`` (npm) runs a scripted turn against ``simagent acp``.

acpx is installed once per version into a folder of the temp directory keyed by that
version (``npm install --prefix``, bounded); the test is skipped, with npm's words, only
when npm is missing or cannot reach its registry. acpx keeps its state in ``~/.acpx``, so
HOME is the test's own.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import cli_fork
import pytest

pytestmark = pytest.mark.slow

ACPX_VERSION = "0.19.1"
UNREACHABLE = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ETIMEDOUT", "ECONNRESET",
               "network", "getaddrinfo")


def acpx_binary() -> Path:
    prefix = Path(tempfile.gettempdir()) / f"simagent-acpx-{ACPX_VERSION}"
    binary = prefix / "node_modules" / ".bin" / "acpx"
    if binary.exists():
        return binary
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: acpx cannot be installed")
    try:
        done = subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit",
                               "--no-fund", f"acpx@{ACPX_VERSION}"], capture_output=True,
                              text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.skip("npm install acpx took over 300 s (registry unreachable?)")
    if done.returncode != 0:
        words = (done.stderr or done.stdout).strip()
        if any(k in words for k in UNREACHABLE):
            print(f"npm cannot reach its registry: {words[-400:]}")
            pytest.skip(f"npm cannot reach its registry: {words.splitlines()[-1][:200]}")
        pytest.fail(f"npm install acpx@{ACPX_VERSION} failed: {words[-1000:]}")
    assert binary.exists(), f"npm installed acpx but {binary} is missing"
    return binary


def test_acpx_runs_a_scripted_turn(tmp_path, workspace):
    acpx = acpx_binary()
    steps = [{"tool": "run_python", "args": {"code": "print(6 * 7)"}},
             {"final": "The answer is {out[-1]}"}]
    script = tmp_path / "script.json"
    script.write_text(json.dumps(steps))
    home = tmp_path / "home"
    home.mkdir()
    agent = shlex.join(cli_fork.command(["acp", "--model", f"scripted:{script}"]))
    done = subprocess.run([str(acpx), "--agent", agent, "--approve-all", "exec",
                           "what is six times seven?"], cwd=workspace,
                          env={**os.environ, "HOME": str(home)}, capture_output=True,
                          text=True, timeout=300)
    out = done.stdout
    assert done.returncode == 0, (out, done.stderr)
    assert "The answer is 42" in out, out
    assert "[tool] run_python: print(6 * 7) (completed)" in out, out
    assert "[done] end_turn" in out, out
