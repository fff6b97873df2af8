"""The TUI's first-token latency: while the model thinks the status bar counts the
seconds, then shows how long the first token took. The renderer and the tracker are pure
(tested with a given clock); the whole of it runs in tmux against llama.cpp's real server
with the tiny random model (``tiny_gguf.py``), whose first token takes seconds to come."""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest

from simagent.agent.events import (
    Notice,
    ReasoningDelta,
    TextDelta,
    ToolFinished,
    ToolRequested,
    ToolStarted,
)
from simagent.tui.status import StatusSnapshot, latency_label, status_fragments
from simagent.tui.status_feed import FirstToken


def bar(width: int = 200, **changes: object) -> str:
    fields = dict(simulator=None, model="local:own", session_id="20261126-120000-ab12",
                  approval="auto", kernel="idle", cost_usd=0.0, ctx_label="ctx 12%",
                  ctx_level="dim")
    fields.update(changes)
    return "".join(text for _, text in status_fragments(StatusSnapshot(**fields), width))


def test_the_label_counts_whole_seconds_then_shows_the_latency() -> None:
    assert latency_label(None, None) is None
    assert latency_label(12.9, None) == "first token… 12s"
    assert latency_label(12.9, 3.0) == "first token… 12s"  # a new wait wins over the last
    assert latency_label(None, 3.44) == "first token 3.4s"


def test_the_bar_shows_the_wait_beside_working_and_keeps_the_latency_after_the_turn() -> None:
    waiting = bar(busy=True, waiting_s=7.2)
    assert "● working · first token… 7s · " in waiting
    answered = bar(busy=False, first_token_s=41.25)
    assert "first token 41.2s" in answered and "working" not in answered
    assert "first token" not in bar(busy=False, waiting_s=3.0)  # no turn: nothing waits
    # narrow: it goes before the context share and the busy mark
    narrow = bar(width=30, busy=True, waiting_s=7.2)
    assert "ctx 12%" in narrow and "● working" in narrow and "first token" not in narrow
    assert "first token… 7s" in bar(width=40, busy=True, waiting_s=7.2)


def test_the_tracker_times_each_call_of_the_main_model() -> None:
    ft = FirstToken()
    ft.ask(100.0, new_turn=True)
    assert ft.waiting_s(104.5) == 4.5 and ft.latency_s is None
    ft.see(Notice("kernel restarted"), 105.0)  # not the model speaking
    ft.see(TextDelta("x", agent="helper"), 105.0)  # a subagent's token: not the main's
    assert ft.waiting_s(106.0) == 6.0
    ft.see(ToolRequested("c1", "run_python", {}), 110.0)
    assert ft.latency_s == 10.0 and ft.waiting_s(111.0) is None
    ft.see(ToolStarted("c1", "run_python", {}), 111.0)
    ft.see(TextDelta("more"), 111.5)  # no wait under way: nothing to measure
    assert ft.latency_s == 10.0
    ft.see(ToolFinished("c1", "run_python", "success", "ok", 1.0), 112.0)  # result goes back
    assert ft.waiting_s(114.0) == 2.0 and ft.latency_s == 10.0  # the last one still shows
    ft.see(ReasoningDelta("hmm"), 115.0)
    assert ft.latency_s == 3.0
    ft.ask(200.0, new_turn=True)
    assert ft.latency_s is None and ft.waiting_s(201.0) == 1.0
    ft.stop()
    assert ft.waiting_s(300.0) is None


# ---- in a real terminal, against the real server ------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_tmux_status_bar_counts_up_to_the_local_models_first_token(
        workspace: Path, tmp_path: Path, _state_home: Path) -> None:
    pytest.importorskip("llama_cpp", reason="needs the local extra: pip install 'simagent[local]'")
    from test_local_server import configure, servers_of
    from test_tui_terminal import Pane
    from tiny_gguf import write_tiny_gguf

    model = write_tiny_gguf(tmp_path / "own.gguf")
    # a window the byte-level model's prompt fits; a reply of a few tokens
    configure(workspace, f"local:{model}", window=16384, max_output=8)
    pane = Pane(workspace, f"local:{model}", _state_home)
    try:
        pane.wait_for(lambda s: "kernel idle" in s and "›" in s, timeout=300)
        pane.type("hello")
        # the prompt's thousands of tokens take the server seconds: the bar counts them
        seen = pane.wait_for(lambda s: re.search(r"first token… [1-9]\d*s", s), timeout=120)
        assert "● working" in seen
        done = pane.wait_for(lambda s: re.search(r"first token \d+\.\ds", s)
                             and "● working" not in s, timeout=400)
        assert "first token…" not in done
        measured = float(re.search(r"first token (\d+\.\d)s", done).group(1))
        counted = int(re.search(r"first token… (\d+)s", seen).group(1))
        assert measured >= counted  # the wait it showed was part of the latency
    finally:
        pane.close()
    deadline = time.monotonic() + 60  # the server exits when simagent does
    while servers_of(model) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert servers_of(model) == []
    assert os.environ.get("SIMAGENT_HOME") == str(_state_home)
