"""The bench report: markdown tables and PNG plots from records (pure but for the files).

Ratios are to ``raw`` for the same workflow in the same run, so machine noise and model
changes cancel. The renderers take rows and return text; only :func:`write_report`
touches the disk.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simagent.bench.bounds_report import (
    dollars,
    excess_table,
    group_table,
    lower_bound_violations,
    opening_summary,
)
from simagent.bench.cost_report import cache_table, kilo, pareto_plot
from simagent.bench.live_report import LIVE_NOTE, live_summary, live_table
from simagent.bench.notebook_rerun import report_section
from simagent.bench.report_figures import recall_plot, request_size_plot
from simagent.bench.workflow_runs import (
    provider_refused,
    run_label,
    summarize,
    sweep_order,
    window_tag,
)
from simagent.context.counting import CATEGORIES, CATEGORY_LABELS
from simagent.context.recall import CALL_OVERHEAD_TOKENS, PAGE_LINES
from simagent.context.recall import STATUSES as SPLIT

SUMMARY_NOTE = (
    "simagent per workflow group and window. Tokens are set against `oracle` (it knows "
    "the script's future and keeps in view only what later steps and probes use: the "
    "lower bound), dollars against `oracle-cached` (the oracle's clearing rescheduled for "
    "each provider's prompt cache); both against `stock`. *Held-out* workflows were "
    "written apart from the tuning. Ratios sum the workflows both runs completed.")
#: Why a token figure differs between two runs of the same commit (measured: two runs of
#: two workflows at 13e2329 differed in every row, up to 0.02 in a summary ratio).
MOVES = ("token and dollar figures move between runs, since each run records the "
         "workflows' kernel steps afresh and the timings, session ids and paths in the text "
         "the model reads change its token counts")
RECOVERY_DEFINITION = (
    "Policies that lose no probe fact rank first, then by the share they lose; within "
    "that, by long-workflow input tokens plus recovery cost: what a model that "
    "knows only the pointer would spend paging each by-pointer fact back with `read_file` "
    f"({PAGE_LINES}-line pages from the file start through the page holding the next path, "
    f"then the fact; +{CALL_OVERHEAD_TOKENS} tokens a call; a kernel's raw output may "
    "instead be paged back from its end with `_out[n].tail`, whichever is cheaper). The "
    "grep figure is a lower bound and does not rank.")


def _ratio(n: float, base: float | None) -> str:
    return f"{n / base:.2f}" if base else "-"


def _num(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def ranked(summary: dict[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Policies that lose no probe fact first, then by the share they lose; within each,
    cheapest first by long tokens with recovery (a lost fact has no price, so tokens alone
    would reward losing it). Those without long data last, in first-seen order."""
    def key(item: tuple[str, dict[str, Any]]) -> tuple[bool, float, int]:
        s = item[1]
        if not s["long_runs"]:
            return (True, 0.0, 0)
        lost = s.get("long_lost_mean")
        if lost is None:  # old records: the yes/no recall, as a mean like the split's
            lost = 1.0 - (s.get("mean_long_recall") or s.get("min_long_recall") or 0.0)
        return (False, round(lost, 4),
                s.get("long_tokens_with_recovery", s["long_tokens_in"]))

    return sorted(summary.items(), key=key)


def policy_table(rows: Sequence[dict[str, Any]]) -> str:
    """One line per policy, cheapest first counting recovery: pass count, tokens, ratio to
    raw on long workflows (with and without recovery), the recall split and recall."""
    summary = summarize(rows)
    lines = ["| rank | policy | passed | tokens in (all) | long: tokens in | long: ratio to raw "
             "| long: tokens + recovery | long: ratio to raw with recovery | long: in view "
             "| long: by pointer | long: lost | long: min recall | mean recall |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, (name, s) in enumerate(ranked(summary), 1):
        has_long = bool(s["long_runs"])
        with_rec = s.get("long_tokens_with_recovery")
        lines.append(
            f"| {i} | {name} | {s['passed']}/{s['runs']} | {kilo(s['tokens_in'])} | "
            f"{kilo(s['long_tokens_in'])} | {_num(s['long_ratio_to_raw'])} | "
            f"{kilo(with_rec) if has_long and with_rec is not None else '-'} | "
            f"{_num(s.get('long_ratio_with_recovery'))} | "
            + " | ".join(_num(s.get(f"long_{k}_mean"), ".3f") for k in SPLIT) + " | "
            f"{s['min_long_recall'] if s['min_long_recall'] is not None else '-'} "
            f"| {_num(s['mean_recall'], '.3f')} |")
    return "\n".join(lines)


def recall_split_table(rows: Sequence[dict[str, Any]]) -> str:
    """One line per (long workflow, policy): where the probes stand and what getting the
    by-pointer ones back costs. Rows recorded before the split show ``-``."""
    lines = ["| workflow | policy | in view | by pointer | lost | recovery tokens "
             "| search lower bound |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if not r.get("long"):
            continue
        split = "recall_in_view" in r
        cells = [_num(r.get(f"recall_{k}"), ".2f") if split else "-" for k in SPLIT]
        lines.append(
            f"| {r['workflow']} | {run_label(r)} | " + " | ".join(cells) + " | "
            f"{kilo(r.get('recovery_tokens') or 0) if split else '-'} | "
            f"{kilo(r.get('recovery_search_tokens') or 0) if split else '-'} |")
    return "\n".join(lines) if len(lines) > 2 else "(no long workflows in these records)"


def window_table(rows: Sequence[dict[str, Any]]) -> str:
    """The sweep: per enforced window (largest first) and policy, whether every workflow
    completed (no provider refusal reached the run), what the layers did, what was kept,
    and tokens next to ``stock`` at the same window. Empty when no run was enforced."""
    summary = summarize([r for r in rows if r.get("enforced")])
    if not summary:
        return ""
    lines = ["| window | policy | passed | refused by provider | summaries | emergencies "
             "(max per run) | long: tokens in | x stock | in view | by pointer | lost "
             "| min recall | ledger recall | ledger entries / compactions |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("enforced") and r.get("long"):
            runs.setdefault(run_label(r), []).append(r)
    for label, s in sweep_order(summary):
        mine = runs.get(label, [])
        lines.append(
            f"| {kilo(s['window'] or 0)} | {s['policy']} | {s['passed']}/{s['runs']} | "
            f"{s['provider_errors']} | {s.get('summaries', 0)} | {s['emergencies']} "
            f"({s.get('max_emergencies', 0)}) | {kilo(s['long_tokens_in'])} | "
            f"{_num(s.get('long_ratio_to_stock'))} | "
            + " | ".join(_num(s.get(f"long_{k}_mean"), ".3f") for k in SPLIT) + " | "
            f"{s['min_long_recall'] if s['min_long_recall'] is not None else '-'} | "
            f"{_num(ledger_recall(mine))} | {ledger_cover(mine)} |")
    return "\n".join(lines)


def ledger_recall(runs: Sequence[dict[str, Any]]) -> float | None:
    """Mean ``ledger_recall`` (share of the probe facts that left the view which the
    ``recall`` tool finds) over the long runs of one sweep line; None where none left."""
    got = [r["ledger_recall"] for r in runs if r.get("ledger_recall") is not None]
    return sum(got) / len(got) if got else None


def ledger_cover(runs: Sequence[dict[str, Any]]) -> str:
    """``entries/compactions`` over the long runs of one sweep line (records before the
    ledger: ``-``)."""
    mine = [r for r in runs if "compactions" in r]
    if not mine:
        return "-"
    return f"{sum(r['ledger_entries'] for r in mine)}/{sum(r['compactions'] for r in mine)}"


def workflow_tables(rows: Sequence[dict[str, Any]]) -> str:
    """Per workflow, every run: tokens as a multiple of ``raw`` and of ``oracle``, and
    Anthropic dollars (prompt caching) as a multiple of ``oracle-cached``, at the same
    window."""
    out = []
    for wf in dict.fromkeys(r["workflow"] for r in rows):
        mine = [r for r in rows if r["workflow"] == wf]

        def ref(policy: str, mine: list[dict[str, Any]] = mine) -> dict[Any, dict[str, Any]]:
            return {(r.get("window"), bool(r.get("enforced"))): r for r in mine
                    if r["policy"] == policy and not provider_refused(r)}

        raws, oracles, cached = ref("raw"), ref("oracle"), ref("oracle-cached")
        tag = " (long, held out)" if mine[0].get("held_out") else \
            " (long)" if mine[0].get("long") else ""
        out += [f"### {wf}{tag}", "",
                "| policy | verdict | tokens in | x raw | x oracle | $ x oracle-cached "
                "| peak | calls | tools | evict | clear | summ | recall | wall s | failed |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in mine:
            at = (r.get("window"), bool(r.get("enforced")))
            raw, orc, cch = raws.get(at), oracles.get(at), cached.get(at)
            usd, bound = dollars(r, "anthropic"), dollars(cch, "anthropic") if cch else None
            out.append(
                f"| {run_label(r)} | {r['verdict']} | {kilo(r['tokens_in'])} | "
                f"{_ratio(r['tokens_in'], raw['tokens_in'] if raw else None)} | "
                f"{_ratio(r['tokens_in'], orc['tokens_in'] if orc else None)} | "
                f"{_ratio(usd, bound) if usd is not None else '-'} | "
                f"{kilo(r['peak_tokens'])} | {r['model_calls']} "
                f"| {r['tool_calls']} | {r['evictions']} | {r['clears']} | {r['summaries']} | "
                f"{r['recall']:.2f} | {r['wall_s']:.1f} | "
                f"{', '.join(r['failed_scorers']) or '-'} |")
        out.append("")
    return "\n".join(out)


def support_table(rows: Sequence[dict[str, Any]]) -> str:
    """Numbers in each final answer that nothing the run saw backs (``support.py``), one
    line per workflow and outcome: policies whose answers fare alike share a line. Empty
    when no row carries the fields (records written before the check)."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    for r in rows:
        if "numbers_checked" not in r:
            continue
        key = (r["workflow"], r["numbers_checked"], r.get("numbers_unsupported", 0),
               tuple(r.get("unsupported_numbers") or ()), r.get("numbers_raw_only", 0),
               r.get("support_power"))
        groups.setdefault(key, []).append(run_label(r))
    if not groups:
        return ""
    lines = ["| workflow | policies | checked | unsupported | raw only | power "
             "| unsupported numbers |", "|---|---|---|---|---|---|---|"]
    for (wf, checked, n, listed, raw, power), labels in groups.items():
        shown = ", ".join(f"`{x}`" for x in listed) + (" ..." if n > len(listed) else "")
        lines.append(f"| {wf} | {', '.join(labels)} | {checked} | {n} | {raw} | "
                     f"{_num(power)} | {shown or '-'} |")
    return "\n".join(lines)


def layer_table(rows: Sequence[dict[str, Any]]) -> str:
    """Which request layer spent the input tokens, per policy (all workflows)."""
    by_policy: dict[str, dict[str, int]] = {}
    for r in rows:
        acc = by_policy.setdefault(run_label(r), {})
        for cat, n in (r.get("layers") or {}).items():
            acc[cat] = acc.get(cat, 0) + n
    cats = [c for c in CATEGORIES if any(c in v for v in by_policy.values())]
    lines = ["| policy | " + " | ".join(CATEGORY_LABELS[c] for c in cats) + " |",
             "|---|" + "---|" * len(cats)]
    for name, acc in by_policy.items():
        total = sum(acc.values()) or 1
        lines.append(f"| {name} | " + " | ".join(
            f"{kilo(acc.get(c, 0))} ({_share(acc.get(c, 0), total)})" for c in cats) + " |")
    return "\n".join(lines)


def _share(part: int, whole: int) -> str:
    """Small layers (a state card, images) keep a decimal so they do not read as 0 %."""
    pct = 100 * part / whole
    return f"{pct:.0f}%" if pct >= 10 or pct == 0 else f"{pct:.1f}%"


def bound_check(rows: Sequence[dict[str, Any]]) -> str:
    """One line: does any run pass with the oracle's recall on fewer tokens (an oracle bug)?"""
    bad = lower_bound_violations(rows)
    if not bad:
        return ("Lower-bound check: no run passes at the oracle's recall with fewer tokens "
                "than the oracle (same workflow and window).")
    return "Lower-bound check FAILED (an oracle bug): " + "; ".join(bad)


def classic(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs at each workflow's declared window, not enforced (ratios to an unbounded
    ``raw``); all rows when the run is a sweep alone. The sweep has its own tables."""
    return [r for r in rows if not r.get("enforced")] or list(rows)


def render_report(rows: Sequence[dict[str, Any]], *, mode: str, plots: Sequence[str] = ()) -> str:
    commit = next((r.get("commit") for r in rows if r.get("commit")), None)
    cost_model = next((r.get("cost_model") for r in rows), None)
    parts = [f"# simagent bench ({mode})", "",
             f"{len({r['workflow'] for r in rows})} workflows x "
             f"{len({r['policy'] for r in rows})} policies, commit {commit or '?'}. "
             "Tokens are what the harness sent (counted on each request the model received); "
             f"ratios are to `raw` in this run; cost at {cost_model} list prices.", "",
             *(["## Summary", "", SUMMARY_NOTE, "", summary, "",
                *(["Where simagent's tokens over the oracle's go (request layers, plus "
                   "the recovery a by-pointer fact costs):", "", excess, ""]
                  if (excess := excess_table(rows)) else [])]
               if (summary := opening_summary(rows)) else []),
             *(["## Live runs", "", LIVE_NOTE, "", live_summary(rows), "", live, ""]
               if (live := live_table(rows)) else []),
             *([bound_check(rows), ""] if any(r["policy"] == "oracle" for r in rows)
               else []),
             *(["## By group", "", table, ""] if (table := group_table(rows)) else []),
             "## Policies", "", RECOVERY_DEFINITION, "", policy_table(classic(rows)), "",
             *(["## Window sweep", "",
                "Each run at an enforced window: the replayed model refuses a request over "
                "it as a provider does (`context_length_exceeded`); such a run is recorded "
                "as failed, not crashed. Ratios are to `stock` at the same window.", "",
                sweep, ""] if (sweep := window_table(rows)) else []),
             *(["## Cost with prompt caching", "",
                "Long workflows (all, when the run has none). The provider's prefix cache "
                "simulated on the requests each run sent (replay) or as the provider "
                "reported it (live): Anthropic writes "
                "at 1.25x the input price and reads at 0.1x at its breakpoints (tools, "
                "system prompt, last message); OpenAI reads the longest prefix seen before "
                "(from 1,024 tokens, in 128-token steps) at its cached rate. A clearing "
                "epoch or a summary rewrites the prefix after the first message it changes."
                , "", costs, ""] if (costs := cache_table(rows)) else []),
             "## Recall split and recovery cost", "",
             "A probe fact is *in view* (verbatim in the last request), *by pointer* (in a "
             "file the request names, up to two paths deep) or *lost*. Long workflows.", "",
             recall_split_table(classic(rows)), "",
             "## Input tokens by request layer", "", layer_table(classic(rows)), "",
             *(["## Unsupported numbers", "", "Numbers in the final answer that no tool "
                "result, code or report of the run backs (rounding, SI prefixes and "
                "percentages allowed; small integers, markers, dates and the prompt's "
                "numbers not checked). *Raw only* (flagged too): backed by nothing but a "
                "raw output file the model never saw in a tool result. *Power*: the share "
                "of the checked numbers' neighbours (nudged 1-5 %) the run's sources would "
                "have flagged; dense per-step logs back many by chance.", "", t, ""]
               if (t := support_table(rows)) else []),
             "## Workflows", "", workflow_tables(rows)]
    if plots:
        parts += ["## Plots", ""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(parts) + "\n"


def short_table(rows: Sequence[dict[str, Any]]) -> str:
    """The stdout summary: one line per policy and window, by window (the declared one
    first, then largest first), then policy (simagent first)."""
    summary = summarize(rows)
    lines = [f"{'policy':<30} {'passed':>7} {'tokens in':>11} {'long x raw':>10} "
             f"{'x stock':>8} {'+recovery':>10} {'min recall':>10}"]
    for name, s in sweep_order(summary):
        lines.append(f"{name:<30} {s['passed']:>3}/{s['runs']:<3} {kilo(s['tokens_in']):>11} "
                     f"{_num(s['long_ratio_to_raw']):>10} "
                     f"{_num(s.get('long_ratio_to_stock')):>8} "
                     f"{_num(s.get('long_ratio_with_recovery')):>10} "
                     f"{s['min_long_recall'] if s['min_long_recall'] is not None else '-':>10}")
    live = live_table(rows)  # live runs are few and slow: each is shown
    return "\n".join(lines) + (f"\n\n{live_summary(rows)}\n\n{live}" if live else "")


def recall_parts(rows: Sequence[dict[str, Any]], key: Any = run_label
                 ) -> dict[str, dict[str, float]]:
    """Per policy (``key`` of a row: its run label), mean shares over all its runs: in
    view, by pointer, lost, and ``unsplit`` (kept, from records written before the split),
    plus tokens in and recovery tokens."""
    acc: dict[str, dict[str, float]] = {}
    for r in rows:
        a = acc.setdefault(key(r), {"n": 0, **{k: 0.0 for k in SPLIT}, "unsplit": 0.0,
                                         "tokens_in": 0, "recovery_tokens": 0})
        a["n"] += 1
        a["tokens_in"] += r["tokens_in"]
        a["recovery_tokens"] += r.get("recovery_tokens") or 0
        if "recall_in_view" in r:
            for k in SPLIT:
                a[k] += r.get(f"recall_{k}") or 0.0
        else:
            a["unsplit"] += r["recall"]
            a["lost"] += 1 - r["recall"]
    for a in acc.values():
        for k in (*SPLIT, "unsplit"):
            a[k] /= a["n"]
    return acc


def recall_groups(rows: Sequence[dict[str, Any]]
                  ) -> list[tuple[str, dict[str, dict[str, float]]]]:
    """The recall figure's panels: the runs at each workflow's declared window (all
    workflows), then each enforced window, largest first (long workflows)."""
    def by_policy(some: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
        return recall_parts(some, key=lambda r: r["policy"])

    out = []
    if declared := [r for r in rows if not r.get("enforced")]:
        out.append(("declared window (not enforced)", by_policy(declared)))
    for window in sorted({int(r["window"]) for r in rows if r.get("enforced")}, reverse=True):
        out.append((f"{window_tag(window)} window",
                    by_policy([r for r in rows if r.get("enforced") and r["window"] == window])))
    return out


def plot(rows: Sequence[dict[str, Any]], out_dir: Path) -> list[str]:
    """tokens_per_call_<workflow>.png for long workflows and tokens_vs_recall.png
    (recall split per policy and window beside its tokens, recovery included)."""
    files = [request_size_plot(rows, wf, out_dir)
             for wf in dict.fromkeys(r["workflow"] for r in rows if r.get("long"))]
    return [*files, recall_plot(recall_groups(rows), out_dir)]


def render_summary(rows: Sequence[dict[str, Any]], *, mode: str) -> str:
    """``summary.md``: the headline table alone, with the commit and the run's size, for
    the docs (``make run`` copies it to ``docs/results/bench-summary.md``): a figure the
    docs show is one this run wrote, never one typed in."""
    table = opening_summary(rows)
    if not table:
        return ""
    commit = next((r.get("commit") for r in rows if r.get("commit")), None)
    epochs = len({r.get("epoch", 0) for r in rows})
    moves = MOVES if mode == "replay" else "a live model's runs differ"
    spread = (f"One run of each: {moves}; `--epochs N` repeats each run N times and shows "
              "each ratio's min–max" if epochs == 1 else
              f"{epochs} runs of each (`--epochs {epochs}`"
              f"{', each replaying its own recording' if mode == 'replay' else ''}): "
              f"{moves}, so each ratio is its min–max over them")
    dirty = " (uncommitted changes on top of it)" if str(commit).endswith("+dirty") else ""
    return (f"`simagent bench run --mode {mode}` at {commit or 'an unknown commit'}{dirty}: "
            f"{len({r['workflow'] for r in rows})} workflows, {len(rows)} runs. "
            f"{spread}.\n\n{SUMMARY_NOTE}\n\n{table}\n")


def write_report(rows: Sequence[dict[str, Any]], out_dir: Path, *, mode: str) -> Path:
    """``report.md`` (everything) and ``summary.md`` (the headline table) in ``out_dir``."""
    plots = plot(rows, out_dir) if rows else []
    if rows and (pareto := pareto_plot(rows, out_dir)):
        plots.append(pareto)
    path = out_dir / "report.md"

    notebooks = report_section(out_dir, sorted({str(r["workflow"]) for r in rows}))
    path.write_text(render_report(rows, mode=mode, plots=plots) + notebooks, encoding="utf-8")
    if summary := render_summary(rows, mode=mode):
        (out_dir / "summary.md").write_text(summary, encoding="utf-8")
    return path
