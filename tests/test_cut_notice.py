"""A reply cut at the output token limit is said, once, in every front end (issue 41).

Such a reply ends mid-sentence as if the model had finished. ``RecoveryMiddleware``
traces ``reply_cut`` and sends one ``Notice`` (``recovery.cut_notice``): the tokens the
reply took and the setting that raises the limit. The TUI, ``simagent run`` and ACP each
show it as one line: a real turn (real graph, scripted model that reports
``finish_reason: length``) feeds all three; then ``simagent run`` against llama.cpp's real
server, whose tiny model never ends a reply, says the count the server made.
"""

from __future__ import annotations

import io
import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import cli_fork
import pytest
from conftest import write_config
from tiny_gguf import write_tiny_gguf

from simagent.acp.updates import TurnUpdates
from simagent.agent.builder import build_agent
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.headless import StreamPrinter
from simagent.session import Session
from simagent.tui.entries import Conversation, NoticeEntry

CUT = "stopped at the output token limit"
RAISE = "raise max_output in the [model] config"


def test_a_cut_reply_is_one_line_in_the_tui_headless_and_acp(workspace: Path) -> None:
    session = Session.create(workspace, approval="auto")
    try:
        model = ScriptedChatModel.from_steps([
            {"final": "The fit converges to tau = 4.2 and the resid", "cut": True}])
        runner = TurnRunner(session, build_agent(session, model))
        tui, acp = Conversation(), TurnUpdates(workspace)
        out, err = io.StringIO(), io.StringIO()
        printer = StreamPrinter(out, err, stream_text=True)
        sent: list[dict[str, Any]] = []

        def every(event: Any) -> None:
            tui.apply(event)
            printer(event)
            sent.extend(u.model_dump(by_alias=True, exclude_none=True, mode="json")
                        for u in acp.on_event(event))

        result = runner.run("fit", every)
        assert result.status == "done"
        (cut,) = [e.payload for e in session.trace.events(["reply_cut"])]
        tokens = cut["output_tokens"]
        assert tokens > 0
        said = f"the model's reply stopped at the output token limit ({tokens:,} tokens)"
        (entry,) = [e for e in tui.entries if isinstance(e, NoticeEntry) and CUT in e.text]
        assert entry.text.startswith(said) and RAISE in entry.text
        assert entry.level == "warning"
        (line,) = [ln for ln in err.getvalue().splitlines() if CUT in ln]
        assert line.startswith(f"! {said}") and RAISE in line
        (update,) = [u for u in sent if CUT in u.get("content", {}).get("text", "")]
        assert update["sessionUpdate"] == "agent_message_chunk"
        assert said in update["content"]["text"] and RAISE in update["content"]["text"]
        assert out.getvalue().startswith("The fit converges to tau = 4.2 and the resid")
    finally:
        session.close()


def trace(state_dir: str, kind: str) -> list[dict]:
    db = sqlite3.connect(Path(state_dir) / "trace.sqlite")
    try:
        return [json.loads(p) for (p,) in db.execute(
            "SELECT payload FROM events WHERE kind = ? ORDER BY id", (kind,))]
    finally:
        db.close()


@pytest.mark.slow
def test_simagent_run_says_a_local_models_reply_was_cut_with_the_servers_count(
        workspace: Path, tmp_path: Path) -> None:
    """A small-tier model (named like one) that never ends its reply, unforced, so its
    first reply is text: cut at ``max_output``, said with the tokens the server counted
    (before, llama.cpp streamed no usage and the line gave no count)."""
    pytest.importorskip("llama_cpp", reason="needs the local extra: pip install "
                        "'simagent[local]'")
    model = write_tiny_gguf(tmp_path / "tiny-0.5b.gguf", endless=True)
    write_config(workspace, "[model]\nwindow = 4096\nmax_output = 12\nthreads = 1\n"
                 "[context]\nsmall_agent_force_call = false\nsummarize = false\n")
    env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_MODEL"}
    done = cli_fork.run(
        [sys.executable, "-m", "simagent", "run", "--json", "--approval", "auto",
         "--model", f"local:{model}", "say something"],
        cwd=workspace, env=env, text=True, capture_output=True, timeout=420)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    (usage,) = trace(report["state_dir"], "model_usage")
    assert usage["source"] == "provider"
    tokens = usage["output_tokens"]
    assert 12 <= tokens <= 12 + 3  # a character begun at the limit is finished
    assert [c["output_tokens"] for c in trace(report["state_dir"], "reply_cut")] == [tokens]
    lines = [ln for ln in done.stderr.splitlines() if CUT in ln]
    assert lines == [f"! the model's reply stopped at the output token limit ({tokens} "
                     f"tokens), so it is cut off; {RAISE} to let it write more"], done.stderr
