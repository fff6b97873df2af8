"""The window sweep: one trajectory replayed at several enforced windows, side by side."""

from __future__ import annotations

import json

import pytest

from simagent.bench.policies import resolve_policies
from simagent.bench.workflow import WorkflowError, load_workflow, resolve_workflows
from simagent.bench.workflow_runs import BenchPlan, run_bench, run_label, summarize
from simagent.cli import parse_windows

# A short workflow whose second step prints ~80k characters: unmanaged, the request that
# carries it is far over a 16k window; capped, it fits.
SWEEP = '''
id = "sweep-demo"
title = "t"
prompt = "Print a long table, then report its last value."
windows = [128000, 16000]

[[steps]]
tool = "run_python"
args = { code = "x = 6 * 7\\nprint('value', x)" }

[[steps]]
tool = "run_python"
args = { code = "for i in range(2000):\\n    print(f'row {i:05d} value={i / 2:.1f} ' + 'z' * 9)" }

[[steps]]
final = "The value is {out[0]|value (\\\\d+)}."

[[probes]]
fact = "value 42"
from_step = 0

[[scorers]]
kind = "numeric"
answer_regex = "value is (\\\\d+)"
expected = 42
'''


def test_parse_windows_accepts_k_suffixes_and_rejects_nonsense():
    assert parse_windows("128k, 32k,16000") == [128_000, 32_000, 16_000]
    assert parse_windows("12.5k,12.5k") == [12_500]
    for bad in ("", "big", "500", "1.5"):
        with pytest.raises(ValueError, match="--window"):
            parse_windows(bad)


def test_workflow_windows_are_validated(tmp_path):
    path = tmp_path / "sweep-demo.toml"
    path.write_text(SWEEP)
    assert load_workflow(path).windows == (128_000, 16_000)
    path.write_text(SWEEP.replace("windows = [128000, 16000]", "windows = [128000, 900]"))
    with pytest.raises(WorkflowError, match="windows"):
        load_workflow(path)


def test_plan_runs_the_declared_window_unenforced_unless_a_sweep_is_asked():
    canary = resolve_workflows(["canary"])[0]
    plan = BenchPlan([canary], resolve_policies("raw"))
    assert plan.windows_for(canary) == [(canary.window, False)]
    plan = BenchPlan([canary], resolve_policies("raw"), windows=[32_000, 16_000])
    assert plan.windows_for(canary) == [(32_000, True), (16_000, True)]


@pytest.mark.slow
def test_sweep_records_a_refused_run_as_failed_and_simagent_passes_everywhere(tmp_path):
    path = tmp_path / "sweep-demo.toml"
    path.write_text(SWEEP)
    wf = load_workflow(path)
    plan = BenchPlan([wf], resolve_policies("raw,simagent,stock"))
    rows = run_bench(plan, tmp_path / "out")
    classic = {r["policy"]: r for r in rows if not r["enforced"]}
    assert set(classic) == {"raw", "simagent", "stock"}  # the unenforced reference runs
    by = {run_label(r): r for r in rows if r["enforced"]}
    assert set(by) == {f"{p} @{w}" for p in ("raw", "simagent", "stock") for w in ("128k", "16k")}
    for r in by.values():
        assert r["window"] in (128_000, 16_000)
        assert r["run"].endswith("/128k") or r["run"].endswith("/16k")
    for r in rows:  # every run is priced with caching, and every input token billed once
        for fam in ("anthropic", "openai"):
            c = r["cache"][fam]
            assert c["uncached"] + c["cache_write"] + c["cache_read"] == r["tokens_in"]
    # unmanaged, the long output is refused at 16k: a failed run, not a crash
    raw16 = by["raw @16k"]
    assert raw16["provider_error"] and raw16["verdict"] == "fail"
    assert "context_length_exceeded" in raw16["error"]
    assert not by["raw @128k"]["provider_error"]
    for label in ("simagent @16k", "simagent @128k", "stock @128k"):
        assert by[label]["verdict"] == "pass" and not by[label]["provider_error"], label
        assert by[label]["max_request_tokens"] <= by[label]["window"]
        assert by[label]["ledger_entries"] == by[label]["compactions"]
    # at 128k nothing was over the window, so the enforced runs are the classic ones ...
    for p in ("raw", "simagent", "stock"):
        assert by[f"{p} @128k"]["same_as"] == classic[p]["run"]
    # ... which replaying them enforced confirms
    again = run_bench(BenchPlan([wf], resolve_policies("raw,simagent,stock"),
                                windows=[128_000]), tmp_path / "again")
    for r in again:
        twin = by[run_label(r)]
        assert "same_as" not in r
        for key in ("recall", "verdict", "summaries", "clears", "model_calls", "tool_calls"):
            assert r[key] == twin[key], (run_label(r), key)
        # the same requests, but for the run folder's name in the paths they show
        assert len(r["per_call_tokens"]) == len(twin["per_call_tokens"])
        for a, b in zip(r["per_call_tokens"], twin["per_call_tokens"], strict=True):
            assert abs(a - b) <= 40, (run_label(r), a, b)
    summary = summarize(rows)
    assert summary["raw @16k"]["provider_errors"] == 1
    assert summary["simagent @16k"]["window"] == 16_000
    records = [json.loads(line) for line in
               (tmp_path / "out" / "records.jsonl").read_text().splitlines()]
    assert len(records) == 9
    from simagent.bench.report import write_report

    report = write_report(rows, tmp_path / "out", mode="replay").read_text()
    assert "## Window sweep" in report and "| 16.0k | simagent | 1/1 | 0 |" in report
    assert "## Cost with prompt caching" in report and "| raw @16k | 0/1 |" in report
    assert (tmp_path / "out" / "pareto_cost_recall.png").stat().st_size > 1000


def test_a_policy_run_starts_without_an_earlier_runs_memory(tmp_path, monkeypatch):
    """Reruns into the same --out reuse run folders; their memory notes (in the state home,
    under the folder's path) must not carry over into the next run's memory index."""
    from types import SimpleNamespace

    from simagent.bench.kernel_recording import policy_workspace
    from simagent.paths import workspace_state_dir

    monkeypatch.setenv("SIMAGENT_HOME", str(tmp_path / "home"))
    recorded = tmp_path / "recorded"
    recorded.mkdir()
    (recorded / "data.csv").write_text("t,y\n")
    dest = tmp_path / "runs" / "wf--simagent--0" / "workspace"
    dest.mkdir(parents=True)
    note = workspace_state_dir(dest) / "memory" / "MEMORY.md"
    note.parent.mkdir(parents=True)
    note.write_text("- a note an earlier run remembered\n")
    assert policy_workspace(SimpleNamespace(workspace=recorded), dest) == dest
    assert (dest / "data.csv").is_file() and not note.exists()
