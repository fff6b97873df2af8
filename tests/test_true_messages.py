"""Every message true (issue 37): what simagent says matches what happened.

The tier a model runs in comes from its name, not from a path or URL in its spec; a
headless answer keeps its messages apart; the other checks drive the real CLI with the
scripted model, a real ``jupyter kernel`` and the real session store.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import cli_fork
import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook
from test_attach import (  # noqa: F401  (fixtures, used by name: hence F811 below)
    jupyter_kernel,
    runtime,
    until,
)

from simagent import exit_codes
from simagent.context.settings import ContextSettings
from simagent.context.thresholds import model_tier, small_agent, tier_name
from simagent.kernel.connection import left_running
from simagent.session import Session
from simagent.trace.log import TraceLog
from simagent.trace.sessions import list_sessions, sessions_dir

SIMAGENT = [sys.executable, "-m", "simagent"]
WAIT_S = 240  # a CLI turn with a kernel start on a loaded machine


def cli(workspace: Path, *args: str, timeout: float = WAIT_S) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_MODEL"}
    return cli_fork.run([*SIMAGENT, *args], cwd=workspace, env=env, text=True,
                        capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)


def script(path: Path, steps: list[dict]) -> str:
    path.write_text(json.dumps(steps))
    return f"scripted:{path}"


# ------------------------------------------------------------------ 2: the tier's name
@pytest.mark.parametrize("spec, name, tier", [
    ("scripted:/data/runs-2b/demo.json", "demo.json", None),  # a folder is not a size
    ("openai-compatible:qwen3@http://gpu-7b:8080/v1", "qwen3", None),  # nor a host
    ("openai-compatible:qwen2.5-0.5b@https://gpu/v1", "qwen2.5-0.5b", "small"),
    ("local:/models/7b-runs/qwen2.5-coder-0.5b-q4.gguf", "qwen2.5-coder-0.5b-q4.gguf",
     "small"),  # the file's name is the model's
    ("local:/models/qwen3-70b/demo.gguf", "demo.gguf", None),
    ("scripted:qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b", "small"),  # named like one
    ("ollama:qwen3:8b", "qwen3:8b", "small"),
    ("anthropic:claude-haiku-4-5", "claude-haiku-4-5", "small"),
    ("huggingface:Qwen/Qwen3-32B", "qwen3-32b", "mid"),
    ("claude-opus-4-7", "claude-opus-4-7", "frontier"),
])
def test_the_tier_comes_from_the_models_name_only(spec: str, name: str, tier: str | None):
    assert tier_name(spec) == name
    assert model_tier(spec) == tier


def test_a_path_or_url_never_makes_a_model_small_agent():
    settings = ContextSettings()
    assert not small_agent("scripted:/data/runs-2b/demo.json", settings)
    assert not small_agent("openai-compatible:qwen3@http://gpu-7b:8080/v1", settings)
    assert small_agent("local:/m/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", settings)


# ------------------------------------------------------------------ 6: answer paragraphs
@pytest.mark.slow
def test_headless_answer_keeps_two_messages_apart(workspace: Path, tmp_path: Path):
    model = script(tmp_path / "two.json", [
        {"say": "The root is at the crossing.", "tool": "run_python",
         "args": {"code": "print(1)"}},
        {"final": "The fit is good."}])
    done = cli(workspace, "run", "--model", model, "--approval", "auto", "fit it")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "The root is at the crossing.\n\nThe fit is good.\n"


# ------------------------------------------------------------------ 12: session titles
@pytest.mark.slow
def test_a_session_from_a_notebook_is_titled_by_the_prompt(workspace: Path, tmp_path: Path):
    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                               "language": "python"}})
    nb.cells = [new_code_cell("x = 41")]
    nbformat.write(nb, workspace / "study.ipynb")
    model = script(tmp_path / "s.json", [{"final": "x is 41."}])
    done = cli(workspace, "run", "--model", model, "--approval", "auto", "--from-notebook",
               "study.ipynb", "what is x?")
    assert done.returncode == 0, done.stderr
    listed = cli(workspace, "sessions", "--json")
    assert [s["title"] for s in json.loads(listed.stdout)] == ["what is x?"]


def test_a_notebook_session_without_a_prompt_is_titled_from_the_notebook(workspace: Path):
    """The TUI runs the notebook before the person has typed anything."""
    folder = sessions_dir(workspace) / "20261128-120000-abcd"
    folder.mkdir(parents=True)
    with TraceLog(folder / "trace.sqlite") as log:
        log.append("session_start", {"model": "scripted:x.json"})
        log.append("notebook_load", {"path": str(workspace / "study.ipynb"), "cells": 1,
                                     "account_chars": 40})
    assert [s.title for s in list_sessions(workspace)] == ["from study.ipynb"]


# ------------------------------------------------------------------ 9, 15: an attached kernel
@pytest.mark.slow
def test_headless_says_the_attached_kernel_stays_running(workspace: Path, tmp_path: Path,
                                                          jupyter_kernel):  # noqa: F811
    model = script(tmp_path / "s.json", [
        {"tool": "run_python", "args": {"code": "z = 3"}}, {"final": "z is set."}])
    done = cli(workspace, "run", "--kernel", str(jupyter_kernel.path), "--model", model,
               "--approval", "auto", "set z")
    assert done.returncode == 0, done.stderr
    sid = re.search(r"^\[session (\S+)\]$", done.stderr, re.M)[1]
    last = done.stderr.splitlines()[-1]
    assert last == (
        f"simagent: the kernel it attached to ({jupyter_kernel.path}) is still running; "
        f'resume with: simagent run --resume {sid} --kernel {jupyter_kernel.path} "..."')
    # the command it gives works: the same session, in the same kernel, z still there
    command = shlex.split(last.split("resume with: ", 1)[1])
    assert command[:2] == ["simagent", "run"] and command[-1] == "..."
    model = script(tmp_path / "again.json", [
        {"tool": "run_python", "args": {"code": "print(f'z*14={z * 14}')"}},
        {"final": "{out[-1]|z\\*14=(\\d+)}"}])
    again = cli(workspace, *command[1:-1], "--model", model, "--approval", "auto", "z?")
    assert again.returncode == 0, again.stderr
    assert again.stdout == "42\n" and f"[session {sid}]" in again.stderr


def test_the_way_out_of_an_attached_kernel_says_how_to_resume(tmp_path: Path):
    """While the kernel runs: ``--kernel`` with its file (quoted for a shell); once it has
    ended, a kernel of simagent's own or another that runs (its file would not attach)."""
    folder = tmp_path / "my kernels"
    folder.mkdir()
    path = folder / "kernel-1.json"
    with socket.create_server(("127.0.0.1", 0)) as hb:
        path.write_text(json.dumps({"shell_port": 1, "hb_port": hb.getsockname()[1],
                                    "ip": "127.0.0.1", "transport": "tcp"}))
        running = left_running(path, "simagent run --resume S1", ' "..."')
    assert running == (f"the kernel it attached to ({path}) is still running; resume "
                       f"with: simagent run --resume S1 --kernel '{path}' \"...\"")
    assert shlex.split(running.split("resume with: ")[1])[5] == str(path)
    assert left_running(path, "simagent --resume S1") == (
        f"the kernel it attached to ({path}) is no longer running; resume with: simagent "
        "--resume S1 (a kernel of simagent's own), or with --kernel and one that runs")


@pytest.mark.real
def test_a_sigkilled_attached_kernel_is_said_gone_and_the_next_cell_has_no_result(
        workspace: Path, tmp_path: Path, jupyter_kernel):  # noqa: F811
    flag = tmp_path / "running"
    model = script(tmp_path / "s.json", [
        {"tools": [{"tool": "run_python",
                    "args": {"code": f"import pathlib, time\npathlib.Path({str(flag)!r})"
                                     ".touch()\ntime.sleep(120)"}},
                   {"tool": "run_python", "args": {"code": "y = 2"}}]},
        {"final": "done"}])
    env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_MODEL"}
    proc = cli_fork.popen([*SIMAGENT, "run", "--kernel", str(jupyter_kernel.path),
                           "--model", model, "--approval", "auto", "go"], cwd=workspace,
                          env=env, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        until(flag.exists, WAIT_S, "the first cell running")
        os.kill(jupyter_kernel.pid, signal.SIGKILL)
        _out, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == exit_codes.KERNEL_CONSENT, err
    where = f"the attached kernel ({jupyter_kernel.path})"
    assert f"simagent: {where} is gone: its process ended, and its variables with it" in err
    assert "left it running" not in err and "variables untouched" not in err
    assert "  ✖ run_python kernel died" in err  # the cell it was running
    assert "  □ run_python no result" in err and "■" not in err  # the one it never ran
    assert err.splitlines()[-1].startswith(  # its file would not attach again
        f"simagent: the kernel it attached to ({jupyter_kernel.path}) is no longer running; "
        "resume with: simagent run --resume ")


# ------------------------------------------------------------------ 10: /restore
def test_restore_names_what_it_did_not_bring_back(workspace: Path):
    """A cell that raised after assigning a name is not replayed: /restore says so."""
    session = Session.create(workspace, approval="auto")
    session.simulator = None  # no warm-up cell
    try:
        assert session.execute("x = 1").ok
        assert session.execute("y = 2\n1 / 0").status == "error"
        rec = session.restore_kernel()  # what /restore runs and shows
        said = rec.message()
        assert "names back: x" in said and "earlier state is restored" not in said
        assert "earlier state is only partly restored" in said
        assert said.endswith("names the kernel had before are NOT back: y; re-run what you need")
        assert not rec.state_restored
        assert session.execute("'y' in dir()").value == "False"  # it is true
    finally:
        session.close()


# ------------------------------------------------------------------ 11: a cut reply
@pytest.mark.slow
def test_a_reply_cut_at_the_output_limit_is_said_and_traced(workspace: Path, tmp_path: Path):
    model = script(tmp_path / "cut.json", [
        {"final": "The fit converges to tau = 4.2 and the resid", "cut": True}])
    done = cli(workspace, "run", "--model", model, "--approval", "auto", "--json", "fit")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["final"] == "The fit converges to tau = 4.2 and the resid"
    notices = [ln for ln in done.stderr.splitlines() if "output token limit" in ln]
    assert len(notices) == 1 and notices[0].startswith("! the model's reply stopped at"), \
        done.stderr
    assert "raise max_output in the [model] config" in notices[0]
    with TraceLog(Path(report["state_dir"]) / "trace.sqlite", readonly=True) as log:
        cut = [e.payload for e in log.events(["reply_cut"])]
    assert len(cut) == 1 and cut[0]["agent"] == "main" and cut[0]["output_tokens"] > 0


@pytest.mark.slow
def test_a_finished_reply_gets_no_cut_notice(workspace: Path, tmp_path: Path):
    model = script(tmp_path / "whole.json", [{"final": "The fit converges."}])
    done = cli(workspace, "run", "--model", model, "--approval", "auto", "fit")
    assert done.returncode == 0 and "output token limit" not in done.stderr, done.stderr
