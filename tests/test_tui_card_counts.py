"""Counts a card prints about what it hides are the real ones, not the capped copy's.

A 50 MB print used to show ``… 26 earlier rows`` on the expanded card: the rows of the
model's capped result beyond the card's 40. The real output (the raw file the capture
wrote, the live buffers with the rows they dropped) is what the note counts now.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from simagent.kernel.capture import Capture
from simagent.tui.entries import NOTES_MAX_CHARS, TASK_TOOL, ToolCard
from simagent.tui.render import EXPANDED_ROWS, LIVE_TAIL_ROWS, render_card

NOTE_RE = re.compile(r"… ([\d,]+) earlier lines? (?:\(([\d.]+ \w+)\) )?not shown"
                     r"(?:; full output: (\S+))?")


def text_of(rows) -> list[str]:
    return ["".join(t for _, t in row) for row in rows]


def note_of(lines: list[str]) -> tuple[int, str | None, str | None]:
    found = [m for line in lines if (m := NOTE_RE.search(line))]
    assert len(found) == 1, lines
    m = found[0]
    return int(m.group(1).replace(",", "")), m.group(2), m.group(3)


def printed(folder: Path, n_lines: int) -> tuple[str, Path]:
    """A real capture of ``n_lines`` printed lines: the model's text and the raw file."""
    folder.mkdir(parents=True, exist_ok=True)
    cap = Capture(folder / "0007.txt", None, "t")
    block = 10_000
    for start in range(0, n_lines, block):
        cap.handle("stream", {"name": "stdout", "text": "".join(
            f"line {i:07d} of the sweep\n" for i in range(start, min(n_lines, start + block)))})
    cap.close()
    result = cap.result("ok", 1.0)
    assert result.raw_path is not None
    return result.model_text(), result.raw_path


def test_expanded_card_of_a_huge_print_counts_the_raw_output(tmp_path):
    n = 300_000
    content, raw = printed(tmp_path / "outputs", n)
    card = ToolCard("c1", "run_python", {"code": "for i in range(N): print(i)"},
                    status="success", content=content, raw_path=str(raw), elapsed_s=2.0)
    lines = text_of(render_card(card, 160, expanded=True, now=0.0))[1:]  # below the header
    shown = [ln for ln in lines if re.search(r"line \d{7} of the sweep", ln)]
    assert shown and shown[-1].strip() == f"line {n - 1:07d} of the sweep"
    hidden, size, where = note_of(lines)
    assert hidden == n - len(shown)  # not the rows of the capped copy beyond the card's 40
    line_bytes = len(f"line {0:07d} of the sweep\n")
    assert size == f"{hidden * line_bytes / (1 << 20):.1f} MB"
    assert where == str(raw)


def test_a_result_that_fits_states_nothing_extra(tmp_path):
    content, raw = printed(tmp_path / "outputs", 10)
    card = ToolCard("c1", "run_python", {}, status="success", content=content,
                    raw_path=str(raw))
    lines = text_of(render_card(card, 100, expanded=True, now=0.0))[1:]
    assert not any("not shown" in ln for ln in lines)
    assert sum("of the sweep" in ln for ln in lines) == 10


def test_live_card_counts_every_line_printed_so_far():
    card = ToolCard("c1", "run_python", {"code": "loop()"}, status="running", started=0.0)
    n = 5_000  # more than the card's buffer keeps (its oldest rows are dropped)
    for i in range(n):
        card.feed("stdout", f"step {i}\n")
    for expanded, room in ((False, LIVE_TAIL_ROWS), (True, EXPANDED_ROWS)):
        lines = text_of(render_card(card, 80, expanded=expanded, now=1.0))
        shown = [ln for ln in lines if re.search(r"step \d+$", ln)]
        assert len(shown) == room and shown[-1].strip() == f"step {n - 1}"
        assert note_of(lines)[0] == n - room


def test_live_card_that_shows_everything_has_no_note():
    card = ToolCard("c1", "run_python", {"code": "loop()"}, status="running", started=0.0)
    card.feed("stdout", "".join(f"step {i}\n" for i in range(LIVE_TAIL_ROWS)))
    assert not any("not shown" in ln for ln in text_of(render_card(card, 80, False, 1.0)))


def test_subagent_notes_past_the_kept_tail_say_the_count_is_unknown():
    card = ToolCard("c1", TASK_TOOL, {"subagent_type": "explorer", "description": "look"},
                    status="running", started=0.0)
    card.notes = "".join(f"note {i}\n" for i in range(NOTES_MAX_CHARS))[-NOTES_MAX_CHARS:]
    lines = text_of(render_card(card, 80, expanded=True, now=1.0))
    assert any("earlier lines not shown (only the end is kept here)" in ln for ln in lines)
    assert not any(re.search(r"… [\d,]+ earlier", ln) for ln in lines)
    card.notes = "".join(f"note {i}\n" for i in range(50))
    lines = text_of(render_card(card, 80, expanded=True, now=1.0))
    assert note_of(lines)[0] == 50 - EXPANDED_ROWS


def test_hidden_code_is_counted_in_lines_not_wrapped_rows():
    code = "\n".join(f"value_{i}={'x' * 60}" for i in range(20))  # two rows each
    card = ToolCard("c1", "run_python", {"code": code}, status="running", started=0.0)
    lines = text_of(render_card(card, 50, expanded=False, now=1.0))
    shown = {m.group(1) for ln in lines if (m := re.search(r"value_(\d+)=", ln))}
    more = next(ln for ln in lines if "more line" in ln)
    # each line wraps into two rows: 8 rows show 4 lines, 16 are not shown
    assert len(shown) == 4 and "… 16 more lines of code" in more


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_tmux_expanded_card_of_a_big_print_states_the_real_count(workspace, tmp_path,
                                                                 _state_home):
    n = 200_000
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps([
        {"tool": "run_python", "args": {"code": f"for i in range({n}):\n"
                                                "    print(f'sweep line {i:07d}')"}},
        {"final": "Printed them."}]))
    socket = f"simagent-cnt-{uuid.uuid4().hex[:8]}"

    def tmux(*args: str) -> str:
        return subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True,
                              timeout=20).stdout

    def wait_for(check, timeout: float = 120.0) -> str:
        end = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < end:
            screen = tmux("capture-pane", "-p", "-J", "-t", "cnt")
            if check(screen):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"timed out; the pane shows:\n{screen}")

    cmd = (f"cd {workspace} && env -u SIMAGENT_MODEL SIMAGENT_HOME={_state_home} "
           f"TERM=xterm-256color {sys.executable} -m simagent --model scripted:{steps}; "
           "sleep 30")
    tmux("new-session", "-d", "-s", "cnt", "-x", "200", "-y", "60", cmd)
    try:
        wait_for(lambda s: "kernel idle" in s and "›" in s)
        tmux("send-keys", "-t", "cnt", "-l", "print them")
        time.sleep(0.2)
        tmux("send-keys", "-t", "cnt", "Enter")
        wait_for(lambda s: "Printed them." in s)
        tmux("send-keys", "-t", "cnt", "C-o")
        screen = wait_for(lambda s: "not shown" in s and f"sweep line {n - 1:07d}" in s, 30)
    finally:
        tmux("kill-server")
    lines = screen.split("\n")
    shown = [ln for ln in lines if re.search(r"^\s+sweep line \d{7}\s*$", ln)]
    hidden, size, _ = note_of(lines)
    assert hidden == n - len(shown), screen
    assert size is not None and size.endswith("MB")
    # the path may wrap onto the next rows
    assert re.search(r"full output: \S*/outputs/\d{4}\.txt", re.sub(r"\n\s*", "", screen))


def test_transcript_note_names_the_raw_output_size(tmp_path):
    """``simagent transcript`` counted the capped result's chars beside the raw path, so
    a 7 MB print read as a few KB more; the raw file's size is named beside it now."""
    from simagent.presentation.transcript import render_markdown
    from simagent.trace.log import TraceLog

    content, raw = printed(tmp_path / "outputs", 300_000)
    with TraceLog(tmp_path / "trace.sqlite") as log:
        log.append("tool_call", {"id": "c1", "name": "run_python", "args": {"code": "f()"},
                                 "agent": "main"})
        log.append("kernel_exec", {"tool_call_id": "c1", "code": "f()", "status": "ok",
                                   "elapsed_s": 1.0, "raw_path": str(raw)})
        log.append("tool_result", {"tool_call_id": "c1", "name": "run_python",
                                   "content": content, "status": "success", "agent": "main"})
    with TraceLog(tmp_path / "trace.sqlite", readonly=True) as log:
        md = render_markdown(log.events())
    size = raw.stat().st_size
    assert size > 5 * len(content)  # the result is a capped copy of the output
    assert f"more chars of this result; full output, {size / (1 << 20):.1f} MB: {raw})" in md
