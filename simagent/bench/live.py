"""What a live bench run needs beyond a replayed one: the user's configuration, a bound on
the model's calls, and the server's own timings.

A live run measures the product, so its session is opened with the configuration a person
running ``simagent run`` in that workspace would get (user config, then the workspace's
``.simagent/config.toml``), with the run's window as ``[model] window`` when the bench
enforces one. Context handling stays the policy's: that is what the bench compares.

A local model can loop (a 0.5B model re-runs the same cell); a run stops one model call
past the workflow's budget, which it fails anyway, so a bench row never runs unbounded.

A ``local:`` model's server (llama.cpp, verbose) prints its own timings after every
completion (``llama_perf_context_print``: prompt eval, eval, total, in ms and tokens) into
its log, which is kept in the run's session folder; those are the server-side figures a
record carries. Streamed responses carry none, so the log is the real source.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from simagent.agent.number_check import is_nudge
from simagent.config import Config
from simagent.presentation.footnotes import final_provenance

#: ``llama_perf_context_print: prompt eval time =  1234.56 ms /   321 tokens (...)``
_PERF = re.compile(r"llama_perf_context_print:\s+(prompt eval|eval|total) time\s*=\s*"
                   r"([\d.]+) ms\s*/\s*(\d+) (?:tokens|runs)")
_CACHE = re.compile(r"Llama\._create_completion: cache (hit|miss)")
#: A wall-time budget measures the machine in a live run (2 cores, shared), not the agent.
SECONDS_BUDGET = "budget:seconds"
#: A record keeps this many of its final answer's unsourced numbers, as written.
UNSOURCED_KEPT = 12


class RequestTap:
    """Stands in for the scripted model's request log: the one request recall reads."""

    def __init__(self, requests: list[list[Any]]) -> None:
        self.requests = requests


def final_view(agent: Any, session: Any) -> list[Any]:
    """The messages the model would see next (the context layers' view of the state)."""
    from simagent.context.state import current_view  # langchain: only when run

    state = agent.graph.get_state(session.thread_config).values
    return list(current_view(state))


def number_fields(agent: Any, session: Any, result: Any, mode: str) -> dict[str, Any]:
    """The final answer's numbers as the person sees them marked (the provenance engine's
    statuses, read as ``run --json`` reads them) and how often the check before final
    asked the model about some: what the live bench measures of that check, run with it
    on and off. ``mode``: the ``check_numbers`` the run's agent was built with
    (``builder.numbers_mode``: a scripted model's default is off, not the config's)."""
    prov = final_provenance(session.trace.events(), result)
    messages = agent.graph.get_state(session.thread_config).values.get("messages") or []
    return {"check_numbers": mode,
            "numbers": None if prov is None else prov.counts(),
            "unsourced_numbers": [] if prov is None else
            list(dict.fromkeys(t.text for t in prov.unsourced))[:UNSOURCED_KEPT],
            "number_nudges": sum(1 for m in messages if is_nudge(m))}


def live_config(workspace: Path, window: int | None) -> Config:
    """The configuration ``simagent run`` would load in ``workspace``; ``window`` (the
    bench's enforced window) set as ``[model] window``, as a person would write it."""
    config = Config.load(workspace, trust=True, record=False)  # the bench wrote it
    if window is None:
        return config
    model = dict(config.model_settings, window=window)
    return Config({**config.data, "model": model}, config.workspace_data, config.user_data,
                  config.trust)


def call_limit(wf: Any) -> int | None:
    """Model calls a live run may make: one past the workflow's budget (over it the run
    fails that budget anyway), None when the workflow sets no budget."""
    budget = (wf.budgets or {}).get("model_calls")
    return int(budget) + 1 if budget else None


def server_timings(log: str | Path | None) -> dict[str, Any] | None:
    """The server's own timings summed over a run's completions, from its log; None
    without a log or without any timing line (a remote server)."""
    if not log or not Path(log).is_file():
        return None
    text = Path(log).read_text(encoding="utf-8", errors="replace")
    found = _PERF.findall(text)
    if not found:
        return None
    out: dict[str, Any] = {"completions": sum(1 for kind, _, _ in found if kind == "total"),
                           "prompt_eval_ms": 0.0, "prompt_eval_tokens": 0,
                           "eval_ms": 0.0, "eval_tokens": 0, "total_ms": 0.0}
    for kind, ms, n in found:
        key = {"prompt eval": "prompt_eval", "eval": "eval", "total": "total"}[kind]
        out[f"{key}_ms"] += float(ms)
        if key != "total":
            out[f"{key}_tokens"] += int(n)
    caches = _CACHE.findall(text)
    out["cache_hits"] = caches.count("hit")
    out["cache_misses"] = caches.count("miss")
    for key in ("prompt_eval", "eval"):
        ms = out[f"{key}_ms"]
        out[f"{key}_tok_s"] = round(out[f"{key}_tokens"] / ms * 1000, 1) if ms else None
        out[f"{key}_ms"] = round(ms, 1)
    out["total_ms"] = round(out["total_ms"], 1)
    return out


def live_verdict(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with the wall-time budget reported, not failed: live on this hardware the
    seconds measure the machine (``over_seconds_budget`` keeps the fact)."""
    failed = [f for f in row.get("failed_scorers", []) if f != SECONDS_BUDGET]
    return {**row, "failed_scorers": failed, "verdict": "fail" if failed else "pass",
            "over_seconds_budget": SECONDS_BUDGET in row.get("failed_scorers", [])}
