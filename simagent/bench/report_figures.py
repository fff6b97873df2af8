"""The bench's request-size figures, and the one colour each policy has in every figure.

A reader compares policies across plots by colour, so the colour is a property of the
policy (:func:`color_of`), never of its position in a legend: ``simagent`` is blue in
the request-size panels and in the cost/recall plot alike, and the bounds are black
reference lines (``oracle`` dashed, ``oracle-cached`` dotted). A policy with setting
overrides (``simagent[...]``) keeps its base policy's colour with a dotted line.
Windows are small multiples (one panel each, the enforced window drawn as a grey
limit), and the legend sits outside the axes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simagent.bench.workflow_runs import window_tag

#: One home for policy colours (matplotlib's tab10 names); unknown policies get grey.
POLICY_COLORS = {"raw": "tab:gray", "simagent": "tab:blue", "stock": "tab:orange",
                 "sliding-window": "tab:purple", "compress-tool-results": "tab:brown",
                 "truncate": "tab:pink", "oracle": "black", "oracle-cached": "black"}
#: Figures are sized to be read at their own width (about 900-1000 px) on a laptop screen
#: or in a README, which shows them at most ~900 px wide.
FIGURE_DPI = 100
#: Drawn as reference lines, over the others.
REFERENCES = ("oracle", "oracle-cached")


def base_policy(name: str) -> str:
    return name.partition("[")[0]


def color_of(policy: str) -> str:
    return POLICY_COLORS.get(base_policy(policy), "tab:olive")


def line_style(policy: str) -> dict[str, Any]:
    """Colour, dash and weight of a policy's line in every figure."""
    base = base_policy(policy)
    style: dict[str, Any] = {"color": color_of(policy), "lw": 1.3}
    if base in REFERENCES:
        style.update(ls="--" if base == "oracle" else ":", lw=1.8, zorder=5)
    elif base != policy:
        style.update(ls=":")
    return style


def policy_order(names: Sequence[str]) -> list[str]:
    """Known policies in the palette's order, then the rest by name."""
    known = list(POLICY_COLORS)
    return sorted(dict.fromkeys(names),
                  key=lambda n: (known.index(base_policy(n)) if base_policy(n) in known
                                 else len(known), n))


def panels(rows: Sequence[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """One workflow's runs by window, largest first: at its declared window each policy's
    run that was not enforced (``raw`` there is the unbounded reference; an enforced run at
    the same window is its twin), at every other window the enforced runs."""
    chosen: dict[Any, dict[str, dict[str, Any]]] = {}
    for r in rows:
        mine = chosen.setdefault(r.get("window"), {})
        if r["policy"] not in mine or not r.get("enforced"):
            mine[r["policy"]] = r
    out = []
    for window in sorted(chosen, key=lambda w: -(w or 10**9)):
        runs = list(chosen[window].values())
        size = f"{window_tag(int(window))} window" if window else "window"
        out.append((size + ("" if all(r.get("enforced") for r in runs)
                            else " (declared, not enforced)"), runs))
    return out


def request_size_plot(rows: Sequence[dict[str, Any]], workflow: str, out_dir: Path) -> str:
    """``tokens_per_call_<workflow>.png``: request tokens per model call, one panel per
    window, one line per policy (the oracle dashed black), legend to the right."""
    import matplotlib  # heavy: only when a figure is drawn (figures' helpers are light)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"), as above
    from matplotlib.ticker import MaxNLocator  # with pyplot, as above

    groups = panels([r for r in rows if r["workflow"] == workflow])
    fig, axes = plt.subplots(1, len(groups), figsize=(2.7 * len(groups) + 1.5, 2.9),
                             sharey=True, squeeze=False)
    handles: dict[str, Any] = {}
    refused = None
    for ax, (title, runs) in zip(axes[0], groups, strict=True):
        order = policy_order([x["policy"] for x in runs])
        for r in sorted(runs, key=lambda r: order.index(r["policy"])):
            calls = r.get("per_call_tokens") or []
            style = line_style(r["policy"])
            (line,) = ax.plot(range(1, len(calls) + 1), calls, **style)
            handles.setdefault(r["policy"], line)
            if r.get("provider_error") and calls:  # where the provider refused the next one
                (mark,) = ax.plot([len(calls)], [calls[-1]], "x", color=style["color"],
                                  ms=7, mew=1.6, zorder=6)
                refused = mark
        if all(r.get("enforced") for r in runs):
            ax.axhline(int(runs[0]["window"]), color="0.75", lw=0.8, zorder=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # calls are whole
        ax.set_title(title, fontsize=9)
        ax.set_yscale("log")
        ax.set_xlabel("model call", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("request tokens", fontsize=8)
    fig.suptitle(f"{workflow}: request size per model call", fontsize=10)
    order = policy_order(list(handles))
    labels = [*order, *(["refused by the provider"] if refused is not None else [])]
    lines = [handles[p] for p in order] + ([refused] if refused is not None else [])
    fig.legend(lines, labels, loc="center left",
               bbox_to_anchor=(1.0, 0.5), fontsize=7, frameon=False)
    fig.tight_layout()
    name = f"tokens_per_call_{workflow}.png"
    fig.savefig(out_dir / name, dpi=FIGURE_DPI, bbox_inches="tight")
    plt.close(fig)
    return name


#: Recall shares (colours no policy uses, so a bar's colour never reads as a policy).
RECALL_COLORS = {"in_view": "tab:green", "by_pointer": "tab:cyan", "lost": "tab:red",
                 "unsplit": "0.8"}
RECALL_LABELS = {"in_view": "in view", "by_pointer": "by pointer", "lost": "lost",
                 "unsplit": "kept (old record, not split)"}


def recall_plot(groups: Sequence[tuple[str, dict[str, dict[str, float]]]],
                out_dir: Path) -> str:
    """``tokens_vs_recall.png``: per window (a column each) every policy's recall split
    (top) over its input tokens plus recovery (bottom, in the policy's colour, the
    oracle a dashed reference line). ``groups``: (panel title, policy -> the shares
    ``in_view``/``by_pointer``/``lost``/``unsplit`` and ``tokens_in``,
    ``recovery_tokens``)."""
    import matplotlib  # heavy: only when a report draws its figures

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg")
    from matplotlib.patches import Patch  # with pyplot
    from matplotlib.ticker import EngFormatter  # with pyplot

    names = policy_order([p for _, parts in groups for p in parts])
    n = len(groups)
    fig, axes = plt.subplots(2, n, figsize=(2.0 * n + 1.7, 0.3 * len(names) * 2 + 1.5),
                             sharey=True, squeeze=False)
    empty = {"in_view": 0.0, "by_pointer": 0.0, "lost": 0.0, "unsplit": 0.0,
             "tokens_in": 0, "recovery_tokens": 0}
    for col, (title, parts) in enumerate(groups):
        top, bottom = axes[0][col], axes[1][col]
        got = [parts.get(p, empty) for p in names]
        start = [0.0] * len(names)
        for k in ("in_view", "by_pointer", "unsplit", "lost"):
            width = [g[k] for g in got]
            top.barh(names, width, left=start, color=RECALL_COLORS[k], height=0.7)
            start = [a + b for a, b in zip(start, width, strict=True)]
        top.set_xlim(0, 1)
        top.set_title(title, fontsize=8)
        sent = [g["tokens_in"] for g in got]
        colors = [color_of(p) for p in names]
        bottom.barh(names, sent, color=colors, height=0.7)
        bottom.barh(names, [g["recovery_tokens"] for g in got], left=sent, color=colors,
                    alpha=0.35, height=0.7, hatch="///", edgecolor="white", lw=0)
        if "oracle" in parts:
            bottom.axvline(parts["oracle"]["tokens_in"], **{**line_style("oracle"), "lw": 1.2})
        bottom.xaxis.set_major_formatter(EngFormatter(sep=""))
        for ax in (top, bottom):
            ax.tick_params(labelsize=7)
            ax.tick_params(axis="x", labelrotation=30)
    axes[0][0].invert_yaxis()
    axes[0][n // 2].set_xlabel("recall: share of probe facts (mean over runs)", fontsize=8)
    axes[1][n // 2].set_xlabel("input tokens (all workflows of the panel)", fontsize=8)
    shares = [Patch(color=RECALL_COLORS[k], label=RECALL_LABELS[k])
              for k in ("in_view", "by_pointer", "lost")]
    tokens = [Patch(color="0.3", label="input tokens (policy colour)"),
              Patch(color="0.3", alpha=0.35, hatch="///", label="+ recovery (paging back)"),
              plt.Line2D([], [], **{**line_style("oracle"), "lw": 1.2}, label="oracle")]
    fig.legend(handles=shares, loc="center left", bbox_to_anchor=(1.0, 0.75), fontsize=7,
               frameon=False, title="recall", title_fontsize=7)
    fig.legend(handles=tokens, loc="center left", bbox_to_anchor=(1.0, 0.28), fontsize=7,
               frameon=False, title="tokens", title_fontsize=7)
    fig.tight_layout()
    name = "tokens_vs_recall.png"
    fig.savefig(out_dir / name, dpi=FIGURE_DPI, bbox_inches="tight")
    plt.close(fig)
    return name
