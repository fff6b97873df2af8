"""``bench run --mode live``: each run measures the product as a person would run it.

The runs here play a workflow's own script (``scripted:<workflow>.toml``, a real model
kind resolved as any other) through the real graph and a real kernel, so what is under
test is the live harness: the configuration the session gets, the bound on model calls,
the verdict's budgets. The server's timings are read from a real llama.cpp server's log
(a tiny random model, ``tiny_gguf.py``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from simagent.bench.live import live_verdict, server_timings
from simagent.bench.policies import POLICIES
from simagent.bench.workflow import resolve_workflows
from simagent.bench.workflow_runs import run_live

CANARY = resolve_workflows(["canary"])[0]


def with_config(wf, text: str):
    """``wf`` whose workspace holds ``.simagent/config.toml`` = ``text``."""
    return replace(wf, fixtures={**wf.fixtures, ".simagent/config.toml": {"text": text}})


def test_a_live_run_gets_the_workspace_config_and_the_run_window_over_it(
        tmp_path: Path) -> None:
    wf = with_config(CANARY, "[model]\nwindow = 12000\n")
    spec = f"scripted:{CANARY.path}"
    free = run_live(wf, POLICIES["simagent"], 0, spec, tmp_path / "a")
    assert free["model_window"] == 12000  # the workspace's [model] window, as `simagent run`
    assert free["verdict"] == "pass", free["failed_scorers"]
    at = run_live(replace(wf, window=9000), POLICIES["simagent"], 0, spec, tmp_path / "b",
                  enforced=True)
    assert at["model_window"] == 9000  # the bench's enforced window wins


def test_a_live_run_stops_one_model_call_past_the_workflow_budget(tmp_path: Path) -> None:
    """A model that keeps calling tools is stopped: the row fails its budget and ends."""
    looping = [{"tool": "run_python", "args": {"code": f"print({i})"}} for i in range(12)]
    script = tmp_path / "loop.json"
    script.write_text(json.dumps([*looping, {"final": "done"}]))
    row = run_live(CANARY, POLICIES["simagent"], 0, f"scripted:{script}", tmp_path / "out")
    budget = CANARY.budgets["model_calls"]
    assert row["call_limit"] == budget + 1
    assert row["model_calls"] == budget + 1
    assert "budget:model_calls" in row["failed_scorers"] and row["verdict"] == "fail"


@pytest.mark.parametrize(("configured", "check", "nudges"),
                         [("nudge", "nudge", 1), ("off", "off", 0), (None, "off", 0)])
def test_a_live_run_records_its_answers_unsourced_numbers_and_the_checks_nudges(
        tmp_path: Path, configured: str | None, check: str, nudges: int) -> None:
    """What the live bench measures of ``[answers] check_numbers``: the model kept a
    number no cell printed (its script answers the nudge with the same answer). The
    record names the mode the run used: unset, a scripted model's is off."""
    printed = {"tool": "run_python", "args": {"code": "print('k =', 0.31647)"}}
    final = {"final": "k is 0.316 and R0 is 3.9."}
    script = tmp_path / "script.json"
    script.write_text(json.dumps([printed, final, final]))
    wf = CANARY if configured is None else with_config(
        CANARY, f'[answers]\ncheck_numbers = "{configured}"\n')
    row = run_live(wf, POLICIES["simagent"], 0, f"scripted:{script}", tmp_path / "out")
    assert row["check_numbers"] == check
    assert row["number_nudges"] == nudges
    assert row["model_calls"] == 2 + nudges
    assert row["numbers"] == {"sourced": 1, "derived": 0, "input": 0, "unsourced": 1}
    assert row["unsourced_numbers"] == ["3.9"]
    from simagent.bench.live_report import live_summary, live_table

    assert f"| {check} | 1 (3.9) | {nudges} |" in live_table([row])
    assert live_summary([row]).endswith(
        f"1 unsourced numbers in 1 final answers, {nudges} nudges")


def test_the_seconds_budget_is_reported_not_failed_in_a_live_run() -> None:
    row = {"verdict": "fail", "failed_scorers": ["budget:seconds"]}
    assert live_verdict(row) == {"verdict": "pass", "failed_scorers": [],
                                 "over_seconds_budget": True}
    other = live_verdict({"verdict": "fail", "failed_scorers": ["numeric", "budget:seconds"]})
    assert (other["verdict"], other["failed_scorers"]) == ("fail", ["numeric"])


def test_server_timings_without_a_log_are_none(tmp_path: Path) -> None:
    assert server_timings(None) is None
    (tmp_path / "x.log").write_text("no timing here\n")
    assert server_timings(tmp_path / "x.log") is None


@pytest.mark.slow
def test_server_timings_are_read_from_a_real_llama_cpp_servers_log(tmp_path: Path) -> None:
    """The lines a real llama.cpp server prints after each completion (tiny random model,
    two short requests) add up to the figures a live record carries."""
    pytest.importorskip("llama_cpp", reason="needs the local extra")
    from langchain_core.messages import HumanMessage
    from tiny_gguf import write_tiny_gguf

    from simagent.models import resolve_model

    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    resolved = resolve_model(f"local:{model}", model_config={"window": 512, "max_output": 4})
    try:
        for text in ("hello", "hello again"):
            resolved.chat_model.invoke([HumanMessage(text)])
    finally:
        resolved.close()
    timings = server_timings(resolved.info["log"])
    assert timings is not None and timings["completions"] == 2
    assert timings["prompt_eval_tokens"] > 0 and timings["prompt_eval_ms"] > 0
    assert timings["eval_tokens"] > 0 and timings["total_ms"] >= timings["eval_ms"]


def live_row(policy: str, window: int, verdict: str, **extra: object) -> dict:
    return {"workflow": "canary", "policy": policy, "mode": "live", "epoch": 0,
            "window": window, "model_window": window + 192, "verdict": verdict,
            "failed_scorers": [] if verdict == "pass" else ["numeric"], "tokens_in": 4321,
            "model_calls": 3, "tool_calls": 2, "wall_s": 95.5,
            "scorers": [{"scorer": "numeric", "ok": verdict == "pass"},
                        {"scorer": "x", "ok": True}],
            **extra}


def test_the_live_table_has_one_line_per_workflow_policy_and_window() -> None:
    from simagent.bench.live_report import live_summary, live_table

    server = {"prompt_eval_tokens": 1800, "prompt_eval_tok_s": 41.2, "eval_tokens": 120,
              "eval_tok_s": 9.5}
    rows = [live_row("stock", 8000, "fail"), live_row("simagent", 16000, "pass"),
            live_row("simagent", 8000, "pass", server=server),
            {"workflow": "canary", "policy": "raw", "mode": "replay"}]
    lines = live_table(rows).splitlines()
    assert len(lines) == 2 + 3  # header, rule, one line per live run (the replay row left out)
    assert lines[2] == ("| canary | simagent | 8k | pass | 2/2 | 4,321 | 3 | 2 | - | - | - | "
                        "95.5 | 1,800 | 41.2 | 120 | 9.5 |")
    assert "| stock | 8k | fail (numeric) | 1/2 |" in lines[3]
    assert lines[4].startswith("| canary | simagent | 16k | pass |")
    assert live_summary(rows).splitlines()[0] == (
        "simagent @8k: 1/1 passed, 4,321 input tokens, 96 s")
    assert live_table(rows[3:]) == ""


@pytest.mark.real
def test_a_local_server_runs_the_configured_number_of_threads(tmp_path: Path) -> None:
    """``[model] threads``: on a 2-core machine others share, a 2-thread llama.cpp server
    crawled (the live bench's first reply had streamed 76 tokens after 8 minutes); the
    server is started with the number asked."""
    pytest.importorskip("llama_cpp", reason="needs the local extra")
    from tiny_gguf import write_tiny_gguf

    from simagent.models import ModelError, resolve_model

    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    resolved = resolve_model(f"local:{model}", model_config={"window": 512, "threads": 1})
    try:
        first = Path(resolved.info["log"]).read_text().splitlines()[0]
    finally:
        resolved.close()
    assert first.startswith("--- simagent: ") and first.endswith(" --threads 1")
    with pytest.raises(ModelError, match="model config: threads must be a whole number >= 1"):
        resolve_model(f"local:{model}", model_config={"window": 512, "threads": 0})


def test_the_live_summary_sets_runs_with_the_check_on_and_off_side_by_side() -> None:
    from simagent.bench.live_report import live_summary

    rows = [{**live_row("simagent", 8000, "pass"), "check_numbers": check,
             "numbers": {"unsourced": n}, "number_nudges": k}
            for check, n, k in (("nudge", 0, 1), ("off", 2, 0), ("off", 1, 0))]
    assert live_summary(rows).splitlines() == [
        "simagent (check_numbers nudge) @8k: 1/1 passed, 4,321 input tokens, 96 s, "
        "0 unsourced numbers in 1 final answers, 1 nudges",
        "simagent (check_numbers off) @8k: 2/2 passed, 8,642 input tokens, 191 s, "
        "3 unsourced numbers in 2 final answers, 0 nudges"]
