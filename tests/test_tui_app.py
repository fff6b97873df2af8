"""The TUI headless: the real prompt_toolkit app on a pipe, the real graph, kernel and
trace, a scripted model. Keys are sent as a terminal would send them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import write_config
from prompt_toolkit.history import InMemoryHistory
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from simagent.config import SessionOptions
from simagent.tui import commands
from simagent.tui.app import TuiApp
from simagent.tui.controller import NO_MODEL_HELP, TuiController
from simagent.tui.entries import ApprovalEntry, PanelEntry, ToolCard

CTRL_O, CTRL_C, TAB, ENTER, SHIFT_TAB = "\x0f", "\x03", "\t", "\r", "\x1b[Z"


def script(path: Path, steps: list[dict]) -> str:
    path.write_text(json.dumps(steps))
    return f"scripted:{path}"


class Driver:
    def __init__(self, ui: TuiApp, inp) -> None:
        self.ui, self.inp, self.ctl = ui, inp, ui.ctl

    async def keys(self, text: str, wait: float = 0.08) -> None:
        self.inp.send_text(text)
        await asyncio.sleep(wait)

    async def type(self, text: str) -> None:
        for ch in text:  # completion runs asynchronously: pace the keystrokes
            await self.keys(ch, 0.02)
        await asyncio.sleep(0.1)

    async def until(self, check: Callable[[], bool], timeout: float = 60.0) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not check():
            if loop.time() > end:
                raise AssertionError(f"timed out; screen:\n{self.ui.screen_text()}")
            await asyncio.sleep(0.05)

    async def enter(self) -> None:
        """Send the line and wait until the app took it (the input empties)."""
        await self.keys(ENTER, 0.02)
        await self.until(lambda: self.ui.input.text == "", 15)

    async def expect(self, check: Callable[[], bool], timeout: float = 15.0) -> None:
        """Wait for what a key causes: the app handles keys, and commands run on worker
        threads, on their own schedule (fixed sleeps flake on a loaded machine)."""
        await self.until(check, timeout)

    async def idle(self) -> None:
        await self.until(lambda: not self.ctl.busy and not self.ctl.conversation
                         .running_cards())
        await asyncio.sleep(0.15)  # posted events land

    def text(self) -> str:
        return self.ui.screen_text()


def drive(workspace: Path, scenario, output=None, **opts) -> TuiController:
    """Run ``scenario(driver)`` inside the running app; returns the closed controller.

    The order is ``run_tui``'s: ``run_async`` closes the controller before the loop ends
    (the scenario may quit the app itself), and the ``close()`` after the loop is gone
    is a no-op; late events from a turn must then be dropped quietly.
    """
    async def main() -> TuiController:
        with create_pipe_input() as inp:
            ctl = TuiController(SessionOptions(workspace=workspace, **opts))
            ui = TuiApp(ctl, input=inp, output=output or DummyOutput(),
                        history=InMemoryHistory())
            task = asyncio.ensure_future(ui.run_async())
            d = Driver(ui, inp)
            try:
                await d.until(lambda: ui.app.is_running or task.done(), 30)
                await scenario(d)
            finally:
                if ui.app.is_running:
                    ui.quit()
                await task
        return ctl

    ctl = asyncio.run(main())
    ctl.close()
    return ctl


@pytest.mark.slow
def test_turn_card_ctrl_o_completion_and_context(workspace, tmp_path):
    model = script(tmp_path / "s.json", [
        {"tool": "run_python", "args": {"code": "vals = [i * i for i in range(60)]\n"
                                                "for v in vals:\n    print('square', v)"}},
        {"final": "The last square is **{out[-1]|square (\\d+)\\s*$}**."}])

    async def scenario(d: Driver) -> None:
        await d.type("/cont")
        await d.keys(TAB)
        assert d.ui.input.text == "/context"
        await d.enter()
        await d.expect(lambda: "Context —" in d.text() and "No model call yet" in d.text())
        await d.type("square numbers")
        await d.enter()
        await d.idle()
        screen = d.text()
        assert "✓ run_python" in screen and "The last square is 3481¹." in screen
        assert "¹ cell 2, output line 60: square 3481" in screen  # its source, said once
        assert "square 10\n" not in screen  # collapsed: one line
        await d.keys(CTRL_O)
        await d.expect(lambda: d.ui.expanded and "square 3364" in d.text())
        assert "for v in vals:" in d.text()
        await d.keys(CTRL_O)
        await d.expect(lambda: not d.ui.expanded and "for v in vals:" not in d.text())
        panels = sum(isinstance(e, PanelEntry) for e in d.ctl.conversation.entries)
        await d.type("/context")
        await d.enter()
        await d.expect(lambda: sum(isinstance(e, PanelEntry)
                                   for e in d.ctl.conversation.entries) > panels)
        panel = d.text()
        for category in ("system prompt", "tool schemas", "tool results", "free space",
                         "Thresholds:"):
            assert category in panel
        snap = d.ctl.snapshot()
        assert snap.ctx_label.startswith("ctx ") and snap.ctx_level == "dim"
        assert snap.kernel == "idle" and snap.session_id == d.ctl.session.id

    drive(workspace, scenario, model=model)


@pytest.mark.slow
def test_every_slash_command_runs(workspace, tmp_path):
    (workspace / "notes.txt").write_text("x")
    model = script(tmp_path / "s.json", [
        {"tool": "run_python", "args": {"code": "kept = 5\nprint('kept', kept)"}},
        {"tool": "remember", "args": {"title": "Solver choice",
                                      "content": "Use BDF for stiff runs.", "kind": "project"}},
        {"final": "noted"}, {"final": "second"}])
    args = {"/model": "", "/memory": "", "/transcript": "md", "/approval": "auto",
            "/compact": "", "/done": "finished the check"}

    async def scenario(d: Driver) -> None:
        await d.type("remember the solver")
        await d.enter()
        await d.idle()
        for spec in commands.COMMANDS:
            if spec.name in ("/quit", "/clear"):
                continue
            before = len(d.ctl.conversation.entries)
            await d.type(f"{spec.name} {args.get(spec.name, '')}".strip())
            await d.enter()
            await d.expect(lambda n=before: len(d.ctl.conversation.entries) > n)
            await d.idle()
            d.ctl.wait(30)
            await asyncio.sleep(0.2)
            added = d.ctl.conversation.entries[before:]
            assert added, spec.name
            errors = [e.text for e in added if getattr(e, "level", "") == "error"]
            assert not errors, (spec.name, errors)
        screen = d.text()
        assert "Commands:" in screen and "/resume-after-cost-ceiling" in screen  # /help
        assert "Solver choice" in screen  # /memory
        assert "python-and-kernel" in screen  # /skills
        assert d.ctl.session.id[:15] in screen  # /sessions
        assert (d.ctl.session.paths.root / "transcript.md").is_file()
        assert d.ctl.session.approval == "auto"
        assert "kernel restarted" in screen  # /reset
        assert "nothing is running" in screen  # /interrupt
        assert "cost ceiling has not been reached" in screen
        assert "~ task checkpoint written" in screen  # /done
        assert "~ compacted" in screen or "nothing to compact" in screen  # /compact
        await d.type("/memory solver")
        await d.enter()
        await d.expect(lambda: "Use BDF for stiff runs." in d.text())
        first = d.ctl.session.id
        d.ctl.wait(30)
        assert d.ctl.session.kernel.execute("kept = 5").status == "ok"  # /reset cleared it
        await d.type("/clear")
        await d.enter()
        await d.expect(lambda: d.ctl.session.id != first
                       and f"simagent --resume {first}" in d.text())
        d.ctl.wait(30)
        kept = d.ctl.session.kernel.execute("print('kept is', kept)")
        assert kept.stdout.strip() == "kept is 5"  # /clear kept the kernel and its state
        assert d.ctl.session.trace.first("session_start").payload["continued_from"] == first
        await d.type("/quit")
        await d.keys(ENTER)
        await d.expect(lambda: not d.ui.app.is_running)

    ctl = drive(workspace, scenario, model=model)
    assert ctl.quit_requested


@pytest.mark.slow
def test_approval_shows_a_diff_and_accept_reject(workspace, tmp_path):
    (workspace / "params.py").write_text("rate = 1\nsteps = 10\n")
    model = script(tmp_path / "s.json", [
        {"tool": "write_file", "args": {"file_path": "params.py",
                                        "content": "rate = 2\nsteps = 10\n"}},
        {"final": "updated"},
        {"tool": "write_file", "args": {"file_path": "other.py", "content": "bad = 1\n"}},
        {"final": "rejected, fine"},
        {"tool": "write_file", "args": {"file_path": "third.py", "content": "z = 1\n"}},
        {"final": "The user said: {out[-1]}"}])

    async def scenario(d: Driver) -> None:
        await d.type("set the rate to 2")
        await d.keys(ENTER)
        await d.until(lambda: bool(d.ctl.conversation.pending_approvals()))
        await d.expect(lambda: "approve write_file?" in d.text())
        screen = d.text()
        assert "approve write_file?" in screen and "-rate = 1" in screen and "+rate = 2" in \
            screen
        assert d.ui._prompt()[0][1].startswith("y/n")
        await d.type("y")
        await d.enter()
        await d.idle()
        assert (workspace / "params.py").read_text() == "rate = 2\nsteps = 10\n"
        assert "updated" in d.text()
        await d.type("write another")
        await d.keys(ENTER)
        await d.until(lambda: bool(d.ctl.conversation.pending_approvals()))
        await d.type("n")
        await d.enter()
        await d.idle()
        assert not (workspace / "other.py").exists()
        await d.type("write a third")
        await d.keys(ENTER)
        await d.until(lambda: bool(d.ctl.conversation.pending_approvals()))
        await d.type("put it in params.py instead")
        await d.enter()
        await d.idle()
        assert not (workspace / "third.py").exists()
        assert "The user said: put it in params.py instead" in d.text()
        decided = [e.decision for e in d.ctl.conversation.entries
                   if isinstance(e, ApprovalEntry)]
        assert decided == ["approve", "reject", "respond: put it in params.py instead"]

    ctl = drive(workspace, scenario, model=model, approval="ask")
    from simagent.trace import TraceLog

    with TraceLog(ctl.session.paths.trace, readonly=True) as log:
        kinds = [e.kind for e in log.events(["hitl_request", "hitl_response"])]
    assert kinds == ["hitl_request", "hitl_response"] * 3


@pytest.mark.slow
def test_no_model_opens_explains_and_model_command_switches(workspace, tmp_path, monkeypatch):
    monkeypatch.delenv("SIMAGENT_MODEL", raising=False)
    model = script(tmp_path / "s.json", [{"final": "hello from the script"}])

    async def scenario(d: Driver) -> None:
        assert any(isinstance(e, PanelEntry) and e.text == NO_MODEL_HELP
                   for e in d.ctl.conversation.entries)
        assert "no model" in "".join(t for _, t in d.ui._status_fragments())
        await d.type("hi")
        await d.keys(ENTER)
        await d.expect(lambda: "no model yet" in d.text())
        assert d.ui.input.text == ""  # held until a model is chosen (test_tui_truth)
        await d.type("draft")
        await d.keys(CTRL_C)  # ctrl+C with text clears the line
        await d.expect(lambda: d.ui.input.text == "")
        assert d.ui.app.is_running
        await d.type(f"/model {model}")
        await d.keys(ENTER)
        await d.expect(lambda: d.ctl.model_id == model and d.ui.input.text == "hi")
        await d.type(" again")
        await d.enter()
        await d.idle()
        assert "hello from the script" in d.text()

    drive(workspace, scenario)


def test_replay_demo_prefills_the_workflow_prompt_and_runs(workspace):
    async def scenario(d: Driver) -> None:
        wf = d.ctl.resolved.workflow
        assert d.ui.input.text == wf.prompt.strip()
        assert d.ctl.session.simulator.name == (wf.simulator or "scipy")
        await d.enter()
        await d.idle()
        cards = [e for e in d.ctl.conversation.entries if isinstance(e, ToolCard)]
        assert cards and all(c.status == "success" for c in cards)

    drive(workspace, scenario, model="replay:canary")


@pytest.mark.real
def test_ctrl_c_interrupts_keeps_state_and_twice_quits(workspace, tmp_path):
    model = script(tmp_path / "s.json", [
        {"tool": "run_python", "args": {"code": "marker = 'kept'\nimport time\n"
                                                "print('sleeping', flush=True)\n"
                                                "time.sleep(30)"}},
        {"tool": "run_python", "args": {"code": "print('marker is', marker)"}},
        {"final": "{out[-1]|marker is (\\w+)}"}])

    async def scenario(d: Driver) -> None:
        await d.type("sleep")
        await d.keys(ENTER)
        await d.until(lambda: d.ctl.session.kernel_state == "busy"
                      and bool(d.ctl.conversation.running_cards()))
        await d.until(lambda: "sleeping" in d.text())  # marker is set: the cell runs on
        await d.keys(CTRL_C)
        await d.until(lambda: not d.ctl.busy, timeout=10)
        await d.expect(lambda: "Turn cancelled; the cell was interrupted and the kernel "
                       "kept its state." in " ".join(d.text().split()))
        await d.type("check")
        await d.enter()
        await d.idle()
        assert "marker is kept" in d.text()
        await d.keys(CTRL_C)
        await d.expect(lambda: "press ctrl+C again to quit" in d.text())
        assert d.ui.app.is_running
        await d.keys(CTRL_C)
        await d.expect(lambda: not d.ui.app.is_running)

    drive(workspace, scenario, model=model)


@pytest.mark.slow
def test_ctrl_c_after_the_reply_is_not_an_interrupt(workspace, tmp_path):
    """The reply is in but the turn still catches up (a slow trace read for the stats):
    the bar says working, and ctrl+C has nothing to interrupt, so it asks to quit."""
    import threading

    model = script(tmp_path / "s.json", [{"final": "All done."}])
    release = threading.Event()

    async def scenario(d: Driver) -> None:
        slow = d.ctl.refresh_stats

        def held(background: bool = True) -> None:
            if not background:
                release.wait(20)
            slow(background)

        d.ctl.refresh_stats = held
        await d.type("hello")
        await d.keys(ENTER)
        await d.until(lambda: "All done." in d.text())
        await asyncio.sleep(0.2)
        bar = "".join(t for _, t in d.ui._status_fragments())
        assert d.ctl.busy and "● working" in bar
        await d.keys(CTRL_C)
        await d.expect(lambda: "press ctrl+C again to quit" in d.text())
        assert "interrupting" not in d.text() and d.ui.app.is_running
        release.set()
        await d.idle()
        bar = "".join(t for _, t in d.ui._status_fragments())
        assert "● working" not in bar and "Turn cancelled" not in d.text()

    drive(workspace, scenario, model=model)


@pytest.mark.slow
def test_ctrl_c_while_the_model_is_silent_gives_the_prompt_back(workspace, tmp_path):
    """A provider thinking (or stalled) before its first token cannot be interrupted;
    ctrl+C abandons the turn instead of waiting, and the late reply never shows."""
    import threading

    model = script(tmp_path / "s.json", [{"final": "LATE-ANSWER", "wait": 6},
                                         {"final": "next one is fine"}])

    async def scenario(d: Driver) -> None:
        before = set(threading.enumerate())  # threads left by earlier tests do not count
        await d.type("think")
        await d.enter()
        await d.until(lambda: d.ctl.resolved.chat_model.cursor.pos == 1)
        await asyncio.sleep(0.3)
        await d.keys(CTRL_C)
        await d.until(lambda: not d.ctl.busy, timeout=20)
        assert any(t.name.startswith("simagent-turn-") and t not in before
                   for t in threading.enumerate()), \
            "the prompt came back only after the model answered"
        assert "turn was abandoned" in d.text()
        await d.type("again")
        await d.enter()
        await d.idle()
        assert "next one is fine" in d.text()
        await asyncio.sleep(6)  # the late reply arrives, and is dropped
        assert "LATE-ANSWER" not in d.text()

    drive(workspace, scenario, model=model)


@pytest.mark.slow
def test_shift_tab_cycles_approval_and_resume_shows_history(workspace, tmp_path):
    model = script(tmp_path / "s.json", [{"final": "first answer"}])

    async def first(d: Driver) -> None:
        await d.type("question one")
        await d.enter()
        await d.idle()
        assert d.ctl.session.approval == "ask"
        await d.keys(SHIFT_TAB)
        await d.expect(lambda: d.ctl.session.approval == "workspace")
        await d.keys(SHIFT_TAB)
        await d.expect(lambda: d.ctl.session.approval == "auto")

    ctl = drive(workspace, first, model=model, approval="ask")
    again = script(tmp_path / "t.json", [{"final": "second"}])

    async def second(d: Driver) -> None:
        screen = d.text()
        assert "› question one" in screen and "first answer" in screen
        assert f"resumed session {ctl.session.id}" in screen

    drive(workspace, second, model=again, resume=ctl.session.id)


@pytest.mark.slow
@pytest.mark.parametrize("columns", [10, 40])
def test_narrow_terminal_renders_without_error(workspace, tmp_path, columns):
    from prompt_toolkit.data_structures import Size

    model = script(tmp_path / "s.json", [
        {"tool": "run_python", "args": {"code": "print('\\x1b[31m' + 'w' * 500 + "
                                                "'\\x1b[0m <b>[red]x[/red]</b>')"}},
        {"final": "| a | b |\n|---|---|\n| 宽字符宽字符 | 2 |"}])

    class Narrow(DummyOutput):
        def get_size(self) -> Size:
            return Size(rows=12, columns=columns)

    async def scenario(d: Driver) -> None:
        await d.type("go")
        await d.enter()
        await d.idle()
        await d.keys(CTRL_O)
        await d.expect(lambda: d.ui.expanded)
        await asyncio.sleep(0.1)
        rows = d.ui.rows()
        flat = "".join(t for r in rows for _, t in r).replace(" ", "")
        assert "<b>[red]x[/red]</b>" in flat and "\x1b" not in flat
        from simagent.tui.text import cells

        assert all(cells("".join(t for _, t in r)) <= columns for r in rows)
        assert d.ui._transcript_fragments()  # the visible slice draws
        status = "".join(t for _, t in d.ui._status_fragments())
        assert cells(status) == columns

    drive(workspace, scenario, output=Narrow(), model=model)


@pytest.mark.slow
def test_cost_ceiling_notices_reset_command_and_input_keys(workspace, tmp_path):
    (workspace / ".simagent").mkdir()
    write_config(workspace, "[context]\nmax_turn_tokens = 9000\n")
    model = script(tmp_path / "s.json", [
        {"tool": "run_python", "args": {"code": "print('first call')"}},
        {"final": "never reached"}, {"final": "after the reset"}])

    async def scenario(d: Driver) -> None:
        await d.type("line one")
        await d.keys("\x1b\r")  # Alt+Enter: a new line, not a send
        await d.type("line two")
        assert d.ui.input.text == "line one\nline two" and not d.ctl.busy
        await d.enter()
        await d.idle()
        screen = d.text()
        assert "› line one\n  line two" in screen
        assert "! cost ceiling reached: this turn used" in screen
        assert screen.count("cost ceiling reached") == 1  # the guard's notice is not repeated
        await d.type("again")
        await d.enter()
        await d.idle()
        assert "! cost ceiling: turn refused" in d.text()
        await d.type("/resume-after-cost-ceiling")
        await d.enter()
        await d.expect(lambda: "cost ceiling reset" in d.text())
        await d.keys("\x10")  # ctrl+P: history, newest first
        await d.expect(lambda: d.ui.input.text == "/resume-after-cost-ceiling")
        await d.keys("\x10")
        await d.expect(lambda: d.ui.input.text == "again")
        await d.keys("\x0e")  # ctrl+N
        await d.expect(lambda: d.ui.input.text == "/resume-after-cost-ceiling")

    drive(workspace, scenario, model=model)


@pytest.mark.real
def test_a_failing_command_is_a_notice_and_a_quit_mid_turn_is_clean(workspace, tmp_path,
                                                                   monkeypatch):
    from simagent.tui import slash

    def broken(ctl, arg):
        raise OSError("disk on fire")

    monkeypatch.setattr(slash, "cmd_skills", broken)
    model = script(tmp_path / "s.json", [
        {"tool": "run_python", "args": {"code": "import time\ntime.sleep(30)"}},
        {"final": "never"}])

    async def scenario(d: Driver) -> None:
        await d.type("/skills")
        await d.enter()
        await d.expect(lambda: "/skills failed: OSError: disk on fire" in d.text())
        assert d.ui.app.is_running
        await d.type("sleep")
        await d.keys(ENTER)
        await d.until(lambda: bool(d.ctl.conversation.running_cards())
                      and d.ctl.session.kernel_state == "busy")
        await d.type("/quit")
        await d.keys(ENTER)
        await d.until(lambda: not d.ui.app.is_running)

    ctl = drive(workspace, scenario, model=model)  # /quit mid-turn, in run_tui's order
    from simagent.trace import TraceLog

    with TraceLog(ctl.session.paths.trace, readonly=True) as log:
        errors = [e.payload["message"] for e in log.events(["error"])]
        ends = [e.payload["reason"] for e in log.events(["session_end"])]
    assert errors == ["turn cancelled by the user"] and ends == ["exit"]


@pytest.mark.slow
def test_an_approval_whose_resume_is_refused_stays_pending(workspace, tmp_path):
    (workspace / ".simagent").mkdir()
    model = script(tmp_path / "s.json", [
        {"tool": "write_file", "args": {"file_path": "a.txt", "content": "x\n"}},
        {"final": "written"}])

    async def scenario(d: Driver) -> None:
        await d.type("write it")
        await d.keys(ENTER)
        await d.until(lambda: bool(d.ctl.conversation.pending_approvals()))
        await d.idle()
        # trip the ceiling by hand: the resume is refused before it reaches the graph
        d.ctl.session.trace.append("cost_ceiling", {"action": "tripped", "scope": "session",
                                                    "limit": 1, "spent": 2, "unit": "tokens",
                                                    "message": "cost ceiling reached: test"})
        await d.type("y")
        await d.enter()
        await d.idle()
        assert "turn refused" in d.text()
        assert [e.name for e in d.ctl.conversation.pending_approvals()] == ["write_file"]
        assert not (workspace / "a.txt").exists()
        await d.type("/resume-after-cost-ceiling")
        await d.enter()
        await d.expect(lambda: "cost ceiling reset" in d.text())
        await d.type("y")
        await d.enter()
        await d.idle()
        assert (workspace / "a.txt").read_text() == "x\n" and "written" in d.text()

    drive(workspace, scenario, model=model, approval="ask")
