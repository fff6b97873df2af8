"""The suite's CLI seam (``tests/cli_fork.py``) behaves as ``subprocess`` does for a fresh
``python -m simagent``: the same output and exit status, the test's streams, folder and
environment, signals, timeouts and a process of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cli_fork
import pytest

pytestmark = pytest.mark.slow
SIMAGENT = [sys.executable, "-m", "simagent"]


def scripted(tmp_path: Path, steps: list[dict]) -> str:
    path = tmp_path / "steps.json"
    path.write_text(json.dumps(steps))
    return f"scripted:{path}"


def both(args: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, ...]:
    return (subprocess.run(args, capture_output=True, text=True, timeout=120, **kwargs),
            cli_fork.run(args, capture_output=True, text=True, timeout=120, **kwargs))


def test_a_forked_run_prints_and_exits_as_a_fresh_one(workspace: Path, tmp_path: Path) -> None:
    model = scripted(tmp_path, [{"tool": "run_python", "args": {"code": "print(6*7)"}},
                                {"final": "the answer is 42"}])
    fresh, forked = both([*SIMAGENT, "run", "--json", "--model", model, "go"], cwd=workspace)
    assert fresh.returncode == forked.returncode == 0, (fresh.stderr, forked.stderr)
    a, b = json.loads(fresh.stdout), json.loads(forked.stdout)
    assert a["final"] == b["final"] == "the answer is 42"
    assert a["session_id"] != b["session_id"]  # its own random state, not the server's
    fresh, forked = both([*SIMAGENT, "run", "--no-such-flag"], cwd=workspace)
    assert fresh.returncode == forked.returncode == 2
    assert fresh.stderr == forked.stderr and "--no-such-flag" in forked.stderr


def test_the_child_takes_the_tests_folder_environment_and_stdin(workspace: Path,
                                                                tmp_path: Path) -> None:
    model = scripted(tmp_path, [{"final": "ok"}])
    env = {**os.environ, "SIMAGENT_HOME": str(tmp_path / "other-home")}
    forked = cli_fork.run([*SIMAGENT, "run", "--json", "--model", model, "-"], cwd=workspace,
                          env=env, input="from stdin", capture_output=True, text=True,
                          timeout=120)
    assert forked.returncode == 0, forked.stderr
    out = json.loads(forked.stdout)
    assert Path(out["state_dir"]).is_relative_to(tmp_path / "other-home")
    assert out["final"] == "ok"


def test_signals_timeouts_and_a_process_group_of_its_own(workspace: Path,
                                                         tmp_path: Path) -> None:
    model = scripted(tmp_path, [
        {"tool": "run_python", "args": {"code": "import time\nprint('started', flush=True)\n"
                                                "time.sleep(60)"}},
        {"final": "never"}])
    proc = cli_fork.popen([*SIMAGENT, "run", "--model", model, "go"], cwd=workspace,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          start_new_session=True)
    try:
        assert proc.pid != os.getpid() and os.getpgid(proc.pid) == proc.pid
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)
        assert proc.poll() is None
        time.sleep(3)  # into the cell
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        proc.stdout.close()
        proc.stderr.close()


def test_what_it_cannot_serve_runs_as_a_plain_subprocess() -> None:
    done = cli_fork.run([sys.executable, "-c", "print('plain')"], capture_output=True,
                        text=True, timeout=60)
    assert done.stdout == "plain\n"
    assert cli_fork.simagent_args([sys.executable, "-X", "importtime", "-m", "simagent"]) \
        is None


def test_a_command_that_changes_the_interpreters_start_gets_a_fresh_one(tmp_path: Path) -> None:
    """``PYTHONPATH`` (a plugin's site folder, say) acts when an interpreter starts: the
    server's children cannot take it, so such a command runs as a plain subprocess."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "marker_mod.py").write_text("")
    env = {**os.environ, "PYTHONPATH": str(site)}
    assert not cli_fork.servable([*SIMAGENT, "--version"], env=env)
    assert cli_fork.servable([*SIMAGENT, "--version"], env={**os.environ,
                                                            "PYTHONUNBUFFERED": "1"})
    done = cli_fork.run([*SIMAGENT, "--version"], env=env, capture_output=True, text=True,
                        timeout=60)
    assert done.returncode == 0 and "simagent" in done.stdout.lower()


def test_a_trampoline_command_line_runs_simagent_for_launchers_of_their_own(
        workspace: Path, tmp_path: Path) -> None:
    """What the MCP SDK or acpx start: ``cli_fork.command`` is a command line whose
    process ends as simagent did, and a signal to it reaches simagent."""
    model = scripted(tmp_path, [{"final": "via trampoline"}])
    line = cli_fork.command(["run", "--model", model, "go"])
    assert line[0] == sys.executable and "-m" not in line
    done = subprocess.run(line, cwd=workspace, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "via trampoline\n", done.stderr
    bad = subprocess.run(cli_fork.command(["run", "--no-such-flag"]), cwd=workspace,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--no-such-flag" in bad.stderr
    slow = scripted(tmp_path, [{"tool": "run_python", "args": {"code": "import time\n"
                                                                "time.sleep(60)"}},
                               {"final": "never"}])
    proc = subprocess.Popen(cli_fork.command(["run", "--model", slow, "go"]), cwd=workspace,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(3)
        proc.terminate()
        assert proc.wait(timeout=60) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_a_trampoline_under_another_pythonpath_becomes_a_fresh_interpreter(
        tmp_path: Path) -> None:
    """``PYTHONPATH=plugins simagent ...`` (docs/plugins.md): the variable must act, so the
    trampoline starts ``python -m simagent`` itself: the folder's ``sitecustomize`` runs in
    the trampoline and again in simagent's interpreter, not once as it would if forked."""
    site = tmp_path / "site"
    site.mkdir()
    starts = tmp_path / "starts"
    (site / "sitecustomize.py").write_text(
        f"import os\nwith open({str(starts)!r}, 'a') as f: f.write(str(os.getpid()) + '\\n')\n")
    line = cli_fork.command(["--version"])
    fresh = subprocess.run(line, env={**os.environ, "PYTHONPATH": str(site)},
                           capture_output=True, text=True, timeout=120)
    forked = subprocess.run(line, capture_output=True, text=True, timeout=120)
    assert fresh.returncode == forked.returncode == 0
    assert fresh.stdout == forked.stdout and "simagent" in forked.stdout
    assert len(starts.read_text().split()) == 2
