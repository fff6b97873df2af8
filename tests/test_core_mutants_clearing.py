"""Edge cases of ``context/clearing.py`` that mutation testing (``make mutate``) showed no
behavioural test pinned down; expected values are worked out from the docstrings' rules."""

from __future__ import annotations

import json

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from simagent.context import clearing as cl
from simagent.context.counting import count_messages
from simagent.context.epoch_cost import InputPrices

RAW = "/s/outputs/0007.txt"


def call(cid: str, name: str = "run_python", code: str = "x = 1") -> AIMessage:
    return AIMessage("", tool_calls=[{"name": name, "args": {"code": code, "t": 1},
                                      "id": cid}])


def result(cid: str, text: str = "out", **kw) -> ToolMessage:
    return ToolMessage(text, tool_call_id=cid, **kw)


def test_tool_names_and_cleared_marks():
    msgs = [call("a"), AIMessage("", tool_calls=[{"name": "grep", "args": {}, "id": "b"}]),
            HumanMessage("q")]
    assert cl.tool_names(msgs) == {"a": "run_python", "b": "grep"}
    done = cl.apply_cleared([call("a"), result("a")], {"a"})[1]
    assert cl.is_cleared(done)
    assert done.response_metadata["context_editing"] == {"cleared": True,
                                                         "strategy": "simagent_epoch"}
    assert done.artifact is None
    assert not cl.is_cleared(result("a")) and not cl.is_cleared(HumanMessage("x"))
    assert not cl.is_cleared(result("a", response_metadata={"context_editing": {}}))


def test_errors_are_never_candidates():
    assert cl.is_error(result("a", status="error"))
    for status in ("error", "died", "timeout"):
        assert cl.is_error(result("a", artifact={"status": status}))
    assert not cl.is_error(result("a", artifact={"status": "ok"}))
    assert not cl.is_error(result("a"))


def _thread(n: int, text: str = "y" * 400) -> list:
    msgs: list = [HumanMessage("go")]
    for i in range(n):
        msgs += [call(f"c{i}", code="x = " + "1 + " * 40 + "1"), result(f"c{i}", f"{i} {text}",
                                       artifact={"raw_path": f"/s/outputs/{i + 1:04d}.txt"})]
    return msgs


def test_candidates_keep_the_newest_within_count_and_tokens():
    msgs = _thread(5)
    ids = lambda ms: [m.tool_call_id for m in ms]  # noqa: E731
    assert ids(cl.candidates(msgs, set(), keep=2)) == ["c0", "c1", "c2"]
    assert ids(cl.candidates(msgs, set(), keep=0)) == ["c0", "c1", "c2", "c3", "c4"]
    assert ids(cl.candidates(msgs, {"c1"}, keep=2)) == ["c0", "c2"]
    size = count_messages([msgs[2]])
    # room for exactly two results' tokens: the third newest goes even though keep=4
    assert ids(cl.candidates(msgs, set(), keep=4, keep_tokens=2 * size)) == ["c0", "c1",
                                                                            "c2"]
    assert ids(cl.candidates(msgs, set(), keep=4, keep_tokens=2 * size - 1)) == [
        "c0", "c1", "c2", "c3"]
    # the newest is kept even when it alone is over the token budget
    assert ids(cl.candidates(msgs, set(), keep=4, keep_tokens=1)) == ["c0", "c1", "c2", "c3"]
    excluded = [*_thread(1), call("t", "task"), result("t", "report")]
    assert ids(cl.candidates([*excluded, *_thread(1)[1:]], set(), keep=0)) == ["c0", "c0"]


#: Prices at which no epoch is ever due by cost (reads are free, so stale results pay no
#: rent): the window rule of ``decide_epoch`` alone decides.
WINDOW_ONLY = InputPrices(read=0.0, write=1.0)


def window_epoch(msgs: list, cleared: set, **kw) -> tuple:
    """``decide_epoch`` at :data:`WINDOW_ONLY` prices: (cleared or None, why, cost)."""
    new, why, cost = cl.decide_epoch(msgs, cleared, prices=WINDOW_ONLY, **kw)
    assert why in (None, "window")
    return new, why, cost


def test_a_window_epoch_is_due_only_over_the_trigger_and_the_minimum():
    msgs = _thread(4)
    nothing = (None, None)
    assert window_epoch(msgs, set(), total_tokens=100, trigger=None, keep=1,
                        min_freed=1)[:2] == nothing
    assert window_epoch(msgs, set(), total_tokens=100, trigger=100, keep=1,
                        min_freed=1)[:2] == nothing
    cleared, why, cost = window_epoch(msgs, set(), total_tokens=101, trigger=100, keep=1,
                                      min_freed=1)
    assert (cleared, why) == ({"c0", "c1", "c2"}, "window")
    names = cl.tool_names(msgs)
    expect = sum(count_messages([m]) - count_messages([cl._cleared_copy(m, names)])
                 for m in msgs if isinstance(m, ToolMessage) and m.tool_call_id != "c3")
    freed = cost.freed
    assert freed == expect > 0
    assert window_epoch(msgs, set(), total_tokens=101, trigger=100, keep=1,
                        min_freed=freed)[:2] == (cleared, "window")
    assert window_epoch(msgs, set(), total_tokens=101, trigger=100, keep=1,
                        min_freed=freed + 1)[:2] == nothing
    assert window_epoch(msgs, {"x"}, total_tokens=101, trigger=100, keep=1,
                        min_freed=1)[0] == {"x", "c0", "c1", "c2"}
    assert window_epoch(msgs, set(), total_tokens=101, trigger=100, keep=4,
                        min_freed=0)[:2] == nothing  # nothing to clear
    with_inputs = window_epoch(msgs, set(), total_tokens=101, trigger=100, keep=1,
                               min_freed=1, clear_inputs=True)
    assert with_inputs[0] == cleared and with_inputs[2].freed > freed
    small = window_epoch(msgs, set(), total_tokens=101, trigger=100, keep=1, min_freed=1,
                         keep_tokens=1)
    assert small[0] == cleared


def test_apply_cleared_swaps_results_and_inputs_and_leaves_the_rest():
    msgs = _thread(2)
    assert cl.apply_cleared(msgs, set()) == msgs
    view = cl.apply_cleared(msgs, {"c0"}, {"c0"})
    assert view[2].content == "[result cleared; full output: _out[1]]"
    assert view[1].tool_calls[0]["args"] == {"code": "# code cleared from view: _out[1].code",
                                             "t": 1}
    assert view[3] == msgs[3] and view[4] == msgs[4] and msgs[1].tool_calls[0]["args"][
        "code"].startswith("x = 1 + ")
    only_inputs = cl.apply_cleared(msgs, set(), {"c1"})
    assert only_inputs[3].tool_calls[0]["args"]["code"] == "# code cleared from view: " \
        "_out[2].code"
    again = cl.apply_cleared(view, {"c0"})
    assert again[2] is view[2]  # an already cleared result is not copied again


def test_clearable_inputs_need_a_kernel_result_naming_its_execution():
    msgs = [*_thread(1), call("g", "grep"), result("g", "hit",
                                                  artifact={"raw_path": RAW}),
            call("n"), result("n", "no path")]
    assert cl.clearable_inputs(msgs, {"c0", "g", "n"}) == {"c0"}
    assert cl.input_pointers(msgs, set()) == {}
    assert cl.input_pointers(msgs, {"c0", "n"}) == {"c0": "# code cleared from view: _out[1].code"}
    done = cl.apply_cleared(msgs, {"c0"})
    assert cl.input_pointers(done, {"c0"}) == {}  # a placeholder no longer names it


def test_swaps_in_every_wire_shape():
    p = {"a": "PTR"}
    assert cl._swapped("run_python", {"code": "x", "k": 2}, "PTR") == {"code": "PTR", "k": 2}
    assert cl._swapped("grep", {"code": "x"}, "PTR") == {"code": "x"}
    assert cl._swapped(None, {"code": "x"}, "PTR") == {"code": "x"}
    assert cl._swapped("run_python", {"other": 1}, "PTR") == {"other": 1}
    assert cl._swapped("run_python", "code", "PTR") == "code"
    assert cl._swapped_json("run_python", '{"code": "é"}', "PTR") == '{"code": "PTR"}'
    keep = '{"other": "é"}'
    assert cl._swapped_json("run_python", keep, "PTR") is keep
    assert cl._swapped_json("run_python", "{bad", "PTR") == "{bad"
    assert cl._swapped_json("run_python", None, "PTR") is None
    assert json.loads(cl._swapped_json("run_python", '{"code": "x", "n": "ü"}', "P")) == \
        {"code": "P", "n": "ü"}
    assert "ü" in cl._swapped_json("run_python", '{"code": "x", "n": "ü"}', "P")
    blocks = [{"type": "tool_use", "id": "a", "name": "run_python", "input": {"code": "x"}},
              {"type": "tool_call", "id": "a", "name": "run_python", "args": {"code": "x"}},
              {"type": "function_call", "call_id": "a", "name": "run_python",
               "arguments": '{"code": "x"}'},
              {"type": "tool_use", "id": "b", "name": "run_python", "input": {"code": "x"}},
              {"type": "tool_call", "id": "b", "name": "run_python", "args": {"code": "x"}},
              {"type": "text", "text": "hi", "id": "a"}, "plain"]
    out = [cl._swapped_block(b, p) for b in blocks]
    assert out[0]["input"] == {"code": "PTR"} and out[1]["args"] == {"code": "PTR"}
    assert out[2]["arguments"] == '{"code": "PTR"}'
    assert out[3:] == blocks[3:]


def test_without_inputs_fixes_every_copy_of_the_call():
    raw = [{"id": "a", "type": "function",
            "function": {"name": "run_python", "arguments": '{"code": "x"}'}},
           {"id": "b", "type": "function",
            "function": {"name": "run_python", "arguments": '{"code": "y"}'}}, "odd"]
    msg = AIMessage(
        [{"type": "text", "text": "t"},
         {"type": "tool_call", "id": "a", "name": "run_python", "args": {"code": "x"}}],
        tool_calls=[{"name": "run_python", "args": {"code": "x"}, "id": "a"},
                    {"name": "run_python", "args": {"code": "y"}, "id": "b"}],
        additional_kwargs={"tool_calls": raw, "other": 1})
    out = cl.without_inputs(msg, {"a": "PTR"})
    assert [c["args"] for c in out.tool_calls] == [{"code": "PTR"}, {"code": "y"}]
    assert [c["id"] for c in out.tool_calls] == ["a", "b"]
    assert out.content[1]["args"] == {"code": "PTR"} and out.content[0] == {"type": "text",
                                                                             "text": "t"}
    fixed = out.additional_kwargs["tool_calls"]
    assert fixed[0]["function"] == {"name": "run_python", "arguments": '{"code": "PTR"}'}
    assert fixed[1] == raw[1] and fixed[2] == "odd" and out.additional_kwargs["other"] == 1
    assert msg.tool_calls[0]["args"] == {"code": "x"}  # a copy
    plain = cl.without_inputs(AIMessage("s", tool_calls=msg.tool_calls), {"a": "PTR"})
    assert plain.content == "s" and "tool_calls" not in plain.additional_kwargs


# ----------------------------------------------------------------------- boundaries
def _len(ms) -> int:
    return sum(len(m.content) for m in ms)


def test_turn_starts_are_safe_real_user_messages():
    from simagent.context.boundaries import turn_starts

    summary = HumanMessage("recap", additional_kwargs={"lc_source": "summarization"})
    msgs = [HumanMessage("q"), call("a"), HumanMessage("typed while waiting"), result("a"),
            summary, AIMessage("ok"), HumanMessage("next")]
    assert turn_starts(msgs) == [0, 6]  # 2 sits inside a call group, 4 is a summary


def test_cut_keeping_tokens_exact_tails_and_the_half_rule():
    from simagent.context.boundaries import cut_keeping_tokens as cut

    h, a = HumanMessage, AIMessage
    msgs = [h("aaaa"), a("bb"), h("cccccc"), a("d")]  # tails 13, 9, 7, 1, 0
    assert cut(msgs, 13, _len) == 0
    assert cut(msgs, 9, _len) == 2  # best is 1; the turn start at 2 keeps 7 >= 9 / 2
    assert cut(msgs, 3, _len) == 3
    assert cut(msgs, 0, _len) == 3  # nothing fits: the latest safe cut, never n
    assert cut([], 5, _len) == 0
    uneven = [h("a"), a("bbb"), a("ccc"), h("d"), a("e")]  # tails 9, 8, 5, 2, 1, 0
    assert cut(uneven, 8, _len) == 1  # the turn start at 3 keeps 2 < 8 / 2
    even = [h("aaaaa"), a("bb"), h("c"), a("d")]  # tails 9, 4, 2, 1, 0
    assert cut(even, 4, _len) == 2  # 2 * 2 >= 4: exactly half still wins
    grouped = [h("q"), call("x"), result("x", "r" * 50), a("done")]
    assert cut(grouped, 10, _len) == 3  # never between the call and its result


def test_cut_keeping_messages_and_turns():
    from simagent.context.boundaries import cut_keeping_messages, cut_keeping_turns

    msgs = [HumanMessage("1"), call("a"), result("a"), AIMessage("x"), HumanMessage("2"),
            AIMessage("y"), HumanMessage("3"), AIMessage("z")]
    assert cut_keeping_messages(msgs, 2) == 6
    assert cut_keeping_messages(msgs, 6) == 1  # target 2 is inside the group
    assert cut_keeping_messages(msgs, 5) == 3
    assert cut_keeping_messages(msgs, 8) == 0 and cut_keeping_messages(msgs, 20) == 0
    assert cut_keeping_turns(msgs, 1) == 6 and cut_keeping_turns(msgs, 2) == 4
    assert cut_keeping_turns(msgs, 3) == 0 and cut_keeping_turns(msgs, 4) == 0
