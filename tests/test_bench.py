"""The bench: loader errors, each policy on a synthetic history, scorers, one real replay."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import cli_fork
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from simagent.bench.policies import (
    POLICIES,
    compress_tool_results,
    resolve_policies,
    sliding_window,
    truncate,
)
from simagent.bench.scorers import SCORERS, RunView, grade, step_results
from simagent.bench.workflow import (
    SCORER_FIELDS,
    WorkflowError,
    bundled_workflows,
    load_workflow,
    resolve_workflows,
)
from simagent.context.boundaries import orphans

GOOD = '''
id = "{id}"
title = "t"
prompt = "p"
[[steps]]
tool = "run_python"
args = {{ code = "print('value', 6 * 7)" }}
[[steps]]
final = "The value is {{out[-1]|value (\\\\d+)}}."
[[probes]]
fact = "value 42"
from_step = 0
[[scorers]]
kind = "numeric"
answer_regex = "value is (\\\\d+)"
expected_from = {{ step = 0, regex = "value (\\\\d+)" }}
'''


def wf_file(tmp_path: Path, text: str, name: str = "demo") -> Path:
    folder = tmp_path / "workflows"
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


# ------------------------------------------------------------------------ loader
def test_every_bundled_workflow_loads():
    wfs = resolve_workflows(None)
    assert len(wfs) >= 4
    assert {w.id for w in wfs} == set(bundled_workflows())


def test_bundled_workflows_cover_the_required_kinds():
    wfs = {w.id: w for w in resolve_workflows(None)}
    kinds = {sc["kind"] for w in wfs.values() for sc in w.scorers}
    assert {"numeric", "artifact", "tool_used", "subagent"} <= kinds
    assert any(sc["kind"] == "tool_used" and sc["tool"] == "record_attempt"
               for w in wfs.values() for sc in w.scorers)
    assert all(w.probes for w in wfs.values())


def test_a_good_file_loads_with_defaults(tmp_path):
    wf = load_workflow(wf_file(tmp_path, GOOD.format(id="demo")))
    assert wf.window == 128_000 and not wf.long and wf.tool_steps == 1
    assert wf.probes[0].fact == "value 42"


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace('id = "demo"', 'id = "other"'), "must equal the file name"),
    (lambda t: t.replace('prompt = "p"', ''), "`prompt` must be a non-empty string"),
    (lambda t: 'simulator = "nope"\n' + t, "unknown simulator 'nope'"),
    (lambda t: t.replace("from_step = 0", "from_step = 9"), r"probes\[0\]: `from_step`"),
    (lambda t: t.replace('kind = "numeric"', 'kind = "vibes"'), r"scorers\[0\]: `kind`"),
    (lambda t: t.replace('expected_from = { step = 0, regex = "value (\\\\d+)" }', ''),
     "exactly one of `expected`"),
    (lambda t: t + '\n[fixtures]\n"a.csv" = { path = "missing.csv" }\n',
     r"fixtures.'a.csv': fixture file 'missing.csv' not found"),
    (lambda t: t + '\nbogus = 1\n', r"unknown field\(s\) \['bogus'\]"),
    (lambda t: t.replace("[[steps]]\nfinal", "[[steps]]\nsay"), "need a `final` step"),
    (lambda t: t.replace('tool = "run_python"', 'tool = "run_python"\nfill = true'),
     "`fill` cannot template run_python code"),
    (lambda t: t + "\n[[steps]]\nwat = 1\n", "unknown field"),
])
def test_bad_files_name_the_file_and_field(tmp_path, edit, message):
    path = wf_file(tmp_path, edit(GOOD.format(id="demo")))
    with pytest.raises(WorkflowError, match=message) as info:
        load_workflow(path)
    assert str(path) in str(info.value)


def test_probe_inside_a_subagent_is_rejected(tmp_path):
    text = GOOD.format(id="demo").replace(
        '[[steps]]\nfinal', '[[steps]]\ntool = "task"\nargs = { subagent_type = "run-analyst", '
        'description = "d" }\nsteps = [{ tool = "read_file", args = { file_path = "x" } }, '
        '{ tool = "submit_report", args = { answer = "a" } }]\n\n[[steps]]\nfinal')
    text = text.replace("from_step = 0", "from_step = 2")
    with pytest.raises(WorkflowError, match="inside a subagent"):
        load_workflow(wf_file(tmp_path, text))


def test_pkg_placeholder_expands_to_the_installed_folder(tmp_path):
    import simpy

    text = GOOD.format(id="demo").replace(
        "[[steps]]\nfinal", '[[steps]]\ntool = "read_file"\nargs = { file_path = '
        '"{pkg:simpy}/core.py" }\n\n[[steps]]\nfinal')
    wf = load_workflow(wf_file(tmp_path, text))
    assert wf.steps[1]["args"]["file_path"] == str(Path(simpy.__file__).parent / "core.py")
    bad = text.replace("{pkg:simpy}", "{pkg:no_such_pkg_xyz}")
    with pytest.raises(WorkflowError, match="package 'no_such_pkg_xyz' is not installed"):
        load_workflow(wf_file(tmp_path, bad))


def test_scorer_kinds_have_one_home():
    assert set(SCORER_FIELDS) == set(SCORERS)


# ---------------------------------------------------------------------- policies
def history(rounds: int, size: int = 2000) -> list:
    msgs = [HumanMessage("the task: sweep it")]
    for i in range(rounds):
        msgs.append(AIMessage("", tool_calls=[{"name": "run_python", "args": {"code": f"s{i}"},
                                                "id": f"c{i}"}]))
        filler = "".join(f"{(i * 31 + k) % 997:4d}" for k in range(size // 4))  # numbers
        msgs.append(ToolMessage(f"result {i} " + filler, tool_call_id=f"c{i}"))
    return msgs


def test_sliding_window_keeps_the_task_and_the_last_rounds_without_orphans():
    msgs = history(30)
    view = sliding_window(msgs, 128_000, rounds=20)
    assert view[0].text == "the task: sweep it" and not orphans(view)
    assert [m.tool_call_id for m in view if isinstance(m, ToolMessage)] == [
        f"c{i}" for i in range(10, 30)]
    assert sliding_window(history(5), 128_000) == history(5)


def test_compress_replaces_only_consumed_long_results():
    msgs = [*history(3), AIMessage("thinking")]
    msgs.insert(3, ToolMessage("short", tool_call_id="x"))  # under 500 chars: kept
    view = compress_tool_results(msgs, 128_000)
    texts = [m.text for m in view if isinstance(m, ToolMessage)]
    assert texts[0].startswith("[tool result compressed: 2,009 chars")
    assert "short" in texts
    fresh = history(2)  # the last result has not been answered yet: kept
    assert compress_tool_results(fresh, 128_000)[-1].text.startswith("result 1 ")
    assert msgs[2].text.startswith("result 0")  # the input is not mutated


def test_truncate_acts_only_under_pressure_and_recaps():
    msgs = history(40, size=4000)  # ~85k tokens
    assert truncate(msgs, 1_000_000) == msgs
    view = truncate(msgs, 40_000)
    assert view[0].text == "the task: sweep it" and view[1].text.startswith("[recap: ")
    assert "run_python" in view[1].text and not orphans(view[1:])
    assert len(view) <= 2 + 10 + 1


def test_policies_differ_only_in_context_handling():
    names = [p.name for p in resolve_policies("all")]
    assert names == ["raw", "simagent", "stock", "sliding-window", "compress-tool-results",
                     "truncate", "oracle", "oracle-cached"]
    raw = POLICIES["raw"].context_settings(128_000)
    assert not raw.summarize and raw.clear_fraction is None and raw.evict_tokens is None
    assert POLICIES["simagent"].context_settings(64_000).window == 64_000
    stock = POLICIES["stock"]
    assert stock.settings.summary_fraction == 0.85 and stock.settings.evict_tokens == 20_000
    edit = stock.middleware(100_000)[0].edits[0]
    assert (edit.trigger, edit.keep) == (60_000, 6)
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        resolve_policies("raw,nope")


# ----------------------------------------------------------------------- scorers
def ev(kind, **payload):
    return SimpleNamespace(kind=kind, payload=payload)


def test_scorers_grade_a_synthetic_trace(tmp_path):
    (tmp_path / "out.csv").write_text("a,b\n1,2\n")
    png = tmp_path / "fig.png"
    png.write_bytes(b"\x89PNG")
    events = [ev("tool_call", name="run_python", agent="main"),
              ev("tool_result", tool_call_id="call_0_0", content="capacity 4.9553 Ah"),
              ev("tool_call", name="record_attempt", agent="main"),
              ev("tool_result", tool_call_id="call_2_0", content="attempt #1"),
              ev("artifact", path=str(png)),
              ev("subagent_end", name="run-analyst", report={"answer": "x"})]
    steps = [{"tool": "run_python"}, {"say": "."}, {"tool": "record_attempt"},
             {"final": "."}]
    run = RunView(final="The capacity is 4.955 Ah.", events=events,
                  step_texts=step_results(steps, events), workspace=tmp_path)
    verdicts = grade([
        {"kind": "numeric", "answer_regex": r"capacity is ([\d.]+)",
         "expected_from": {"step": 0, "regex": r"capacity ([\d.]+)"}, "rel_tol": 1e-3},
        {"kind": "numeric", "answer_regex": r"capacity is ([\d.]+)", "expected": 5.0},
        {"kind": "cites", "from_step": 0, "regex": r"capacity (\d\.\d{3})"},
        {"kind": "tool_used", "tool": "record_attempt"},
        {"kind": "tool_used", "tool": "record_attempt", "min": 2},
        {"kind": "tool_avoided", "tool": "execute"},
        {"kind": "artifact"},
        {"kind": "file_exists", "path": "out.csv", "contains": "1,2"},
        {"kind": "file_exists", "path": "nope.csv"},
        {"kind": "subagent", "name": "run-analyst"},
        {"kind": "subagent", "name": "source-explorer"},
    ], run)
    assert [v.ok for v in verdicts] == [True, False, True, True, False, True, True, True,
                                        False, True, False]
    assert verdicts[1].detail == "answer 4.955 vs expected 5"


def test_step_results_follow_call_ids_through_subagents():
    """The ids come from the scripted model itself, so a change of its id format that
    the bench cannot read fails here (it once made every subagent workflow's numeric
    scorers fail: results were matched to the wrong steps)."""
    from langchain_core.messages import HumanMessage, ToolMessage

    from simagent.agent.scripted import ScriptedChatModel

    steps = [{"say": "x"}, {"tool": "task", "args": {}}, {"tool": "read_file", "args": {}},
             {"final": "."}]
    model = ScriptedChatModel.from_steps(steps)
    history: list = [HumanMessage("go")]
    ids = []
    while (reply := model.invoke(history)).tool_calls or not ids:
        history.append(reply)
        for call in reply.tool_calls:
            ids.append(call["id"])
            history.append(ToolMessage("r", tool_call_id=call["id"]))
    task_id, read_id = ids
    # a subagent's inner result is traced before the task's own result
    events = [ev("tool_result", tool_call_id=read_id, content="inside"),
              ev("tool_result", tool_call_id=task_id, content="the report")]
    assert step_results(steps, events) == {2: ["inside"], 1: ["the report"]}


# -------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_short_replay_end_to_end_writes_records_report_and_resumes(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "simagent", "bench", "run", "canary", "--policy",
           "raw,simagent,truncate", "--out", str(out), "--json"]
    first = cli_fork.run(cmd, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    summary = json.loads(first.stdout)
    assert summary["rows"] == 3 and set(summary["policies"]) == {"raw", "simagent", "truncate"}
    rows = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert [r["policy"] for r in rows] == ["raw", "simagent", "truncate"]
    for r in rows:
        assert r["verdict"] == "pass" and r["recall"] == 1.0, r
        assert r["tokens_in"] == sum(r["layers"].values()) > 10_000
        assert r["model_calls"] == len(r["per_call_tokens"]) == 3 and r["tool_calls"] == 2
        assert {"run", "workflow", "policy", "model", "epoch", "verdict", "failed_scorers",
                "tokens_in", "tokens_out", "tokens_cache_read", "peak_tokens", "model_calls",
                "tool_calls", "evictions", "clears", "summaries", "recall", "wall_s",
                "cost_usd", "commit"} <= set(r)
    report = (out / "report.md").read_text()
    assert "| simagent |" in report and "### canary" in report
    assert (out / "tokens_vs_recall.png").stat().st_size > 1000
    again = cli_fork.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and json.loads(again.stdout)["rows"] == 3
    assert len((out / "records.jsonl").read_text().splitlines()) == 3  # nothing redone
    assert "recording" not in again.stderr


@pytest.mark.slow
def test_live_mode_runs_a_real_model_over_http_and_records_provider_usage(tmp_path):
    """Live mode: a model over HTTP (the local OpenAI-compatible stub), a real kernel."""
    sys.path.insert(0, str(Path(__file__).parent))
    from openai_stub import OpenAIStub, Reply

    from simagent.bench.workflow_runs import BenchPlan, run_bench

    canary = resolve_workflows(["canary"])[0]
    codes = [s["args"]["code"] for s in canary.steps if s.get("tool") == "run_python"]
    replies = [Reply(tool_calls=[("run_python", json.dumps({"code": c}))], prompt_tokens=5000,
                     completion_tokens=40, cached_tokens=4000) for c in codes]
    replies.append(Reply(text="The mean reading is 6.2525 mV; a line gives a slope of 0.7868 mV/s.",
                         prompt_tokens=6000, completion_tokens=20, cached_tokens=5000))
    with OpenAIStub(replies) as stub:
        plan = BenchPlan([canary], resolve_policies("simagent"), mode="live",
                         model=f"openai-compatible:local@{stub.base_url}")
        [row] = run_bench(plan, tmp_path / "out")
    assert row["mode"] == "live" and row["model"].startswith("openai-compatible:local")
    n = len(codes)
    assert row["tokens_in"] == 5000 * n + 6000 and row["tokens_cache_read"] == 4000 * n + 5000
    assert row["model_calls"] == n + 1 and row["tool_calls"] == n
    assert row["verdict"] == "pass", row["failed_scorers"]  # the kernel really computed it
