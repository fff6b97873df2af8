"""Fast, true errors (issue 37): every usage error is one line and exit 2, answered before
any heavy import; ``--json`` failures are JSON; options before the command are honoured or
refused; long prompts come from standard input or a file. Each case runs the real
``simagent`` command in a subprocess with the test's own state home (``SIMAGENT_HOME``).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import cli_fork
import pytest
from conftest import write_config
from test_cli_bad_input import _ro_mount_prefix

from simagent import exit_codes
from simagent.cli import build_parser
from simagent.cli.arguments import _options, _subparsers
from simagent.config import Config, ConfigError

SIMAGENT = [sys.executable, "-m", "simagent"]
HEAVY = ("deepagents", "langchain", "langchain_core", "langgraph", "matplotlib",
         "jupyter_client", "nbformat")


def cli(workspace: Path, *args: str, env: dict[str, str] | None = None,
        stdin: str | bytes | None = "", prefix: list[str] | None = None,
        timeout: float = 180) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_MODEL"}
    full_env.update(env or {})
    data = stdin.encode() if isinstance(stdin, str) else stdin
    proc = cli_fork.run([*(prefix or []), *SIMAGENT, *args], cwd=workspace, env=full_env,
                        input=data, capture_output=True, timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode,
                                       proc.stdout.decode(errors="replace"),
                                       proc.stderr.decode(errors="replace"))


def script(tmp_path: Path, steps: list[dict] | None = None) -> str:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(steps or [{"final": "ok"}]))
    return f"scripted:{path}"


def errors(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ": error: " in ln]


def one_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "internal error" not in proc.stderr
    (line,) = errors(proc.stderr)
    return line


def state_sessions(home: Path) -> list[Path]:
    return list(home.glob("workspaces/*/sessions/*"))


def user_messages(state_dir: str) -> list[str]:
    db = sqlite3.connect(Path(state_dir) / "trace.sqlite")
    try:
        return [json.loads(p)["content"] for (p,) in db.execute(
            "SELECT payload FROM events WHERE kind = 'message_user' ORDER BY id")]
    finally:
        db.close()


# ------------------------------------------- the speed goal: nothing heavy is loaded
USAGE_ERRORS = [
    ["run", ""],
    ["run", "--model", "scripted:{tmp}/missing.json", "hi"],
    ["run", "--model", "nonsense", "hi"],
    ["run", "--model", "scripted:{script}", "--from-notebook", "{tmp}/missing.ipynb", "hi"],
    ["run", "--workspace", "{script}", "--model", "scripted:{script}", "hi"],
    ["run", "--workspace", "{tmp}/missing", "--model", "scripted:{script}", "hi"],
    ["run", "--kernel", "", "--model", "scripted:{script}", "hi"],
    ["run", "--prompt-file", "{tmp}/missing.txt", "--model", "scripted:{script}"],
    ["run", "--json", "--model", "scripted:{script}", ""],
    ["--model", "scripted:{script}", "sessions"],
    ["transcript", "-o", "{tmp}/missing/t.md"],
    ["notebook", "-o", "{tmp}/missing/n.ipynb"],
]


@pytest.mark.slow
@pytest.mark.parametrize("argv", USAGE_ERRORS, ids=lambda a: " ".join(a)[:40])
def test_usage_errors_are_answered_before_any_heavy_import(argv, workspace, tmp_path):
    """The measured speed (``simagent bench cli``) comes from this: the error is found
    before langchain, deepagents, jupyter_client or nbformat load."""
    script(tmp_path)
    filled = [a.format(tmp=tmp_path, script=tmp_path / "script.json") for a in argv]
    probe = ("import sys\nfrom simagent.cli import main\ncode = main(sys.argv[1:])\n"
             f"print('HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
             "sys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", probe, *filled], cwd=workspace,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert len(errors(proc.stderr)) == 1 and "internal error" not in proc.stderr
    assert proc.stdout.splitlines()[-1] == "HEAVY []"


# ---------------------------------------------------- defect 7: --json errors are JSON
@pytest.mark.parametrize("argv", [["run", "--json", ""], ["run", "--json", "--bogus", "x"],
                                  ["run", "--json", "--workspace", "/no/such/folder", "x"],
                                  ["--json", "run", "x"]])
def test_json_failures_print_one_json_object_with_the_error(argv, workspace):
    proc = cli(workspace, *argv)
    assert proc.returncode == 2, proc.stderr
    out = json.loads(proc.stdout)
    assert out["exit_code"] == 2 and out["error"] and "error" not in out["error"][:7]
    assert out["error"] in errors(proc.stderr)[0]


@pytest.mark.slow
@pytest.mark.parametrize("approval, status, code", [("workspace", "done", 0),
                                                     ("ask", "paused", 3)])
def test_a_turn_s_json_report_carries_the_exit_status(approval, status, code, workspace,
                                                       tmp_path):
    """A script reads one object whichever way the run ended: the turn's report names the
    status the process leaves with, as an error object does."""
    model = script(tmp_path, [{"tool": "run_python", "args": {"code": "x = 1"}},
                              {"final": "done"}])
    proc = cli(workspace, "run", "--json", "--approval", approval, "--model", model, "go")
    (line,) = proc.stdout.splitlines()
    out = json.loads(line)
    assert (out["status"], out["exit_code"], proc.returncode) == (status, code, code), \
        proc.stderr


@pytest.mark.slow
def test_a_notebook_held_for_approval_is_a_json_error_with_its_exit_status(workspace,
                                                                            tmp_path):
    (workspace / "n.ipynb").write_text(json.dumps({
        "cells": [{"cell_type": "code", "source": "x = 1", "metadata": {}, "outputs": [],
                   "execution_count": None}],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    proc = cli(workspace, "run", "--json", "--approval", "ask", "--from-notebook",
               "n.ipynb", "--model", script(tmp_path), "go")
    assert proc.returncode == exit_codes.APPROVAL, proc.stderr
    out = json.loads(proc.stdout)
    assert out["exit_code"] == exit_codes.APPROVAL and "were not run" in out["error"]
    assert f"simagent: {out['error']}" in proc.stderr.splitlines()


# -------------------------------------------- defect 1: options before the command
@pytest.mark.slow
def test_options_before_the_command_are_honoured(workspace, tmp_path, _state_home):
    proc = cli(workspace, "--model", script(tmp_path, [{"final": "honoured"}]), "run", "hi")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "honoured"
    before = state_sessions(_state_home)
    # --kernel before `run` is used: it names no running kernel, so exit 6, no session
    proc = cli(workspace, "--kernel", "no-such-kernel-id", "run", "--model",
               script(tmp_path), "hi")
    assert proc.returncode == 6, proc.stderr
    assert "--kernel no-such-kernel-id: no kernel" in proc.stderr
    assert state_sessions(_state_home) == before


def test_options_a_command_does_not_take_are_refused(workspace, tmp_path):
    line = one_error(cli(workspace, "--model", script(tmp_path), "sessions"))
    assert "--model is not an option of 'simagent sessions'" in line
    line = one_error(cli(workspace, "--resume", "x", "run", "--continue", "hi"))
    assert "--resume and --continue do not go together" in line


@pytest.mark.parametrize("where", ["before", "after"])
def test_an_empty_kernel_is_an_error_not_a_kernel_of_its_own(where, workspace, tmp_path,
                                                               _state_home):
    args = ["run", "--model", script(tmp_path), "hi"]
    args = ["--kernel", "", *args] if where == "before" else [*args, "--kernel", ""]
    line = one_error(cli(workspace, *args))
    assert "--kernel got an empty value" in line
    assert state_sessions(_state_home) == []


def test_every_shared_option_has_one_default_everywhere():
    """``share_top_options`` keeps a value given before the command only where the
    command's own default agrees with the top level's (then left as SUPPRESS)."""
    parser = build_parser()
    top = {d for d in _options(parser) if d != "version"}
    pending = _subparsers(parser)
    while pending:
        sub = pending.pop()
        for dest, action in _options(sub).items():
            if dest in top:
                assert action.default is argparse.SUPPRESS, (sub.prog, dest)
        pending.extend(_subparsers(sub))


# -------------------------------------- defect 3: a workspace that is not a folder
@pytest.mark.parametrize("kind", ["file", "missing"])
def test_run_in_a_workspace_that_is_not_a_folder(kind, workspace, tmp_path, _state_home):
    target = tmp_path / "not-a-folder"
    if kind == "file":
        target.write_text("x")
    line = one_error(cli(workspace, "run", "--workspace", str(target), "--model",
                         script(tmp_path), "hi"))
    assert f"workspace {target} " in line
    assert ("is not a folder" if kind == "file" else "does not exist") in line
    assert state_sessions(_state_home) == []


@pytest.mark.parametrize("command", ["sessions", "transcript", "context"])
def test_reading_commands_refuse_a_missing_workspace_too(command, workspace, tmp_path):
    """Not "no sessions in this workspace yet": there is no such folder."""
    line = one_error(cli(workspace, command, "--workspace", str(tmp_path / "missing")))
    assert f"workspace {tmp_path / 'missing'} does not exist" in line


# ------------------------------------------------ defects 4 and 13: output paths
@pytest.mark.slow
def test_output_paths_in_a_missing_folder_and_a_read_only_state_home(workspace, tmp_path,
                                                                      _state_home):
    steps = [{"tool": "run_python", "args": {"code": "x = 41 + 1"}}, {"final": "done"}]
    assert cli(workspace, "run", "--model", script(tmp_path, steps), "go").returncode == 0
    for command, name in (("transcript", "t.md"), ("notebook", "n.ipynb")):
        line = one_error(cli(workspace, command, "-o", str(tmp_path / "no" / "dir" / name)))
        assert f"folder {tmp_path / 'no' / 'dir'} does not exist" in line
    # export only reads: a read-only state home does not stop it
    prefix = _ro_mount_prefix(_state_home)
    if prefix is None:
        pytest.skip("no read-only mount possible here (unshare/mount refused)")
    out = tmp_path / "n.ipynb"
    proc = cli(workspace, "notebook", "-o", str(out), prefix=prefix)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["cells"]
    assert "not noted in the session's trace" in proc.stderr


@pytest.mark.slow
def test_an_unwritable_home_names_simagent_home(workspace, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    prefix = _ro_mount_prefix(home)
    if prefix is None:
        pytest.skip("no read-only mount possible here (unshare/mount refused)")
    env = {k: v for k, v in os.environ.items()
           if k not in ("SIMAGENT_HOME", "XDG_DATA_HOME", "SIMAGENT_MODEL")}
    env["HOME"] = str(home)
    proc = subprocess.run([*prefix, *SIMAGENT, "run", "--model", script(tmp_path), "hi"],
                          cwd=workspace, env=env, stdin=subprocess.DEVNULL, text=True,
                          capture_output=True, timeout=180)
    line = one_error(proc)
    assert "SIMAGENT_HOME" in line and str(home) in line


# ------------------------------------------------------ defect 5: configs name the file
@pytest.mark.parametrize("content", [b'model = "caf\xe9"\n', b"model = [\n"])
@pytest.mark.parametrize("command", [["run", "--model", "{script}", "hi"],
                                     ["init", "--no-check"], ["mcp"]])
def test_a_broken_user_config_is_named_by_every_command(command, content, workspace,
                                                         tmp_path, _state_home):
    (_state_home / "config.toml").write_bytes(content)
    argv = [a.format(script=script(tmp_path)) for a in command]
    line = one_error(cli(workspace, *argv))
    assert str(_state_home / "config.toml") in line
    assert ("not UTF-8" if b"\xe9" in content else "invalid TOML") in line


@pytest.mark.slow
def test_doctor_reports_a_broken_config_as_a_failing_row(workspace, _state_home):
    (_state_home / "config.toml").write_bytes(b"model = [\n")
    proc = cli(workspace, "doctor", "--quick", "--json")
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert rows["config"]["ok"] is False and proc.returncode == 1, rows["config"]
    assert str(_state_home / "config.toml") in json.dumps(rows["config"])
    assert "bug" not in proc.stdout + proc.stderr


def test_a_config_value_of_the_wrong_kind_names_its_file(workspace, tmp_path, _state_home):
    other = tmp_path / "elsewhere"
    other.mkdir()
    path = write_config(workspace, 'approval = "bogus"\n')
    line = one_error(cli(other, "run", "--workspace", str(workspace), "--model",
                         script(tmp_path), "hi"))
    assert f"{path}: approval = 'bogus'" in line
    assert state_sessions(_state_home) == []
    (_state_home / "config.toml").write_text('[files]\nreadable = "/data"\n')
    with pytest.raises(ConfigError, match=f"^{_state_home / 'config.toml'}: \\[files\\]"):
        Config.load(other).files_readable()


@pytest.mark.slow
def test_a_bad_model_setting_names_its_file(workspace, tmp_path, _state_home):
    (_state_home / "config.toml").write_text(
        f'[model]\nid = "{script(tmp_path)}"\nmax_output = 0\n')
    line = one_error(cli(workspace, "run", "hi"))
    assert line.endswith(f"{_state_home / 'config.toml'}: [model] max_output must be a "
                         "positive integer, got 0"), line
    assert state_sessions(_state_home) == []


# --------------------------------------------------------- defect 8: long prompts
@pytest.mark.slow
def test_a_prompt_from_stdin_dash_and_a_file(workspace, tmp_path):
    model = script(tmp_path, [{"final": "ok"}])
    piped = cli(workspace, "run", "--json", "--model", model, stdin="from a pipe\n")
    assert piped.returncode == 0, piped.stderr
    assert user_messages(json.loads(piped.stdout)["state_dir"]) == ["from a pipe\n"]
    dash = cli(workspace, "run", "--json", "--model", model, "-", stdin="from a dash")
    assert dash.returncode == 0, dash.stderr
    assert user_messages(json.loads(dash.stdout)["state_dir"]) == ["from a dash"]
    big = tmp_path / "prompt.txt"
    text = "fit the decay constant " * 90_000  # 2 MB: more than one argument may hold
    big.write_text(text)
    proc = cli(workspace, "run", "--json", "--model", model, "--prompt-file", str(big))
    assert proc.returncode == 0, proc.stderr
    (saved,) = Path(json.loads(proc.stdout)["state_dir"]).glob("conversation_history/*.md")
    assert saved.read_text() == text
    line = one_error(cli(workspace, "run", "--model", model, "--prompt-file", str(big), "x"))
    assert "not both" in line
    line = one_error(cli(workspace, "run", "--model", model, stdin=""))
    assert "empty prompt from standard input" in line


def test_run_help_documents_the_long_prompt_ways(workspace):
    text = " ".join(cli(workspace, "run", "--help").stdout.split())
    assert "'-' (or no PROMPT with piped input) reads it from standard input" in text
    assert "--prompt-file PATH" in text


# ------------------------------------------------------------- make bench-cli
@pytest.mark.slow
def test_the_cli_bench_measures_every_case(workspace):
    proc = cli(workspace, "bench", "cli", "--runs", "1", "--json", timeout=600)
    report = json.loads(proc.stdout)
    assert report["goal_s"] == 1.0 and "load average" in report["machine"]
    for row in report["rows"]:  # no timing asserted: the figures are the bench's output
        assert row["exit_codes"] == [2] and row["error_lines"] == 1, row
        assert row["json_error"] in (None, True) and row["min_s"] > 0, row
