"""The cost ceiling as a host sees it: a tripped turn is an error, later turns are refused
without a model call until the ceiling is reset, and ``simagent run`` exits 5 with the
command that resets it. Real graph, real kernel, real SQLite; the model is scripted.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import cli_fork
import pytest
from conftest import write_config

from simagent import exit_codes
from simagent.agent.builder import build_agent
from simagent.agent.events import ContextEvent, Notice
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.context.guards import ceiling_tripped
from simagent.context.settings import ContextSettings
from simagent.headless import StreamPrinter
from simagent.presentation.notices import context_line
from simagent.session import Session

SIMAGENT = [sys.executable, "-m", "simagent"]


def _usage_calls(session: Session) -> int:
    return len(session.trace.events(["model_usage"]))


# ------------------------------------------------------------------- in process
def test_trip_is_an_error_later_turns_are_refused_until_reset(workspace: Path):
    session = Session.create(workspace, approval="auto")
    try:
        model = ScriptedChatModel.from_steps([
            {"final": "warm-up"},
            {"tool": "run_python", "args": {"code": "a = 1"}},
            {"tool": "run_python", "args": {"code": "b = 2"}},
            {"tool": "run_python", "args": {"code": "print('c =', 3)"}},
            {"final": "done: {out[-1]}"}])
        runner = TurnRunner(session, build_agent(session, model))
        warm = runner.run("warm up")  # no limits yet: measures one call's size
        one_call = warm.usage.input_tokens + warm.usage.output_tokens
        # one call stays under the limit, the second passes it (requests are ~ equal)
        limited = ContextSettings(max_turn_tokens=int(one_call * 1.5))
        runner.switch_agent(build_agent(session, model, context_settings=limited))

        events: list = []
        result = runner.run("compute", events.append)
        assert result.status == "error"
        assert result.cost_ceiling is not None
        assert (result.cost_ceiling["scope"], result.cost_ceiling["unit"]) == ("turn", "tokens")
        assert result.error == result.cost_ceiling["message"]
        assert result.error.startswith("cost ceiling reached: this turn used")
        assert "\n" not in result.error
        assert result.final.startswith("[cost ceiling]")  # the guard's note, kept
        assert len(session.trace.events(["tool_result"])) == 1  # 3 scripted, 1 ran
        assert any(isinstance(e, Notice) and e.level == "error" for e in events)

        calls = _usage_calls(session)
        users = len(session.trace.events(["message_user"]))
        events.clear()
        refused = runner.run("try again", events.append)
        assert refused.status == "error" and refused.cost_ceiling == result.cost_ceiling
        assert refused.error == result.error
        assert _usage_calls(session) == calls  # the model was not called
        assert len(session.trace.events(["message_user"])) == users
        last = session.trace.events(["cost_ceiling"])[-1].payload
        assert last == {"action": "refused", "scope": "turn",
                        "limit": result.cost_ceiling["limit"],
                        "spent": result.cost_ceiling["spent"], "unit": "tokens"}
        assert ceiling_tripped(session.trace.events()) is not None  # a refusal is no reset
        assert [type(e) for e in events] == [ContextEvent, Notice]
        # resume() (an approval answer) is refused the same way
        assert runner.resume([{"type": "approve"}], pending=[]).cost_ceiling is not None
        assert _usage_calls(session) == calls

        assert runner.reset_cost_ceiling() is True
        assert runner.reset_cost_ceiling() is False  # nothing left to reset
        runner.switch_agent(build_agent(session, model, context_settings=ContextSettings(
            max_turn_tokens=one_call * 100)))
        again = runner.run("go on")
        assert again.status == "done" and again.cost_ceiling is None
        assert again.final == "done: c = 3"
        assert _usage_calls(session) == calls + 2
    finally:
        session.close()


# ------------------------------------------------------------------ context_line
@pytest.mark.parametrize("kind, detail, expected", [
    ("context_summary", {"tokens_before": 52310, "tokens_after": 9800, "path": "/h.md",
                         "reason": "threshold", "agent": "main"},
     "~ context: summary (52,310 → 9,800 tokens; history in /h.md)"),
    ("context_summary", {"tokens_before": 100, "tokens_after": 50, "path": "/h.md",
                         "reason": "manual"},
     "~ context: summary (manual; 100 → 50 tokens; history in /h.md)"),
    ("context_clear", {"cleared": 12, "total_cleared": 20, "tokens_before": 80000,
                       "tokens_after": 41000, "agent": "main"},
     "~ context: cleared 12 old tool results (80,000 → 41,000 tokens)"),
    ("context_clear", {"cleared": 1, "tokens_before": 10, "tokens_after": 5,
                       "agent": "general-purpose"},
     "~ context: [general-purpose] cleared 1 old tool result (10 → 5 tokens)"),
    ("context_eviction", {"tool": "run_python", "chars": 412000, "path": "/big/x",
                          "tokens_before": 103000, "tokens_after": 900},
     "~ context: evicted a 412,000-char result of run_python to /big/x"),
    ("context_checkpoint", {"note": "fit done\nmore", "tokens_before": 30000,
                            "tokens_after": 4000, "path": "/h.md"},
     '~ context: checkpoint "fit done" (30,000 → 4,000 tokens; history in /h.md)'),
    ("context_checkpoint", {}, "~ context: checkpoint (? → ? tokens)"),
    ("context_emergency", {"error": "too long", "kept": 6, "dropped": 40,
                           "tokens_before": 210000, "tokens_after": 90000, "path": "/h.md"},
     "~ context: emergency compaction after a context-length error: kept 6, dropped 40 "
     "messages (210,000 → 90,000 tokens; history in /h.md)"),
    ("watchdog_alert", {"tool": "run_python", "repeats": 5, "mode": "warn"},
     "! watchdog: run_python called 5 times in a row with the same arguments"),
    ("watchdog_alert", {"tool": "run_python", "repeats": 5, "mode": "enforce"},
     "! watchdog: run_python called 5 times in a row with the same arguments; turn stopped"),
    ("cost_ceiling", {"action": "tripped", "scope": "turn", "unit": "tokens", "limit": 1000,
                      "spent": 1500, "message": "..."},
     "! cost ceiling reached: this turn used 1,500 tokens (limit 1,000 tokens); turn stopped"),
    ("cost_ceiling", {"action": "refused", "scope": "session", "unit": "usd", "limit": 0.5,
                      "spent": 0.51},
     "! cost ceiling: turn refused, this session used $0.5100 (limit $0.5000); "
     "reset it to go on"),
    ("cost_ceiling", {"action": "reset"}, "~ context: cost ceiling reset"),
    ("context_something_new", {}, "~ context: something_new"),
])
def test_context_line(kind, detail, expected):
    assert context_line(ContextEvent(kind, detail)) == expected


def test_context_line_ignores_other_events_and_the_printer_says_each_guard_once():
    assert context_line(Notice("hi")) is None
    out, err = io.StringIO(), io.StringIO()
    printer = StreamPrinter(out, err, stream_text=True)
    trip = {"action": "tripped", "scope": "turn", "unit": "tokens", "limit": 10, "spent": 20,
            "message": "cost ceiling reached: this turn used 20 tokens (limit 10 tokens)"}
    printer(Notice("cost ceiling: no price known for x"))
    printer(ContextEvent("cost_ceiling", trip))
    printer(Notice(trip["message"], level="warning"))  # the guard's notice
    printer(Notice(trip["message"], level="error"))  # the runner's
    printer(ContextEvent("context_clear", {"cleared": 2, "tokens_before": 9,
                                           "tokens_after": 3}))
    assert err.getvalue().splitlines() == [
        "! cost ceiling: no price known for x",
        "! cost ceiling reached: this turn used 20 tokens (limit 10 tokens); turn stopped",
        "~ context: cleared 2 old tool results (9 → 3 tokens)"]
    assert out.getvalue() == ""


# ---------------------------------------------------------------- simagent run
def _cli(workspace: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_MODEL"}
    return cli_fork.run([*SIMAGENT, *args], cwd=workspace, env=env, text=True,
                        capture_output=True, timeout=180)


def _script(path: Path, steps: list[dict]) -> str:
    path.write_text(json.dumps(steps))
    return f"scripted:{path}"


def _limit(workspace: Path, tokens: int) -> None:
    write_config(workspace, f"[context]\nmax_session_tokens = {tokens}\n")


@pytest.mark.slow
def test_run_exits_5_refuses_the_next_turn_and_resets(workspace: Path, tmp_path: Path):
    _limit(workspace, 1)
    first = _script(tmp_path / "a.json", [
        {"tool": "run_python", "args": {"code": "print('never runs')"}},
        {"final": "never"}])
    p1 = _cli(workspace, "run", "--model", first, "--json", "go")
    assert p1.returncode == exit_codes.COST_CEILING, p1.stderr
    data = json.loads(p1.stdout)
    sid = data["session_id"]
    assert data["status"] == "error" and data["tool_calls"] == 0
    ceiling = data["cost_ceiling"]
    assert (ceiling["action"], ceiling["scope"], ceiling["unit"], ceiling["limit"]) == (
        "tripped", "session", "tokens", 1)
    assert data["error"] == ceiling["message"]
    last = p1.stderr.strip().splitlines()[-1]
    assert last.startswith("simagent: cost ceiling reached: this session used ")
    assert last.endswith(f"; resume with 'simagent run --resume {sid} --reset-cost-ceiling "
                         "PROMPT'")
    assert "cost ceiling reached: cost ceiling" not in last
    assert "! cost ceiling reached:" in p1.stderr  # the live line, once
    assert p1.stderr.count("cost ceiling reached") == 2

    # refused: exit 5 again, the model is not called (its script would fail loudly)
    p2 = _cli(workspace, "run", "--model", first, "--continue", "again")
    assert p2.returncode == exit_codes.COST_CEILING, p2.stderr
    assert p2.stdout == ""
    assert "! cost ceiling: turn refused, this session used" in p2.stderr
    assert "--reset-cost-ceiling PROMPT'" in p2.stderr

    # the reset flag needs a session to reset
    p3 = _cli(workspace, "run", "--model", first, "--reset-cost-ceiling", "again")
    assert p3.returncode == exit_codes.USAGE
    assert "--reset-cost-ceiling" in p3.stderr and "--continue" in p3.stderr

    _limit(workspace, 10**9)
    after = _script(tmp_path / "b.json", [{"final": "back in business"}])
    p4 = _cli(workspace, "run", "--model", after, "--continue", "--reset-cost-ceiling",
              "--json", "go on")
    assert p4.returncode == exit_codes.OK, p4.stderr
    data = json.loads(p4.stdout)
    assert data["session_id"] == sid and data["status"] == "done"
    assert data["final"] == "back in business" and data["cost_ceiling"] is None
    assert "cost ceiling reset" in p4.stderr
