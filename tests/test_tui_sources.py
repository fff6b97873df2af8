"""The TUI's final answer with its numbers' sources (pure: entries and rows): markers in
the answer, a sources block under it, and ctrl+O's lines of each source."""

from __future__ import annotations

from simagent.context.provenance.engine import Source, trace
from simagent.presentation.footnotes import TracedAnswer
from simagent.trace.log import Event
from simagent.tui.entries import AssistantEntry, Conversation, UserEntry, answer_sources
from simagent.tui.history import history_entries, history_footnotes
from simagent.tui.render import RenderCache, render_entry

OUT = Source("output", "fitting\nk_fit = 0.31647\ntau_ms = 2.6753\ndone", 3)


def _text(rows) -> str:
    return "\n".join("".join(t for _, t in row) for row in rows)


def _answered() -> tuple[Conversation, AssistantEntry]:
    conv = Conversation()
    conv.add(UserEntry("fit it"))
    answer = "k is 0.316 and tau 2.68, 2.36 apart; R0 is 3.9."
    entry = conv.add(AssistantEntry(answer))
    traced = TracedAnswer(answer, trace(answer, [OUT]), (OUT,))
    conv.footnote(*answer_sources(traced))
    return conv, entry


def test_the_answer_is_marked_and_its_sources_follow_it():
    _conv, entry = _answered()
    assert entry.footnoted is not None
    assert entry.footnoted.statuses == ("sourced", "sourced", "derived", "unsourced")
    shown = _text(render_entry(entry, 100, False, 0.0))
    assert "k is 0.316¹ and tau 2.68², 2.36³ apart; R0 is 3.9[?]." in shown
    assert "Sources · ctrl+O shows their lines" in shown
    assert "¹ cell 3, output line 2: k_fit = 0.31647" in shown
    assert "³ = ² - ¹ (difference)" in shown
    assert "[?] no cell printed this number" in shown
    assert "│" not in shown  # the lines wait for ctrl+O


def test_ctrl_o_shows_the_lines_around_each_source_line():
    _conv, entry = _answered()
    shown = _text(render_entry(entry, 100, True, 0.0))
    lines = [ln.strip() for ln in shown.splitlines()]
    at = lines.index("¹ cell 3, output line 2: k_fit = 0.31647")
    assert lines[at + 1:at + 5] == ["1 │ fitting", "2 │ k_fit = 0.31647",
                                    "3 │ tau_ms = 2.6753", "4 │ done"]


def test_footnotes_land_on_this_turns_answer_only_and_redraw_once():
    conv = Conversation()
    old = conv.add(AssistantEntry("earlier 0.316"))
    conv.add(UserEntry("again"))
    answer = "k is 0.316."
    conv.footnote(*answer_sources(TracedAnswer(answer, trace(answer, [OUT]), (OUT,))))
    assert old.footnoted is None  # no answer since the person spoke: nothing marked
    entry = conv.add(AssistantEntry(answer))
    cache = RenderCache()
    before = _text(cache.render(conv.entries, 80, False, 0.0))
    conv.footnote(*answer_sources(TracedAnswer(answer, trace(answer, [OUT]), (OUT,))))
    after = _text(cache.render(conv.entries, 80, False, 0.0))
    assert "0.316¹" not in before and "0.316¹" in after and entry.footnoted is not None
    narrow = _text(render_entry(entry, 12, True, 0.0))  # a narrow terminal: no error
    assert "¹" in narrow


def test_a_resumed_session_shows_each_turns_answer_with_its_sources(tmp_path):
    raw = tmp_path / "0002.txt"
    raw.write_text("k_fit = 0.31647\n")
    events = [Event(1, "t", "message_user", {"content": "fit"}),
              Event(2, "t", "message_assistant", {"content": "First 7.5 steps.",
                                                  "agent": "main"}),
              Event(3, "t", "kernel_exec", {"code": "fit()", "raw_path": str(raw)}),
              Event(4, "t", "message_assistant", {"content": "k is 0.316; R0 is 3.9.",
                                                  "agent": "main"}),
              Event(5, "t", "message_user", {"content": "thanks"}),
              Event(6, "t", "message_assistant", {"content": "You're welcome.",
                                                  "agent": "main"})]
    shown = history_entries(events)
    _first, final, _last = [e for e in shown if not isinstance(e, UserEntry)]
    assert final.footnoted is None  # drawn at once as written; footnotes come after
    ((entry, footnoted, lines),) = history_footnotes(events, shown)
    assert entry is final  # not the turn's first message, nor an answer without numbers
    entry.footnoted, entry.lines = footnoted, lines
    assert footnoted.statuses == ("sourced", "unsourced")
    assert "k is 0.316¹; R0 is 3.9[?]." in _text(render_entry(final, 80, False, 0.0))
    assert lines == {1: [(1, "k_fit = 0.31647")]}
    assert history_footnotes(events, shown[-1:]) == []  # only the answers shown
