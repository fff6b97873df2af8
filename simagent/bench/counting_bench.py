"""``simagent bench counting``: what counting costs per model call, old ruler vs real.

Every model call measures its request (the context layers before the call, the trace
recorder after it, the scripted model's usage), so counting sits on the hot path. The
bench replays one workflow through the real graph, keeps every request the model got,
and then times, in the same process and run, one measurement of each request with:

* ``approx``: langchain's ``count_tokens_approximately`` per message and for the tool
  schemas, exactly as simagent counted before the real ruler;
* ``real (cold)``: :func:`counting.measure` with the o200k ruler and an empty cache,
  the first call of a resumed session;
* ``real (warm)``: the same with the cache as a session leaves it (each earlier request
  counted once), the steady state of a long session.

It also reports how far chars/4 is from the real count on those requests (the ratio the
thresholds were off by). Figures are medians in milliseconds; nothing here is asserted.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages.utils import count_tokens_approximately

from simagent.bench.kernel_recording import record
from simagent.bench.policies import resolve_policies
from simagent.bench.workflow import resolve_workflows
from simagent.bench.workflow_runs import replayed
from simagent.context.counting import measure, tool_schema
from simagent.context.tokens import Ruler, clear_cache

#: The workflow with the most raw input tokens in the bundled bench.
DEFAULT_WORKFLOW = "scipy-stiff-kinetics"
RUNS = 3  # timing repetitions per request; the median of all is reported


def replay_requests(wf: Any, policy: Any, out_dir: Path,
                    progress: Callable[[str], None] | None = None
                    ) -> list[tuple[list[Any], list[Any]]]:
    """Every (messages, tools) request the model received in one replayed run."""
    recording = record(wf, out_dir / "recordings" / wf.id, progress=progress or (lambda _m: None))
    with replayed(wf, policy, recording, out_dir / "runs" / f"{wf.id}--counting") as run:
        tools = list(run.model.bound_tools)
        return [(list(req), tools) for req in run.model.requests]


def _approx(messages: Sequence[Any], tools: Sequence[Any]) -> int:
    n = sum(count_tokens_approximately([m]) for m in messages)
    return n + count_tokens_approximately([], tools=[tool_schema(t) for t in tools])


def _real(messages: Sequence[Any], tools: Sequence[Any]) -> int:
    system = messages[0] if messages and messages[0].type == "system" else None
    rest = list(messages[1:] if system is not None else messages)
    return measure(system, rest, tools, Ruler("o200k_base")).total


def _time(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000.0


def time_counting(requests: Sequence[tuple[list[Any], list[Any]]],
                  runs: int = RUNS) -> dict[str, Any]:
    """Median ms per request for each ruler, and the real/approx token ratio."""
    approx_ms, cold_ms, warm_ms, ratios = [], [], [], []
    for messages, tools in requests:
        for _ in range(runs):
            approx_ms.append(_time(lambda m=messages, t=tools: _approx(m, t)))
            clear_cache()
            cold_ms.append(_time(lambda m=messages, t=tools: _real(m, t)))
    clear_cache()
    real_totals = []
    for messages, tools in requests:  # a session's order: each request once, then again
        _real(messages, tools)
        warm_ms.append(statistics.median(
            _time(lambda m=messages, t=tools: _real(m, t)) for _ in range(runs)))
        real_totals.append(_real(messages, tools))
        approx = _approx(messages, tools)
        ratios.append(real_totals[-1] / approx if approx else 1.0)
    return {
        "requests": len(requests),
        "messages_last": len(requests[-1][0]) if requests else 0,
        "real_tokens_last": real_totals[-1] if real_totals else 0,
        "approx_ms_median": round(statistics.median(approx_ms), 3) if approx_ms else 0.0,
        "real_cold_ms_median": round(statistics.median(cold_ms), 3) if cold_ms else 0.0,
        "real_warm_ms_median": round(statistics.median(warm_ms), 3) if warm_ms else 0.0,
        "real_to_approx_tokens_median": round(statistics.median(ratios), 3) if ratios else 1.0,
        "real_to_approx_tokens_max": round(max(ratios), 3) if ratios else 1.0,
    }


def run_counting_bench(workflow: str | None = None, policy: str = "simagent",
                       out_dir: Path | None = None,
                       progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    wf = resolve_workflows([workflow or DEFAULT_WORKFLOW])[0]
    pol = resolve_policies(policy)[0]
    with tempfile.TemporaryDirectory(prefix="simagent-counting-") as tmp:
        requests = replay_requests(wf, pol, Path(out_dir or tmp), progress)
    if progress:
        progress(f"timing {len(requests)} requests")
    return {"workflow": wf.id, "policy": pol.name, **time_counting(requests)}


def format_table(result: dict[str, Any]) -> str:
    rows = [
        ("workflow / policy", f"{result['workflow']} / {result['policy']}"),
        ("model calls (requests)", str(result["requests"])),
        ("last request", f"{result['messages_last']} messages, "
                         f"{result['real_tokens_last']:,} real tokens"),
        ("approx (chars/4) per call", f"{result['approx_ms_median']:.2f} ms median"),
        ("real, cold cache, per call", f"{result['real_cold_ms_median']:.2f} ms median"),
        ("real, warm cache, per call", f"{result['real_warm_ms_median']:.2f} ms median"),
        ("real / approx tokens", f"{result['real_to_approx_tokens_median']:.2f}x median, "
                                 f"{result['real_to_approx_tokens_max']:.2f}x max"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
