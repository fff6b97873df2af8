"""``/context`` from the trace: stats, the estimated flag, the panel text and the CLI.

Traces are written with a real ``TraceLog``; nothing is mocked. The rule under test most
of all: right after a compaction the figure is the event's estimate, flagged, never stale.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import cli_fork
import pytest

from simagent.context import prices
from simagent.context.counting import CATEGORIES
from simagent.context.panel import render_context, status_label
from simagent.context.settings import ContextSettings
from simagent.context.stats import ContextStats, stats_from_events, stats_from_trace
from simagent.context.thresholds import CLEAR_FRACTION, thresholds_for
from simagent.trace.log import TraceLog

MODEL = "anthropic:claude-sonnet-4-5"
WINDOW = 200_000
REQUEST = {"system_prompt": 3000, "tool_schemas": 5000, "skills_index": 800,
           "memory_index": 200, "conversation": 20_000, "tool_results": 60_000, "summaries": 0}


def usage(input_tokens: int, *, agent: str = "main", model: str = MODEL,
          request: dict[str, int] | None = None, window: int | None = WINDOW,
          source: str = "provider", **extra: Any) -> dict[str, Any]:
    return {"agent": agent, "model": model, "input_tokens": input_tokens, "output_tokens": 500,
            "cache_read": 0, "source": source, "request": request, "window": window, **extra}


def stats(tmp_path: Path, events: list[tuple[str, dict[str, Any]]],
          settings: ContextSettings | None = None, **kw: Any) -> ContextStats:
    path = tmp_path / "trace.sqlite"
    with TraceLog(path) as log:
        log.append("session_start", {"session_id": "s", "model": MODEL})
        for kind, payload in events:
            log.append(kind, payload)
    return stats_from_trace(path, settings or ContextSettings(), **kw)


def test_categories_sum_to_measured_input_and_percent(tmp_path: Path) -> None:
    s = stats(tmp_path, [("model_usage", usage(90_000, request=REQUEST))])
    assert not s.no_calls and not s.estimated and s.window_known
    assert s.used == s.last_input_tokens == 90_000
    assert s.categories is not None and s.categories.total == 90_000
    assert s.categories.tool_results > s.categories.conversation > s.categories.system_prompt
    assert s.free_tokens == WINDOW - 90_000
    assert s.percent == 45.0
    text = render_context(s)
    assert "45% — 90,000 of 200,000 tokens" in text and "(estimated)" not in text
    assert text.count("█") + text.count("░") == 24 and text.count("█") == 11
    for label in ("system prompt", "tool schemas", "skills index", "memory index",
                  "conversation", "tool results", "summaries", "free space"):
        assert label in text


def test_estimated_right_after_compaction_then_measured_again(tmp_path: Path) -> None:
    events = [("model_usage", usage(90_000, request=REQUEST)),
              ("context_summary", {"reason": "threshold", "path": "conversation_history/s.md",
                                   "tokens_before": 90_000, "tokens_after": 30_000,
                                   "summary_tokens": 4_000, "agent": "main"})]
    s = stats(tmp_path / "a", events)
    assert s.estimated and s.estimated_after == "summary"
    assert s.used == 30_000 and s.last_input_tokens == 90_000  # not the stale figure
    assert s.categories is not None and s.categories.total == 30_000
    before = stats(tmp_path / "b", events[:1]).categories
    assert before is not None
    assert s.categories.fixed == before.fixed and s.categories.summaries == 4_000
    label, _ = status_label(s)
    assert label == "ctx ~15%"
    assert "(estimated)" in render_context(s) and "estimated after a summary" in render_context(s)

    after = stats(tmp_path / "c", [*events, ("model_usage", usage(32_000, request=REQUEST))])
    assert not after.estimated and after.used == 32_000 and after.estimated_after is None
    assert status_label(after)[0] == "ctx 16%"


def test_clear_frees_tool_results_first_and_subagent_compaction_is_not_main(
        tmp_path: Path) -> None:
    s = stats(tmp_path, [("model_usage", usage(90_000, request=REQUEST)),
                         ("context_clear", {"cleared": 4, "total_cleared": 4, "agent": "research",
                                            "tokens_before": 50_000, "tokens_after": 10_000}),
                         ("context_clear", {"cleared": 5, "total_cleared": 5,
                                            "tokens_before": 90_000, "tokens_after": 50_000})])
    assert s.estimated and s.used == 50_000 and s.categories is not None
    assert s.categories.total == 50_000 and s.categories.tool_results < 25_000
    assert s.clears.count == 2 and [b.agent for b in s.boundaries] == ["research", "main"]


def test_estimated_source_is_flagged(tmp_path: Path) -> None:
    s = stats(tmp_path, [("model_usage", usage(12_000, source="estimated"))])
    assert s.estimated and s.estimated_after is None and s.categories is None
    assert status_label(s)[0] == "ctx ~6%"


def test_counts_times_and_boundaries_in_order(tmp_path: Path) -> None:
    s = stats(tmp_path, [
        ("model_usage", usage(150_000)),
        ("context_eviction", {"tool_call_id": "c1", "tool": "run_python", "path": "big/c1",
                              "tokens_before": 30_000, "tokens_after": 400}),
        ("context_checkpoint", {"note": "mesh converged", "source": "tool", "path": "t.md",
                                "tokens_before": 150_000, "tokens_after": 40_000}),
        ("context_emergency", {"error": "too long\nmore", "tokens_before": 40_000,
                               "tokens_after": 20_000}),
        ("watchdog_alert", {"tool": "run_python", "repeats": 5, "mode": "warn"})])
    assert (s.evictions.count, s.checkpoints.count, s.emergencies.count,
            s.watchdog_alerts.count, s.summaries.count) == (1, 1, 1, 1, 0)
    assert s.summaries.last is None and s.evictions.last is not None
    assert [b.kind for b in s.boundaries] == ["checkpoint", "emergency"]
    assert s.boundaries[0].detail == "mesh converged; t.md" and s.boundaries[1].detail == (
        "too long")
    assert s.used == 20_000 and s.estimated_after == "emergency"
    text = render_context(s, width=80)
    assert "checkpoint" in text and "150k → 40k" in text and "watchdog alerts" in text


def test_subagent_rollup_and_per_model_rows(tmp_path: Path) -> None:
    cheap, unknown = "openai:gpt-4o-mini", "acme:mystery-model"
    s = stats(tmp_path, [("model_usage", usage(10_000)),
                         ("model_usage", usage(4_000, agent="research", model=cheap)),
                         ("model_usage", usage(6_000, agent="research", model=cheap)),
                         ("model_usage", usage(1_000, agent="plotter", model=cheap)),
                         ("model_usage", usage(20_000))])
    assert s.used == 20_000 and s.main_calls == 2
    rows = {r.name: r for r in s.subagents}
    assert set(rows) == {"research", "plotter"}
    assert (rows["research"].calls, rows["research"].input_tokens,
            rows["research"].output_tokens) == (2, 10_000, 1_000)
    models = {r.name: r for r in s.models}
    assert (models[MODEL].calls, models[MODEL].input_tokens) == (2, 30_000)
    assert (models[cheap].calls, models[cheap].input_tokens) == (3, 11_000)
    assert [r.usd for r in s.models] == sorted((r.usd for r in s.models), reverse=True)
    assert s.cost_usd == pytest.approx(sum(prices.cost_usd(m.name, m) for m in s.models))
    text = render_context(s)
    assert "Models (by cost):" in text and "research" in text

    s2 = stats(tmp_path / "u", [("model_usage", usage(10_000)),
                                ("model_usage", usage(5_000, agent="x", model=unknown))])
    assert s2.cost_usd is None and s2.unpriced_models == (unknown,)
    assert s2.models[-1].name == unknown and s2.models[-1].usd is None
    assert f"no price for {unknown}" in render_context(s2)
    json.dumps(s2.as_dict())


def test_a_dropped_late_reply_is_paid_but_not_the_context_size(tmp_path: Path) -> None:
    """An abandoned turn's call may answer after newer calls: it costs, but the window's
    fill is the newest call that was kept."""
    s = stats(tmp_path, [("model_usage", usage(30_000)),
                         ("model_usage", usage(90_000, dropped=True))])
    assert s.used == 30_000 and s.main_calls == 1
    assert {r.name: r for r in s.models}[MODEL].input_tokens == 120_000


@pytest.mark.parametrize(("used", "text", "level"), [
    (69_000, "ctx 69%", "dim"), (69_999, "ctx 69%", "dim"), (70_000, "ctx 70%", "warning"),
    (89_999, "ctx 89%", "warning"), (90_000, "ctx 90%", "alert")])
def test_status_label_levels(tmp_path: Path, used: int, text: str, level: str) -> None:
    s = stats(tmp_path, [("model_usage", usage(used, window=100_000))])
    assert status_label(s) == (text, level)


def test_status_label_without_a_window_shows_tokens(tmp_path: Path) -> None:
    s = stats(tmp_path, [("model_usage", usage(12_345, window=None))])
    assert not s.window_known and status_label(s) == ("ctx 12k", "dim")
    assert "window size unknown" in render_context(s)


@pytest.mark.parametrize("settings", [ContextSettings(),
                                      ContextSettings(clear_fraction=0.5, clear_keep=2,
                                                      summary_fraction=0.7, evict_tokens=8000)])
def test_panel_shows_the_thresholds_the_middleware_uses(tmp_path: Path,
                                                        settings: ContextSettings) -> None:
    s = stats(tmp_path, [("model_usage", usage(1_000))], settings)
    th = thresholds_for(WINDOW, MODEL, settings)
    if s.categories is not None:  # the summary trigger moves with the fixed prompt
        th = th.for_prompt(s.categories.fixed)
    assert s.thresholds == th and s.window == WINDOW
    assert th.clear_trigger == int((settings.clear_fraction or 0) * WINDOW)
    text = render_context(s, width=100)
    pct = f"{round(100 * (settings.clear_fraction or 0))}%"
    assert (f"old tool results start clearing at {th.clear_trigger:,} tokens ({pct}), "
            f"keeping {th.clear_keep}") in text
    assert f"summary at {th.summary_trigger:,} tokens" in text and f"tier {th.tier}" in text
    assert f"a single result over {th.evict_tokens:,} tokens is saved to disk" in text


def test_before_any_call(tmp_path: Path) -> None:
    s = stats(tmp_path, [])
    assert s.no_calls and s.used == 0 and not s.estimated and s.categories is None
    assert s.model_id == MODEL and not s.window_known
    text = " ".join(render_context(s).split())
    assert "No model call yet" in text and "the system prompt, the tool schemas" in text
    assert "Window size unknown" in text and "Thresholds:" in text
    assert status_label(s) == ("ctx 0", "dim")
    # pure: plain events work as well as a trace
    assert stats_from_events([], settings=ContextSettings(), window=50_000).window == 50_000


def test_cost_ceiling_state(tmp_path: Path) -> None:
    s = stats(tmp_path, [("model_usage", usage(1_000, request=REQUEST)),
                         ("cost_ceiling", {"action": "tripped", "scope": "session", "limit": 5,
                                           "spent": 5.2, "unit": "usd"})],
              ContextSettings(max_session_usd=5.0))
    assert s.ceiling is not None and s.ceiling.action == "tripped"
    assert s.limits == {"max_session_usd": 5.0}
    assert "$5.20 of $5.00" in render_context(s, width=80)
    assert CATEGORIES[0] in s.as_dict()["categories"]


# ------------------------------------------------------------------------------- CLI
def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("simagent")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "simagent"]
    return cli_fork.run([*cmd, "context", *args], capture_output=True, text=True,
                        timeout=120, env=os.environ.copy())


@pytest.mark.slow
def test_cli_context_json_and_text(workspace: Path) -> None:
    from simagent.session import Session

    session = Session.create(workspace)
    session.trace.append("model_usage", usage(60_000, request=REQUEST))
    session.trace.append("context_summary", {"reason": "manual", "focus": "mesh",
                                             "tokens_before": 60_000, "tokens_after": 15_000})
    sid = session.id
    session.close()

    r = _cli("--workspace", str(workspace), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["session_id"] == sid and data["used"] == 15_000 and data["estimated"] is True
    assert data["window"] == WINDOW
    assert data["thresholds"]["clear_trigger"] == int(CLEAR_FRACTION * WINDOW)
    assert sum(data["categories"].values()) == 15_000
    assert data["boundaries"][0]["kind"] == "summary"

    r = _cli(sid[:12], "--workspace", str(workspace))
    assert r.returncode == 0, r.stderr
    assert f"Session {sid}" in r.stdout and f"{int(CLEAR_FRACTION * WINDOW):,} tokens" in r.stdout

    r = _cli("nope-no-such", "--workspace", str(workspace))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no session matches" in r.stderr


def test_panel_names_the_ruler_and_the_providers_ratio(tmp_path: Path) -> None:
    ours = sum(REQUEST.values())  # 89,000
    s = stats(tmp_path, [("model_usage", usage(97_900, request=REQUEST, ruler="o200k_base"))])
    assert s.ruler == "o200k_base" and s.provider_ratio == 1.1
    text = render_context(s, width=200)
    assert "Counted with the o200k_base tokenizer; the provider counted 1.10x that" in text
    assert "(thresholds are scaled by it)" in text
    odd = stats(_fresh(tmp_path, "x"), [("model_usage", usage(400_000, request=REQUEST,
                                                             ruler="o200k_base"))])
    assert "4.49x that on the last call (thresholds are scaled by at most 3.00x)" in \
        render_context(odd, width=200)
    est = stats(_fresh(tmp_path, "e"), [("model_usage", usage(ours, request=REQUEST, ruler="approx",
                                                       source="estimated"))])
    assert est.provider_ratio is None
    assert "Counted with chars/4 (approximate); the provider reported no usage" in \
        render_context(est, width=200)
    old = stats(_fresh(tmp_path, "o"), [("model_usage", usage(90_000, request=REQUEST))])
    assert old.ruler is None and "Counted with" not in render_context(old, width=200)


def test_a_resumed_agent_starts_calibrated_from_the_trace(tmp_path: Path) -> None:
    from simagent.context.counting import last_calibration

    o200k = {"ruler": "o200k_base"}
    with TraceLog(tmp_path / "trace.sqlite") as log:
        assert last_calibration(log, "main", MODEL, "o200k_base") == (None, None)
        log.append("model_usage", usage(97_900, request=REQUEST, **o200k))
        log.append("model_usage", usage(50_000, request=REQUEST, agent="general-purpose",
                                        **o200k))
        log.append("model_usage", usage(10, request=REQUEST, model="openai:gpt-4o", **o200k))
        log.append("model_usage", usage(5, request=REQUEST, source="estimated", **o200k))
        log.append("model_usage", usage(7, request=REQUEST, dropped=True, **o200k))
        assert last_calibration(log, "main", MODEL, "o200k_base") == (89_000, 97_900)
        assert last_calibration(log, "general-purpose", MODEL, "o200k_base") == \
            (89_000, 50_000)
        assert last_calibration(log, "main", "openai:gpt-5", "o200k_base") == (None, None)
        # a split counted with another ruler (or before rulers were traced) would mis-scale
        assert last_calibration(log, "main", MODEL, "approx") == (None, None)
        log.append("model_usage", usage(90_000, request=REQUEST))  # an old record
        assert last_calibration(log, "main", MODEL, "o200k_base") == (None, None)


def _fresh(tmp_path: Path, name: str) -> Path:
    (tmp_path / name).mkdir()
    return tmp_path / name
