"""The TUI end to end in a real terminal: tmux runs ``simagent``, keys go in, the pane
is read back. Real process, real kernel, real graph; the model is scripted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


class Pane:
    def __init__(self, workspace: Path, model: str, home: Path) -> None:
        self.socket = f"simagent-test-{uuid.uuid4().hex[:8]}"
        self.name = "tui"
        env = {"SIMAGENT_HOME": str(home), "TERM": "xterm-256color"}
        exports = " ".join(f"{k}={v}" for k, v in env.items())
        cmd = (f"cd {workspace} && env -u SIMAGENT_MODEL {exports} {sys.executable} -m simagent "
               f"--model {model}; echo SIMAGENT-EXITED-$?; sleep 30")
        self.tmux("new-session", "-d", "-s", self.name, "-x", "110", "-y", "40", cmd)

    def tmux(self, *args: str) -> str:
        out = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True,
                             text=True, timeout=20)
        return out.stdout

    def send(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", self.name, *keys)

    def type(self, text: str) -> None:
        self.tmux("send-keys", "-t", self.name, "-l", text)
        time.sleep(0.2)
        self.send("Enter")

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.name)

    def wait_for(self, check, timeout: float = 90.0) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            screen = self.screen()
            if check(screen):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting; the pane shows:\n{self.screen()}")

    def close(self) -> None:
        self.tmux("kill-server")


@pytest.fixture
def pane(workspace, tmp_path, _state_home):
    steps = [
        {"tool": "run_python", "args": {"code": "for i in range(60):\n    print('row', i)"}},
        {"final": "Printed sixty rows."},
        {"tool": "run_python", "args": {"code": "marker = 'kept'\nimport time\n"
                                                "time.sleep(30)"}},
        {"tool": "run_python", "args": {"code": "print('marker is', marker)"}},
        {"final": "The marker is {out[-1]|marker is (\\w+)}."},
    ]
    path = tmp_path / "steps.json"
    path.write_text(json.dumps(steps))
    p = Pane(workspace, f"scripted:{path}", _state_home)
    try:
        yield p
    finally:
        p.close()


@pytest.mark.real
def test_tmux_card_ctrl_o_context_and_ctrl_c(pane, _state_home):
    pane.wait_for(lambda s: "kernel idle" in s and "›" in s)
    pane.type("print sixty rows")
    screen = pane.wait_for(lambda s: "Printed sixty rows." in s)
    assert "✓ run_python" in screen and "row 40" not in screen  # collapsed card

    pane.send("C-o")
    expanded = pane.wait_for(lambda s: "row 40" in s, timeout=60)
    assert "row 59" in expanded and "Printed sixty rows." in expanded
    pane.send("C-o")
    collapsed = pane.wait_for(lambda s: "row 40" not in s, timeout=60)
    assert "✓ run_python" in collapsed

    pane.type("/context")
    panel = pane.wait_for(lambda s: "free space" in s, timeout=60)
    for category in ("system prompt", "tool schemas", "tool results", "Thresholds:"):
        assert category in panel

    pane.type("sleep for a while")
    pane.wait_for(lambda s: "time.sleep(30)" in s and "kernel busy" in s and "● working" in s)
    pane.send("C-c")
    pane.wait_for(lambda s: "Turn cancelled" in s and "kernel idle" in s, timeout=60)

    pane.type("is the marker still there?")
    pane.wait_for(lambda s: "The marker is kept." in s and "● working" not in s)
    # an ordering, not a stopwatch (speed is the benches' job): the prompt came back
    # because the cell was stopped, not because its 30 s sleep ran out
    (slept,) = [r for r in map(json.loads, map(Path.read_text,
                                               _state_home.rglob("outputs/*.json")))
                if "time.sleep(30)" in r["code"]]
    assert slept["status"] == "interrupted", slept

    pane.send("C-c")
    pane.wait_for(lambda s: "press ctrl+C again" in s, timeout=60)
    pane.send("C-c")
    done = pane.wait_for(lambda s: "SIMAGENT-EXITED-" in s, timeout=60)
    assert "SIMAGENT-EXITED-0" in done
    assert "simagent --resume" in done  # the session id is printed on the way out


def test_no_terminal_is_a_clear_error(workspace):
    env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_MODEL"}
    p = subprocess.run([sys.executable, "-m", "simagent"], cwd=workspace, env=env,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "needs a terminal" in p.stderr and "simagent run" in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.slow
def test_tmux_status_counts_a_provider_retry_down_and_the_turn_goes_on(workspace, _state_home):
    """A 429 asking for 4 s over real HTTP: the status line shows the retry and its
    countdown while the turn waits, then the answer arrives in the same turn."""
    from simagent.bench.openai_stub import OpenAIStub, Reply, error_reply

    with OpenAIStub([error_reply(429, "slow down", retry_after=4),
                     Reply(text="Answer after the retry.")]) as stub:
        p = Pane(workspace, f"openai-compatible:stub-model@{stub.base_url}", _state_home)
        try:
            p.wait_for(lambda s: "kernel" in s and "›" in s)
            p.type("hello")
            first = p.wait_for(lambda s: "retry 1/" in s, timeout=30)
            assert "429" in first
            p.wait_for(lambda s: "in 2s" in s or "in 1s" in s, timeout=10)  # it ticks down
            done = p.wait_for(lambda s: "Answer after the retry." in s, timeout=30)
            assert "retry 1/" not in done  # the countdown is gone once the call answered
            assert len(stub.chat_requests) == 2
        finally:
            p.close()
