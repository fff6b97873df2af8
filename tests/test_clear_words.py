"""The model's words beside a cleared exchange are cut to their first sentence (issue 31:
the conversation layer was 40 % of simagent's excess over the oracle at 128k, most of it
the model's own earlier words). Pure functions of ``context.clearing``, then the rule on
the real graph with the scripted model."""

from __future__ import annotations

import re

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from simagent.context import clearing as cl
from simagent.context.counting import count_message
from simagent.context.epoch_cost import InputPrices

WORDS = ("Cu comes out at a0 = 3.5898 A and B = 134.31 GPa. The window matters more "
         "for Au than for Cu: at 8 % Murnaghan falls to 170 GPa while Vinet holds. " * 4)
ROWS = "row 1.2345 2.3456\n" * 100


def _call(i: int, name: str = "run_python") -> dict:
    return {"name": name, "id": f"c{i}", "args": {"code": f"x{i} = 1"}}


def _result(i: int) -> ToolMessage:
    return ToolMessage(f"{i} {ROWS}", tool_call_id=f"c{i}",
                       artifact={"raw_path": f"/s/outputs/{i + 1:04d}.txt"})


def _thread(n: int, words: str = WORDS) -> list:
    msgs: list = [HumanMessage("go")]
    for i in range(n):
        msgs += [AIMessage(words, tool_calls=[_call(i)]), _result(i)]
    return msgs


def test_headline_is_the_first_sentence_within_the_limit_and_stable():
    assert cl.headline(WORDS) == "Cu comes out at a0 = 3.5898 A and B = 134.31 GPa. …"
    assert cl.headline("Only one line") == "Only one line"
    assert cl.headline("Plan:\n- a\n- b") == "Plan: …"
    assert cl.headline("Ag: a0 = 4.0636 A. Then Au.") == "Ag: a0 = 4.0636 A. …"
    long = cl.headline("word " * 100)
    assert long.endswith(" …") and len(long) <= cl.WORDS_KEEP_CHARS + 2
    for text in (WORDS, "word " * 100, "Plan:\n- a"):  # cutting twice changes nothing
        assert cl.headline(cl.headline(text)) == cl.headline(text)


def test_only_messages_whose_calls_are_all_cleared_lose_their_words():
    attempt = {"name": "record_attempt", "id": "a", "args": {"rationale": "r"}}
    msgs = [HumanMessage("go"),
            AIMessage(WORDS, tool_calls=[_call(0)]), _result(0),
            AIMessage(WORDS, tool_calls=[_call(1), _call(2, "grep")]), _result(1),
            ToolMessage("no match", tool_call_id="c2"),
            AIMessage(WORDS, tool_calls=[attempt]), ToolMessage("attempt #1", tool_call_id="a"),
            AIMessage("", tool_calls=[_call(3)]), _result(3),
            AIMessage(WORDS, tool_calls=[{**attempt, "id": "b"}]),
            ToolMessage("attempt #2", tool_call_id="b")]
    # c1's message also made c2's call, which is not cleared; c3's said nothing; the
    # attempt log's call is never cleared: its words go once a result after it is (a),
    # not before (b)
    assert cl.clearable_words(msgs, {"c0", "c1", "c3"}) == {"words:c0", "words:a"}
    assert cl.clearable_words(msgs, {"c0", "c1"}) == {"words:c0"}
    assert cl.clearable_words(msgs, {"c0", "c1", "c2", "c3"}) == {
        "words:c0", "words:c1", "words:a"}
    assert cl.clearable_inputs(msgs, {"c0"}, words=True) == {"c0", "words:c0"}
    assert cl.clearable_inputs(msgs, {"c0"}) == {"c0"}


def test_the_view_cuts_keyed_words_and_keeps_calls_and_their_pairing():
    msgs = _thread(2)
    view = cl.apply_cleared(msgs, {"c0"}, {"c0", "words:c0"})
    first, second = view[1], view[3]
    assert first.content == cl.headline(WORDS)
    assert first.tool_calls[0]["id"] == "c0"
    assert first.tool_calls[0]["args"]["code"].startswith("# code cleared")
    assert second.content == WORDS  # not keyed: untouched
    assert msgs[1].content == WORDS  # the stored messages stay as they are
    blocks = AIMessage([{"type": "text", "text": WORDS}, {"type": "text", "text": "more"},
                        {"type": "tool_use", "id": "c0", "name": "run_python",
                         "input": {"code": "x0 = 1"}}], tool_calls=[_call(0)])
    cut = cl.without_words(blocks)
    assert [b.get("type") for b in cut.content] == ["text", "tool_use"]
    assert cut.content[0]["text"] == cl.headline(WORDS)


def test_an_epoch_counts_the_words_it_cuts_and_changes_the_prefix_from_their_message():
    msgs = _thread(6)
    prices = InputPrices(read=0.1, write=1.25, family="anthropic")
    kw = dict(total_tokens=0, trigger=None, keep=1, min_freed=1, prices=prices,
              clear_inputs=True)
    plain = cl.decide_epoch(msgs, set(), **kw)[2]
    worded = cl.decide_epoch(msgs, set(), words=True, **kw)[2]
    gain = count_message(msgs[1]) - count_message(cl.without_words(msgs[1]))
    assert gain > 0 and worded.freed == plain.freed + 5 * gain
    saved, inputs = cl.savings(msgs, cl.candidates(msgs, set(), keep=1), clear_inputs=True,
                               words=True)
    assert {f"words:c{i}" for i in range(5)} <= inputs and sum(saved.values()) == worded.freed
    assert worded.rewrite == plain.rewrite - 5 * gain  # the code changed the same message
    # without clear_inputs nothing of the model's side goes
    off = cl.decide_epoch(msgs, set(), words=True, **{**kw, "clear_inputs": False})[2]
    assert off.freed == cl.decide_epoch(msgs, set(), **{**kw, "clear_inputs": False})[2].freed


def test_cut_words_move_the_first_change_to_their_message():
    msgs: list = [HumanMessage("go")]
    for i in range(6):  # grep's input stays: only the words change the AI messages
        msgs += [AIMessage(WORDS, tool_calls=[_call(i, "grep")]),
                 ToolMessage(ROWS, tool_call_id=f"c{i}")]
    kw = dict(total_tokens=0, trigger=None, keep=1, min_freed=1, clear_inputs=True,
              prices=InputPrices(read=0.1, write=1.25, family="anthropic"))
    plain = cl.decide_epoch(msgs, set(), **kw)[2]
    worded = cl.decide_epoch(msgs, set(), words=True, **kw)[2]
    gain = count_message(msgs[1]) - count_message(cl.without_words(msgs[1]))
    assert worded.rewrite == plain.rewrite + count_message(msgs[1]) - 5 * gain


def test_words_already_cut_free_nothing_more():
    msgs = _thread(4)
    view = cl.apply_cleared(msgs, {"c0", "c1"}, cl.clearable_inputs(msgs, {"c0", "c1"},
                                                                      words=True))
    saved, _ = cl.savings(view, [view[6]], clear_inputs=True, cleared={"c0", "c1"},
                          words=True)
    alone, _ = cl.savings(view, [view[6]], clear_inputs=True)
    gain = count_message(msgs[5]) - count_message(cl.without_words(msgs[5]))
    assert saved["c2"] == alone["c2"] + gain  # c2's own words only


# ------------------------------------------------------------ on the real graph
def test_after_an_epoch_the_requests_carry_the_headlines_of_cleared_exchanges(workspace):
    from langchain_core.tools import tool

    from simagent.agent.builder import build_agent
    from simagent.agent.runner import TurnRunner
    from simagent.agent.scripted import ScriptedChatModel
    from simagent.context.settings import ContextSettings
    from simagent.session import Session

    @tool("dump")
    def dump(n: int) -> str:
        """Return n characters of numeric rows."""
        return (ROWS * (n // len(ROWS) + 1))[:n]

    steps = [{"say": f"Step {i}: the rows look flat. " + WORDS, "tool": "dump",
              "args": {"n": 4000}} for i in range(30)] + [{"final": "done"}]
    session = Session.create(workspace, approval="auto")
    try:
        model = ScriptedChatModel.from_steps(steps, window=128_000, enforce_window=True)
        settings = ContextSettings(summarize=False, cost_model="anthropic:claude-sonnet-4-5")
        agent = build_agent(session, model, extra_tools=[dump], context_settings=settings)
        assert TurnRunner(session, agent).run("go").status == "done"
        clears = [e.payload for e in session.trace.events(["context_clear"])]
        assert clears and clears[-1]["words_cut"] > 0
        last = model.requests[-1]
        said = [m for m in last if isinstance(m, AIMessage) and m.tool_calls]
        cleared = {m.tool_call_id for m in last if cl.is_cleared(m)}
        for m in said:
            if all(c["id"] in cleared for c in m.tool_calls):
                assert re.fullmatch(r"Step \d+: the rows look flat\. …", m.content)
            else:
                assert WORDS in m.content
        assert any(WORDS not in m.content for m in said)
        # the graph's state keeps every word: only the view is cut
        state = agent.graph.get_state(session.thread_config).values
        kept = [m for m in state["messages"] if isinstance(m, AIMessage) and m.tool_calls]
        assert all(WORDS in m.content for m in kept)
    finally:
        session.close()


def test_words_beside_the_attempt_log_count_in_the_epoch_that_passes_them():
    msgs = _thread(3)
    msgs[3:3] = [AIMessage(WORDS, tool_calls=[{"name": "record_attempt", "id": "a",
                                                "args": {"rationale": "r"}}]),
                 ToolMessage("attempt #1 recorded", tool_call_id="a")]
    todo = cl.candidates(msgs, set(), keep=1)
    assert [m.tool_call_id for m in todo] == ["c0", "c1"]
    saved, inputs = cl.savings(msgs, todo, clear_inputs=True, words=True)
    plain, _ = cl.savings(msgs, todo, clear_inputs=True)
    gain = count_message(msgs[3]) - count_message(cl.without_words(msgs[3]))
    assert "words:a" in inputs and sum(saved.values()) == sum(plain.values()) + 3 * gain
