"""Prompt caching: the per-family simulation, its prices, and what a compaction costs it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from simagent.bench.caching import (
    Block,
    Request,
    cache_fields,
    reported_use,
    simulate,
    totals,
)
from simagent.context.prefix import first_change, rewrite_tokens
from simagent.context.prices import (
    ANTHROPIC_CACHE,
    OPENAI_CACHE,
    cache_rules,
    cached_cost_usd,
    cost_usd,
    price_for,
)


def req(*sizes: int, fixed: int = 2, tag: str = "") -> Request:
    """Blocks b0, b1, ... of the given sizes (``tag`` changes the content of every block
    from the third on, as a rewrite of early history does)."""
    return Request(tuple(Block(f"b{i}{tag if i >= 2 else ''}", n) for i, n in enumerate(sizes)),
                   fixed)


# ------------------------------------------------------------------------ prices
def test_rules_per_family_come_from_the_price_table():
    assert cache_rules("anthropic:claude-sonnet-4-5").family == "anthropic"
    assert cache_rules("anthropic:claude-haiku-4-5").min_prefix == 4096
    assert cache_rules("openai:gpt-5").family == "openai"
    assert cache_rules("scripted:x") is None and cache_rules("ollama:qwen3:8b") is None
    sonnet = price_for("anthropic:claude-sonnet-4-5")
    # a write costs 1.25x input, a read the table's cache price, uncached the input price
    assert cached_cost_usd("anthropic:claude-sonnet-4-5", uncached=1_000_000, cache_write=0,
                           cache_read=0) == pytest.approx(sonnet.input_per_mtok)
    assert cached_cost_usd("anthropic:claude-sonnet-4-5", uncached=0, cache_write=1_000_000,
                           cache_read=0) == pytest.approx(1.25 * sonnet.input_per_mtok)
    assert cached_cost_usd("anthropic:claude-sonnet-4-5", uncached=0, cache_write=0,
                           cache_read=1_000_000) == pytest.approx(sonnet.cache_read_per_mtok)
    gpt = price_for("openai:gpt-5")
    assert cached_cost_usd("openai:gpt-5", uncached=0, cache_write=1_000_000,
                           cache_read=0) == pytest.approx(gpt.input_per_mtok)


def test_cost_usd_bills_reported_writes_at_the_write_price():
    usage = {"input_tokens": 10_000, "cache_read": 6_000, "cache_creation": 3_000,
             "output_tokens": 0}
    p = price_for("anthropic:claude-sonnet-4-5")
    expected = (1_000 * p.input_per_mtok + 3_000 * 1.25 * p.input_per_mtok
                + 6_000 * p.cache_read_per_mtok) / 1e6
    assert cost_usd("anthropic:claude-sonnet-4-5", usage) == pytest.approx(expected)


def test_anthropic_ttl_split_writes_are_counted():
    from simagent.trace.usage import usage_record

    rec = usage_record({"input_tokens": 9_000, "output_tokens": 5, "input_token_details": {
        "cache_read": 1_000, "cache_creation": 0, "ephemeral_5m_input_tokens": 7_000}})
    assert rec["cache_creation"] == 7_000 and rec["cache_read"] == 1_000


# ------------------------------------------------------------------- simulation
def test_openai_reads_the_longest_seen_prefix_in_128_token_steps():
    first, second = simulate([req(1500, 600), req(1500, 600, 300)], OPENAI_CACHE)
    assert first.cache_read == 0 and first.uncached == 2100
    assert second.cache_read == 2100 // 128 * 128 and second.cache_write == 0
    assert second.total == 2400
    # below 1,024 tokens nothing is served from the cache
    small = simulate([req(500, 200), req(500, 200, 100)], OPENAI_CACHE)
    assert small[1].cache_read == 0


def test_anthropic_writes_at_breakpoints_reads_the_prefix_and_pays_for_a_rewrite():
    grow = [req(3000, 1000, 500), req(3000, 1000, 500, 400),
            req(3000, 1000, 500, 400, 300, tag="x")]
    one, two, three = simulate(grow, ANTHROPIC_CACHE)
    assert (one.cache_read, one.cache_write, one.uncached) == (0, 4500, 0)
    assert (two.cache_read, two.cache_write) == (4500, 400)  # only the new message
    # the third rewrote messages after the system prompt: it reads tools + system, and
    # writes everything after them again
    assert (three.cache_read, three.cache_write) == (4000, 1200)


def test_anthropic_reads_nothing_beyond_the_lookback_window():
    base = req(3000, 1000, *([50] * 10))
    far = Request(base.blocks + tuple(Block(f"n{i}", 50) for i in range(30)), 2)
    _, later = simulate([base, far], ANTHROPIC_CACHE)
    # the last write is 30 blocks back from the new breakpoint: only the fixed
    # breakpoints (tools, system) are still found
    assert later.cache_read == 4000


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.lists(st.integers(1, 3000), min_size=1,
                                                      max_size=6)), min_size=1, max_size=8))
def test_every_token_is_billed_once_whatever_the_history(edits):
    """Random growth and rewrites: uncached + write + read always equals the request."""
    messages: list[int] = []
    requests = []
    for n, (keep, new) in enumerate(edits):
        messages = messages[:keep] if n % 3 == 2 else messages
        messages = [*messages, *new]
        requests.append(Request((Block("tools", 2500), Block("sys", 900),
                                 *(Block(f"m{i}-{s}", s) for i, s in enumerate(messages))), 2))
    for rules in (ANTHROPIC_CACHE, OPENAI_CACHE):
        uses = simulate(requests, rules)
        for r, u in zip(requests, uses, strict=True):
            assert min(u.uncached, u.cache_write, u.cache_read) >= 0
            assert u.total == r.tokens
        assert totals(uses).total == sum(r.tokens for r in requests)


def test_live_runs_keep_what_the_provider_reported():
    usage = [{"input_tokens": 5000, "output_tokens": 40, "cache_read": 4000,
              "cache_creation": 500}]
    assert reported_use(usage).as_dict() == {"uncached": 500, "cache_write": 500,
                                             "cache_read": 4000}
    fields = cache_fields(None, usage, mode="live", price_model="anthropic:claude-sonnet-4-5")
    row = fields["cache"]["anthropic"]
    assert row["source"] == "provider" and row["cache_read"] == 4000
    assert fields["cost_usd_cached"] == row["cost_usd"] > 0


# ---------------------------------------------------------- compaction's rewrite
def test_rewrite_tokens_counts_from_the_first_changed_message():
    sys = SystemMessage("rules")
    a = HumanMessage("run it", id="a")
    call = AIMessage("", tool_calls=[{"name": "run_python", "args": {"code": "print(1)"},
                                      "id": "c1"}], id="b")
    out = ToolMessage("x = 1\n" * 400, tool_call_id="c1", id="c")
    new = HumanMessage("next", id="d")
    old_view = [sys, a, call, out]
    assert rewrite_tokens(old_view, [*old_view, new]) == 0  # appending rewrites nothing
    cleared = ToolMessage("[cleared: _out[1]]", tool_call_id="c1", id="c")
    assert first_change(old_view, [sys, a, call, cleared, new]) == 3
    small = rewrite_tokens(old_view, [sys, a, call, cleared, new])
    assert 0 < small < 60  # the placeholder and the new message are written again
    summary = HumanMessage("summary of earlier work", id="s")
    assert rewrite_tokens(old_view, [sys, summary, new]) > 0


# ------------------------------------------------------------ real graph, /context
@pytest.mark.slow
def test_a_clearing_epoch_traces_its_cache_write_and_context_shows_it(workspace):
    """Real graph and kernel: each epoch's event carries the tokens the next request
    writes again, which is what the automatic-cache simulation bills that request beyond
    the prefix it shares, and the /context history shows it."""
    from simagent.agent.builder import build_agent
    from simagent.agent.runner import TurnRunner
    from simagent.agent.scripted import ScriptedChatModel
    from simagent.bench.caching import scripted_requests
    from simagent.context.panel import render_context
    from simagent.context.settings import ContextSettings
    from simagent.context.stats import stats_from_trace
    from simagent.session import Session

    steps = [{"tool": "run_python", "args": {"code": f"print('R{i}', 'v' * 3000)"}}
             for i in range(20)] + [{"final": "done"}]
    settings = ContextSettings(summarize=False, budget_check=False, state_card_tokens=0)
    session = Session.create(workspace, approval="auto")
    try:
        model = ScriptedChatModel.from_steps(steps, window=30_000, enforce_window=True)
        agent = build_agent(session, model, context_settings=settings)
        assert TurnRunner(session, agent).run("go").status == "done"
        clears = [e.payload for e in session.trace.events(["context_clear"])]
        assert clears and all(p["cache_write_tokens"] > 0 for p in clears)
        # the request right after each epoch: what it could not read from the cache
        uses = simulate(scripted_requests(model), OPENAI_CACHE._replace(increment=1))
        changed = [i for i in range(1, len(model.requests))
                   if [m.text for m in model.requests[i][:len(model.requests[i - 1])]]
                   != [m.text for m in model.requests[i - 1]]]
        assert len(changed) == len(clears)
        for i, p in zip(changed, clears, strict=True):
            assert uses[i].uncached == pytest.approx(p["cache_write_tokens"], rel=0.02)
        stats = stats_from_trace(session.paths.trace, settings, window=30_000)
        assert all(b.cache_write for b in stats.boundaries if b.kind == "clear")
        assert "cache write" in render_context(stats, width=120)
    finally:
        session.close()


def test_extractive_summaries_merge_instead_of_nesting_and_stay_bounded():
    """Sixty summaries in a row (a long session at a small window): the summary keeps the
    newest numbers and the first request, never quotes itself, and its size levels off."""
    from simagent.context.summary import SECTION_CHARS, ExtractiveSummarizer, boundary_message

    summarize = ExtractiveSummarizer()
    previous = None
    sizes = []
    for k in range(60):
        msgs = [HumanMessage(f"step {k}: continue the sweep")] if k else \
            [HumanMessage("Sweep the rate constant k1 and report the half-life.")]
        msgs += [AIMessage(f"Run {k} looks converged.", id=f"a{k}"),
                 ToolMessage(f"k1_{k} = {k * 0.25:.2f} 1/s\nhalf_life_{k}: {k + 10.5} s\n"
                             f"wrote results_{k}.csv", tool_call_id=f"c{k}")]
        text = summarize([*([previous] if previous else []), *msgs], kind="summary")
        previous = boundary_message("summary", text, __import__("pathlib").Path("h.md"), 3)
        sizes.append(len(text))
    assert "Earlier summary" not in text and text.count("<summary>") == 0
    assert "half_life_59: 69.5 s" in text and "results_59.csv" in text
    assert "Sweep the rate constant" in text or "step 59" in text
    assert max(sizes) <= sum(SECTION_CHARS[s] for s in ("Session intent", "Decisions and reasons",
                                                         "Artifacts and files",
                                                         "Numbers that matter",
                                                         "Next steps")) + 400
    assert sizes[-1] <= sizes[40] * 1.1  # levelled off, not growing with the history
