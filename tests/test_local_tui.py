"""``simagent --model local:...`` in a real terminal: one whole turn with a tool call.

tmux runs the TUI against llama.cpp's real server, which simagent starts with a tiny
random model (``tiny_gguf.py``) named like a small one (``…-0.5b.gguf``), so it gets the
small tier's request. With ``small_agent_force_call`` the first call of the turn names
``run_python`` and the server decodes its arguments under the tool's JSON-schema
grammar: even a random model's first reply is a valid call. The model favours ``"``, so
the code string ends within a few tokens and the call is complete. What it runs is
noise; that it runs, that the status bar shows the first token's latency, that the turn
ends and that ``/exit`` leaves no server behind is the point.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="needs the local extra: pip install 'simagent[local]'")
pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

from conftest import write_config  # noqa: E402
from test_local_server import servers_of  # noqa: E402
from test_tui_terminal import Pane  # noqa: E402
from tiny_gguf import write_tiny_gguf  # noqa: E402

#: Bounds on each wait (seconds): the server's start, the turn, the exit. Far beyond a
#: healthy run on 2 loaded cores; only a hang reaches them.
START_S, TURN_S, EXIT_S = 300, 400, 60


def events(home: Path, kind: str) -> list[dict]:
    (db_path,) = home.glob("workspaces/*/sessions/*/trace.sqlite")
    db = sqlite3.connect(db_path)
    try:
        return [json.loads(p) for (p,) in db.execute(
            "SELECT payload FROM events WHERE kind = ? ORDER BY id", (kind,))]
    finally:
        db.close()


@pytest.mark.slow
def test_a_local_model_turn_with_a_forced_tool_call_in_the_tui(
        workspace: Path, tmp_path: Path, _state_home: Path) -> None:
    model = write_tiny_gguf(tmp_path / "tiny-0.5b.gguf", favour=b'"')
    (workspace / ".simagent").mkdir(exist_ok=True)
    write_config(workspace,
        "[model]\nwindow = 8192\nthreads = 1\n"
        "[context]\nsmall_agent_force_call = true\nsummarize = false\n")
    pane = Pane(workspace, f"local:{model}", _state_home)
    try:
        pane.wait_for(lambda s: "kernel idle" in s and "›" in s, timeout=START_S)
        pane.type("compute the mean of 3, 5 and 10 with python")
        done = pane.wait_for(lambda s: "run_python" in s and "● working" not in s
                             and re.search(r"first token \d+\.\ds", s), timeout=TURN_S)
        assert "first token…" not in done  # no call left waiting
        # a local model costs nothing: the bar said "cost ?" (no price known) after a turn
        assert "$0.0000" in done and "cost ?" not in done
        # the forced call ran in the kernel. What the random model does next varies (a
        # reply, or calls cut off at its limit until the recovery gives up): the turn ends
        cells = [e for e in events(_state_home, "kernel_exec") if not e.get("warmup")]
        forced = [e for e in events(_state_home, "tool_call") if e.get("name") == "run_python"]
        assert cells and cells[0]["tool_call_id"] == forced[0]["id"]
        assert cells[0]["code"] == forced[0]["args"]["code"]
        # the call's tokens as the server counted them (one a byte: at least its code's),
        # not simagent's estimate of 1 (issue 41)
        usage = events(_state_home, "model_usage")[0]
        assert usage["source"] == "provider"
        assert usage["output_tokens"] >= len(cells[0]["code"].encode())
        assert len(servers_of(model)) == 1
        pane.type("/exit")
        after = pane.wait_for(lambda s: "SIMAGENT-EXITED-0" in s, timeout=EXIT_S)
        # the line the terminal showed while the server loaded, before the TUI could draw
        # (the TUI drew on the alternate screen; this one is the terminal's own)
        assert f"simagent: starting llama.cpp's server for local:{model}" in after.replace(
            "\n", "")
    finally:
        pane.close()
    deadline = time.monotonic() + EXIT_S  # stopped by simagent, else on its stdin's end
    while servers_of(model) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert servers_of(model) == []
