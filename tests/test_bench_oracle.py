"""The bench's bounds (issue 31): the oracle's view, the lower-bound check on a real replay,
the cache-aware schedule, and the report that sets every policy against them."""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from simagent.agent.scripted import fill_template, tool_outputs
from simagent.bench.bounds_report import (
    EXCESS_LAYERS,
    excess_table,
    group_lines,
    lower_bound_violations,
    opening_summary,
)
from simagent.bench.oracle import OraclePlan, Script
from simagent.bench.policies import resolve_policies
from simagent.bench.report import recall_groups, short_table
from simagent.bench.report_figures import (
    POLICY_COLORS,
    RECALL_COLORS,
    REFERENCES,
    color_of,
    line_style,
    panels,
    policy_order,
)
from simagent.bench.workflow import load_workflow, resolve_workflows
from simagent.bench.workflow_runs import BenchPlan, run_bench
from simagent.context.clearing import is_cleared
from simagent.context.counting import CATEGORIES
from simagent.context.recall import locate, request_text

TAG = "abc123"
STEPS = [
    {"tool": "run_python", "args": {"code": "print('alpha', a)"}},
    {"tool": "run_python", "args": {"code": "print('beta', b)"}},
    {"tool": "run_python", "args": {"code": "print('gamma')"}},
    {"tool": "run_python", "args": {"code": "x = 9.87654 * 2"}},  # takes beta's value
    {"final": "alpha was {out[-4]|alpha ([\\d.]+)}"},  # quotes the first result
]
#: long enough that a pointer is shorter than each (a short result stays in view)
OUTPUTS = [head + "\n" + "a line of output\n" * 200
           for head in ("alpha 1.2345", "beta 9.87654", "gamma", "ok")]


def history(upto: int, steps: list | None = None, outputs: list | None = None) -> list:
    """The main conversation after steps 0..upto-1, with the scripted model's call ids."""
    steps, outputs = steps or STEPS, outputs or OUTPUTS
    msgs: list = [HumanMessage("task")]
    for i in range(upto):
        cid = f"call_{TAG}_{i}_0"
        msgs.append(AIMessage("", tool_calls=[{"name": "run_python", "id": cid,
                                               "args": steps[i]["args"]}]))
        msgs.append(ToolMessage(outputs[i], tool_call_id=cid, name="run_python"))
    return msgs


def kept(view: list) -> list[str]:
    return [m.text.splitlines()[0] for m in view
            if isinstance(m, ToolMessage) and not is_cleared(m)]


def test_oracle_keeps_what_later_steps_use_and_clears_the_rest_at_once():
    plan = OraclePlan(Script.of("task", STEPS), probes=())
    # before step 3: beta's value is written by step 3, alpha is quoted by the final,
    # gamma is the fresh result; nothing is cleared yet that anything needs
    assert kept(plan.view(history(3), final=False)) == ["alpha 1.2345", "beta 9.87654",
                                                        "gamma"]
    # before the final: beta and gamma are used by nothing left; alpha is quoted
    assert kept(plan.view(history(4), final=True)) == ["alpha 1.2345", "ok"]
    last = plan.decisions[-1]
    assert {f"call_{TAG}_1_0", f"call_{TAG}_2_0"} <= last.results


def test_a_call_nothing_needs_leaves_with_its_result_unless_a_later_quote_counts_across_it():
    """simagent's summaries drop whole calls; an oracle that kept a mark of every call (and
    every non-kernel call's arguments) sent more than simagent at 16k on four long
    workflows. A mark stays only where the final's ``{out[-3]}`` counts positions."""
    steps = [*STEPS[:3], {"tool": "run_python", "args": {"code": "print('delta')"}},
             {"final": "beta was {out[-3]|beta ([\\d.]+)}"}]
    outputs = [*OUTPUTS[:3], "delta\n" + "a line of output\n" * 200]
    plan = OraclePlan(Script.of("task", steps), probes=())
    view = plan.view(history(4, steps, outputs), final=True)
    ids = {c["id"] for m in view if isinstance(m, AIMessage) for c in m.tool_calls}
    assert f"call_{TAG}_0_0" not in ids  # alpha: nothing needs it, not even in place
    results = [m.text for m in view if isinstance(m, ToolMessage)]
    assert [r.splitlines()[0] for r in results] == ["beta 9.87654", "[cleared]", "delta"]
    assert fill_template(steps[-1]["final"], tool_outputs(view)) == "beta was 9.87654"
    assert plan.decisions[-1].dropped == {f"call_{TAG}_0_0"}


def test_a_call_naming_the_file_of_a_probe_fact_stays(tmp_path):
    """pybamm-rate-capability at 16k: the probe's only source was the path a read_file
    call named (its result showed a truncation notice); dropping the call lost it."""
    params = tmp_path / "Chen2020.py"
    params.write_text('values = {\n    "Negative particle diffusivity": 3.3e-14,\n}\n')
    fact = '"Negative particle diffusivity": 3.3e-14'
    steps = [{"tool": "read_file", "args": {"file_path": str(params)}}, *STEPS[1:4],
             {"final": "done"}]
    msgs = history(4, steps, ["[Output was truncated due to size limits]", *OUTPUTS[1:4]])
    msgs[1] = AIMessage("", tool_calls=[{"name": "read_file", "id": f"call_{TAG}_0_0",
                                         "args": steps[0]["args"]}])

    def lost(text: str, facts) -> list[str]:
        return [f for f in facts if locate(f, text, [tmp_path]).status == "lost"]

    plan = OraclePlan(Script.of("task", steps), probes=(fact,), lost=lost)
    view = plan.view(msgs, final=True)
    assert lost(request_text(view), [fact]) == []
    assert f"call_{TAG}_0_0" not in plan.decisions[-1].dropped


def test_code_defining_what_a_later_step_calls_keeps_only_its_signatures():
    """Whole defining cells kept until their last caller outweighed simagent's summaries."""
    body = "\n".join(f"    y = y * {k} + k" for k in range(60))
    code = f"def model(k,\n          t):\n    y = t\n{body}\n    return y\nprint('defined')"
    steps = [{"tool": "run_python", "args": {"code": code}},
             {"tool": "run_python", "args": {"code": "print('other')"}},
             {"tool": "run_python", "args": {"code": "print(model(2, 3))"}},
             {"final": "done"}]
    outputs = ["defined", "other " * 300, "12345.5"]
    plan = OraclePlan(Script.of("task", steps), probes=())
    view = plan.view(history(2, steps, outputs), final=False)
    first = next(m for m in view if isinstance(m, AIMessage))
    shown = first.tool_calls[0]["args"]["code"]
    assert "def model(k,\n          t):" in shown and "y = y * 7" not in shown
    assert plan.decisions[-1].signed == {f"call_{TAG}_0_0"}
    # after its last caller, the definition is needed no more: the call leaves
    later = plan.view(history(3, steps, outputs), final=True)
    assert f"call_{TAG}_0_0" not in {c["id"] for m in later if isinstance(m, AIMessage)
                                     for c in m.tool_calls}


@pytest.mark.slow
def test_no_policy_beats_the_oracle_on_a_bundled_workflow_at_a_small_window(tmp_path):
    """The acceptance check on a real bench run: at 16k simagent summarises five times
    on this workflow, and neither it nor stock may send fewer tokens than the oracle at
    equal recall."""
    plan = BenchPlan(resolve_workflows(["scipy-bratu-newton-log"]),
                     resolve_policies("simagent,stock,oracle"), windows=[16_000])
    rows = run_bench(plan, tmp_path / "out")
    by = {r["policy"]: r for r in rows}
    assert by["oracle"]["verdict"] == "pass" and by["oracle"]["recall"] == 1.0
    assert by["simagent"]["summaries"] > 0  # the case the old oracle lost elsewhere
    assert lower_bound_violations(rows) == []
    assert by["oracle"]["tokens_in"] < by["simagent"]["tokens_in"]


def test_the_template_index_is_resolved_against_the_main_conversation_only():
    steps = [STEPS[0], {"tool": "task", "args": {"description": "d"}},
             {"tool": "run_python", "args": {"code": "print('inside')"}},  # the subagent's
             {"final": "{out[-2]}"}]
    script = Script.of("task", steps, inside={2})
    assert script.main == [0, 1, 3]
    assert script.refs[3] == [(0, 0)]  # out[-2] of the main results (step 0, task)


def rows_for(wf: str, **by_policy) -> list[dict]:
    out = []
    for policy, (tokens, recall, verdict, usd) in by_policy.items():
        out.append({"workflow": wf, "policy": policy.replace("_", "-"), "window": 128_000,
                    "enforced": True, "long": True, "tokens_in": tokens, "recall": recall,
                    "verdict": verdict, "epoch": 0,
                    "cache": {"anthropic": {"cost_usd": usd}, "openai": {"cost_usd": usd}}})
    return out


def test_a_cheaper_run_at_equal_recall_is_reported_as_an_oracle_bug():
    ok = rows_for("w", oracle=(100, 1.0, "pass", 2.0), simagent=(150, 1.0, "pass", 1.0),
                  truncate=(50, 0.5, "pass", 0.5), stock=(90, 1.0, "fail", 1.0))
    assert lower_bound_violations(ok) == []  # lossy or failing runs may be cheaper
    bad = rows_for("w", oracle=(100, 1.0, "pass", 2.0), simagent=(99, 1.0, "pass", 1.0))
    assert lower_bound_violations(bad) == ["w @128k: simagent 99 < oracle 100"]
    # folder names and clock stamps in paths: a few tokens in thousands are no bug
    noise = rows_for("w", oracle=(31_995, 1.0, "pass", 2.0), simagent=(31_937, 1.0, "pass", 1.0))
    assert lower_bound_violations(noise) == []


def test_group_lines_set_tokens_against_the_oracle_and_dollars_against_oracle_cached():
    rows = rows_for("w", oracle=(100, 1.0, "pass", 3.0), oracle_cached=(110, 1.0, "pass", 1.0),
                    simagent=(150, 1.0, "pass", 1.2), stock=(300, 1.0, "pass", 2.4))
    held = [{**r, "workflow": "h", "held_out": True} for r in rows]
    lines = {(s["group"], s["policy"]): s for s in group_lines(rows + held)}
    sim = lines[("tuned long", "simagent")]
    assert sim["tokens_x_oracle"] == 1.5 and sim["tokens_x_stock"] == 0.5
    assert sim["usd_anthropic_x_bound"] == 1.2 and sim["usd_openai_x_stock"] == 0.5
    assert ("held-out", "simagent") in lines
    summary = opening_summary(rows + held)
    assert "| tuned long | 128k | 1/1 | 1.00 | 0.50x | 1.50x | 0.50x / 0.50x " \
           "| 1.20x / 1.20x |" in summary
    assert summary.index("tuned long") < summary.index("held-out")


def test_each_policy_has_one_colour_everywhere_and_windows_are_panels():
    assert color_of("simagent[clear_fraction=0.3]") == color_of("simagent") != color_of("stock")
    assert line_style("oracle")["ls"] == "--"
    # the bounds are black reference lines; no other policy (raw was a near-twin grey of
    # oracle-cached) and no recall share shares a colour with another policy
    assert line_style("oracle-cached")["color"] == "black" and \
        line_style("oracle-cached")["ls"] == ":"
    others = [color_of(p) for p in POLICY_COLORS if p not in REFERENCES]
    assert len(set(others)) == len(others) and "black" not in others
    assert not set(RECALL_COLORS.values()) & set(POLICY_COLORS.values())
    assert policy_order(["truncate", "oracle", "raw", "simagent"]) == [
        "raw", "simagent", "truncate", "oracle"]
    runs = [{"workflow": "w", "policy": "raw", "window": 128_000, "enforced": False},
            {"workflow": "w", "policy": "raw", "window": 128_000, "enforced": True},
            {"workflow": "w", "policy": "raw", "window": 16_000, "enforced": True}]
    assert [t for t, _ in panels(runs)] == ["128k window (declared, not enforced)",
                                            "16k window"]
    assert [r["enforced"] for _, runs_ in panels(runs) for r in runs_] == [False, True]


def test_the_recall_figure_has_a_panel_per_window_and_the_excess_table_every_layer():
    rows = [{**r, "long": True, "enforced": e, "window": w,
             "layers": {"tool_results": t, "tool_schemas": 50, "state_card": c},
             "recovery_tokens": 0, "recall_in_view": 1.0, "recall_by_pointer": 0.0,
             "recall_lost": 0.0}
            for w, e in ((128_000, False), (128_000, True), (16_000, True))
            for r, t, c in ((rows_for("w", oracle=(100, 1.0, "pass", 1.0))[0], 40, 0),
                            (rows_for("w", simagent=(150, 1.0, "pass", 1.0))[0], 80, 10))]
    assert [t for t, _ in recall_groups(rows)] == ["declared window (not enforced)",
                                                   "128k window", "16k window"]
    assert set(recall_groups(rows)[2][1]) == {"oracle", "simagent"}
    table = excess_table(rows)
    named = [line.split(" | ")[2] for line in table.splitlines()[2:]]
    assert named == [label for label, _ in EXCESS_LAYERS]  # every layer, zeros included
    assert "| tool results kept too long | 0.1k | 0.0k | +0.0k | 80% |" in table
    assert "| tool schemas | 0.1k | 0.1k | +0.0k | 0% |" in table
    # every request layer the counter knows lands in exactly one row
    cats = [c for _, cs in EXCESS_LAYERS for c in cs]
    assert sorted(cats) == sorted([*CATEGORIES, "recovery"])


def test_the_printed_table_is_ordered_by_window_then_policy():
    rows = []
    for window, enforced in ((128_000, False), (128_000, True), (16_000, True)):
        for policy in ("stock", "raw", "simagent"):
            rows.append({"workflow": "w", "policy": policy, "window": window,
                         "enforced": enforced, "long": False, "tokens_in": 10, "recall": 1.0,
                         "verdict": "pass", "epoch": 0})
    names = [line.split()[0] + (line.split()[1] if "@" in line else "")
             for line in short_table(rows).splitlines()[1:]]
    assert names == ["simagent", "raw", "stock", "simagent@128k", "raw@128k", "stock@128k",
                     "simagent@16k", "raw@16k", "stock@16k"]


LONGISH = r"""
id = "oracle-demo"
title = "values, a wide table and a quoted result"
prompt = "Tabulate and report."
long = true
[[steps]]
tool = "run_python"
[steps.args]
code = '''
import math
for i in range(300):
    print(f"row {i:4d} " + " ".join(f"{math.sin(i * k):.6f}" for k in range(1, 9)))
print("peak_value=" + str(round(math.e + 2, 5)))'''
[[steps]]
tool = "run_python"
args = { code = "print('unused ' * 400)" }
[[steps]]
tool = "run_python"
[steps.args]
code = '''
scale = 4.71828 / 2
print("scaled", round(scale, 5))'''
[[steps]]
tool = "run_python"
[steps.args]
code = '''
print("\n".join(f"log line {i}" for i in range(200)))
print("RESULT answer=" + str(round(math.pi * 10, 4)))'''
[[steps]]
tool = "run_python"
args = { code = "print('filler ' * 300)" }
[[steps]]
final = 'The answer is {out[-2]|answer=([\d.]+)}.'
[[probes]]
fact = "peak_value=4.71828"
from_step = 0
[[probes]]
fact = "RESULT answer=31.4159"
from_step = 3
[[scorers]]
kind = "numeric"
answer_regex = 'answer is ([\d.]+)'
expected = 31.4159
"""


@pytest.mark.slow
def test_no_policy_beats_the_oracle_on_a_real_replay_and_oracle_cached_pays_less(tmp_path):
    path = tmp_path / "workflows" / "oracle-demo.toml"
    path.parent.mkdir()
    path.write_text(LONGISH)
    wf = load_workflow(path)
    plan = BenchPlan([wf], resolve_policies("all"))
    rows = run_bench(plan, tmp_path / "out")
    by = {r["policy"]: r for r in rows}
    assert set(by) >= {"oracle", "oracle-cached", "simagent", "stock", "raw"}
    oracle, cached = by["oracle"], by["oracle-cached"]
    assert oracle["verdict"] == "pass" and oracle["recall"] == 1.0, oracle
    assert lower_bound_violations(rows) == []
    # against the oracle of its own run (another run's folder names differ in a few tokens)
    assert cached["tokens_in"] >= cached["oracle_tokens_in"]  # keeps more, rewrites less
    for family in ("anthropic", "openai"):
        assert cached["cache"][family]["cost_usd"] <= \
            cached["oracle_cache"][family]["cost_usd"]
        assert cached["cache"][family]["source"] == "scheduled"
    assert oracle["tokens_in"] < by["simagent"]["tokens_in"] < by["raw"]["tokens_in"]
    assert Path(tmp_path / "out" / "records.jsonl").is_file()


def test_the_models_own_earlier_words_leave_the_view_but_the_latest_stay():
    """A summary drops the conversation, so an oracle that kept every word it said was
    beaten by simagent's summaries at 16k (two held-out workflows)."""
    msgs = history(3)
    for i, m in enumerate(msgs):
        if isinstance(m, AIMessage):
            msgs[i] = m.model_copy(update={"content": f"my plan number {i}: " + "words " * 50})
    plan = OraclePlan(Script.of("task", STEPS), probes=())
    view = plan.view(msgs, final=False)
    said = [m.text for m in view if isinstance(m, AIMessage)]
    assert said[:-1] == ["", ""] and said[-1].startswith("my plan number 5")
    assert all(len(m.tool_calls) == 1 for m in view if isinstance(m, AIMessage))


def test_results_nothing_reads_again_become_a_bare_mark_and_probe_sources_a_pointer():
    """A pointer per cleared item cost more than simagent's summaries at 16k on a
    held-out workflow: only a probe fact's source needs to say where it is."""
    plan = OraclePlan(Script.of("task", STEPS), probes=("beta 9.87654",))
    view = plan.view(history(4), final=False)
    texts = {m.tool_call_id.split("_")[2]: m.text for m in view if isinstance(m, ToolMessage)}
    assert texts["2"] == "[cleared]"  # gamma: nothing reads it again
    assert texts["1"].startswith("[result cleared; ")  # holds a probe fact


def test_a_probe_fact_only_in_the_full_output_file_keeps_its_pointer(tmp_path):
    """Evicted or capped results show part of their output; the fact may be in the rest."""
    raw = tmp_path / "7.txt"
    raw.write_text("row 1\nNEWTON lambda=3.480 converged=False\n")
    msgs = history(4)
    i = [k for k, m in enumerate(msgs) if isinstance(m, ToolMessage)][1]  # beta: cleared
    msgs[i] = msgs[i].model_copy(update={"artifact": {"raw_path": str(raw)}})
    plan = OraclePlan(Script.of("task", STEPS), probes=("NEWTON lambda=3.480",))
    view = plan.view(msgs, final=False)
    assert str(raw) in view[i].text  # the pointer names the file, not a bare mark


def test_the_summary_file_is_the_headline_table_with_its_commit():
    """``make run`` copies ``summary.md`` into docs/results: the docs' figures are the
    ones this function wrote from the run's rows (issue 37, defect 16)."""
    from simagent.bench.report import render_summary

    rows = [{**r, "commit": "abc1234"} for r in rows_for(
        "w", oracle=(100, 1.0, "pass", 3.0), oracle_cached=(110, 1.0, "pass", 1.0),
        simagent=(150, 1.0, "pass", 1.2), stock=(300, 1.0, "pass", 2.4))]
    text = render_summary(rows, mode="replay")
    assert text.startswith("`simagent bench run --mode replay` at abc1234: 1 workflows, "
                           "4 runs. One run of each: token and dollar figures move between "
                           "runs, since each run records")
    assert opening_summary(rows) in text
    assert render_summary([r for r in rows if r["policy"] != "simagent"], mode="replay") == ""
    dirty = render_summary([{**r, "commit": "abc1234+dirty"} for r in rows], mode="replay")
    assert dirty.startswith("`simagent bench run --mode replay` at abc1234+dirty "
                            "(uncommitted changes on top of it): ")


def test_repeated_runs_show_each_ratio_s_spread():
    """Epochs are repeated runs (each its own recording, whose tokens differ): a ratio
    that moved between them is its min–max, one that did not a single value; each run is
    set against the references of its own epoch."""
    from simagent.bench.report import render_summary

    first = rows_for("w", oracle=(100, 1.0, "pass", 3.0), oracle_cached=(110, 1.0, "pass", 1.0),
                     simagent=(150, 1.0, "pass", 1.2), stock=(300, 1.0, "pass", 2.4))
    second = [{**r, "epoch": 1} for r in rows_for(
        "w", oracle=(100, 1.0, "pass", 3.0), oracle_cached=(110, 1.0, "pass", 1.0),
        simagent=(159, 0.5, "pass", 1.2), stock=(300, 1.0, "pass", 2.4))]
    summary = opening_summary(first + second)
    assert "| tuned long | 128k | 2/2 | 0.50 | 0.50–0.53x | 1.50–1.59x | 0.50x / 0.50x " \
           "| 1.20x / 1.20x |" in summary
    # the same references twice: each epoch's ratio alone, not a mix of the two
    moved_refs = [{**r, "tokens_in": 2 * r["tokens_in"]} if r["policy"] == "stock" else r
                  for r in second]
    (line,) = [s for s in group_lines(first + moved_refs) if s["policy"] == "simagent"]
    assert line["tokens_x_stock"] == (150 + 159) / (300 + 600)
    text = render_summary([{**r, "commit": "abc1234"} for r in first + second], mode="replay")
    assert "8 runs. 2 runs of each (`--epochs 2`, each replaying its own recording): " in text
