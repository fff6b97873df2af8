"""Trace-graded scorers (design.md §9.1): pure functions of what a run left behind.

The same scorers grade replay and live runs, because they read only the final answer,
the trace events and the workspace, never the script. ``step_texts`` maps a flattened
step index to the tool results that step produced, in trace order.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simagent.agent.scripted import call_step
from simagent.bench.support_sources import check_run
from simagent.context.task_records import check_record, records_from_events

if TYPE_CHECKING:
    from simagent.bench.support import SupportReport

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
#: How far (characters, either side) a ``value`` scorer's ``near`` match reaches.
NEAR_CHARS = 60


@dataclass(frozen=True)
class RunView:
    final: str
    events: Sequence[Any]  # trace events (.kind, .payload)
    step_texts: dict[int, list[str]]
    workspace: Path

    @cached_property
    def support(self) -> SupportReport:
        """The final answer's numbers vs what the run saw (``support.py``); computed once
        for the record and the ``supported_numbers`` scorer (it reads raw output files)."""
        return check_run(self.final, self.events)


@dataclass(frozen=True)
class Verdict:
    scorer: str
    ok: bool
    detail: str


def step_results(steps: Sequence[dict[str, Any]], events: Sequence[Any]) -> dict[int, list[str]]:
    """Flattened step index -> the tool results it produced.

    Scripted calls carry their step in the id (:func:`scripted.call_step`), which survives
    subagents (whose results are traced before their ``task`` result). Other ids (live
    runs) fall back to trace order.
    """
    results = [e.payload for e in events if e.kind == "tool_result"]
    out: dict[int, list[str]] = {}
    steps_of = [call_step(str(r.get("tool_call_id"))) for r in results]
    if results and None not in steps_of:
        for r, step in zip(results, steps_of, strict=True):
            out.setdefault(step, []).append(r.get("content", ""))
        return out
    pos = 0
    for i, step in enumerate(steps):
        n = len(step["tools"]) if "tools" in step else (1 if "tool" in step else 0)
        if n:
            out[i] = [r.get("content", "") for r in results[pos:pos + n]]
            pos += n
    return out


def _number(text: str) -> float | None:
    m = re.search(_NUMBER, text.replace(",", ""))
    return float(m.group(0)) if m else None


def _group(regex: str, text: str) -> str | None:
    m = re.search(regex, text, re.M)
    if not m:
        return None
    return m.group(1) if m.groups() else m.group(0)


def numeric(sc: dict[str, Any], run: RunView) -> Verdict:
    got_s = _group(sc["answer_regex"], run.final)
    got = _number(got_s) if got_s is not None else None
    if "expected_from" in sc:
        src = sc["expected_from"]
        texts = run.step_texts.get(int(src["step"]), [])
        exp_s = next((g for t in texts if (g := _group(src["regex"], t)) is not None), None)
        expected = _number(exp_s) if exp_s is not None else None
    else:
        expected = float(sc["expected"])
    if got is None:
        return Verdict("numeric", False, f"no number for {sc['answer_regex']!r} in the answer")
    if expected is None:
        return Verdict("numeric", False, "the expected value was not found in the step result")
    ok = math.isclose(got, expected, rel_tol=float(sc.get("rel_tol", 1e-6)),
                      abs_tol=float(sc.get("abs_tol", 0.0)))
    return Verdict("numeric", ok, f"answer {got:g} vs expected {expected:g}")


def _numbers(text: str) -> list[float]:
    return [float(m) for m in re.findall(_NUMBER, text.replace(",", ""))]


def value(sc: dict[str, Any], run: RunView) -> Verdict:
    """The expected value stated anywhere in the final answer, in any phrasing: a live
    model writes its own sentences, so this reads every number of the answer (or, with
    ``near``, those within :data:`NEAR_CHARS` of a match of that regex) and passes when
    one is within ``rel_tol``/``abs_tol`` of ``expected``, a constant computed from the
    workflow's data, never from a script's printout."""
    text = run.final or ""
    if "near" in sc:
        spans = [m.span() for m in re.finditer(sc["near"], text, re.I)]
        got = [n for a, b in spans
               for n in _numbers(text[max(0, a - NEAR_CHARS):b + NEAR_CHARS])]
    else:
        got = _numbers(text)
    expected = float(sc["expected"])
    hit = next((n for n in got if math.isclose(
        n, expected, rel_tol=float(sc.get("rel_tol", 1e-6)),
        abs_tol=float(sc.get("abs_tol", 0.0)))), None)
    where = f" near {sc['near']!r}" if "near" in sc else ""
    if hit is not None:
        return Verdict("value", True, f"answer states {hit:g}{where} (expected {expected:g})")
    return Verdict("value", False, f"no number{where} in the answer within tolerance of "
                                   f"{expected:g} ({len(got)} number(s) read)")


def cites(sc: dict[str, Any], run: RunView) -> Verdict:
    texts = run.step_texts.get(int(sc["from_step"]), [])
    value = next((g for t in texts if (g := _group(sc["regex"], t)) is not None), None)
    if value is None:
        return Verdict("cites", False, f"step {sc['from_step']} has no {sc['regex']!r}")
    cited = value in run.final
    return Verdict("cites", cited, f"answer {'cites' if cited else 'lacks'} {value!r}")


def _calls(run: RunView, tool: str, agent: str | None = None) -> int:
    return sum(1 for e in run.events if e.kind == "tool_call" and e.payload.get("name") == tool
               and (agent is None or e.payload.get("agent") == agent))


def tool_used(sc: dict[str, Any], run: RunView) -> Verdict:
    n, need = _calls(run, sc["tool"], sc.get("agent")), int(sc.get("min", 1))
    return Verdict(f"tool_used:{sc['tool']}", n >= need, f"{n} call(s), need {need}")


def tool_avoided(sc: dict[str, Any], run: RunView) -> Verdict:
    n = _calls(run, sc["tool"])
    return Verdict(f"tool_avoided:{sc['tool']}", n == 0, f"{n} call(s)")


def artifact(sc: dict[str, Any], run: RunView) -> Verdict:
    suffix, need = sc.get("suffix", ".png"), int(sc.get("min", 1))
    paths = [e.payload.get("path", "") for e in run.events if e.kind == "artifact"]
    found = [p for p in paths if p.endswith(suffix) and Path(p).is_file()]
    return Verdict("artifact", len(found) >= need, f"{len(found)} {suffix} artifact(s)")


def file_exists(sc: dict[str, Any], run: RunView) -> Verdict:
    path = run.workspace / sc["path"]
    if not path.is_file():
        return Verdict(f"file_exists:{sc['path']}", False, "missing")
    if "contains" in sc and sc["contains"] not in path.read_text(errors="replace"):
        return Verdict(f"file_exists:{sc['path']}", False, f"lacks {sc['contains']!r}")
    return Verdict(f"file_exists:{sc['path']}", True, "present")


def subagent(sc: dict[str, Any], run: RunView) -> Verdict:
    ends = [e.payload for e in run.events if e.kind == "subagent_end"
            and e.payload.get("name") == sc["name"] and e.payload.get("report")]
    need = int(sc.get("min", 1))
    return Verdict(f"subagent:{sc['name']}", len(ends) >= need,
                   f"{len(ends)} typed report(s)")


def supported_numbers(sc: dict[str, Any], run: RunView) -> Verdict:
    """Every number of the final answer is backed by something the model saw (support.py):
    at most ``max`` unsupported or raw-only ones."""
    report = run.support
    flagged, limit = report.flagged, int(sc.get("max", 0))
    listed = ", ".join(f.text + (" (raw only)" if f.status == "raw_only" else "")
                       for f in flagged[:8])
    return Verdict("supported_numbers", len(flagged) <= limit,
                   f"{len(flagged)} of {len(report.checked)} number(s) unsupported "
                   f"(max {limit})" + (f": {listed}" if listed else ""))


def task_record(sc: dict[str, Any], run: RunView) -> Verdict:
    """The latest task record (of ``source``, when given) graded on one field."""
    filed = [f for f in records_from_events(run.events)
             if sc.get("source") is None or sc["source"] in f.record.source]
    name = f"task_record:{sc['field']}"
    if not filed:
        return Verdict(name, False, "no task record" + (f" from {sc['source']}"
                                                        if sc.get("source") else ""))
    ok, detail = check_record(filed[-1].record, sc["field"], expected=sc.get("expected"),
                              unit=sc.get("unit"), contains=sc.get("contains"),
                              rel_tol=float(sc.get("rel_tol", 1e-6)),
                              abs_tol=float(sc.get("abs_tol", 0.0)))
    return Verdict(name, ok, detail)


SCORERS = {"numeric": numeric, "value": value, "cites": cites, "tool_used": tool_used,
           "tool_avoided": tool_avoided, "artifact": artifact, "file_exists": file_exists,
           "subagent": subagent, "supported_numbers": supported_numbers,
           "task_record": task_record}


def grade(scorers: Sequence[dict[str, Any]], run: RunView) -> list[Verdict]:
    return [SCORERS[sc["kind"]](sc, run) for sc in scorers]
