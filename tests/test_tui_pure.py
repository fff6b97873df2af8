"""The TUI's pure cores: commands table, text shaping, entries, renderers, status bar."""

from __future__ import annotations

import re

import pytest
from conftest import sample
from hypothesis import given, settings
from hypothesis import strategies as st

from simagent.agent.events import (
    ContextEvent,
    Interrupt,
    Notice,
    ReasoningDelta,
    TextDelta,
    ToolFinished,
    ToolOutput,
    ToolStarted,
)
from simagent.context.panel import ALERT_PERCENT, WARNING_PERCENT
from simagent.tui import commands, slash
from simagent.tui.entries import (
    ApprovalEntry,
    AssistantEntry,
    Conversation,
    NoticeEntry,
    PanelEntry,
    ReasoningEntry,
    ToolCard,
    UserEntry,
)
from simagent.tui.history import history_entries
from simagent.tui.render import action_preview, render_conversation
from simagent.tui.status import StatusSnapshot, status_fragments
from simagent.tui.text import cells, sanitize, wrap

HOSTILE = [
    "<b>bold?</b> [red]rich markup[/red] {{fmt}} %s \\x1b",
    "\x1b[31mred\x1b[0m \x1b[2J\x1b[H cleared? \x1b]0;title\x07 bell\x07",
    "x" * 5000,
    "宽字符" * 300,
    "tab\there\r\noverwritten\rfinal",
    "\x00\x01\x02 nul and friends \x7f\u200b",
    "rm -rf \u202e/ tsil\u202c bidi \u2066override\u2069",
]


def text_of(rows) -> str:
    return "\n".join("".join(t for _, t in row) for row in rows)


# ------------------------------------------------------------------- commands
def test_every_command_spec_resolves_to_a_handler_and_a_completion_source():
    names = set()
    for spec in commands.COMMANDS:
        assert callable(getattr(slash, spec.handler)), spec.handler
        if spec.source:
            assert callable(getattr(slash, spec.source)), spec.source
        assert commands.find(spec.name) is spec
        for alias in spec.aliases:
            assert commands.find(alias) is spec
        assert spec.name in commands.help_text()
        names.add(spec.name)
    required = {"/help", "/context", "/compact", "/done", "/model", "/reset", "/interrupt",
                "/memory", "/skills", "/sessions", "/transcript", "/approval",
                "/resume-after-cost-ceiling", "/clear", "/quit"}
    assert required <= names


def test_command_completion_and_argument_completion():
    def source(name):
        return {"complete_approval": [("ask", "a"), ("workspace", "w"), ("auto", "x")],
                "complete_models": [("replay:canary", "demo"), ("openai:gpt-5", "")]}[name]

    got = [c for c, _, _ in commands.completions("/c", source)]
    assert got == ["/context", "/compact", "/clear"]
    assert list(commands.completions("/approval a", source)) == [
        ("ask", -1, "a"), ("auto", -1, "x")]
    assert [c for c, _, _ in commands.completions("/model rep", source)] == ["replay:canary"]
    assert list(commands.completions("hello /c", source)) == []
    assert list(commands.completions("/nosuch x", source)) == []


def test_parse_and_unknown_command_hint():
    spec, arg = commands.parse("/compact  keep the fit results ")
    assert spec is not None and spec.name == "/compact" and arg == "keep the fit results"
    assert commands.parse("/EXIT")[0].name == "/quit"
    assert commands.parse("/conte")[0] is None
    assert "did you mean /context" in commands.suggestion("/conte")


# ----------------------------------------------------------------------- text
def test_sanitize_removes_escapes_and_controls_and_keeps_markup_literal():
    out = sanitize(HOSTILE[1])
    assert "\x1b" not in out and "\x07" not in out and "red" in out
    assert sanitize("progress 10%\rprogress 100%\n") == "progress 100%\n"
    assert sanitize(HOSTILE[0]) == HOSTILE[0]
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", sanitize(HOSTILE[5]))
    assert sanitize(HOSTILE[6]) == "rm -rf / tsil bidi override"  # no reordering tricks


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300), st.integers(min_value=1, max_value=40))
def test_wrap_never_exceeds_the_width(text, width):
    for line in sanitize(text).split("\n"):
        rows = wrap(line, width)
        assert rows
        assert all(cells(r) <= width for r in rows), rows


# -------------------------------------------------------------------- entries
def test_conversation_folds_a_turn_into_entries():
    conv = Conversation()
    conv.add(UserEntry("fit it"))
    for ev in [ReasoningDelta("let me think"), ReasoningDelta(" more"), TextDelta("Running"),
               ToolStarted("c1", "run_python", {"code": "fit()"}),
               ToolOutput("c1", "stdout", "step 1\n"),
               ToolOutput("c1", "stderr", "10%|#   |\r50%|#####|\r100%|##########|"),
               ToolOutput("c1", "human", "Dask dashboard: http://127.0.0.1:8787/status\n"),
               ToolFinished("c1", "run_python", "success", "Out[1]: 3.2", 1.5,
                            raw_path="/tmp/out.txt"),
               TextDelta("Done: "), TextDelta("k = 3.2")]:
        conv.apply(ev)
    kinds = [type(e).__name__ for e in conv.entries]
    assert kinds == ["UserEntry", "ReasoningEntry", "AssistantEntry", "ToolCard",
                     "NoticeEntry", "AssistantEntry"]
    reasoning, card = conv.entries[1], conv.cards["c1"]
    assert reasoning.done and reasoning.text == "let me think more"
    assert card.status == "success" and card.raw_path == "/tmp/out.txt"
    assert card.rendered(10) == "step 1\n100%|##########|"  # the bar redrew in place
    assert conv.entries[4].level == "human"
    assert conv.entries[-1].text == "Done: k = 3.2"


def test_guard_notice_is_not_repeated_after_its_context_line():
    conv = Conversation()
    conv.apply(ContextEvent("watchdog_alert", {"tool": "run_python", "repeats": 4}))
    conv.apply(Notice("watchdog: same call 4 times", "warning"))
    conv.apply(Notice("kernel restarted", "warning"))
    texts = [e.text for e in conv.entries]
    assert len(texts) == 2 and texts[0].startswith("! watchdog") and texts[1] == \
        "kernel restarted"


def test_interrupt_becomes_one_approval_per_action():
    conv = Conversation()
    conv.apply(Interrupt("i1", [{"name": "execute", "args": {"command": "ls"}},
                                {"name": "write_file", "args": {"file_path": "a.txt"}}],
                         [{"allowed_decisions": ["approve", "reject"]}, {}]))
    pending = conv.pending_approvals()
    assert [(p.name, p.index) for p in pending] == [("execute", 0), ("write_file", 1)]
    assert pending[0].allowed == ("approve", "reject")


def test_end_turn_marks_unfinished_cards_cancelled():
    conv = Conversation()
    conv.apply(ToolStarted("c1", "run_python", {"code": "sleep(30)"}))
    conv.end_turn()
    assert conv.cards["c1"].status == "cancelled" and not conv.running_cards()


# ------------------------------------------------------------------ rendering
def _turn() -> list:
    card = ToolCard("c1", "run_python", {"code": "import numpy as np\nprint(np.pi)"})
    card.status, card.elapsed_s = "success", 0.4
    card.content = "\n".join(f"row {i}" for i in range(100))
    card.raw_path = "/state/outputs/exec-7.txt"
    return [UserEntry("compute"), card, AssistantEntry("**pi** is 3.14")]


def test_collapsed_card_is_one_line_and_ctrl_o_expands_it_bounded():
    collapsed = render_conversation(_turn(), 80, expanded=False, now=0)
    text = text_of(collapsed)
    assert "✓ run_python" in text and "import numpy as np" in text and "row 99" in text
    assert "row 50" not in text and "print(np.pi)" not in text
    expanded = text_of(render_conversation(_turn(), 80, expanded=True, now=0))
    assert "print(np.pi)" in expanded and "row 99" in expanded and "row 61" in expanded
    assert "row 10\n" not in expanded
    assert "… 60 earlier lines not shown; full output: /state/outputs/exec-7.txt" in expanded


def test_running_card_shows_code_and_a_live_tail():
    card = ToolCard("c1", "run_python", {"code": "\n".join(f"l{i} = {i}" for i in range(20))})
    card.status, card.started = "running", 0.0
    card.feed("stdout", "".join(f"out {i}\n" for i in range(30)))
    text = text_of(render_conversation([card], 60, expanded=False, now=2.5))
    assert "2.5s" in text and "l0 = 0" in text and "more lines of code" in text
    assert "out 29" in text and "out 5\n" not in text


@pytest.mark.slow
@pytest.mark.sampled
@settings(max_examples=sample(30, 120), deadline=None)  # narrow and expanded: 0.3 s each
@given(st.sampled_from(HOSTILE), st.integers(min_value=1, max_value=30),
       st.booleans())
def test_hostile_text_never_breaks_the_layout(hostile, width, expanded):
    card = ToolCard("c1", "run_python", {"code": hostile})
    card.status = "error"
    card.feed("stdout", hostile)
    card.content = hostile
    live = ToolCard("c2", "run_python", {"code": "\n".join([hostile] * 12)},
                    status="running", started=0.0)
    live.feed("stderr", hostile)
    entries = [UserEntry(hostile), AssistantEntry(f"- {hostile}\n> {hostile}"), card, live,
               NoticeEntry(hostile), PanelEntry(hostile, hostile),
               ReasoningEntry(hostile, done=True), ReasoningEntry(hostile),
               ApprovalEntry("i", 0, "write_file", {"file_path": hostile,
                                                    "content": "\n".join([hostile] * 50)})]
    rows = render_conversation(entries, width, expanded, now=0)
    for row in rows:
        line = "".join(t for _, t in row)
        assert cells(line) <= width, (width, line)
        assert "\x1b" not in line and "\r" not in line
    literal = text_of(render_conversation([UserEntry(HOSTILE[0])], 200, False, now=0))
    assert "<b>bold?</b> [red]rich markup[/red]" in literal


def test_approval_preview_is_a_diff_of_the_file_change():
    diff = action_preview("write_file", {"file_path": "a.py", "content": "x = 2\ny = 3\n"},
                          "x = 1\ny = 3\n")
    assert "-x = 1" in diff and "+x = 2" in diff and "a/a.py" in diff
    new = action_preview("write_file", {"file_path": "n.py", "content": "z = 1\n"}, None)
    assert "/dev/null" in new and "+z = 1" in new
    edit = action_preview("edit_file", {"file_path": "a.py", "old_string": "y = 3",
                                        "new_string": "y = 4"}, "x = 1\ny = 3\n")
    assert "-y = 3" in edit and "+y = 4" in edit
    assert action_preview("execute", {"command": "rm -rf build"}, None) == "$ rm -rf build"


# --------------------------------------------------------------------- status
def _snap(level: str, label: str = "ctx 50%", **kw) -> StatusSnapshot:
    base = dict(simulator="pybamm", model="anthropic:claude-sonnet-4-5",
                session_id="20261122-101010-abcd", approval="ask", kernel="idle",
                cost_usd=0.0123, ctx_label=label, ctx_level=level)
    base.update(kw)
    return StatusSnapshot(**base)


def test_status_bar_fields_and_context_colours():
    frags = status_fragments(_snap("dim"), 200)
    text = "".join(t for _, t in frags)
    for part in ("pybamm", "anthropic:claude-sonnet-4-5", "20261122-101010", "approval ask",
                 "kernel idle", "$0.0123", "ctx 50%"):
        assert part in text
    style = {t: s for s, t in frags}
    assert style["ctx 50%"] == "class:status.ctx"
    warn = dict((t, s) for s, t in status_fragments(_snap("warning", "ctx 75%"), 200))
    alert = dict((t, s) for s, t in status_fragments(_snap("alert", "ctx 93%"), 200))
    assert warn["ctx 75%"] == "class:status.ctx.warning"
    assert alert["ctx 93%"] == "class:status.ctx.alert"
    dead = dict((t, s) for s, t in status_fragments(_snap("dim", kernel="dead"), 200))
    assert dead["kernel dead"] == "class:status.kernel.dead"
    assert WARNING_PERCENT == 70 and ALERT_PERCENT == 90


def test_status_bar_says_working_while_a_turn_runs():
    idle = "".join(t for _, t in status_fragments(_snap("dim"), 200))
    busy = dict((t, s) for s, t in status_fragments(_snap("dim", busy=True), 200))
    assert "working" not in idle
    assert busy["● working"] == "class:status.busy"
    narrow = "".join(t for _, t in status_fragments(_snap("dim", busy=True), 24))
    assert "working" in narrow  # it goes last, with the context share


def test_status_label_levels_come_from_the_context_panel():
    from dataclasses import replace

    from simagent.context.panel import status_label
    from simagent.context.settings import ContextSettings
    from simagent.context.stats import stats_from_events

    base = stats_from_events([], settings=ContextSettings(window=100_000))
    assert base.window_known
    for used, level in ((69_999, "dim"), (70_000, "warning"), (89_999, "warning"),
                        (90_000, "alert")):
        label, got = status_label(replace(base, used=used))
        assert got == level and label == f"ctx {used * 100 // 100_000}%"


@given(st.integers(min_value=1, max_value=120))
def test_status_bar_fits_any_width(width):
    frags = status_fragments(_snap("alert", "ctx 95%"), width)
    assert cells("".join(t for _, t in frags)) == width or width < 3


def test_narrow_status_bar_keeps_the_context_share_last():
    text = "".join(t for _, t in status_fragments(_snap("alert", "ctx 95%"), 30))
    assert "ctx 95%" in text and "pybamm" not in text


# -------------------------------------------------------------------- history
def test_history_rebuilds_a_resumed_conversation():
    from simagent.trace.log import Event

    evs = [Event(1, "t", "message_user", {"content": "hi", "turn": 1}),
           Event(2, "t", "tool_call", {"id": "c1", "name": "run_python",
                                       "args": {"code": "1+1"}, "agent": "main"}),
           Event(3, "t", "kernel_exec", {"tool_call_id": "c1", "raw_path": "/o.txt"}),
           Event(4, "t", "tool_result", {"tool_call_id": "c1", "name": "run_python",
                                         "content": "Out[1]: 2", "status": "success",
                                         "elapsed_s": 0.2, "agent": "main"}),
           Event(5, "t", "message_assistant", {"content": "It is 2.", "agent": "main"}),
           Event(6, "t", "context_clear", {"cleared": 3, "tokens_before": 9000,
                                           "tokens_after": 4000})]
    entries = history_entries(evs)
    assert [type(e).__name__ for e in entries] == ["UserEntry", "ToolCard", "AssistantEntry",
                                                    "NoticeEntry"]
    card = entries[1]
    assert card.status == "success" and card.content == "Out[1]: 2" and card.raw_path == \
        "/o.txt"
    assert "cleared 3 old tool results" in entries[3].text


def test_subagent_runs_as_a_task_card_with_its_own_tools_and_text():
    conv = Conversation()
    conv.apply(ToolStarted("t1", "task", {"subagent_type": "source-explorer",
                                          "description": "find the default solver"}))
    conv.apply(ToolStarted("r1", "read_file", {"file_path": "/pkg/solver.py"},
                           agent="source-explorer"))
    conv.apply(TextDelta("The default is BDF.", agent="source-explorer"))
    conv.apply(ToolFinished("r1", "read_file", "success", "def solve(): ...", 0.1,
                            agent="source-explorer"))
    conv.apply(ToolFinished("t1", "task", "success", '{"answer": "BDF"}', 2.0))
    text = text_of(render_conversation(conv.entries, 80, expanded=False, now=0))
    assert "task → source-explorer" in text and "find the default solver" in text
    assert "[source-explorer] read_file" in text
    assert conv.cards["t1"].notes == "The default is BDF."
    assert not any(isinstance(e, AssistantEntry) for e in conv.entries)
    expanded = text_of(render_conversation(conv.entries, 80, expanded=True, now=0))
    assert "The default is BDF." in expanded


def test_render_cache_redraws_exactly_what_changed():
    from simagent.tui.render import RenderCache

    conv = Conversation()
    conv.add(UserEntry("go"))
    conv.apply(ToolStarted("c1", "run_python", {"code": "x = 1"}))
    conv.apply(TextDelta("partial"))
    cache = RenderCache()

    def same(expanded: bool) -> None:
        assert cache.render(conv.entries, 50, expanded, now=1.0) == \
            render_conversation(conv.entries, 50, expanded, now=1.0)

    same(False)
    conv.apply(ToolOutput("c1", "stdout", "printed\n"))
    conv.apply(ToolFinished("c1", "run_python", "success", "printed", 0.3))
    conv.apply(TextDelta(" and more"))
    same(False)
    same(True)
    assert "partial and more" in text_of(cache.render(conv.entries, 50, False, now=1.0))
    same(False)
