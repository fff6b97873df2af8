"""What the person is told must be true (issue 30): a card's mark follows how the call
really ended, cards never overwrite each other, and the small TUI promises hold.

The real prompt_toolkit app on a pipe (``test_tui_app``'s driver), the real graph,
kernel and trace, scripted models; assertions read the rendered screen rows.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import threading

import cli_fork
import pytest
from test_tui_app import CTRL_C, ENTER, Driver, drive, script

from simagent.agent.events import ToolFinished, ToolStarted
from simagent.tui.entries import Conversation, PanelEntry, ToolCard, UserEntry

FAILING_CELLS = [  # (code, the outcome it must be marked with); a good cell between
    ("1/0", "error"),  # failures keeps the REPL watchdog from stopping the turn
    ("print('fine 1')", "ok"),
    ("undefined_name_here", "error"),
    ("print('fine 2')", "ok"),
    ("input()", "error"),
    ("print('fine 3')", "ok"),
    ("import os; os._exit(3)", "died"),
]


def _card_rows(text: str, code: str) -> list[str]:
    return [row for row in text.splitlines() if "run_python" in row and code in row]


@pytest.mark.real
def test_a_failed_cell_is_never_marked_ok_in_the_tui(workspace, tmp_path):
    from simagent.outcomes import MARKS

    steps = [{"tool": "run_python", "args": {"code": code}} for code, _ in FAILING_CELLS]
    model = script(tmp_path / "s.json", [*steps, {"final": "done"}])

    async def scenario(d: Driver) -> None:
        await d.type("try them")
        await d.enter()
        await d.idle()
        screen = d.text()
        for code, outcome in FAILING_CELLS:
            rows = _card_rows(screen, code)
            assert rows, (code, screen)
            assert rows[0].startswith(MARKS[outcome].glyph + " "), (code, rows[0])
        cards = [e for e in d.ctl.conversation.entries if isinstance(e, ToolCard)]
        assert [c.outcome for c in cards] == [o for _, o in FAILING_CELLS]

    drive(workspace, scenario, model=model)


@pytest.mark.real
def test_headless_and_transcript_mark_failed_cells_as_the_tui_does(workspace, tmp_path,
                                                                   _state_home):
    from simagent.outcomes import MARKS

    path = tmp_path / "s.json"
    path.write_text(json.dumps([{"tool": "run_python", "args": {"code": code}}
                                for code, _ in FAILING_CELLS] + [{"final": "done"}]))
    env = {**os.environ, "SIMAGENT_HOME": str(_state_home)}
    env.pop("SIMAGENT_MODEL", None)
    run = cli_fork.run([sys.executable, "-m", "simagent", "run", "--model",
                        f"scripted:{path}", "try them"], cwd=workspace, env=env,
                       capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    finished = [ln.strip() for ln in run.stderr.splitlines()
                if ln.startswith("  ") and "run_python" in ln]
    assert len(finished) == len(FAILING_CELLS), run.stderr
    for line, (code, outcome) in zip(finished, FAILING_CELLS, strict=True):
        assert line.startswith(MARKS[outcome].glyph + " run_python"), (code, line)
    assert "ZeroDivisionError" in finished[0] and "NameError" in finished[2]

    md = cli_fork.run([sys.executable, "-m", "simagent", "transcript"], cwd=workspace,
                      env=env, capture_output=True, text=True, timeout=120).stdout
    heads = [ln for ln in md.splitlines() if ln.startswith("### Tool `run_python`")]
    heads = heads[-len(FAILING_CELLS):]  # after the simulator's warm-up cell
    assert [h.split("(", 1)[1][:1] for h in heads] == [MARKS[o].glyph
                                                       for _, o in FAILING_CELLS], heads


def test_a_reused_call_id_gets_its_own_card():
    """Any provider may reuse ids across turns: the old card keeps its result."""
    conv = Conversation()
    for text in ("first", "second"):
        conv.apply(ToolStarted("call_0_0", "run_python", {"code": f"print('{text}')"}))
        conv.apply(ToolFinished("call_0_0", "run_python", "success", text, 0.1))
    cards = [e for e in conv.entries if isinstance(e, ToolCard)]
    assert [c.content for c in cards] == ["first", "second"]


@pytest.mark.slow
def test_switching_scripts_in_one_conversation_keeps_every_card(workspace, tmp_path):
    one = script(tmp_path / "one.json", [
        {"tool": "run_python", "args": {"code": "print('from script one')"}},
        {"final": "one done"}])
    two = script(tmp_path / "two.json", [
        {"tool": "run_python", "args": {"code": "print('from script two')"}},
        {"final": "two done"}])

    async def scenario(d: Driver) -> None:
        await d.type("go")
        await d.enter()
        await d.idle()
        await d.type(f"/model {two}")
        await d.enter()
        await d.expect(lambda: d.ctl.model_id == two)
        await d.type("again")
        await d.enter()
        await d.idle()
        screen = d.text()
        assert _card_rows(screen, "print('from script one')"), screen
        assert _card_rows(screen, "print('from script two')"), screen
        cards = [e for e in d.ctl.conversation.entries if isinstance(e, ToolCard)]
        assert len(cards) == 2 and len({c.id for c in cards}) == 2
        calls = [e.payload["id"] for e in d.ctl.session.trace.events(["tool_call"])]
        assert len(calls) == len(set(calls)) == 2

    drive(workspace, scenario, model=one)


@pytest.mark.slow
def test_a_message_typed_before_a_model_waits_and_is_not_glued_to_the_command(
        workspace, tmp_path, monkeypatch):
    monkeypatch.delenv("SIMAGENT_MODEL", raising=False)
    model = script(tmp_path / "s.json", [{"final": "hello back"}])

    async def scenario(d: Driver) -> None:
        await d.type("hello")
        await d.enter()  # taken: the input line is free for /model
        await d.expect(lambda: "no model yet" in d.text())
        await d.type(f"/model {model}")
        await d.keys(ENTER)
        await d.expect(lambda: d.ctl.model_id == model and d.ui.input.text == "hello")
        assert "your message is back in the input line" in d.text()
        await d.enter()
        await d.idle()
        users = [e.text for e in d.ctl.conversation.entries if isinstance(e, UserEntry)]
        assert users == ["hello"]
        assert "hello back" in d.text()

    drive(workspace, scenario)


@pytest.mark.slow
def test_continue_keeps_the_resumed_sessions_model(workspace, tmp_path, monkeypatch):
    first = script(tmp_path / "first.json", [{"final": "the first script answers"}])
    other = script(tmp_path / "other.json", [{"final": "the default model"}])

    async def talk(d: Driver) -> None:
        await d.type("hi")
        await d.enter()
        await d.idle()

    drive(workspace, talk, model=first)
    monkeypatch.setenv("SIMAGENT_MODEL", other)  # a default, not this conversation's

    async def resumed(d: Driver) -> None:
        assert d.ctl.model_id == first
        await d.type("and now?")
        await d.enter()
        await d.idle()
        assert "the first script answers" in d.text().split("and now?", 1)[1]
        assert "the default model" not in d.text()

    drive(workspace, resumed, continue_last=True)


def test_a_missing_key_says_which_variable_and_how_from_inside_the_tui(workspace, tmp_path,
                                                                        monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    model = script(tmp_path / "s.json", [{"final": "x"}])

    async def scenario(d: Driver) -> None:
        await d.type("/model openai:gpt-4o")
        await d.enter()
        await d.expect(lambda: "OPENAI_API_KEY" in d.text())
        line = " ".join(d.text().split())
        assert "openai:gpt-4o: openai:gpt-4o" not in line  # said once
        assert "with --model)" not in line  # no command-line flag from inside the TUI
        assert "export OPENAI_API_KEY=" in line and "/model" in line
        assert d.ctl.model_id == model  # the working model stays

    drive(workspace, scenario, model=model)


def test_help_continuations_are_indented_under_their_description(workspace, tmp_path):
    model = script(tmp_path / "s.json", [{"final": "x"}])

    async def scenario(d: Driver) -> None:
        await d.type("/help")
        await d.enter()
        await d.expect(lambda: any(isinstance(e, PanelEntry) and e.title == "Help"
                                   for e in d.ctl.conversation.entries))
        rows = d.text().split("Commands:", 1)[1].split("\n")
        stray = [r for r in rows if r and not r.startswith(" ") and r != "Keys:"]
        assert not stray, stray  # a wrapped word never lands in the command column
        assert any(r.startswith("  /reset ") for r in rows)

    drive(workspace, scenario, model=model)


def test_a_subagents_filed_report_is_marked_ok(workspace, tmp_path):
    from simagent.outcomes import MARKS

    model = script(tmp_path / "s.json", [
        {"tool": "task", "args": {"subagent_type": "source-explorer", "description": "q"},
         "steps": [{"tool": "submit_report", "args": {"answer": "it is A"}}]},
        {"final": "reported"}])

    async def scenario(d: Driver) -> None:
        await d.type("delegate")
        await d.enter()
        await d.idle()
        rows = [r for r in d.text().splitlines() if "submit_report" in r]
        assert rows and rows[0].startswith(MARKS["ok"].glyph + " "), rows

    drive(workspace, scenario, model=model)


@pytest.mark.slow
def test_done_counts_messages_in_words_that_agree(workspace, tmp_path):
    """A question cancelled before the model answered leaves one message to checkpoint."""
    # the reply comes 6 s after the call begins: past the ctrl+C on a loaded machine too
    model = script(tmp_path / "s.json", [{"final": "too late", "wait": 6}])

    async def scenario(d: Driver) -> None:
        await d.type("one question")
        await d.enter()
        await d.expect(lambda: d.ctl.busy and d.ctl.runner is not None and d.ctl.runner.busy)
        await asyncio.sleep(0.5)  # the model call has begun
        await d.keys(CTRL_C)
        await d.expect(lambda: not d.ctl.busy, 30)
        await d.type("/done")
        await d.enter()
        await d.expect(lambda: "task checkpoint written" in d.text())
        found = re.search(r"checkpoint written \((\d+) (messages?) ", d.text())
        assert found, d.text()
        assert (found.group(2) == "message") == (found.group(1) == "1"), found.group(0)
        assert found.group(1) == "1"

    drive(workspace, scenario, model=model)
    for th in threading.enumerate():  # the abandoned call ends with its wait
        if th.name.startswith("simagent-turn-"):
            th.join(30)


@pytest.mark.slow
def test_the_status_bar_follows_the_kernel_when_no_turn_runs(workspace, tmp_path):
    """The kernel changes state on its own (an abandoned turn's cell stopping, the
    ladder's restart): the bar is redrawn then too, not only while a turn runs."""
    from prompt_toolkit.history import InMemoryHistory
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from simagent.config import SessionOptions
    from simagent.tui.app import TuiApp
    from simagent.tui.controller import TuiController

    drawn: list[str] = []

    class Watched(TuiApp):
        def _status_fragments(self):  # what the bar shows, each time it is drawn
            frags = super()._status_fragments()
            drawn.append("".join(t for _, t in frags))
            return frags

    model = script(tmp_path / "s.json", [{"final": "x"}])

    async def main() -> None:
        with create_pipe_input() as inp:
            ctl = TuiController(SessionOptions(workspace=workspace, model=model))
            ui = Watched(ctl, input=inp, output=DummyOutput(), history=InMemoryHistory())
            task = asyncio.ensure_future(ui.run_async())
            d = Driver(ui, inp)
            try:
                await d.until(lambda: ctl.kernel_ready and ctl.session.kernel_state == "idle")
                await asyncio.sleep(0.5)
                drawn.clear()  # from here on only the cell below changes the kernel's state
                kernel = ctl.session.kernel
                cell = asyncio.get_running_loop().run_in_executor(
                    None, lambda: kernel.execute("import time; time.sleep(3)"))
                await d.until(lambda: any("kernel busy" in t for t in drawn), 15)
                await cell
                await d.until(lambda: "kernel idle" in drawn[-1], 15)
            finally:
                ui.quit()
                await task
        ctl.close()

    asyncio.run(main())


def test_a_resumed_sessions_cards_keep_their_marks_even_from_an_older_trace():
    """History is rebuilt from the trace: the outcome recorded with the result, or, in a
    trace written before outcomes were recorded, the cell's kernel status."""
    from simagent.trace.log import Event
    from simagent.tui.history import history_entries

    call = {"name": "run_python", "args": {"code": "1/0"}}
    events = [Event(1, "t", "tool_call", {"id": "c1", **call}),
              Event(2, "t", "kernel_exec", {"tool_call_id": "c1", "status": "error"}),
              Event(3, "t", "tool_result", {"tool_call_id": "c1", "name": "run_python",
                                            "status": "success", "content": "ZeroDivision"}),
              Event(4, "t", "tool_call", {"id": "c2", **call}),
              Event(5, "t", "kernel_exec", {"tool_call_id": "c2", "status": "interrupted"}),
              Event(6, "t", "tool_result", {"tool_call_id": "c2", "name": "run_python",
                                            "status": "success", "outcome": "restarted"})]
    cards = [e for e in history_entries(events) if isinstance(e, ToolCard)]
    assert [c.outcome for c in cards] == ["error", "restarted"]


def test_every_outcome_has_its_own_glyph_and_colour_and_the_card_uses_them():
    from simagent.outcomes import MARKS, STYLES
    from simagent.tui.app import STYLE
    from simagent.tui.render import card_header

    ended = {k: m for k, m in MARKS.items() if k != "requested"}
    assert len({m.glyph for m in ended.values()}) == len(ended)
    assert len({STYLES[m.style] for m in ended.values()}) == len(ended)
    defined = {name for names, _ in STYLE.class_names_and_attrs for name in names}
    assert {m.style for m in MARKS.values()} <= defined
    for outcome, m in ended.items():
        card = ToolCard("c", "run_python", {"code": "x"}, status="success", ended=outcome,
                        elapsed_s=0.1)
        style, glyph = card_header(card, 80, 0.0)[0]
        assert (style, glyph) == (f"class:{m.style}", f"{m.glyph} ")
