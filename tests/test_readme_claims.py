"""Documentation claims, each proved by a test that fails when the claim breaks (issue 27).

The figures are read from the page that states them (README.md or docs/, where issue 37
moved the details), so the test and the claim cannot drift apart; orderings and a
hand-stepped clock stand in for wall-clock thresholds."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import write_config
from langchain_core.messages import AIMessage, BaseMessage

from simagent.agent.builder import build_agent
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.session import Session

TUI_PAGE = Path(__file__).resolve().parents[1] / "docs" / "tui.md"


def doc_figure(pattern: str, page: Path = TUI_PAGE) -> float:
    """The number a documentation sentence states (whitespace and line breaks normalised)."""
    text = " ".join(page.read_text().split())
    found = re.search(pattern, text)
    assert found, f"{page.name} no longer says {pattern!r}"
    return float(found.group(1))


class SteppedClock:
    """A monotonic clock the test moves by hand; counts reads so the test knows the
    runner has looked at a given time (an ordering, not a sleep)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.reads = 0
        self._cv = threading.Condition()

    def __call__(self) -> float:
        with self._cv:
            self.reads += 1
            self._cv.notify_all()
            return self.now

    def set(self, now: float) -> None:
        with self._cv:
            self.now = now

    def seen(self, times: int, timeout: float = 30.0) -> None:
        """Wait until the clock has been read ``times`` more times (bounded)."""
        with self._cv:
            target = self.reads + times
            assert self._cv.wait_for(lambda: self.reads >= target, timeout), \
                "the runner stopped reading its clock"


class HeldModel(ScriptedChatModel):
    """The scripted model whose first call does not answer until the test lets it: a
    provider thinking before its first token, or a stalled connection."""

    def _reply(self, messages: list[BaseMessage]) -> AIMessage:
        gate: dict[str, threading.Event] = _GATES[id(self.cursor)]
        if not gate["entered"].is_set():
            gate["entered"].set()
            gate["release"].wait(60)
        return super()._reply(messages)


_GATES: dict[int, dict[str, threading.Event]] = {}


def test_a_silent_model_is_abandoned_exactly_at_the_readme_bound(workspace):
    """"A model that has not answered within 1.5 s of the ctrl+C does not hold the
    prompt": just before the bound the turn is still waiting, at the bound it ends. With
    the limit raised to 3.5 s this fails (the turn does not end at 1.5 s)."""
    bound = doc_figure(r"has not answered within ([\d.]+) s of the ctrl\+C")
    session = Session.create(workspace, approval="auto")
    model = HeldModel.from_steps([{"final": "late reply"}, {"final": "second answer"}])
    gate = _GATES[id(model.cursor)] = {"entered": threading.Event(),
                                       "release": threading.Event()}
    runner = TurnRunner(session, build_agent(session, model))
    clock = runner.clock = SteppedClock()
    out: dict[str, Any] = {}
    ended = threading.Event()

    def turn() -> None:
        out["r"] = runner.run("think hard")
        ended.set()

    before = set(threading.enumerate())
    worker = threading.Thread(target=turn, daemon=True)
    worker.start()
    try:
        assert gate["entered"].wait(60), "the model call never began"
        runner.cancel()
        clock.seen(3)  # the cancel was seen at t0 = 1000
        clock.set(1000 + bound - 0.01)
        clock.seen(3)
        assert not ended.is_set(), "abandoned before the bound"
        clock.set(1000 + bound)
        assert ended.wait(30), f"the turn still held the prompt {bound} s after ctrl+C"
        assert out["r"].status == "cancelled"
        assert not gate["release"].is_set()  # the model had still not answered
        errors = [e.payload["message"] for e in session.trace.events(["error"])]
        assert any(m.startswith("turn abandoned") for m in errors)
    finally:
        gate["release"].set()
        worker.join(30)
        for th in set(threading.enumerate()) - before:
            if th.name.startswith("simagent-turn-"):
                th.join(30)
        session.close()
        _GATES.pop(id(model.cursor), None)
    assert not worker.is_alive()


def _requests(ctl: Any, workspace: Path) -> list[str]:
    """Every model request of the session as a provider receives it (OpenAI message
    dicts, no local ids), with what differs between two sessions made neutral: the
    session id and the scripted model's per-instance call ids (numbered by first use)."""
    from langchain_core.messages import convert_to_openai_messages

    cursor = ctl.resolved.chat_model.cursor
    out = []
    for messages, tools in zip(cursor.requests, cursor.request_tools, strict=True):
        text = json.dumps({"messages": convert_to_openai_messages(messages), "tools": tools},
                          sort_keys=True, ensure_ascii=False)
        text = text.replace(str(workspace), "<ws>").replace(ctl.session.id, "<sid>")
        for n, cid in enumerate(dict.fromkeys(re.findall(r'"(call_[0-9A-Za-z_]+)"', text))):
            text = text.replace(f'"{cid}"', f'"call#{n}"')
        out.append(text)
    return out


@pytest.mark.slow
def test_ctrl_o_is_display_only_the_next_request_is_byte_identical(tmp_path):
    """"ctrl+O expands every card (display only; the model's context is untouched)": the
    same conversation with and without ctrl+O sends byte-identical requests."""
    from test_tui_app import CTRL_O, drive, script

    steps = [{"tool": "run_python", "args": {"code": "for i in range(40):\n"
                                                     "    print('row', i * i)"}},
             {"final": "Last row: {out[-1]|row (\\d+)\\s*$}."},
             {"tool": "run_python", "args": {"code": "print(sum(range(10)))"}},
             {"final": "Sum: {out[-1]}."}]
    seen: dict[bool, list[str]] = {}
    workspace = tmp_path / "workspace"  # one workspace, a new session each time
    workspace.mkdir()
    for expand in (False, True):
        model = script(tmp_path / f"s-{expand}.json", steps)

        async def scenario(d: Any, expand: bool = expand) -> None:
            await d.type("squares")
            await d.enter()
            await d.idle()
            if expand:
                await d.keys(CTRL_O)
                await d.expect(lambda: d.ui.expanded and "row 1521" in d.text())
            await d.type("sum")
            await d.enter()
            await d.idle()
            assert d.ui.expanded is expand

        ctl = drive(workspace, scenario, model=model)
        seen[expand] = _requests(ctl, workspace)
    assert len(seen[False]) == 4  # two turns, two model calls each
    assert seen[True] == seen[False]


def _context_headline(ctl: Any) -> tuple[int, int, int, bool]:
    """(percent, used, window, estimated) as ``/context``'s panel prints them."""
    from simagent.tui.entries import PanelEntry

    panel = [e for e in ctl.conversation.entries if isinstance(e, PanelEntry)][-1].text
    found = re.search(r"(\d+)% — ([\d,]+) of ([\d,]+) tokens( \(estimated\))?", panel)
    assert found, panel
    pct, used, window = (int(found.group(i).replace(",", "")) for i in (1, 2, 3))
    return pct, used, window, bool(found.group(4))


def _trace_figure(ctl: Any) -> tuple[int, bool]:
    """What the window holds now, read from the raw trace events: the last main model
    call's input tokens, or the tokens after a later compaction (then estimated)."""
    used, estimated = None, False
    for ev in ctl.session.trace.events():
        p = ev.payload
        if (ev.kind == "model_usage" and p.get("agent", "main") == "main"
                and not p.get("dropped")):
            used, estimated = int(p["input_tokens"]), p.get("source") == "estimated"
        elif p.get("tokens_after") is not None and p.get("agent", "main") == "main":
            used, estimated = int(p["tokens_after"]), True
    assert used is not None
    return used, estimated


@pytest.mark.slow
def test_status_bar_ctx_matches_context_in_every_state(workspace, tmp_path):
    """"ctx NN% ... computed by the same function as /context": after a turn, after a
    clearing epoch, after a summary (``~``) and after the next measured call, the status
    bar and ``/context`` show the same figure, and it is the trace's."""
    from test_tui_app import drive, script

    window = 24_000
    (workspace / ".simagent").mkdir()
    write_config(workspace,
        f"[model]\nwindow = {window}\n[context]\nclear_fraction = 0.3\nclear_keep = 1\n"
        "clear_keep_fraction = 0.02\nclear_min_freed_fraction = 0.05\n")
    big = "for i in range(400):\n    print('line', i, 'x' * 60)"
    model = script(tmp_path / "s.json", [
        {"tool": "run_python", "args": {"code": big}}, {"final": "one"},
        {"tool": "run_python", "args": {"code": big.replace("line", "more")}},
        {"tool": "run_python", "args": {"code": big.replace("line", "again")}},
        {"final": "two"}, {"final": "three"}, {"final": "four"}])
    states: list[tuple[str, str, tuple[int, int, int, bool], tuple[int, bool]]] = []
    kinds: list[dict[str, int]] = []

    async def check(d: Any, name: str) -> None:
        from simagent.tui.entries import PanelEntry

        panels = sum(isinstance(e, PanelEntry) for e in d.ctl.conversation.entries)
        # the bar refreshes off the UI thread: wait (bounded) until it caught up
        await d.expect(lambda: d.ctl.stats is not None
                       and d.ctl.stats.used == _trace_figure(d.ctl)[0])
        label = d.ctl.snapshot().ctx_label
        await d.type("/context")
        await d.enter()
        await d.expect(lambda: sum(isinstance(e, PanelEntry)
                                   for e in d.ctl.conversation.entries) > panels)
        states.append((name, label, _context_headline(d.ctl), _trace_figure(d.ctl)))
        kinds.append({k: len(d.ctl.session.trace.events([k]))
                      for k in ("context_clear", "context_summary")})

    async def scenario(d: Any) -> None:
        for prompt, name in (("first", "after a turn"), ("second", "after clearing")):
            await d.type(prompt)
            await d.enter()
            await d.idle()
            await check(d, name)
        await d.type("/compact")
        await d.enter()
        await d.expect(lambda: "~ compacted" in d.text() or "nothing to compact" in d.text())
        await d.idle()
        await check(d, "after a summary")
        await d.type("third")
        await d.enter()
        await d.idle()
        await check(d, "measured again")

    drive(workspace, scenario, model=model)
    assert [s[0] for s in states] == ["after a turn", "after clearing", "after a summary",
                                      "measured again"]
    for name, label, (pct, used, shown_window, est), (traced, traced_est) in states:
        assert shown_window == window, name
        assert (used, est) == (traced, traced_est), name
        assert pct == 100 * traced // window, name
        assert label == f"ctx {'~' if est else ''}{pct}%", (name, label, pct)
    assert [s[2][3] for s in states] == [False, False, True, False]
    assert len({s[2][0] for s in states}) >= 3, states  # the states really differ
    assert kinds[0] == {"context_clear": 0, "context_summary": 0}
    assert kinds[1]["context_clear"] >= 1 and kinds[1]["context_summary"] == 0
    assert kinds[2]["context_summary"] == 1
