"""The rent counts the reads expected to come (issue 31 §2): a stale result kept stays in
view for the rest of the session, estimated as long again as the session has run
(``epoch_cost.horizon``). Pure functions, without a kernel; figures worked by hand."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from simagent.context import clearing as cl
from simagent.context.counting import count_message
from simagent.context.epoch_cost import InputPrices, epoch_cost, horizon

OPENAI = InputPrices(read=0.1, write=1.0, family="openai")
ROWS = "row 1.2345 2.3456\n" * 100


def _thread(n: int) -> list:
    """``n`` steps of a small clearable result beside a big kept one (a subagent's
    digest): each epoch frees little and rewrites much."""
    msgs: list = [HumanMessage("go")]
    for i in range(n):
        msgs += [AIMessage("", tool_calls=[{"name": "grep", "id": f"c{i}",
                                            "args": {"pattern": "x"}},
                                           {"name": "task", "id": f"t{i}",
                                            "args": {"description": "digest"}}]),
                 ToolMessage(f"{i} {ROWS}", tool_call_id=f"c{i}"),
                 ToolMessage(f"{i} {ROWS}", tool_call_id=f"t{i}")]
    return msgs


def test_the_horizon_is_the_replies_so_far():
    assert horizon(_thread(0)) == 0
    assert horizon(_thread(5)) == 5
    assert horizon([HumanMessage("go"), AIMessage("done")]) == 1


def test_the_rent_is_the_more_of_reads_paid_and_reads_expected():
    sizes = [10, 100, 10, 100, 10, 100]
    paid = epoch_cost(sizes, 1, {"a": 90}, {"a": 3}, OPENAI)
    assert paid.rent == pytest.approx(27) and not paid.pays  # price 0.9 x 230 = 207
    ahead = epoch_cost(sizes, 1, {"a": 90}, {"a": 3}, OPENAI, horizon=30)
    assert ahead.rent == pytest.approx(0.1 * 90 * 30) and ahead.pays
    assert ahead.price == paid.price  # the epoch costs the same either way
    # reads already paid count when they are more than those expected
    assert epoch_cost(sizes, 1, {"a": 90}, {"a": 40}, OPENAI, horizon=30).rent == \
        pytest.approx(0.1 * 90 * 40)


def _due_at(**kw) -> int:
    for n in range(3, 60):
        msgs = _thread(n)
        total = sum(count_message(m) for m in msgs)
        if cl.decide_epoch(msgs, set(), total_tokens=total, trigger=None, keep=1,
                           min_freed=1, prices=OPENAI, **kw)[1] == "cost":
            return n
    raise AssertionError("no epoch")


def test_a_long_session_clears_sooner_with_the_expected_reads():
    plain, expected = _due_at(), _due_at(expect=True)
    assert expected < plain
    # at the first due epoch the expected reads pay for it and the paid ones do not
    msgs = _thread(expected)
    total = sum(count_message(m) for m in msgs)
    kw = dict(total_tokens=total, trigger=None, keep=1, min_freed=1, prices=OPENAI)
    cost = cl.decide_epoch(msgs, set(), expect=True, **kw)[2]
    assert cost.rent == pytest.approx(0.1 * cost.freed * horizon(msgs))
    assert cl.decide_epoch(msgs, set(), **kw)[2].rent < cost.price <= cost.rent
