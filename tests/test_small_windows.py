"""A long session at a 16k window, the size small local models run with (real graph,
real kernel, the scripted model refusing any request over the window like a provider)."""

from __future__ import annotations

from itertools import pairwise

import pytest

from simagent.agent.builder import build_agent
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.context import thresholds as th
from simagent.context.recall import recall
from simagent.context.settings import ContextSettings
from simagent.session import Session

WINDOW = 16_000


def steps(n: int, lines: int = 60) -> list[dict]:
    out = []
    for i in range(n):
        code = (f"print('FACT-{i:03d} = {i * 7919}')\n"
                f"for k in range({lines}):\n"
                f"    print(f'sweep {i} step {{k}}: residual = {{k * 1e-3:.4f}}')")
        out.append({"tool": "run_python", "args": {"code": code}})
    out.append({"final": "last: {out[-1]|FACT-\\d+ = \\d+}"})
    return out


@pytest.mark.slow
def test_a_small_window_summarizes_with_the_small_tier_without_thrashing(workspace):
    n = 60
    session = Session.create(workspace, approval="auto")
    try:
        model = ScriptedChatModel.from_steps(steps(n), window=WINDOW, enforce_window=True)
        # a generous keep leaves the view near the trigger after each summary, as a large
        # fixed prompt (a simulator's skills and tools) does at this window
        settings = ContextSettings(summary_keep_fraction=0.3)
        agent = build_agent(session, model, context_settings=settings)
        result = TurnRunner(session, agent).run("run the sweep")
        assert result.status == "done", result.error
        assert result.final == f"last: FACT-{n - 1:03d} = {(n - 1) * 7919}"
        # the provider never saw an over-long request, and no emergency was needed
        assert model.cursor.rejected == [] and max(model.cursor.request_tokens) <= WINDOW
        events = session.trace.events(["context_summary", "context_emergency"])
        assert not [e for e in events if e.kind == "context_emergency"]
        summaries = [e.payload for e in events if e.payload.get("agent") == "main"]
        assert len(summaries) >= 2
        t = th.thresholds_for(WINDOW, model.model_name, settings)
        assert t.tier == "small"  # an unplaced model at 16k
        # the trigger sits above the fixed prompt, and a summary at the trigger waits
        # until the conversation has grown by an epoch's worth since the last one
        for prev, cur in pairwise(summaries):
            if cur["reason"] == "threshold":
                assert cur["tokens_before"] - prev["tokens_after"] >= t.clear_min_freed
        # what left the view stays reachable from the last request
        facts = [f"FACT-{i:03d} = {i * 7919}" for i in range(n)]
        assert recall(facts, model.requests[-1], [session.paths.root],
                      outputs=session.paths.outputs) == 1.0
    finally:
        session.close()
