"""The live bench's table: one line per workflow x policy x window, with what the model's
server itself measured.

Live runs are few and slow, so each one is shown whole rather than summed: its verdict
(and the scorers it failed), the input tokens simagent counted on the requests it sent
(llama.cpp streams no usage), model and tool calls, wall time, and the server's own
figures (``bench.live.server_timings``: prompt tokens it evaluated, which prompt caching
keeps below the tokens sent, and its prompt and generation speeds).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

LIVE_NOTE = ("One line per run. Input tokens: what simagent counted on each request it "
             "sent (a local server streams no usage). Server columns: llama.cpp's own "
             "timings from its log; prompt tokens are those it evaluated, which its prompt "
             "cache keeps below the tokens sent. A wall-time budget is reported "
             "(`over_seconds_budget` in the record), not failed: live, it measures the "
             "machine. Verdicts in brackets name the scorers a run failed; *scorers ok* counts "
             "the workflow's scorers the run passed.")
HEADER = ("| workflow | policy | window | verdict | scorers ok | input tokens | model calls "
          "| tool calls | number check | unsourced | nudges "
          "| wall s | server prompt tokens | prompt tok/s | gen tokens | gen tok/s |")


def live_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    order = {"simagent": 0, "stock": 1}
    return sorted((r for r in rows if r.get("mode") == "live"),
                  key=lambda r: (r["workflow"], int(r.get("window") or 0),
                                 order.get(r["policy"], 2), r["policy"], r.get("epoch", 0)))


def _cell(value: Any) -> str:
    return "-" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


def scorers_ok(row: dict[str, Any]) -> str | None:
    """``passed/total`` of the run's scorers: a graded view where both policies fail."""
    scorers = row.get("scorers")
    if not scorers:
        return None
    return f"{sum(bool(s.get('ok')) for s in scorers)}/{len(scorers)}"


def unsourced(row: dict[str, Any]) -> str | None:
    """The final answer's unsourced numbers: how many, and which (as written)."""
    numbers = row.get("numbers")
    if numbers is None:
        return None
    named = ", ".join(row.get("unsourced_numbers") or ())
    return f"{numbers.get('unsourced', 0)}" + (f" ({named})" if named else "")


def live_table(rows: Sequence[dict[str, Any]]) -> str:
    """A markdown table of the live runs ('' when there are none)."""
    live = live_rows(rows)
    if not live:
        return ""
    lines = [HEADER, "|" + "---|" * HEADER.count(" | ") + "---|"]
    for r in live:
        server = r.get("server") or {}
        verdict = r["verdict"] + (f" ({', '.join(r['failed_scorers'])})"
                                  if r.get("failed_scorers") else "")
        window = r.get("window")  # the bench's window; the server loads it rounded up
        lines.append("| " + " | ".join(_cell(v) for v in (
            r["workflow"], r["policy"], f"{window / 1000:g}k" if window else None, verdict,
            scorers_ok(r), r.get("tokens_in"), r.get("model_calls"), r.get("tool_calls"),
            r.get("check_numbers"), unsourced(r), r.get("number_nudges"), r.get("wall_s"),
            server.get("prompt_eval_tokens"), server.get("prompt_eval_tok_s"),
            server.get("eval_tokens"), server.get("eval_tok_s"))) + " |")
    return "\n".join(lines)


def live_summary(rows: Sequence[dict[str, Any]]) -> str:
    """Per policy and window: runs passed, input tokens and wall time summed."""
    live = live_rows(rows)
    groups: dict[tuple[str, Any, Any], list[dict[str, Any]]] = {}
    for r in live:
        groups.setdefault((r["policy"], r.get("window"), r.get("check_numbers")),
                          []).append(r)
    checks = {check for _p, _w, check in groups}
    lines = []
    for (policy, window, check), runs in groups.items():
        passed = sum(r["verdict"] == "pass" for r in runs)
        tokens = sum(int(r.get("tokens_in") or 0) for r in runs)
        wall = sum(float(r.get("wall_s") or 0) for r in runs)
        counted = [r["numbers"] for r in runs if r.get("numbers") is not None]
        numbers = (f", {sum(n.get('unsourced', 0) for n in counted)} unsourced numbers in "
                   f"{len(counted)} final answers, "
                   f"{sum(int(r.get('number_nudges') or 0) for r in runs)} nudges"
                   if counted else "")
        label = f"{policy}" + (f" (check_numbers {check})" if len(checks) > 1 else "")
        lines.append(f"{label} @{(window or 0) / 1000:g}k: {passed}/{len(runs)} passed, "
                     f"{tokens:,} input tokens, {wall:,.0f} s{numbers}")
    return "\n".join(lines)
