"""What makes ``make run`` fast must not change a figure: the caches answer as a fresh
computation would, and workflows replayed in worker processes give the same rows, in the
same order, written once each."""

from __future__ import annotations

import json

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from test_bench import wf_file

from simagent.bench import oracle, workflow_runs
from simagent.bench.caching import CacheUse
from simagent.bench.oracle import OraclePlan, Script
from simagent.bench.oracle_cached import Bill, Family, schedule, timeline
from simagent.bench.policies import resolve_policies
from simagent.bench.workflow import load_workflow
from simagent.bench.workflow_runs import BenchPlan, load_records, run_bench
from simagent.context import tokens
from simagent.context.counting import count_message
from simagent.context.prices import cache_rules
from simagent.context.tokens import Ruler


def test_short_texts_are_counted_once_per_encoding(monkeypatch):
    calls = []
    real_encode = tokens._encode
    monkeypatch.setattr(tokens, "_encode",
                        lambda n, t: calls.append((n, t)) or real_encode(n, t))
    tokens.clear_cache()
    text = "привет мир: 3.14159e-07"  # under CACHE_MIN_CHARS
    assert len(text) < tokens.CACHE_MIN_CHARS
    o200k = Ruler("o200k_base").count(text)
    assert Ruler("o200k_base").count("".join([text])) == o200k  # equal text, another object
    cl100k = Ruler("cl100k_base").count(text)  # the same text, another encoding: counted
    assert (o200k, cl100k) == (len(real_encode("o200k_base", text)),
                               len(real_encode("cl100k_base", text)))
    assert o200k != cl100k  # this text tells the encodings apart: the key must hold both
    assert calls == [("o200k_base", text), ("cl100k_base", text)]
    tokens.clear_cache()
    Ruler("o200k_base").count(text)
    assert len(calls) == 3


def test_a_results_probe_check_follows_its_text_and_its_file(tmp_path):
    """The memo of ``_holds`` is keyed by what the result shows and its file's path."""
    raw = tmp_path / "3.txt"
    raw.write_text("head\nNEWTON lambda=3.480\n")
    msg = ToolMessage("head (capped)", tool_call_id="c1", artifact={"raw_path": str(raw)})
    assert oracle._holds(msg, "NEWTON lambda=3.480")  # only in the file
    assert not oracle._holds(msg, "lambda=9.9")
    shown = msg.model_copy(update={"content": "lambda=9.9 now shown", "artifact": None})
    assert oracle._holds(shown, "lambda=9.9")  # same id, another text: asked again
    assert not oracle._holds(shown, "NEWTON lambda=3.480")  # no file named: not held


STEPS = [
    {"tool": "run_python", "args": {"code": f"print('value', {k}.2345)"}} for k in range(5)
] + [{"final": "done"}]


def _oracle_timeline():
    """An oracle's decisions over five requests of a synthetic run, as ``reprice`` sees
    them (system prompt plus the main conversation, the tokens the model counted)."""
    ruler = Ruler(tokens.DEFAULT_ENCODING)
    plan = OraclePlan(Script.of("task", STEPS), probes=("value 1.2345",))
    msgs: list = [HumanMessage("task")]
    requests, totals = [], []
    for i in range(5):
        plan.view(list(msgs), final=False)
        req = [SystemMessage("you are a scientist's assistant"), *msgs]
        requests.append(req)
        totals.append(300 + sum(count_message(m, ruler) for m in req))  # 300: schemas
        cid = f"call_abc123_{i}_0"
        msgs.append(AIMessage(f"step {i}", tool_calls=[{"name": "run_python", "id": cid,
                                                        "args": STEPS[i]["args"]}]))
        msgs.append(ToolMessage(f"value {i}.2345\n" + "a line of output\n" * 150,
                                tool_call_id=cid, name="run_python"))
    return plan, requests, totals, ruler


def test_repricing_with_the_memo_equals_a_fresh_timeline_for_every_schedule():
    plan, requests, totals, ruler = _oracle_timeline()
    model = "anthropic:claude-sonnet-4-5"
    rules = cache_rules(model)
    tools = [["run_python"]] * len(requests)

    def fresh():
        return timeline(plan.decisions, requests, totals, ruler, plan.probes)

    warm = fresh()
    best = schedule(warm, Family.of(model))
    trials = [[0], best, [0, 2], [0, 1, 2, 3, 4], [0, 3], best]
    for epochs in trials:  # the warm timeline keeps its memo from one trial to the next
        got, reqs = Bill(warm, tools, ruler, rules, model, 100, CacheUse())(epochs)
        want, want_reqs = Bill(fresh(), tools, ruler, rules, model, 100, CacheUse())(epochs)
        assert (got, reqs) == (want, want_reqs), epochs
    assert len({Bill(warm, tools, ruler, rules, model, 100, CacheUse()).usd(e)
                for e in trials}) > 1  # the schedules differ, so a stale memo would show


TWO = '''
id = "{id}"
title = "t"
prompt = "Compute a value, then report it."

[[steps]]
tool = "run_python"
args = {{ code = "x = {a} * 7\\nprint('value', x)" }}

[[steps]]
tool = "run_python"
args = {{ code = "for i in range(300):\\n    print(f'row {{i:04d}} value={{i / 2:.1f}}')" }}

[[steps]]
final = "The value is {{out[0]|value (\\\\d+)}}."

[[probes]]
fact = "value {v}"
from_step = 0

[[scorers]]
kind = "numeric"
answer_regex = "value is (\\\\d+)"
expected = {v}
'''

#: what a row's figures are apart from ids (the scripted model's play tag and session
#: ids are random per run, and paths name the output folder, so token totals differ by
#: a few tokens between any two runs; the guard against that is the bench comparison)
SHAPE = ("workflow", "policy", "window", "enforced", "verdict", "failed_scorers", "recall",
         "probes_lost", "model_calls", "tool_calls", "evictions", "clears", "summaries",
         "emergencies", "compactions")


@pytest.mark.slow
def test_workflows_in_worker_processes_give_the_serial_rows_in_plan_order(tmp_path,
                                                                       monkeypatch):
    # rows are reused for the same commit; others commit to this checkout while it runs
    monkeypatch.setattr(workflow_runs, "git_commit", lambda **_: "pinned")
    wfs = []
    for wid, a in (("par-one", 6), ("par-two", 8)):
        wfs.append(load_workflow(wf_file(tmp_path, TWO.format(id=wid, a=a, v=a * 7), wid)))
    plan = BenchPlan(wfs, resolve_policies("raw,simagent,oracle-cached"))
    said: list[str] = []
    # workers first: this process runs one thread yet, so they are forked (row_pool)
    parallel = run_bench(plan, tmp_path / "parallel", said.append, jobs=2, notebooks=True)
    serial = run_bench(plan, tmp_path / "serial", jobs=1)
    assert [r["run"] for r in parallel] == [r["run"] for r in serial]
    assert [[r[k] for k in SHAPE] for r in parallel] == [[r[k] for k in SHAPE] for r in serial]
    assert all(r["verdict"] == "pass" for r in parallel)
    # each worker wrote its rows as they finished, once each, whole lines
    written = load_records(tmp_path / "parallel" / "records.jsonl")
    assert sorted(r["run"] for r in written) == sorted(r["run"] for r in serial)
    assert [json.dumps(r, sort_keys=True) for r in written] == \
        [json.dumps(r, sort_keys=True) for r in sorted(parallel, key=lambda r: [
            x["run"] for x in written].index(r["run"]))]
    # progress lines came back from both workers, labelled as a serial run labels them
    assert {f"[{n}/6]" for n in range(1, 7)} <= {m.split()[0] for m in said}
    # each worker re-ran its workflow's notebook after its rows (bench.notebook_rerun)
    books = load_records(tmp_path / "parallel" / "notebooks.jsonl")
    assert sorted((b["workflow"], b["ok"], b["commit"]) for b in books) == \
        [("par-one", True, "pinned"), ("par-two", True, "pinned")], books
    # a resumed bench redoes nothing and returns the same rows
    again = run_bench(plan, tmp_path / "parallel", said.append, jobs=2, notebooks=True)
    assert again == parallel
    assert len(load_records(tmp_path / "parallel" / "records.jsonl")) == len(parallel)
    assert len(load_records(tmp_path / "parallel" / "notebooks.jsonl")) == 2


STAMP = '''
id = "stamp"
title = "t"
prompt = "Read the clock."
[[steps]]
tool = "run_python"
args = {{ code = "import time\\nprint('stamp', time.time_ns() % 10**9)" }}
[[steps]]
final = "The stamp is {{out[-1]|stamp (\\\\d+)}}."
[[probes]]
fact = "stamp"
from_step = 0
[[scorers]]
kind = "numeric"
answer_regex = "stamp is (\\\\d+)"
expected_from = {{ step = 0, regex = "stamp (\\\\d+)" }}
'''


@pytest.mark.slow
def test_each_epoch_replays_its_own_recording(tmp_path, monkeypatch):
    """Epochs are repeated runs, as two ``make run`` are: each records the kernel afresh
    (whose text, and so whose tokens, differ between recordings), so the summary's
    min–max over them is the spread a person rerunning the bench sees. Before, every
    epoch replayed one recording."""
    monkeypatch.setattr(workflow_runs, "git_commit", lambda **_: "pinned")
    wf = load_workflow(wf_file(tmp_path, STAMP.format(), "stamp"))
    rows = run_bench(BenchPlan([wf], resolve_policies("simagent"), epochs=2), tmp_path / "o")
    assert [(r["epoch"], r["verdict"]) for r in rows] == [(0, "pass"), (1, "pass")], rows
    assert rows[0]["final"] != rows[1]["final"]  # each quotes its own kernel's clock
    assert sorted(p.name for p in (tmp_path / "o" / "recordings").iterdir()) == \
        ["stamp", "stamp--1"]
