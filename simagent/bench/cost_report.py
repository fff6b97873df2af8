"""What the runs would cost with provider prompt caching: a table and a Pareto plot.

Token totals rank policies by what they send; a bill ranks them by what the provider
charges, and with prompt caching a cheap read of an unchanged prefix costs a tenth of a
fresh token while a rewritten prefix costs a write. Each record carries the simulated
(replay) or reported (live) split per cache family (``simagent.bench.caching``); this
module sums it per policy and window (``run_label``) and puts dollars per *solved*
workflow beside recall, so a policy cannot look cheap by failing its work.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simagent.bench.report_figures import (
    FIGURE_DPI,
    REFERENCES,
    base_policy,
    color_of,
    line_style,
    policy_order,
)
from simagent.bench.workflow_runs import run_label, sweep_order, window_tag

FAMILIES = ("anthropic", "openai")


def kilo(n: float) -> str:
    """Tokens as the report's tables show them: ``12.3k`` from a thousand up."""
    return f"{n / 1000:,.1f}k" if n >= 1000 else f"{n:,.0f}"


def cost_summary(rows: Sequence[dict[str, Any]], *, long_only: bool = True
                 ) -> dict[str, dict[str, Any]]:
    """Per run label (long workflows; all when there are none): runs, passed, mean
    recall, tokens in, and per family the uncached,
    cache-write and cache-read tokens and dollars (None when a run has no price), plus
    dollars per solved workflow."""
    out: dict[str, dict[str, Any]] = {}
    long_only = long_only and any(r.get("long") for r in rows)
    for r in rows:
        if long_only and not r.get("long"):
            continue
        s = out.setdefault(run_label(r), {
            "policy": r["policy"], "window": r.get("window") if r.get("enforced") else None,
            "runs": 0, "passed": 0, "recall_sum": 0.0, "tokens_in": 0,
            **{f: {"uncached": 0, "cache_write": 0, "cache_read": 0, "cost_usd": 0.0,
                   "priced": True} for f in FAMILIES}})
        s["runs"] += 1
        s["passed"] += r["verdict"] == "pass"
        s["recall_sum"] += float(r.get("recall") or 0.0)
        s["tokens_in"] += int(r.get("tokens_in") or 0)
        cache = r.get("cache") or {}
        for f in FAMILIES:
            got = cache.get(f)
            acc = s[f]
            if not got or got.get("cost_usd") is None:
                acc["priced"] = False
                continue
            for k in ("uncached", "cache_write", "cache_read"):
                acc[k] += int(got.get(k) or 0)
            acc["cost_usd"] += float(got["cost_usd"])
    for s in out.values():
        s["mean_recall"] = s["recall_sum"] / s["runs"] if s["runs"] else None
        for f in FAMILIES:
            acc = s[f]
            if not acc["priced"]:
                acc["cost_usd"] = acc["per_solved_usd"] = None
            else:
                acc["per_solved_usd"] = acc["cost_usd"] / s["passed"] if s["passed"] else None
    return out


def _stock_of(summary: dict[str, dict[str, Any]], s: dict[str, Any]) -> dict[str, Any] | None:
    return next((t for t in summary.values()
                 if t["policy"] == "stock" and t["window"] == s["window"]), None)


def cache_table(rows: Sequence[dict[str, Any]]) -> str:
    """Long workflows, per policy and window: input tokens by how the provider bills them
    (Anthropic's explicit breakpoints; OpenAI's automatic prefix cache) and the dollars,
    next to ``stock`` at the same window."""
    summary = cost_summary(rows)
    if not summary:
        return ""
    lines = ["| policy | passed | tokens in | Anthropic: uncached / write / read | "
             "Anthropic $ | x stock | OpenAI: read share | OpenAI $ | x stock | "
             "$ per solved (Anthropic) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for label, s in sweep_order(summary):
        a, o = s["anthropic"], s["openai"]
        stock = _stock_of(summary, s)

        def vs(fam: str, s: dict[str, Any] = s, stock: Any = stock) -> str:
            mine, base = s[fam]["cost_usd"], (stock or {}).get(fam, {}).get("cost_usd")
            return f"{mine / base:.2f}" if mine is not None and base else "-"

        read_share = o["cache_read"] / s["tokens_in"] if s["tokens_in"] else 0.0
        lines.append(
            f"| {label} | {s['passed']}/{s['runs']} | {kilo(s['tokens_in'])} | "
            f"{kilo(a['uncached'])} / {kilo(a['cache_write'])} / {kilo(a['cache_read'])} | "
            f"{_usd(a['cost_usd'])} | {vs('anthropic')} | {read_share:.0%} | "
            f"{_usd(o['cost_usd'])} | {vs('openai')} | {_usd(a['per_solved_usd'])} |")
    return "\n".join(lines)


def _usd(x: float | None) -> str:
    return "-" if x is None else f"${x:,.2f}"


def pareto_plot(rows: Sequence[dict[str, Any]], out_dir: Path) -> str | None:
    """``pareto_cost_recall.png``: dollars per solved long workflow (Anthropic prices with
    caching) against mean recall, one panel per window and one point per policy in its
    colour; the bounds are reference lines (``oracle`` dashed, ``oracle-cached`` dotted);
    policies that solved nothing sit hollow at the right edge. None when no run is
    priced."""
    # a sweep's points (its 128k run stands for the classic one); else every run
    summary = cost_summary([r for r in rows if r.get("enforced")] or rows)
    points = [s for s in summary.values() if s["anthropic"]["cost_usd"] is not None]
    if not points:
        return None
    import matplotlib  # heavy: only when there is a figure to draw

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"), as above
    from matplotlib.lines import Line2D  # with pyplot

    windows = sorted({s["window"] for s in points}, key=lambda w: -(w or 10**9))
    solved = [s["anthropic"]["per_solved_usd"] for s in points
              if s["anthropic"]["per_solved_usd"] is not None]
    edge = max(solved) * 1.15 if solved else 1.0
    fig, axes = plt.subplots(1, len(windows), figsize=(2.6 * len(windows) + 1.6, 2.9),
                             sharey=True, sharex=True, squeeze=False)
    shown: list[str] = []
    for ax, window in zip(axes[0], windows, strict=True):
        here = [s for s in points if s["window"] == window]
        for s in here:
            per = s["anthropic"]["per_solved_usd"]
            if base_policy(s["policy"]) in REFERENCES and per is not None:
                ax.axvline(per, **{**line_style(s["policy"]), "lw": 1.2})
            else:
                color = color_of(s["policy"])
                ax.scatter([per if per is not None else edge], [s["mean_recall"]], s=40,
                           zorder=3, facecolors=color if per is not None else "none",
                           edgecolors=color, linewidths=1.3)
            shown.append(s["policy"])
        ax.axvline(edge, color="0.85", lw=0.8, zorder=1)
        ax.set_title(f"{window_tag(int(window))} window" if window else "declared window",
                     fontsize=9)
        ax.set_xlabel("$ per solved long workflow", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].set(ylim=(-0.06, 1.06), xlim=(0, edge * 1.05))
    axes[0][0].set_ylabel("mean recall of probe facts", fontsize=8)
    handles = [Line2D([], [], **line_style(p)) if base_policy(p) in REFERENCES else
               Line2D([], [], ls="", marker="o", color=color_of(p)) for p in
               policy_order(shown)]
    handles.append(Line2D([], [], ls="", marker="o", mfc="none", color="0.4"))
    fig.legend(handles, [*policy_order(shown), "solved none (right edge)"],
               loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7, frameon=False)
    fig.suptitle("Cost against recall (Anthropic list prices, prompt caching): "
                 "upper left wins", fontsize=9)
    fig.tight_layout()
    name = "pareto_cost_recall.png"
    fig.savefig(out_dir / name, dpi=FIGURE_DPI, bbox_inches="tight")
    plt.close(fig)
    return name
