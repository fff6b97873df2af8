"""simagent's token counts judged by an independent ruler (issue 27): the stand-in
provider here counts what it receives with langchain-openai's request builder and
tiktoken (``payload_reference``), so neither the figure checked nor the window enforced
comes from simagent's own counter."""

from __future__ import annotations

from typing import Any

import pytest
from payload_reference import payload_tokens  # tests/ is on sys.path (rootdir conftest)
from pydantic import Field

from simagent.agent.builder import build_agent
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.context.settings import ContextSettings
from simagent.session import Session

#: simagent's per-message count against the cookbook rule on the wire payload: the two
#: frame messages and tool schemas a little differently (measured: under 1.5 %).
TOLERANCE = 0.02


class IndependentProvider(ScriptedChatModel):
    """The scripted model, but the provider's ruler (usage it reports, the window it
    enforces) is the independent one; every request is kept with its bound tools."""

    seen: list[tuple[list[Any], list[Any], int]] = Field(default_factory=list)

    def count_request(self, messages: Any) -> int:
        n = payload_tokens(list(messages), list(self.bound_tools))
        self.seen.append((list(messages), list(self.bound_tools), n))
        return n


def _open(workspace, steps, *, window, settings=None):
    session = Session.create(workspace, approval="auto")
    model = IndependentProvider.from_steps(steps, window=window, enforce_window=True)
    runner = TurnRunner(session, build_agent(session, model,
                                             context_settings=settings or ContextSettings()))
    return session, model, runner


@pytest.mark.slow
def test_simagent_counts_what_an_independent_ruler_counts(workspace):
    """The figure the trace keeps per category (what the status bar and thresholds read)
    is within 2 % of the wire payload counted by tiktoken, request by request."""
    steps = [{"tool": "run_python", "args": {"code": "print('température', 'é' * 300)"}},
             {"tool": "run_python", "args": {"code": "import math\nprint([math.pi * i "
                                                     "for i in range(200)])"}},
             {"final": "Δ = 3.14 ± 0.01 (units: m·s⁻¹)"}]
    session, model, runner = _open(workspace, steps, window=128_000)
    try:
        assert runner.run("go, with ünïcode").status == "done"
        usage = [e.payload for e in session.trace.events(["model_usage"])]
        assert len(usage) == 3 and len(model.cursor.request_tokens) == 3
        for p, reference in zip(usage, model.cursor.request_tokens, strict=True):
            counted = sum(p["request"].values())
            assert p["input_tokens"] == reference  # the provider's figure is the reference
            assert abs(counted - reference) <= TOLERANCE * reference, (counted, reference)
        assert usage[-1]["request"]["tool_schemas"] > 1000  # the schemas were in it
    finally:
        session.close()


@pytest.mark.slow
def test_the_budget_check_prevents_overflow_by_an_independent_ruler(workspace):
    """The window is enforced by the independent ruler: the middleware, which decides
    with simagent's counter, still never sends a request the provider refuses, and each
    request leaves the reply's reserve (``max_output_tokens``) free."""
    steps = [{"tool": "run_python", "args": {"code": f"print('B{i}', 'q' * 4000)"}}
             for i in range(8)] + [{"final": "done"}]
    settings = ContextSettings(summary_fraction=1.0, clear_fraction=None,
                               max_output_tokens=14_000)
    session, model, runner = _open(workspace, steps, window=24_000, settings=settings)
    try:
        assert runner.run("go").status == "done"
        assert model.cursor.rejected == []
        assert session.trace.events(["context_summary"])  # it did have to compact
        # the budget held by the independent ruler: request plus the reply's reserve fit
        largest = max(model.cursor.request_tokens)
        assert 24_000 - 14_000 - 2_000 < largest <= 24_000 - 14_000
    finally:
        session.close()
