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

from simagent.bench.figures import color_of
from simagent.bench.workflow_runs import run_label, sweep_order

FAMILIES = ("anthropic", "openai")


def _k(n: float) -> str:
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
            f"| {label} | {s['passed']}/{s['runs']} | {_k(s['tokens_in'])} | "
            f"{_k(a['uncached'])} / {_k(a['cache_write'])} / {_k(a['cache_read'])} | "
            f"{_usd(a['cost_usd'])} | {vs('anthropic')} | {read_share:.0%} | "
            f"{_usd(o['cost_usd'])} | {vs('openai')} | {_usd(a['per_solved_usd'])} |")
    return "\n".join(lines)


def _usd(x: float | None) -> str:
    return "-" if x is None else f"${x:,.2f}"


def pareto_plot(rows: Sequence[dict[str, Any]], out_dir: Path) -> str | None:
    """``pareto_cost_recall.png``: dollars per solved long workflow (Anthropic prices with
    caching) against mean recall, one point per policy and window; policies that solved
    nothing sit hollow at the right edge. None when no run is priced."""
    # a sweep's points (its 128k run stands for the classic one); else every run
    summary = cost_summary([r for r in rows if r.get("enforced")] or rows)
    points = [(label, s) for label, s in summary.items()
              if s["anthropic"]["cost_usd"] is not None]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    solved = [s["anthropic"]["per_solved_usd"] for _, s in points
              if s["anthropic"]["per_solved_usd"] is not None]
    edge = max(solved) * 1.25 if solved else 1.0
    fig, ax = plt.subplots(figsize=(9, 5.5))
    colors = {s["policy"]: color_of(s["policy"]) for _, s in points}  # as in every figure
    markers = {None: "o", 128_000: "o", 32_000: "s", 16_000: "^"}
    for label, s in points:
        per = s["anthropic"]["per_solved_usd"]
        color = colors[s["policy"]]
        ax.scatter([per if per is not None else edge], [s["mean_recall"]],
                   marker=markers.get(s["window"], "D"), s=55, zorder=3,
                   facecolors=color if per is not None else "none", edgecolors=color,
                   label=label + ("" if per is not None else " (solved none)"))
    if solved:
        ax.axvline(edge, color="0.8", lw=0.8, zorder=1)
        ax.annotate("solved none", (edge, -0.03), fontsize=7, ha="center", color="0.4")
    ax.set(xlabel="$ per solved long workflow (Anthropic list prices, prompt caching)",
           ylabel="mean recall of probe facts", ylim=(-0.06, 1.06),
           title="Cost against recall: upper left (cheap, nothing forgotten) wins")
    ax.set_xlim(left=0)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False,
              title="policy @ window (o 128k, s 32k, ^ 16k)", title_fontsize=7)
    fig.tight_layout()
    name = "pareto_cost_recall.png"
    fig.savefig(out_dir / name, dpi=110)
    plt.close(fig)
    return name
