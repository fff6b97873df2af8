"""The bench report: markdown tables and PNG plots from records (pure but for the files).

Ratios are to ``raw`` for the same workflow in the same run, so machine noise and model
changes cancel. The renderers take rows and return text; only :func:`write_report`
touches the disk.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simagent.bench.runner import summarize
from simagent.context.counting import CATEGORIES


def _k(n: float) -> str:
    return f"{n / 1000:,.1f}k" if n >= 1000 else f"{n:,.0f}"


def _ratio(n: float, base: float | None) -> str:
    return f"{n / base:.2f}" if base else "-"


def policy_table(rows: Sequence[dict[str, Any]]) -> str:
    """One line per policy: pass count, tokens, ratio to raw on long workflows, recall."""
    summary = summarize(rows)
    lines = ["| policy | passed | tokens in (all) | long: tokens in | long: ratio to raw "
             "| long: min recall | mean recall |", "|---|---|---|---|---|---|---|"]
    for name, s in summary.items():
        ratio = s["long_ratio_to_raw"]
        lines.append(f"| {name} | {s['passed']}/{s['runs']} | {_k(s['tokens_in'])} | "
                     f"{_k(s['long_tokens_in'])} | {'-' if ratio is None else f'{ratio:.2f}'} "
                     f"| {s['min_long_recall'] if s['min_long_recall'] is not None else '-'} "
                     f"| {s['mean_recall']:.3f} |")
    return "\n".join(lines)


def workflow_tables(rows: Sequence[dict[str, Any]]) -> str:
    out = []
    for wf in dict.fromkeys(r["workflow"] for r in rows):
        mine = [r for r in rows if r["workflow"] == wf]
        raw = next((r["tokens_in"] for r in mine if r["policy"] == "raw"), None)
        tag = " (long)" if mine[0].get("long") else ""
        out += [f"### {wf}{tag}", "",
                "| policy | verdict | tokens in | x raw | peak | calls | tools | evict | clear "
                "| summ | recall | wall s | failed |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in mine:
            out.append(
                f"| {r['policy']} | {r['verdict']} | {_k(r['tokens_in'])} | "
                f"{_ratio(r['tokens_in'], raw)} | {_k(r['peak_tokens'])} | {r['model_calls']} "
                f"| {r['tool_calls']} | {r['evictions']} | {r['clears']} | {r['summaries']} | "
                f"{r['recall']:.2f} | {r['wall_s']:.1f} | "
                f"{', '.join(r['failed_scorers']) or '-'} |")
        out.append("")
    return "\n".join(out)


def layer_table(rows: Sequence[dict[str, Any]]) -> str:
    """Which request layer spent the input tokens, per policy (all workflows)."""
    by_policy: dict[str, dict[str, int]] = {}
    for r in rows:
        acc = by_policy.setdefault(r["policy"], {})
        for cat, n in (r.get("layers") or {}).items():
            acc[cat] = acc.get(cat, 0) + n
    cats = [c for c in CATEGORIES if any(c in v for v in by_policy.values())]
    lines = ["| policy | " + " | ".join(cats) + " |", "|---|" + "---|" * len(cats)]
    for name, acc in by_policy.items():
        total = sum(acc.values()) or 1
        lines.append(f"| {name} | " + " | ".join(
            f"{_k(acc.get(c, 0))} ({100 * acc.get(c, 0) / total:.0f}%)" for c in cats) + " |")
    return "\n".join(lines)


def render_report(rows: Sequence[dict[str, Any]], *, mode: str, plots: Sequence[str] = ()) -> str:
    commit = next((r.get("commit") for r in rows if r.get("commit")), None)
    cost_model = next((r.get("cost_model") for r in rows), None)
    parts = [f"# simagent bench ({mode})", "",
             f"{len({r['workflow'] for r in rows})} workflows x "
             f"{len({r['policy'] for r in rows})} policies, commit {commit or '?'}. "
             "Tokens are what the harness sent (counted on each request the model received); "
             f"ratios are to `raw` in this run; cost at {cost_model} list prices.", "",
             "## Policies", "", policy_table(rows), "",
             "## Input tokens by request layer", "", layer_table(rows), "",
             "## Workflows", "", workflow_tables(rows)]
    if plots:
        parts += ["## Plots", ""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(parts) + "\n"


def short_table(rows: Sequence[dict[str, Any]]) -> str:
    """The stdout summary: one line per policy."""
    summary = summarize(rows)
    lines = [f"{'policy':<22} {'passed':>7} {'tokens in':>11} {'long x raw':>10} "
             f"{'min recall':>10}"]
    for name, s in summary.items():
        ratio = s["long_ratio_to_raw"]
        lines.append(f"{name:<22} {s['passed']:>3}/{s['runs']:<3} {_k(s['tokens_in']):>11} "
                     f"{'-' if ratio is None else f'{ratio:.2f}':>10} "
                     f"{s['min_long_recall'] if s['min_long_recall'] is not None else '-':>10}")
    return "\n".join(lines)


def plot(rows: Sequence[dict[str, Any]], out_dir: Path) -> list[str]:
    """tokens_per_call_<workflow>.png for long workflows and tokens_vs_recall.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    for wf in dict.fromkeys(r["workflow"] for r in rows if r.get("long")):
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for r in (r for r in rows if r["workflow"] == wf):
            ax.plot(range(1, len(r["per_call_tokens"]) + 1), r["per_call_tokens"],
                    label=r["policy"])
        ax.set(xlabel="model call", ylabel="request tokens", title=f"{wf}: request size")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
        name = f"tokens_per_call_{wf}.png"
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        files.append(name)
    summary = summarize(rows)
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for name, s in summary.items():
        ax.scatter(s["tokens_in"], s["mean_recall"], s=40)
        ax.annotate(name, (s["tokens_in"], s["mean_recall"]), fontsize=8,
                    xytext=(4, 4), textcoords="offset points")
    ax.set(xscale="log", xlabel="total input tokens (all workflows)", ylabel="mean recall",
           title="tokens vs recall per policy")
    fig.tight_layout()
    fig.savefig(out_dir / "tokens_vs_recall.png", dpi=110)
    plt.close(fig)
    return [*files, "tokens_vs_recall.png"]


def write_report(rows: Sequence[dict[str, Any]], out_dir: Path, *, mode: str) -> Path:
    plots = plot(rows, out_dir) if rows else []
    path = out_dir / "report.md"
    path.write_text(render_report(rows, mode=mode, plots=plots), encoding="utf-8")
    return path
