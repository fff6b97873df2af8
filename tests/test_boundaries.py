"""No cut, in any layer, ever orphans a tool call or a tool result (property tests).

Conversations are generated with parallel tool calls, results in any order, long turns,
summary messages and a call still waiting for approval at the end; every cut function
the layers use (summary by tokens, emergency by messages, sliding window by turns, task
checkpoints, the compactor itself) must leave a view a provider accepts.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from conftest import sample
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from simagent.context.boundaries import (
    cut_keeping_messages,
    cut_keeping_tokens,
    cut_keeping_turns,
    orphans,
    safe_cuts,
    turn_starts,
)
from simagent.context.clearing import apply_cleared
from simagent.context.compaction import Compactor, view_of
from simagent.context.summary import ExtractiveSummarizer


# Conversations come from a seed (cheap to draw, so 10,000 examples run in seconds):
# turns of steps; a step makes 0-3 parallel calls whose results arrive in any order.
def spec_from_seed(seed: int):
    rnd = random.Random(seed)
    turns = [[(rnd.randint(0, 3), rnd.randint(0, 5), rnd.randint(1, 400))
              for _ in range(rnd.randint(0, 6))] for _ in range(rnd.randint(1, 7))]
    return turns, rnd.random() < 0.3, rnd.random() < 0.3


seeds = st.integers(0, 2**32 - 1)


def build(spec) -> list:
    turns, pending, summary_first = spec
    msgs: list = []
    if summary_first:
        msgs.append(HumanMessage("[summary]", additional_kwargs={"lc_source": "simagent_summary"}))
    n = 0
    for t, steps in enumerate(turns):
        msgs.append(HumanMessage(f"request {t}", id=f"h{t}"))
        for calls, seed, size in steps:
            if calls == 0:
                continue
            ids = [f"c{n + k}" for k in range(calls)]
            n += calls
            msgs.append(AIMessage("", id=f"a{ids[0]}", tool_calls=[
                {"name": "run_python", "args": {"code": "x" * size}, "id": i} for i in ids]))
            order = ids[seed % calls:] + ids[: seed % calls]
            msgs += [ToolMessage("r" * size, tool_call_id=i, name="run_python", id=f"t{i}")
                     for i in order]
        msgs.append(AIMessage(f"answer {t}", id=f"f{t}"))
    if pending:  # a call waiting for approval: no result yet
        msgs.append(AIMessage("", id="pending", tool_calls=[
            {"name": "execute", "args": {"command": "ls"}, "id": "p0"}]))
    return msgs


def acceptable(full: list, kept: list) -> bool:
    """The kept part has no result without its call, and no answered call cut from its
    results (a call with no result anywhere is the pending one, which is allowed)."""
    answered = {m.tool_call_id for m in full if isinstance(m, ToolMessage)}
    problems = [p for p in orphans(kept)
                if not (p.startswith("call ") and p.split()[1] not in answered)]
    return not problems


def cheap_count(msgs) -> int:
    return sum(len(m.text) // 4 + 3 for m in msgs)


@pytest.mark.slow  # 10,000 examples (test-deep): over 300 s on 2 loaded cores
@pytest.mark.sampled
@settings(max_examples=sample(2_000, 10_000), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(seeds, st.integers(0, 40), st.integers(0, 4000))
def test_no_cut_function_orphans_a_call_or_a_result(seed, keep_n, keep_tokens):
    msgs = build(spec_from_seed(seed))
    cuts = set(safe_cuts(msgs))
    assert 0 in cuts
    # brute force on sampled indexes: a safe cut exactly when both sides are acceptable
    answered = {m.tool_call_id for m in msgs if isinstance(m, ToolMessage)}
    probes = random.Random(seed ^ keep_tokens).sample(range(len(msgs) + 1),
                                                      min(6, len(msgs) + 1))
    for i in probes:
        pending_before = any(isinstance(m, AIMessage) and any(
            c["id"] not in answered for c in m.tool_calls) for m in msgs[:i])
        ok = acceptable(msgs, msgs[i:]) and acceptable(msgs, msgs[:i]) and not pending_before
        assert (i in cuts) == ok, (i, [m.id for m in msgs])
    for cut in (cut_keeping_messages(msgs, keep_n), cut_keeping_turns(msgs, 1 + keep_n % 4),
                cut_keeping_tokens(msgs, keep_tokens, cheap_count)):
        assert cut in cuts
        # the view with a boundary message in front is acceptable too
        view = [HumanMessage("[summary]", additional_kwargs={"lc_source": "simagent_summary"}),
                *msgs[cut:]]
        assert acceptable(msgs, view)
    for start in turn_starts(msgs):
        assert isinstance(msgs[start], HumanMessage) and start in cuts


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(seeds, st.integers(0, 3000), st.integers(1, 12))
def test_compactor_views_stay_valid(tmp_path_factory, seed, keep_tokens, min_messages):
    msgs = build(spec_from_seed(seed))
    compactor = Compactor(Path(tmp_path_factory.mktemp("h")) / "history.md",
                          ExtractiveSummarizer())
    boundary = None
    for op in ("summary", "emergency", "checkpoint"):
        if op == "summary":
            done = compactor.summarize(msgs, boundary, keep_tokens)
        elif op == "emergency":
            done = compactor.emergency(msgs, boundary, min_messages)
        else:
            done = compactor.checkpoint(msgs, boundary, len(msgs), note="n", how="/done")
        if done is not None:
            assert done.boundary["cutoff"] > (boundary or {}).get("cutoff", 0)
            boundary = done.boundary
        view = view_of(msgs, boundary)
        assert acceptable(msgs, view)
        # clearing swaps contents only: same ids, same order
        cleared = apply_cleared(view, {m.tool_call_id for m in view if isinstance(m, ToolMessage)})
        assert [m.id for m in cleared] == [m.id for m in view]


def _call(cid: str) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": "run_python", "args": {}, "id": cid}])


def _result(cid: str) -> ToolMessage:
    return ToolMessage("ok", tool_call_id=cid, name="run_python")


def test_orphans_pairs_a_recurring_call_id_by_occurrence():
    """A scripted session resumed in a new process numbers its calls afresh, so one
    thread can hold ``call_0_0`` twice; each result answers the earliest open call."""
    turn = [HumanMessage("go"), _call("call_0_0"), _result("call_0_0"), AIMessage("done")]
    assert orphans(turn + turn) == []
    # the second call with the same id has no result of its own
    assert orphans(turn + turn[:2]) == ["call call_0_0 at 5 has no result"]
    # one call answered twice: the second result answers nothing
    assert orphans([*turn[:3], _result("call_0_0")]) == ["result call_0_0 at 3 has no earlier call"]
    # a result before its call
    assert orphans([_result("x"), _call("x")]) == ["result x at 0 has no earlier call",
                                                   "call x at 1 has no result"]
