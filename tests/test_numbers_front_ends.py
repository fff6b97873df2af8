"""Issue 38: where the person reads an answer, every number shows the same status. One
scripted session on a real kernel (a cell prints two numbers; the answer states both, their
difference and a number no cell printed) read through each front end: the TUI's answer
(its markers and sources block, ctrl+O's lines), the markdown and HTML transcript, the
exported notebook, and ``simagent acp``'s PromptResponse ``_meta``. Each is read back as
the person (or client) gets it, and all give the engine's one status list."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path
from typing import Any

import nbformat
import pytest
from test_acp_protocol import Recorder, init, prompt, script, start
from test_tui_app import CTRL_O, drive
from test_tui_terminal import Pane

from simagent.notebooks.export import build
from simagent.presentation.transcript import render_html, render_markdown
from simagent.trace import TraceLog
from simagent.tui.entries import AssistantEntry

pytestmark = pytest.mark.real

CODE = "k = 0.31647\ntau = 2.6753\nprint('k_fit =', k)\nprint('tau_ms =', tau)"
STEPS = [{"tool": "run_python", "args": {"code": CODE}},
         {"final": "k is 0.316 and tau is 2.68, so they are 2.36 apart; R0 is 3.9."}]
STATUSES = ["sourced", "sourced", "derived", "unsourced"]
#: A marker as each medium draws it: ``[[1]](#cell-3)``, ``[1]``, ``¹``, ``[?]``.
MARK = re.compile(r"\[\[(\d+)\]\]\(#cell-\d+\)|\[(\d+)\]|([⁰¹²³⁴⁵⁶⁷⁸⁹]+)|(\[\?\])")
_SUP = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹", "0123456789")


def read_statuses(answer: str, sources: str) -> list[str]:
    """The statuses a reader gets from an answer's markers and its sources block: a
    footnote whose line names a cell is sourced, one that says ``=`` is derived, ``from
    your message`` is input, and ``[?]`` is unsourced."""
    kinds = {}
    for line in sources.splitlines():
        m = re.match(r"^\W*(?:\[(\d+)\]|([⁰¹²³⁴⁵⁶⁷⁸⁹]+)) (.*)$", line.strip())
        if m:
            key = m.group(1) or m.group(2).translate(_SUP)
            rest = m.group(3)
            kinds[key] = ("derived" if rest.startswith("=") else "input"
                          if rest.startswith("from your message") else "sourced"
                          if "cell " in rest else "?")
    out = []
    for m in MARK.finditer(answer):
        if m.group(4):
            out.append("unsourced")
        else:
            out.append(kinds[m.group(1) or m.group(2) or m.group(3).translate(_SUP)])
    return out


@pytest.fixture(scope="module")
def tui_session(tmp_path_factory) -> dict[str, Any]:
    """The session run in the TUI (real kernel, scripted model): what it showed
    collapsed and with ctrl+O, and its state folder."""
    root = tmp_path_factory.mktemp("numbers")
    workspace = root / "ws"
    workspace.mkdir()
    seen: dict[str, Any] = {}

    async def scenario(d) -> None:
        await d.type("fit k and tau")
        await d.enter()
        await d.until(lambda: any(isinstance(e, AssistantEntry) and e.footnoted
                                  for e in d.ctl.conversation.entries), 180)
        await d.idle()
        seen["collapsed"] = d.text()
        await d.keys(CTRL_O)
        await d.expect(lambda: "│ k_fit = 0.31647" in d.text())
        seen["expanded"] = d.text()
        seen["entry"] = next(e for e in d.ctl.conversation.entries
                             if isinstance(e, AssistantEntry) and e.footnoted)
        seen["state"] = d.ctl.session.paths.root
        seen["id"] = d.ctl.session.id

    home = root / "home"  # a module fixture runs before each test's own state home
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SIMAGENT_HOME", str(home))
        drive(workspace, scenario, model=script(root, STEPS), approval="auto")
    seen["workspace"], seen["root"], seen["home"] = workspace, root, str(home)
    return seen


def _answer_and_sources(screen: str) -> tuple[str, str]:
    answer = next(ln for ln in screen.splitlines() if "R0 is 3.9" in ln)
    return answer, screen[screen.index("Sources"):]


def test_the_tui_marks_each_number_and_ctrl_o_shows_its_lines(tui_session):
    entry = tui_session["entry"]
    assert list(entry.footnoted.statuses) == STATUSES
    answer, sources = _answer_and_sources(tui_session["collapsed"])
    assert "0.316¹" in answer and "2.36³" in answer and "3.9[?]" in answer
    assert read_statuses(answer, sources) == STATUSES
    n = entry.footnoted.notes[0].execution
    assert f"¹ cell {n}, output line 1: k_fit = 0.31647" in sources
    assert "1 │ k_fit = 0.31647" in tui_session["expanded"]
    assert "2 │ tau_ms = 2.6753" in tui_session["expanded"]


def test_a_resumed_session_shows_the_answers_footnotes_again(tui_session, monkeypatch):
    monkeypatch.setenv("SIMAGENT_HOME", tui_session["home"])
    seen = {}

    async def scenario(d) -> None:
        await d.until(lambda: "ctrl+O shows their lines" in d.text(), 60)
        seen["screen"] = d.text()

    drive(tui_session["workspace"], scenario, resume=tui_session["id"],
          model=script(tui_session["root"], [{"final": "again"}], "again.json"))
    answer, sources = _answer_and_sources(seen["screen"])
    assert read_statuses(answer, sources) == STATUSES


def test_the_transcript_and_the_notebook_give_the_same_statuses(tui_session, tmp_path):
    state = Path(tui_session["state"])
    with TraceLog(state / "trace.sqlite", readonly=True) as log:
        events = log.events()
    md = render_markdown(events, session_dir=state)
    section = md[md.rindex("## Assistant"):md.index("## Usage")]
    answer, sources = section.split("**Sources**")
    assert read_statuses(answer, sources) == STATUSES
    n = tui_session["entry"].footnoted.notes[0].execution
    assert f'<a id="cell-{n}"></a>' in md and f"0.316[[1]](#cell-{n})" in answer
    page = render_html(events, session_dir=state)
    assert f'id="cell-{n}"' in page and f'0.316<sup><a href="#cell-{n}">[1]</a></sup>' in page
    nb, _ = build(state)
    path = tmp_path / "s.ipynb"
    nbformat.write(nb, path)
    cells = nbformat.read(path, as_version=4).cells
    cell = next(c for c in cells if "numbers" in c.metadata.get("simagent", {}))
    answer, sources = cell.source.split("**Sources**")
    assert read_statuses(answer, sources) == STATUSES
    assert [x["status"] for x in cell.metadata["simagent"]["numbers"]] == STATUSES
    anchor = next(i for i, c in enumerate(cells) if f'<a id="cell-{n}"></a>' in c.source)
    assert cells[anchor + 1].cell_type == "code" and cells[anchor + 1].execution_count == n


def test_acp_meta_gives_the_same_statuses(tmp_path, workspace):
    model = script(tmp_path, STEPS)

    async def main() -> dict[str, Any]:
        client = Recorder()
        async with await start(client, model, "--approval", "auto") as (conn, _proc):
            await init(conn)
            new = await asyncio.wait_for(conn.new_session(cwd=str(workspace),
                                                          mcp_servers=[]), 120)
            r = await prompt(conn, new.session_id, "fit k and tau")
            assert r.stop_reason == "end_turn"
            return r.field_meta["simagent"]

    meta = asyncio.run(asyncio.wait_for(main(), 300))
    numbers = meta["numbers"]
    assert [x["status"] for x in numbers] == STATUSES, json.dumps(numbers)
    k = numbers[0]
    assert (k["text"], k["source"]["line"], k["source"]["excerpt"]) == \
        ("0.316", 1, "k_fit = 0.31647")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_a_real_terminal_shows_the_markers_and_ctrl_o_the_lines(workspace, tmp_path,
                                                                 _state_home):
    """``simagent`` in tmux: the superscripts and the block reach a real terminal."""
    pane = Pane(workspace, script(tmp_path, STEPS), _state_home)
    try:
        pane.wait_for(lambda s: "kernel idle" in s and "›" in s)
        pane.type("fit k and tau")
        screen = pane.wait_for(lambda s: "ctrl+O shows their lines" in s)
        answer, sources = _answer_and_sources(screen)
        assert read_statuses(answer, sources) == STATUSES
        pane.send("C-o")
        pane.wait_for(lambda s: "│ k_fit = 0.31647" in s and "│ tau_ms = 2.6753" in s,
                      timeout=60)
    finally:
        pane.close()
