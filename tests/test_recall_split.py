"""Recall split (in view / by pointer / lost) and its recovery cost, on real files.

Costs are checked against the definition (read_file pages from the file start, counted
with the project's tokenizer, plus a per-call overhead), so a change in paging, in the
chain search or in what is counted shows up as a wrong number, not just a wrong status.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from deepagents.middleware.filesystem import DEFAULT_READ_LIMIT
from langchain_core.messages import HumanMessage, ToolMessage

from simagent.bench.policies import POLICIES
from simagent.bench.report import (
    RECOVERY_DEFINITION,
    policy_table,
    ranked,
    recall_parts,
    recall_split_table,
    render_report,
    short_table,
    write_report,
)
from simagent.bench.workflow import Probe, Workflow
from simagent.bench.workflow_runs import measure_run, summarize
from simagent.context.counting import count_text
from simagent.context.recall import (
    CALL_OVERHEAD_TOKENS,
    PAGE_LINES,
    locate,
    reachable,
    recall,
    tail_cost,
)

FACT = "capacity 4.955 Ah"


def filler(n: int, tag: str = "row") -> list[str]:
    return [f"{tag} {i}: t={i * 0.1:.3f} V=3.{i % 97:02d} I=-1.25e+00" for i in range(n)]


def write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def pages(lines: list[str], n: int) -> int:
    """What reading the first ``n`` pages of ``lines`` costs, by the definition."""
    cut = [lines[i * PAGE_LINES:(i + 1) * PAGE_LINES] for i in range(n)]
    return sum(count_text("".join(f"{line}\n" for line in page)) + CALL_OVERHEAD_TOKENS
               for page in cut)


def test_page_size_is_deepagents_read_file_default():
    assert PAGE_LINES == DEFAULT_READ_LIMIT == 100
    assert CALL_OVERHEAD_TOKENS > 0


def test_fact_in_the_request_is_in_view_and_free(tmp_path):
    raw = write(tmp_path / "raw.txt", [FACT])
    loc = locate(FACT, f"result: {FACT}; full output at {raw}", [tmp_path])
    assert loc.status == "in_view"
    assert loc.pointer is None and loc.chain == () and loc.recovery_tokens is None
    assert loc.search_tokens is None


def test_fact_on_page_two_of_a_named_file_costs_two_pages(tmp_path):
    lines = filler(150)
    lines[130] = f"{lines[130]} {FACT}"
    raw = write(tmp_path / "out" / "raw.txt", lines)
    loc = locate(FACT, f"[output cut; the full output is at {raw}]", [tmp_path])
    assert loc.status == "by_pointer"
    assert loc.pointer == str(raw) and loc.chain == (str(raw),)
    assert loc.recovery_tokens == pages(lines, 2)
    assert loc.recovery_tokens > pages(lines, 1) + CALL_OVERHEAD_TOKENS
    # grep would return just the line: a lower bound, much below the paged read
    assert loc.search_tokens == count_text(lines[130]) + CALL_OVERHEAD_TOKENS
    assert loc.search_tokens < loc.recovery_tokens


def test_fact_on_page_one_costs_one_page(tmp_path):
    lines = filler(150)
    lines[3] = FACT
    raw = write(tmp_path / "raw.txt", lines)
    assert locate(FACT, f"see {raw}", [tmp_path]).recovery_tokens == pages(lines, 1)


def test_fact_split_over_a_page_boundary_needs_the_page_holding_its_end(tmp_path):
    lines = filler(150)
    lines[99], lines[100] = "capacity", "4.955 Ah"
    raw = write(tmp_path / "raw.txt", lines)
    loc = locate("capacity\n4.955 Ah", f"see {raw}", [tmp_path])
    assert loc.recovery_tokens == pages(lines, 2)


def test_two_hop_chain_costs_the_history_pages_and_the_raw_pages(tmp_path):
    raw_lines = filler(40, "raw")
    raw_lines[20] = FACT
    raw = write(tmp_path / "outputs" / "call_7.txt", raw_lines)
    hist_lines = filler(120, "turn")
    hist_lines[110] = f"tool result cut; the full output is at {raw}."
    history = write(tmp_path / "history" / "conversation.md", hist_lines)
    loc = locate(FACT, f"Summary so far. Full history: {history}", [tmp_path])
    assert loc.status == "by_pointer"
    assert loc.chain == (str(history), str(raw)) and loc.pointer == str(history)
    assert loc.recovery_tokens == pages(hist_lines, 2) + pages(raw_lines, 1)
    assert loc.search_tokens == count_text(FACT) + CALL_OVERHEAD_TOKENS
    # one hop is not enough to reach it
    assert locate(FACT, f"history: {history}", [tmp_path], hops=1).status == "lost"


def test_the_cheaper_of_two_pointers_wins(tmp_path):
    big_lines = filler(300)
    big_lines[250] = FACT
    big = write(tmp_path / "big.txt", big_lines)
    small_lines = filler(10)
    small_lines[3] = FACT
    small = write(tmp_path / "small.txt", small_lines)
    loc = locate(FACT, f"outputs at {big} and {small}", [tmp_path])  # big named first
    assert loc.pointer == str(small)
    assert loc.recovery_tokens == pages(small_lines, 1) < pages(big_lines, 3)


def test_a_cheap_two_hop_chain_beats_an_expensive_direct_pointer(tmp_path):
    direct_lines = filler(300)
    direct_lines[290] = FACT
    direct = write(tmp_path / "direct.txt", direct_lines)
    raw = write(tmp_path / "raw.txt", [FACT])
    index = write(tmp_path / "index.md", [f"raw output: {raw}"])
    loc = locate(FACT, f"see {direct} or the index {index}", [tmp_path])
    assert loc.chain == (str(index), str(raw))
    assert loc.recovery_tokens == pages([f"raw output: {raw}"], 1) + pages([FACT], 1)
    assert loc.recovery_tokens < pages(direct_lines, 3)


def test_a_fact_nowhere_or_outside_the_roots_is_lost(tmp_path):
    inside, outside = tmp_path / "session", tmp_path / "elsewhere"
    kept = write(inside / "raw.txt", ["nothing to see"])
    away = write(outside / "raw.txt", [FACT])
    for text in (f"see {kept}", f"see {away}", "no paths here"):
        loc = locate(FACT, text, [inside])
        assert loc.status == "lost" and loc.pointer is None and loc.recovery_tokens is None
    assert locate(FACT, f"see {away}", [outside]).status == "by_pointer"


def test_reachable_and_recall_keep_their_meaning(tmp_path):
    raw = write(tmp_path / "raw.txt", [*filler(5), FACT])
    text = f"see {raw}"
    assert reachable(FACT, text, [tmp_path]) and not reachable("absent 1.23", text, [tmp_path])
    msgs = [HumanMessage("go"), ToolMessage(f"cut; full output at {raw}", tool_call_id="c1")]
    assert recall([FACT, "go", "absent 1.23"], msgs, [tmp_path]) == 2 / 3


def test_a_kernel_handle_points_at_its_raw_output_in_the_sessions_outputs(tmp_path):
    """Placeholders name a kernel output by its handle alone (``_out[3]``): the model pages
    it back in the kernel, so recall follows the handle into the outputs folder, pages it
    from its end as ``.tail`` does, and only where that folder is the kernel's."""
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    lines = filler(150)
    lines[140] = FACT
    write(outputs / "0003.txt", lines)
    text = "[result cleared; full output: _out[3] (12 lines)]"
    loc = locate(FACT, text, [tmp_path], outputs=outputs)
    assert loc.status == "by_pointer" and loc.pointer == "_out[3]"
    assert loc.recovery_tokens == tail_cost("\n".join(lines) + "\n", FACT)
    assert locate(FACT, text, [tmp_path]).status == "lost"  # no kernel outputs given
    assert locate(FACT, text.replace("3", "4"), [tmp_path], outputs=outputs).status == "lost"
    assert reachable(FACT, text, [tmp_path], outputs=outputs)
    assert recall([FACT], [HumanMessage(text)], [tmp_path], outputs=outputs) == 1.0


# ----------------------------------------------------------------- records, summary
def test_measure_run_records_the_split_per_probe_as_json(tmp_path):
    lines = filler(150)
    lines[120] = FACT
    raw = write(tmp_path / "raw.txt", lines)
    probes = (Probe("seen 1.5", 0), Probe(FACT, 0), Probe("lost 9.9", 0),
              Probe("x" * 300, 0))
    wf = Workflow(id="w", title="t", prompt="p", steps=[{"final": "done"}],
                  path=tmp_path / "w.toml", long=True, probes=probes)
    request = [HumanMessage("p"), ToolMessage(f"seen 1.5, rest at {raw}", tool_call_id="c")]
    session = SimpleNamespace(trace=SimpleNamespace(events=lambda: []), simulator=None,
                              paths=SimpleNamespace(root=tmp_path, outputs=tmp_path / "outputs"),
                              workspace=tmp_path)
    row = measure_run(wf, POLICIES["simagent"], 0, session=session,
                      model=SimpleNamespace(requests=[request]),
                      result=SimpleNamespace(final="done", status="done"), wall=1.0,
                      mode="replay", model_id="replay:w")
    assert row["recall"] == 0.5 and row["probes_lost"] == ["lost 9.9", "x" * 300]
    assert (row["recall_in_view"], row["recall_by_pointer"], row["recall_lost"]) == \
        (0.25, 0.25, 0.5)
    assert row["recovery_tokens"] == pages(lines, 2)
    assert row["recovery_search_tokens"] == count_text(FACT) + CALL_OVERHEAD_TOKENS
    assert [p["status"] for p in row["probes"]] == ["in_view", "by_pointer", "lost", "lost"]
    assert row["probes"][1] == {"fact": FACT, "status": "by_pointer", "pointer": str(raw),
                                "recovery_tokens": pages(lines, 2)}
    assert row["probes"][3]["fact"] == "x" * 120
    assert json.loads(json.dumps(row))["probes"] == row["probes"]


def row(policy: str, tokens: int, *, recall: float = 1.0, split: tuple | None = None,
        recovery: int = 0, search: int = 0, long: bool = True, wf: str = "sweep") -> dict:
    r = {"workflow": wf, "policy": policy, "long": long, "verdict": "pass",
         "tokens_in": tokens, "recall": recall, "peak_tokens": tokens // 4, "model_calls": 4,
         "tool_calls": 3, "evictions": 0, "clears": 0, "summaries": 0, "wall_s": 1.0,
         "failed_scorers": [], "per_call_tokens": [tokens // 4] * 4, "layers": {}}
    if split is not None:  # rows recorded before the split have none of these keys
        r.update(recall_in_view=split[0], recall_by_pointer=split[1], recall_lost=split[2],
                 recovery_tokens=recovery, recovery_search_tokens=search)
    return r


ROWS = [
    row("raw", 100_000, split=(1.0, 0.0, 0.0)),
    row("simagent", 20_000, split=(0.5, 0.5, 0.0), recovery=5_000, search=300),
    row("evict", 15_000, split=(0.0, 1.0, 0.0), recovery=30_000, search=900),
    row("truncate", 10_000, recall=0.5),  # old-style record
    row("simagent", 3_000, split=(0.0, 1.0, 0.0), recovery=400, search=50, long=False,
        wf="canary"),
]


def test_summarize_adds_the_split_and_recovery_and_keeps_old_keys():
    s = summarize(ROWS)
    sim, ev, tr = s["simagent"], s["evict"], s["truncate"]
    for key in ("runs", "passed", "tokens_in", "long_tokens_in", "long_raw_tokens_in",
                "long_ratio_to_raw", "min_long_recall", "mean_recall"):
        assert key in sim and key in tr
    assert sim["long_tokens_in"] == 20_000 and sim["tokens_in"] == 23_000
    assert sim["long_recovery_tokens"] == 5_000  # the short workflow's 400 stays out
    assert sim["long_tokens_with_recovery"] == 25_000
    assert sim["long_ratio_with_recovery"] == 0.25 and sim["long_ratio_to_raw"] == 0.2
    assert (sim["long_in_view_mean"], sim["long_by_pointer_mean"], sim["long_lost_mean"]) \
        == (0.5, 0.5, 0.0)
    assert sim["long_by_pointer_sum"] == 0.5 and sim["long_recovery_search_tokens"] == 300
    assert ev["long_ratio_with_recovery"] == 0.45
    # an old record counts in the old totals, not in the split
    assert tr["long_split_runs"] == 0 and tr["long_in_view_mean"] is None
    assert tr["long_tokens_with_recovery"] == 10_000 and tr["min_long_recall"] == 0.5


def test_policy_table_ranks_by_tokens_with_recovery_and_renders_old_rows():
    table = policy_table(ROWS)
    order = [line.split("|")[2].strip() for line in table.splitlines()[2:]]
    # evict sends fewer tokens than simagent but costs more once recovery is counted;
    # truncate is cheapest but loses half its facts, so it ranks after every lossless one
    assert order == ["simagent", "evict", "raw", "truncate"]
    assert "long: by pointer" in table.splitlines()[0]
    sim = next(line for line in table.splitlines() if "| simagent |" in line)
    assert "| 25.0k | 0.25 | 0.500 | 0.500 | 0.000 |" in sim
    old = next(line for line in table.splitlines() if "| truncate |" in line)
    assert "| - | - | - |" in old  # no split for an old record
    assert short_table(ROWS).splitlines()[1].startswith("simagent")


def test_recall_split_section_has_one_row_per_long_workflow_and_policy():
    table = recall_split_table(ROWS)
    body = table.splitlines()[2:]
    assert len(body) == 4  # the short canary run is not listed
    assert "| sweep | evict | 0.00 | 1.00 | 0.00 | 30.0k | 900 |" in body
    assert "| sweep | truncate | - | - | - | - | - |" in body
    report = render_report(ROWS, mode="replay")
    assert "## Recall split and recovery cost" in report and RECOVERY_DEFINITION in report
    assert report.index("## Recall split") < report.index("## Workflows")


def test_recall_plot_parts_and_png(tmp_path):
    parts = recall_parts(ROWS)
    assert parts["simagent"]["in_view"] == 0.25 and parts["simagent"]["by_pointer"] == 0.75
    assert parts["simagent"]["recovery_tokens"] == 5_400
    assert parts["truncate"]["unsplit"] == 0.5 and parts["truncate"]["lost"] == 0.5
    path = write_report(ROWS, tmp_path, mode="replay")
    assert "![tokens_vs_recall.png](tokens_vs_recall.png)" in path.read_text()
    assert (tmp_path / "tokens_vs_recall.png").stat().st_size > 1000


def test_a_tuning_run_without_raw_still_splits_and_ranks():
    rows = [row("simagent", 20_000, split=(0.5, 0.5, 0.0), recovery=5_000),
            row("simagent[clear_fraction=0.3]", 12_000, split=(0.5, 0.0, 0.5))]
    s = summarize(rows)
    variant = s["simagent[clear_fraction=0.3]"]
    assert variant["long_tokens_in"] == 12_000 and variant["long_lost_mean"] == 0.5
    assert variant["long_ratio_to_raw"] is None and s["simagent"]["long_recovery_tokens"] == 5_000
    # cheaper, but it loses half its facts: the lossless policy ranks first
    assert [name for name, _ in ranked(s)] == ["simagent", "simagent[clear_fraction=0.3]"]


def test_a_path_at_the_end_of_a_sentence_or_in_bold_is_still_a_pointer(tmp_path):
    raw = tmp_path / "out.txt"
    raw.write_text("result: 42.5\n")
    for text in (f"see {raw}!", f"is it in {raw}?", f"**{raw}**", f"<{raw}>", f"{{{raw}}}"):
        assert locate("result: 42.5", text, [tmp_path]).status == "by_pointer", text


def test_a_kernel_output_is_paged_back_from_its_end(tmp_path):
    """``_out[n].tail`` serves kernel raw outputs: a final value on the last page costs one
    page, not the whole file; the same file elsewhere is read from the start."""
    from simagent.context.recall import read_cost, tail_cost

    body = "".join(f"row {i} {i * 0.5:.3e}\n" for i in range(1_000)) + "final h=1.280e-03\n"
    fact = "final h=1.280e-03"
    (tmp_path / "outputs").mkdir()
    raw = tmp_path / "outputs" / "0005.txt"
    other = tmp_path / "elsewhere.txt"
    for path in (raw, other):
        path.write_text(body)
    lines = body.splitlines(keepends=True)
    one_page = count_text("".join(lines[-PAGE_LINES:])) + CALL_OVERHEAD_TOKENS
    assert tail_cost(body, fact) == one_page < read_cost(body, fact)
    assert locate(fact, f"see {raw}", [tmp_path]).recovery_tokens == one_page
    assert locate(fact, f"see {other}", [tmp_path]).recovery_tokens == read_cost(body, fact)
    # a fact on the first page is still cheapest from the start
    assert locate("row 3 ", f"see {raw}", [tmp_path]).recovery_tokens == read_cost(body, "row 3 ")
