"""The TUI asks before it restarts a kernel the person already runs, in a real terminal.

tmux runs ``simagent --kernel ID``; the kernels are started as a person starts them
(``jupyter kernel``, a token-protected ``jupyter server``: the fixtures of test_attach). A
cell ignores interrupts, so the recovery ladder reaches the point where only the person
may allow a restart; the question on screen says what a restart does to this kind of
kernel, "n" leaves it as it is (same process, variables kept) and "y" restarts it through
its server, or stops one nothing would restart, as the question said.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from test_attach import (  # noqa: F401  (fixtures, used by name: hence F811 below)
    jupyter_kernel,
    run,
    runtime,
    scripted,
    server_kernel,
    stubborn,
    until,
)

pytestmark = [pytest.mark.real,
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]


class Pane:
    """simagent's TUI in a tmux pane of its own server, attached to ``existing``."""

    def __init__(self, workspace: Path, model: str, existing: str, env: dict[str, str]) -> None:
        self.socket = f"simagent-attach-{uuid.uuid4().hex[:8]}"
        exports = " ".join(f"{k}={v}" for k, v in {**env, "TERM": "xterm-256color"}.items())
        cmd = (f"cd {workspace} && env -u SIMAGENT_MODEL {exports} {sys.executable} -m simagent "
               f"--kernel {existing} --model {model}; echo SIMAGENT-EXITED-$?; sleep 60")
        self.tmux("new-session", "-d", "-s", "tui", "-x", "160", "-y", "60", cmd)

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True,
                              text=True, timeout=20).stdout

    def quit(self) -> str:
        """ctrl+C twice (the second one quits); the screen once simagent has exited."""
        self.tmux("send-keys", "-t", "tui", "C-c")
        self.wait_for(lambda s: "press ctrl+C again" in s)
        self.tmux("send-keys", "-t", "tui", "C-c")
        return self.wait_for(lambda s: "SIMAGENT-EXITED-" in s)

    def type(self, text: str) -> None:
        self.tmux("send-keys", "-t", "tui", "-l", text)
        time.sleep(0.2)
        self.tmux("send-keys", "-t", "tui", "Enter")

    def text(self) -> str:
        """The screen as one line of words (wrapped lines joined, runs of spaces one)."""
        return " ".join(self.tmux("capture-pane", "-p", "-J", "-t", "tui").split())

    def wait_for(self, check, timeout: float = 120.0) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if check(text := self.text()):
                return text
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting; the pane shows:\n{self.text()}")

    def close(self) -> None:
        self.tmux("kill-server")


def after(text: str, marker: str) -> str:
    """What the screen shows below the last ``marker`` (the prompt just typed)."""
    return text.rsplit(marker, 1)[-1]


def test_n_leaves_a_jupyter_kernel_as_it_is_and_y_stops_it_as_the_question_said(
        jupyter_kernel, runtime, workspace, tmp_path, _state_home):  # noqa: F811
    kc, pid = jupyter_kernel.kc, jupyter_kernel.pid
    run(kc, "x = 41")
    first, second = tmp_path / "first-ends", tmp_path / "second-ends"
    model = scripted(tmp_path / "s.json", [
        {"tool": "run_python", "args": {"code": stubborn(first), "timeout_s": 1}},
        {"final": "first done"},
        {"tool": "run_python", "args": {"code": "y = x + 1\nprint(y)"}},
        {"final": "y is {out[-1]|(\\d+)}"},
        {"tool": "run_python", "args": {"code": stubborn(second), "timeout_s": 1}},
        {"final": "second done"}])
    pane = Pane(workspace, model, jupyter_kernel.id,
                {"SIMAGENT_HOME": str(_state_home), "JUPYTER_RUNTIME_DIR": str(runtime)})
    try:
        hello = pane.wait_for(lambda s: "kernel idle" in s and "simagent is attached" in s)
        assert f"attached to your kernel ({jupyter_kernel.path}), started with `jupyter " \
               "kernel` (pid" in hello, hello
        pane.type("stubborn one")
        asked = pane.wait_for(lambda s: "(y/n)" in after(s, "stubborn one"))
        assert "Restart it?" in asked and "with `jupyter kernel` (pid" in asked, asked
        assert "does not restart kernels: y STOPS it" in asked, asked

        pane.type("n")
        left = pane.wait_for(lambda s: "simagent left the attached kernel" in s)
        assert "it is still running the cell that would not stop, and its variables are " \
               "untouched" in left, left
        assert jupyter_kernel.proc.poll() is None and psutil.pid_exists(pid)
        first.touch()  # the cell ends by itself: the kernel, same process, has x
        assert run(kc, "import os; print(x, os.getpid())", timeout=60) == f"41 {pid}\n"
        pane.type("go on")  # simagent goes on in it once it answers
        pane.wait_for(lambda s: "y is 42" in after(s, "go on"))

        pane.type("stubborn two")
        asked = pane.wait_for(lambda s: "(y/n)" in after(s, "stubborn two"))
        pane.type("y")
        told = pane.wait_for(lambda s: "stopped and did not come back" in after(s,
                                                                                 "stubborn two"))
        assert "simagent has no kernel now" in told and "simagent --kernel latest" in told
        until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() ==
              psutil.STATUS_ZOMBIE, 60, "the kernel stopped, as the question said")
        gone = pane.quit()
        # its file would not attach again: the way back is without it, or another kernel
        assert f"the kernel it attached to ({jupyter_kernel.path}) is no longer running; " \
               "resume with: simagent --resume " in gone, gone
        assert f"--kernel {jupyter_kernel.path}" not in gone, gone
    finally:
        second.touch()
        pane.close()


def test_y_lets_its_jupyter_server_restart_it(
        server_kernel, runtime, workspace, tmp_path, _state_home):  # noqa: F811
    kc = server_kernel.kc
    before = run(kc, "x = 41\nimport os; print(os.getpid())").strip()
    flag = tmp_path / "never"
    model = scripted(tmp_path / "s.json", [
        {"tool": "run_python", "args": {"code": stubborn(flag), "timeout_s": 1}},
        {"final": "stubborn done"}])
    pane = Pane(workspace, model, server_kernel.id,
                {"SIMAGENT_HOME": str(_state_home), "JUPYTER_RUNTIME_DIR": str(runtime)})
    try:
        hello = pane.wait_for(lambda s: "kernel idle" in s and "simagent is attached" in s)
        assert f"run by Jupyter server ({server_kernel.base.removesuffix('api/')})" in hello
        pane.type("please run it")
        asked = pane.wait_for(lambda s: "(y/n)" in after(s, "please run it"))
        assert f"Its Jupyter server ({server_kernel.base.removesuffix('api/')}) restarts it " \
               "in place: it comes back empty, every variable lost" in asked, asked
        pane.type("y")
        done = pane.wait_for(lambda s: "the kernel was restarted" in after(s, "(y/n)"))
        assert "nothing was replayed into it" in done, done

        def fresh() -> str | None:
            try:
                return run(kc, "import os; print(os.getpid(), 'x' in globals())", timeout=10)
            except Exception:  # the person's client, while the kernel comes back
                return None

        pid, has_x = until(fresh, 60, "the restarted kernel answering the person").split()
        assert pid != before and has_x == "False"
        bye = pane.quit()
        assert f"the kernel it attached to ({server_kernel.path}) is still running" in bye
    finally:
        flag.touch()
        pane.close()


def test_the_tui_refuses_a_kernel_that_is_not_running_before_any_session(
        runtime, workspace, tmp_path, _state_home):  # noqa: F811
    """As ``simagent run``: one line, exit 6, no session (it opened one on a dead kernel)."""
    model = scripted(tmp_path / "s.json", [{"final": "x"}])
    pane = Pane(workspace, model, "no-such-id",
                {"SIMAGENT_HOME": str(_state_home), "JUPYTER_RUNTIME_DIR": str(runtime)})
    try:
        shown = pane.wait_for(lambda s: "SIMAGENT-EXITED-" in s)
        assert "SIMAGENT-EXITED-6" in shown, shown
        assert "simagent: error: --kernel no-such-id: no kernel with that id in the Jupyter " \
               f"runtime directory {runtime}" in shown, shown
    finally:
        pane.close()
    assert not list(_state_home.rglob("trace.sqlite"))
