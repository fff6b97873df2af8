"""The bench's request-size figures, and the one colour each policy has in every figure.

A reader compares policies across plots by colour, so the colour is a property of the
policy (:func:`color_of`), never of its position in a legend: ``simagent`` is blue in
the request-size panels and in the cost/recall plot alike, and the oracle is the black
dashed reference line. A policy with setting overrides (``simagent[...]``) keeps its
base policy's colour with a dotted line. Windows are small multiples (one panel each,
the enforced window drawn as a grey limit), and the legend sits outside the axes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simagent.bench.workflow_runs import window_tag

#: One home for policy colours (matplotlib's tab10 names); unknown policies get grey.
POLICY_COLORS = {"raw": "tab:gray", "simagent": "tab:blue", "stock": "tab:orange",
                 "sliding-window": "tab:purple", "compress-tool-results": "tab:brown",
                 "truncate": "tab:pink", "oracle": "black", "oracle-cached": "0.45"}
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    groups = panels([r for r in rows if r["workflow"] == workflow])
    fig, axes = plt.subplots(1, len(groups), figsize=(3.6 * len(groups) + 1.8, 3.4),
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
    fig.savefig(out_dir / name, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return name
