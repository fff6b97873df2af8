"""The watchdog and the cost ceiling: pure cores, then the real graph with a real kernel.

The only stand-in is the scripted model; the trace, the ledger, the checkpointer and
the kernel are the session's own, so "the 5th call did not run" is counted from
``tool_result`` events and "no orphaned call" is read from the checkpointed state.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, ToolMessage

from simagent.agent.builder import build_agent
from simagent.agent.events import ContextEvent, Notice
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.context.guards import (
    MARK,
    CostCeilingMiddleware,
    call_key,
    ceiling_tripped,
    check_ceiling,
    repeat_alerts,
    reset_ceiling,
    strip_pending_calls,
)
from simagent.context.prices import FREE, PRICES, cost_usd, price_for, totals_cost
from simagent.context.settings import ContextSettings
from simagent.session import Session
from simagent.trace.log import TraceLog
from simagent.trace.usage import Usage, UsageTotals

ONE_PLUS_ONE = {"tool": "run_python", "args": {"code": "1+1"}}


# --------------------------------------------------------------------------- prices
def test_price_lookup_by_name_after_the_provider_prefix():
    assert price_for("anthropic:claude-sonnet-4-5-20250929") is PRICES["claude-sonnet-4-5"]
    assert price_for("openai:gpt-4o-mini") is PRICES["gpt-4o-mini"]  # longest key wins
    assert price_for("openai:gpt-4o-2024-08-06") is PRICES["gpt-4o"]
    assert price_for("openai:gpt-5-mini") is PRICES["gpt-5-mini"]
    assert price_for("openai:gpt-4.1") is PRICES["gpt-4.1"]
    assert price_for("openrouter:anthropic/claude-haiku-4.5") is PRICES["claude-haiku-4-5"]
    assert price_for("google_genai:gemini-2.5-flash-lite") is PRICES["gemini-2.5-flash-lite"]
    assert price_for("ollama:qwen3:8b") == FREE  # "o3" must not match inside qwen3
    assert price_for("scripted") == FREE and price_for("scripted:/tmp/s.json") == FREE
    assert price_for("openai-compatible:gpt-4o@http://localhost:8080/v1") == FREE
    assert price_for("acme:mystery-model") is None and price_for("model-b") is None


def test_cache_reads_are_billed_once_at_the_cache_rate():
    usage = {"input_tokens": 1_000_000, "output_tokens": 100_000, "cache_read": 400_000}
    # 600k fresh × $3 + 400k cached × $0.30 + 100k out × $15
    assert cost_usd("anthropic:claude-sonnet-4-5", usage) == pytest.approx(1.8 + 0.12 + 1.5)
    assert cost_usd("anthropic:claude-sonnet-4-5", Usage(input_tokens=2000)) == pytest.approx(
        0.006)
    assert cost_usd("scripted", usage) == 0.0
    assert cost_usd("acme:x", usage) is None


def test_totals_cost_sums_known_models_and_names_unknown_ones():
    ledger = UsageTotals()
    ledger.record("main", "openai:gpt-4o", {"input_tokens": 1_000_000, "output_tokens": 0})
    ledger.record("helper", "openai:gpt-4o", {"input_tokens": 0, "output_tokens": 1_000_000})
    ledger.record("main", "scripted", {"input_tokens": 5000, "output_tokens": 10})
    ledger.record("main", "acme:mystery", {"input_tokens": 5000, "output_tokens": 10})
    total, unknown = totals_cost(ledger)
    assert total == pytest.approx(12.5)
    assert unknown == ["acme:mystery"]


# ------------------------------------------------------------------- watchdog core
def test_call_key_compares_literal_arguments():
    assert call_key("read_file", {"a": 1, "b": 2}) == call_key("read_file", {"b": 2, "a": 1})
    assert (call_key("read_file", {"file_path": "main.go"})
            != call_key("read_file", {"file_path": "/workspace/main.go"}))
    assert call_key("ls", {}) != call_key("glob", {})


def test_repeat_alerts_fire_once_per_stuck_run():
    a, b = ("run_python", {"code": "1+1"}), ("run_python", {"code": "2+2"})
    assert repeat_alerts([a] * 5, 5) == [4]
    assert repeat_alerts([a] * 6, 5) == [4]
    assert repeat_alerts([a] * 4, 5) == []
    assert repeat_alerts([a, b, a, b, a], 5) == []
    assert repeat_alerts([a] * 5 + [b] + [a] * 5, 5) == [4, 10]
    assert repeat_alerts([a] * 3, 0) == []


def test_strip_keeps_answered_calls_and_drops_tool_use_blocks():
    ai = AIMessage(content=[{"type": "text", "text": "trying"},
                            {"type": "tool_use", "id": "c1", "name": "ls", "input": {}},
                            {"type": "tool_use", "id": "c2", "name": "ls", "input": {}}],
                   id="m1", tool_calls=[{"name": "ls", "args": {}, "id": "c1"},
                                        {"name": "ls", "args": {}, "id": "c2"}])
    rejected = ToolMessage("rejected", tool_call_id="c1", name="ls", status="error")
    out = strip_pending_calls([ai, rejected], "stopped", {"guard": "test"})
    assert out.id == "m1" and [c["id"] for c in out.tool_calls] == ["c1"]
    assert [b.get("id") for b in out.content if b["type"] == "tool_use"] == ["c1"]
    assert out.content[-1] == {"type": "text", "text": "stopped"}
    assert out.additional_kwargs[MARK] == {"guard": "test"}
    assert strip_pending_calls([AIMessage("done", id="m2")], "x", {}) is None


# ------------------------------------------------------------------- ceiling core
def test_check_ceiling_trips_when_a_limit_is_met():
    s = ContextSettings(max_turn_tokens=1000, max_session_usd=2.0)
    assert check_ceiling(s, 1.99, 10**6, 0.5, 999) is None
    trip = check_ceiling(s, 1.0, 5000, 0.5, 1000)
    assert (trip.scope, trip.unit, trip.limit, trip.spent) == ("turn", "tokens", 1000, 1000)
    trip = check_ceiling(s, 2.0, 5000, 0.5, 5000)  # session is named first
    assert (trip.scope, trip.unit) == ("session", "usd") and "$2.0000" in trip.message
    assert check_ceiling(ContextSettings(), 1e9, 10**9, 1e9, 10**9) is None
    assert check_ceiling(ContextSettings(max_session_usd=0.0), 0.0, 10**6, 0.0, 10**6) is None


def test_a_trip_holds_until_reset_across_reopening_the_trace(tmp_path: Path):
    path = tmp_path / "trace.sqlite"
    with TraceLog(path) as trace:
        assert ceiling_tripped(trace.events()) is None
        trace.append("cost_ceiling", {"action": "tripped", "scope": "turn", "limit": 5,
                                      "spent": 7, "unit": "tokens"})
        trace.append("cost_ceiling", {"action": "refused"})
    with TraceLog(path) as trace:  # a new process reads the same trace
        assert ceiling_tripped(trace.events())["spent"] == 7
        reset_ceiling(trace)
        assert ceiling_tripped(trace.events()) is None
        trace.append("cost_ceiling", {"action": "tripped", "scope": "session", "limit": 1.0,
                                      "spent": 1.5, "unit": "usd"})
        assert ceiling_tripped(trace.events())["scope"] == "session"


# ----------------------------------------------------------------------- the graph
# build_agent wires both guards into the main agent from ``context_settings`` (layers.py),
# so these tests exercise the real stack rather than a hand-added middleware.
@pytest.fixture
def opened(workspace):
    sessions = []

    def _open(steps, settings):
        session = Session.create(workspace, approval="auto")
        sessions.append(session)
        model = ScriptedChatModel.from_steps(steps)
        runner = TurnRunner(session, build_agent(session, model, context_settings=settings))
        return session, model, runner

    yield _open
    for s in sessions:
        s.close()


def _guards(agent) -> list:
    names = [n for n in agent.graph.nodes if n.endswith(".after_model")]
    return [n for n in names if "Watchdog" in n or "CostCeiling" in n]


def _no_orphans(session: Session, runner: TurnRunner) -> None:
    state = runner.agent.graph.get_state(session.thread_config).values["messages"]
    answered = {m.tool_call_id for m in state if isinstance(m, ToolMessage)}
    calls = [c["id"] for m in state if isinstance(m, AIMessage) for c in m.tool_calls]
    assert set(calls) <= answered


def test_five_identical_calls_warn_once_and_the_turn_goes_on(opened):
    session, _model, runner = opened([ONE_PLUS_ONE] * 5 + [{"final": "{out[-1]}"}],
                                    ContextSettings(watchdog="warn"))
    assert sorted(_guards(runner.agent)) == ["CostCeilingMiddleware[main].after_model",
                                             "WatchdogMiddleware[main].after_model"]
    events = []
    result = runner.run("go", events.append)
    assert result.status == "done" and result.final == "Out[6]: 2"  # after the warm-up
    alerts = [e.payload for e in session.trace.events(["watchdog_alert"])]
    assert alerts == [{"tool": "run_python", "args": {"code": "1+1"}, "repeats": 5,
                       "mode": "warn", "agent": "main"}]
    assert len(session.trace.events(["tool_result"])) == 5
    assert [e.kind for e in events if isinstance(e, ContextEvent)] == ["watchdog_alert"]
    assert any(isinstance(e, Notice) and e.level == "warning" and
               "run_python called 5 times in a row" in e.text for e in events)


def test_alternating_calls_never_alert(opened):
    other = {"tool": "run_python", "args": {"code": "2+2"}}
    session, _model, runner = opened([ONE_PLUS_ONE, other, ONE_PLUS_ONE, other, ONE_PLUS_ONE,
                                     {"final": "ok"}], ContextSettings(watchdog="warn"))
    assert runner.run("go").status == "done"
    assert not session.trace.events(["watchdog_alert"])


def test_the_run_is_read_from_the_thread_so_a_rebuilt_agent_keeps_counting(opened):
    session, model, runner = opened([ONE_PLUS_ONE] * 3 + [{"final": "three"},
                                     ONE_PLUS_ONE, ONE_PLUS_ONE, {"final": "five"}],
                                    ContextSettings())
    runner.run("first")
    # a new agent (as after a restart or a model switch): fresh middleware, same thread
    runner.switch_agent(build_agent(session, model, context_settings=ContextSettings()))
    assert runner.run("second").final == "five"
    assert len(session.trace.events(["watchdog_alert"])) == 1


def test_off_never_alerts(opened):
    session, _model, runner = opened([ONE_PLUS_ONE] * 5 + [{"final": "ok"}],
                                    ContextSettings(watchdog="off"))
    assert runner.run("go").final == "ok"
    assert not session.trace.events(["watchdog_alert"])


def test_enforce_stops_before_the_fifth_identical_call_runs(opened):
    session, model, runner = opened([ONE_PLUS_ONE] * 5 + [{"final": "unreachable"}],
                                    ContextSettings(watchdog="enforce"))
    result = runner.run("go")
    assert result.status == "done"
    assert result.final.startswith("[watchdog] Turn stopped: `run_python`")
    assert len(session.trace.events(["tool_result"])) == 4
    assert model.remaining == 1  # the model was not asked again
    assert session.trace.events(["watchdog_alert"])[0].payload["mode"] == "enforce"
    _no_orphans(session, runner)
    last = runner.agent.graph.get_state(session.thread_config).values["messages"][-1]
    assert isinstance(last, AIMessage) and not last.tool_calls
    assert last.additional_kwargs[MARK]["guard"] == "watchdog"


def test_cost_ceiling_stops_the_turn_midway_and_holds_until_reset(opened):
    session, model, runner = opened(
        [{"final": "warm-up"},
         {"tool": "run_python", "args": {"code": "a = 1"}},
         {"tool": "run_python", "args": {"code": "b = 2"}},
         {"tool": "run_python", "args": {"code": "c = 3"}},
         {"final": "never"}], ContextSettings())
    first = runner.run("warm up")  # no limits: the ceiling does nothing
    assert first.final == "warm-up" and not session.trace.events(["cost_ceiling"])
    one_call = first.usage.input_tokens + first.usage.output_tokens
    # a limit one call stays under and two calls pass (each request is ~ the first's size)
    limited = ContextSettings(max_turn_tokens=int(one_call * 1.5))
    runner.switch_agent(build_agent(session, model, context_settings=limited))
    events = []
    result = runner.run("compute", events.append)
    assert result.status == "error" and result.final.startswith("[cost ceiling]")
    assert len(session.trace.events(["tool_result"])) == 1  # 3 scripted, 1 ran
    assert model.remaining == 2
    _no_orphans(session, runner)
    trip = [e.payload for e in session.trace.events(["cost_ceiling"])]
    assert [(t["action"], t["scope"], t["unit"]) for t in trip] == [
        ("tripped", "turn", "tokens")]
    # the recorder put the tripping call in the ledger before after_model ran: the
    # spend checked is the whole turn's usage, both model calls included
    user = session.trace.events(["message_user"])[-1].id
    turn = session.trace.events(["model_usage"], after_id=user)
    assert len(turn) == 2
    assert trip[0]["spent"] == sum(u.payload["input_tokens"] + u.payload["output_tokens"]
                                   for u in turn)
    assert any(isinstance(e, ContextEvent) and e.kind == "cost_ceiling" for e in events)
    assert any(isinstance(e, Notice) and "cost ceiling reached" in e.text for e in events)
    assert ceiling_tripped(session.trace.events())
    reset_ceiling(session.trace)
    assert ceiling_tripped(session.trace.events()) is None


def test_session_usd_ceiling_uses_the_price_table(opened):
    session, _, _ = opened([], ContextSettings())
    priced = ScriptedChatModel.from_steps([ONE_PLUS_ONE, {"final": "never"}],
                                          name="anthropic:claude-haiku-4-5")
    runner = TurnRunner(session, build_agent(session, priced, context_settings=ContextSettings(
        max_session_usd=0.001)))
    result = runner.run("go")
    assert result.final.startswith("[cost ceiling]") and "$0.0010" in result.final
    assert not session.trace.events(["tool_result"])  # stopped before the call ran
    trip = ceiling_tripped(session.trace.events())
    assert (trip["scope"], trip["unit"], trip["limit"]) == ("session", "usd", 0.001)
    assert trip["spent"] == pytest.approx(totals_cost(session.usage)[0])
    assert trip["spent"] == pytest.approx(session.usage.total.input_tokens * 1e-6
                                          + session.usage.total.output_tokens * 5e-6)


def test_turn_spend_after_a_restart_is_read_from_the_trace(tmp_path: Path):
    # a resumed approval in a new process: no before_agent ran in this instance
    with TraceLog(tmp_path / "trace.sqlite") as trace:
        old = {"agent": "main", "model": "scripted", "input_tokens": 900, "output_tokens": 9}
        new = {"agent": "main", "model": "scripted", "input_tokens": 1000, "output_tokens": 10}
        trace.append("message_user", {"content": "one", "turn": 1})
        trace.append("model_usage", old)
        trace.append("message_user", {"content": "two", "turn": 2})
        trace.append("model_usage", new)
        ledger = UsageTotals.from_trace(trace.events(["model_usage"]))
        guard = CostCeilingMiddleware(trace, ledger, ContextSettings(max_turn_tokens=2000))
        assert guard.spend() == (0.0, 1919, 0.0, 1010, [])
