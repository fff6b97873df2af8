"""Clearing decided by the prompt cache's prices (issue 31 §2): the pure cost model of
``context/epoch_cost.py`` and ``clearing.decide_epoch``, without a kernel. Expected
figures are worked out by hand from the rules in the docstrings."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from simagent.context import clearing as cl
from simagent.context import thresholds as th
from simagent.context.counting import count_message
from simagent.context.epoch_cost import (
    UNPRICED,
    InputPrices,
    epoch_cost,
    first_change,
    input_prices,
    requests_since,
    stale_ages,
)
from simagent.context.settings import ContextSettings

ANTHROPIC = InputPrices(read=0.1, write=1.25, family="anthropic")
OPENAI = InputPrices(read=0.1, write=1.0, family="openai")


ROWS = "row 1.2345 2.3456\n" * 100  # ~1.1k tokens of numeric output


def _thread(n: int, text: str = ROWS) -> list:
    msgs: list = [HumanMessage("go")]
    for i in range(n):
        msgs += [AIMessage("", tool_calls=[{"name": "run_python", "id": f"c{i}",
                                            "args": {"code": "x = " + "1 + " * 40 + "1"}}]),
                 ToolMessage(f"{i} {text}", tool_call_id=f"c{i}",
                             artifact={"raw_path": f"/s/outputs/{i + 1:04d}.txt"})]
    return msgs


def test_prices_come_from_the_price_table_relative_to_input():
    sonnet = input_prices("anthropic:claude-sonnet-4-5")
    assert (sonnet.read, sonnet.write, sonnet.family) == (pytest.approx(0.1), 1.25,
                                                          "anthropic")
    gpt5 = input_prices("openai:gpt-5")
    assert (gpt5.read, gpt5.write, gpt5.family) == (pytest.approx(0.1), 1.0, "openai")
    assert input_prices("openai:gpt-4o").read == pytest.approx(0.5)  # a dearer read
    for unpriced in ("scripted:x.json", "replay:wf", "ollama:llama3", "nobody:knows", None):
        assert input_prices(unpriced) == UNPRICED
    assert ANTHROPIC.epoch_price(1000) == pytest.approx(1150)
    assert OPENAI.epoch_price(1000) == pytest.approx(900)
    assert InputPrices(read=1.0, write=1.0).epoch_price(1000) == 0  # no cache: free epochs


def test_the_epoch_cost_figures():
    sizes = [10, 100, 10, 100, 10, 100]
    cost = epoch_cost(sizes, 1, {"a": 90}, {"a": 3}, ANTHROPIC)
    assert (cost.freed, cost.rewrite, cost.candidates) == (90, 230, 1)
    assert cost.rent == pytest.approx(0.1 * 90 * 3)
    assert cost.price == pytest.approx(1.15 * 230)
    assert not cost.pays
    # without a pinned breakpoint Anthropic writes every message again
    assert epoch_cost(sizes, 1, {"a": 90}, {"a": 3}, ANTHROPIC, pinned=False).rewrite == 240
    # an automatic cache reads up to the first change, pin or not
    assert epoch_cost(sizes, 1, {"a": 90}, {"a": 3}, OPENAI, pinned=False).rewrite == 230
    old = epoch_cost(sizes, 1, {"a": 90}, {"a": 30}, OPENAI)
    assert old.rent == pytest.approx(270) and old.price == pytest.approx(207) and old.pays
    nothing = epoch_cost(sizes, None, {}, {}, OPENAI)
    assert (nothing.freed, nothing.rent, nothing.price, nothing.pays) == (0, 0, 0, False)
    assert cost.as_dict() == {"freed": 90, "rewrite": 230, "rent": 27, "price": 264,
                              "candidates": 1}


def test_ages_count_the_requests_since_a_result_left_the_kept_ones():
    msgs = _thread(4)  # H, (A R) x 4: results at 2, 4, 6, 8
    assert requests_since(msgs, 8) == 1  # only the request being made now
    assert requests_since(msgs, 2) == 4  # three replies after it, plus this request
    # keep 1: c0 left the kept results when c1 arrived (index 4): 2 replies after, +1
    assert stale_ages(msgs, {"c0", "c1", "c2"}, kept=1) == {"c0": 3, "c1": 2, "c2": 1}
    assert stale_ages(msgs, {"c0", "c1"}, kept=2) == {"c0": 2, "c1": 1}
    assert stale_ages(msgs, {"c0"}, kept=0) == {"c0": 3}  # kept 0 counts as one
    assert first_change(msgs, {"c1", "c2"}) == 4
    assert first_change(msgs, {"c1", "c2"}, inputs={"c1"}) == 3  # the call's code goes too
    assert first_change(msgs, set()) is None


def _decide(msgs, prices=OPENAI, trigger=None, min_freed=1, keep=2, **kw):
    total = sum(count_message(m) for m in msgs)
    return cl.decide_epoch(msgs, set(), total_tokens=total, trigger=trigger, keep=keep,
                           min_freed=min_freed, prices=prices, **kw)


def test_an_epoch_fires_by_cost_once_the_stale_results_paid_for_its_rewrite():
    due_at = None
    for n in range(3, 40):
        cleared, why, cost = _decide(_thread(n))
        assert (why == "cost") == cost.pays == (cleared is not None)
        assert cost.candidates == n - 2
        if cost.pays and due_at is None:
            due_at = n
        if due_at is None:
            assert cost.rent < cost.price
    assert due_at is not None and 3 < due_at < 40
    cleared, why, cost = _decide(_thread(due_at))
    assert cleared == {f"c{i}" for i in range(due_at - 2)}
    # the messages this request adds are written anyway: they are not in the rewrite
    sizes = [count_message(m) for m in _thread(due_at)]
    assert cost.rewrite == sum(sizes[2:-2]) - cost.freed  # from c0 to the newest reply
    # the same epoch under a dearer cache write (Anthropic) is due later, never sooner
    assert not _decide(_thread(due_at - 1), prices=ANTHROPIC)[2].pays
    # a cache that reads at input price makes every epoch free
    assert _decide(_thread(3), prices=InputPrices(read=1.0, write=1.0))[1] == "cost"


def test_the_window_forces_an_epoch_the_prices_would_not_pay_for():
    msgs = _thread(4)
    total = sum(count_message(m) for m in msgs)
    cleared, why, cost = _decide(msgs, trigger=total - 1)
    assert why == "window" and not cost.pays and cleared == {"c0", "c1"}
    # ... but only when it frees the minimum; below it, the cost rule still decides
    assert _decide(msgs, trigger=total - 1, min_freed=cost.freed + 1)[1] is None
    assert _decide(msgs, trigger=total)[1] is None  # not over the trigger


def test_input_clearing_counts_in_what_an_epoch_frees():
    msgs = _thread(6)
    plain = _decide(msgs, keep=1)[2]
    both = _decide(msgs, keep=1, clear_inputs=True)[2]
    assert both.freed > plain.freed
    saved, inputs = cl.savings(msgs, cl.candidates(msgs, set(), keep=1), clear_inputs=True)
    assert inputs == {f"c{i}" for i in range(5)} and sum(saved.values()) == both.freed


# ------------------------------------------------------------ on the real graph
@tool("dump")
def dump(n: int) -> str:
    """Return n characters of numeric rows."""
    return ("row 1.2345 2.3456\n" * (n // 18 + 1))[:n]


def _run(workspace, settings):
    from simagent.agent.builder import build_agent
    from simagent.agent.runner import TurnRunner
    from simagent.agent.scripted import ScriptedChatModel
    from simagent.session import Session

    steps = [{"tool": "dump", "args": {"n": 4000}} for _ in range(30)] + [{"final": "done"}]
    session = Session.create(workspace, approval="auto")
    model = ScriptedChatModel.from_steps(steps, window=128_000, enforce_window=True)
    agent = build_agent(session, model, extra_tools=[dump], context_settings=settings)
    assert TurnRunner(session, agent).run("go").status == "done"
    return session, model


def test_below_the_window_trigger_an_epoch_comes_when_the_cache_prices_pay(workspace):
    from simagent.context.panel import render_context
    from simagent.context.stats import stats_from_events

    settings = ContextSettings(summarize=False, clear_keep=2,
                               cost_model="anthropic:claude-sonnet-4-5")
    session, model = _run(workspace, settings)
    try:
        peak = max(model.cursor.request_tokens)
        trigger = th.thresholds_for(128_000, "anthropic:claude-sonnet-4-5", settings).clear_trigger
        assert peak < trigger  # the window never forced an epoch
        clears = [e.payload for e in session.trace.events(["context_clear"])]
        assert clears and all(c["reason"] == "cost" and c["rent"] >= c["price"]
                              for c in clears)
        costs = [e.payload for e in session.trace.events(["context_clear_cost"])]
        assert [c for c in costs if c["due"]] and all(
            (c["due"] == "cost") == (c["rent"] >= c["price"]) for c in costs)
        # /context shows the latest of those decisions
        events = session.trace.events()
        text = render_context(stats_from_events(events, settings=settings), width=120)
        last = costs[-1]
        assert (f"last call {last['rent']:,} of {last['price']:,} input tokens' worth, "
                f"{last['candidates']:,} results holding {last['freed']:,} tokens") in text
        assert "or sooner, when keeping old results has cost (cached reads)" in text
    finally:
        session.close()


def test_without_the_cost_rule_only_the_window_clears(workspace):
    settings = ContextSettings(summarize=False, clear_keep=2, clear_by_cost=False,
                               cost_model="anthropic:claude-sonnet-4-5")
    session, _model = _run(workspace, settings)
    try:
        clears = [e.payload for e in session.trace.events(["context_clear"])]
        trigger = th.thresholds_for(128_000, None, settings).clear_trigger
        assert all(c["reason"] == "window" and c["tokens_before"] > trigger for c in clears)
        costs = [e.payload for e in session.trace.events(["context_clear_cost"])]
        # the rule would have fired: figured, not acted on
        assert any(c["rent"] >= c["price"] and c["due"] is None for c in costs)
    finally:
        session.close()
