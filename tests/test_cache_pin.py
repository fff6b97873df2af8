"""The pinned prompt-cache breakpoint: where it goes, what Anthropic's request carries, and
what it saves (real graph, real kernel, langchain-anthropic's own request builder)."""

from __future__ import annotations

import json
from typing import Any

from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import ConfigDict, Field

from simagent.agent.builder import build_agent
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.bench.caching import scripted_requests, simulate, totals
from simagent.context.placeholders import placeholder
from simagent.context.prefix import EPHEMERAL, pin_index, with_cache_pin
from simagent.context.prices import cache_rules
from simagent.context.settings import ContextSettings
from simagent.models import ResolvedModel, parse_model_spec
from simagent.session import Session

MODEL = "anthropic:claude-sonnet-4-5"


def call(i: int) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": "run_python", "args": {"code": f"print({i})"},
                                      "id": f"c{i}"}], id=f"a{i}")


def result(i: int, cleared: bool) -> ToolMessage:
    msg = ToolMessage(f"out {i} " + "x" * 200, tool_call_id=f"c{i}", name="run_python",
                      id=f"r{i}")
    if cleared:
        msg = msg.model_copy(update={"content": placeholder(msg, "run_python"),
                                     "response_metadata": {"context_editing":
                                                           {"cleared": True}}})
    return msg


def test_the_pin_sits_on_the_newest_result_cleared_before_this_request():
    view = [SystemMessage("rules"), HumanMessage("go"), call(1), result(1, True), call(2),
            result(2, True), call(3), result(3, False)]
    assert pin_index(view, {"c1"}) == 3  # c2 was cleared by this request's own epoch
    assert pin_index(view, {"c1", "c2"}) == 5
    assert pin_index(view, set()) is None
    pinned = with_cache_pin(view, 5)
    assert pinned[5].content[-1]["cache_control"] == EPHEMERAL
    assert pinned[5].text == view[5].text and view[5].content == result(2, True).content
    assert with_cache_pin(view, None) == view


class PayloadAnthropic(ChatAnthropic):
    """ChatAnthropic that builds each request with langchain-anthropic's own payload code,
    keeps it, and answers from a script instead of the network."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    script: Any = None
    payloads: list[dict[str, Any]] = Field(default_factory=list)

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        self.payloads.append(self._get_request_payload(messages, stop=stop, **kwargs))
        return ChatResult(generations=[ChatGeneration(message=self.script._reply(messages))])


def markers(obj: Any) -> int:
    return json.dumps(obj).count('"cache_control"')


def test_anthropic_requests_carry_at_most_four_breakpoints_and_the_pin_saves_writes(
        workspace):
    steps = [{"tool": "run_python", "args": {"code": f"print('R{i}', 'v' * 3000)"}}
             for i in range(22)] + [{"final": "done"}]
    script = ScriptedChatModel.from_steps(steps, window=30_000, enforce_window=True)
    chat = PayloadAnthropic(model="claude-sonnet-4-5", api_key="sk-test", script=script,
                            payloads=[], disable_streaming=True)
    resolved = ResolvedModel(spec=parse_model_spec(MODEL), chat_model=chat, window=30_000,
                             max_output=4_096)
    settings = ContextSettings(summarize=False, budget_check=False, state_card_tokens=0)
    session = Session.create(workspace, approval="auto")
    try:
        agent = build_agent(session, resolved, context_settings=settings)
        assert TurnRunner(session, agent).run("go").status == "done"
        clears = session.trace.events(["context_clear"])
        assert len(clears) >= 2
        pinned = 0
        for payload in chat.payloads:
            # tools, system prompt, the last message and the pin: never over Anthropic's 4
            assert markers(payload) <= 4, markers(payload)
            results = [b for m in payload["messages"] if isinstance(m["content"], list)
                       for b in m["content"] if b.get("type") == "tool_result"]
            tagged = [b for b in results if "cache_control" in b]
            pinned += bool(tagged)
            for b in tagged:  # the pin is on a placeholder, hoisted to the tool_result
                assert "result cleared" in json.dumps(b["content"])
        assert pinned >= 3
        # what it saves at Anthropic's prices, on the requests the model received
        rules = cache_rules(MODEL)
        plain = totals(simulate(scripted_requests(script, False), rules))
        pin = totals(simulate(scripted_requests(script, True), rules))
        assert pin.total == plain.total
        assert pin.cache_write < plain.cache_write
    finally:
        session.close()


def test_no_pin_for_other_providers_or_when_off(workspace):
    from simagent.context.middleware import ContextMiddleware

    for model_id, settings, expected in (
            (MODEL, ContextSettings(), True),
            (MODEL, ContextSettings(cache_pin=False), False),
            ("openai:gpt-5", ContextSettings(), False),
            ("scripted:x", ContextSettings(), False)):
        mw = ContextMiddleware(trace=None, compactor=None, settings=settings,
                               model_id=model_id, window=30_000, max_output=None)
        assert mw.pins_cache is expected, model_id
