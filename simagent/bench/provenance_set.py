"""The provenance engine against its labelled set (``bench/provenance/``): precision and
recall per label.

Each case is a folder under ``bench/provenance/cases/``: the answer(s) (``*.md``) and
what came before them, either as sources (``sources.json.gz``: bench sessions, read once
from their traces and raw outputs) or as trace events with raw output files
(``events.jsonl`` + ``outputs/``: hand-written traps, so the reading of a trace is
measured too, a cell printed after the answer included). ``labelled.jsonl`` holds one
line per number: the case, the answer file, the number's place among the numbers the
engine reads there (``index``) and its text, the true status (``sourced``, ``derived``,
``input``, ``unsourced``, or ``ignored``) and, where checked by hand, the executions
that truly show it.
"""

from __future__ import annotations

import gzip
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from simagent.context.provenance.engine import (
    IGNORED,
    STATUSES,
    Provenance,
    Source,
    SourceIndex,
    trace_answer,
)
from simagent.context.provenance.sources import final_answer, sources_from_events
from simagent.paths import content_dir

LABELS = (*STATUSES, IGNORED)


def set_dir() -> Path:
    return content_dir("bench") / "provenance"


def case_sources(case: Path) -> list[Source]:
    """The sources of a case's answers: stored ones, or read from its events."""
    stored = case / "sources.json.gz"
    if stored.exists():
        with gzip.open(stored, "rt", encoding="utf-8") as fh:
            return [Source(d["kind"], d["text"], d.get("execution"), d.get("label", ""),
                           d.get("line_offset", 0)) for d in json.load(fh)]
    events = case_events(case)
    answer = final_answer(events)
    return sources_from_events(events, before=None if answer is None else answer.id)


def case_events(case: Path) -> list[Any]:
    """A hand-written case's trace: ``raw_path`` names a file under the case folder."""
    out = []
    for i, line in enumerate((case / "events.jsonl").read_text().splitlines(), 1):
        if not line.strip():
            continue
        d = json.loads(line)
        payload = dict(d.get("payload", {}))
        if payload.get("raw_path"):
            payload["raw_path"] = str(case / payload["raw_path"])
        out.append(SimpleNamespace(id=d.get("id", i), kind=d["kind"], payload=payload))
    return out


def traced_cases(root: Path) -> dict[tuple[str, str], Provenance]:
    """Every answer of every case, traced: ``(case, answer file) -> Provenance``."""
    out = {}
    for case in sorted(p for p in (root / "cases").iterdir() if p.is_dir()):
        index = SourceIndex(case_sources(case))
        for answer in sorted(case.glob("*.md")):
            out[(case.name, answer.name)] = trace_answer(answer.read_text(), index)
    return out


@dataclass
class Scores:
    """Counts per label: how often the engine said it (``said``), how often it is true
    (``true``), how often both (``hit``); a ``sourced`` hit names a true execution."""

    said: Counter[str] = field(default_factory=Counter)
    true: Counter[str] = field(default_factory=Counter)
    hit: Counter[str] = field(default_factory=Counter)
    #: Numbers truly unsourced that the engine called sourced (the issue's hard line).
    unsourced_as_sourced: list[str] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # labels whose number was not read

    def precision(self, label: str) -> float | None:
        return self.hit[label] / self.said[label] if self.said[label] else None

    def recall(self, label: str) -> float | None:
        return self.hit[label] / self.true[label] if self.true[label] else None

    def table(self) -> str:
        """The markdown table ``make run`` prints and keeps."""
        def f(x: float | None) -> str:
            return "–" if x is None else f"{x:.3f}"
        rows = ["| label | numbers | engine said | precision | recall |",
                "|---|---|---|---|---|"]
        rows += [f"| {lb} | {self.true[lb]} | {self.said[lb]} | {f(self.precision(lb))} | "
                 f"{f(self.recall(lb))} |" for lb in LABELS]
        total = sum(self.true.values())
        rows.append(f"\n{total} labelled numbers; truly unsourced called sourced: "
                    f"{len(self.unsourced_as_sourced)}.")
        return "\n".join(rows)


def evaluate(root: Path | None = None) -> Scores:
    """The engine's statuses against ``labelled.jsonl``."""
    root = set_dir() if root is None else root
    traced = traced_cases(root)
    scores = Scores()
    for line in (root / "labelled.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        lab = json.loads(line)
        numbers = traced[(lab["case"], lab["answer"])].numbers
        where = f"{lab['case']}/{lab['answer']}#{lab['index']} {lab['text']!r}"
        if lab["index"] >= len(numbers) or numbers[lab["index"]].text != lab["text"]:
            scores.missing.append(where)
            continue
        got = numbers[lab["index"]]
        true = lab["label"]
        scores.true[true] += 1
        scores.said[got.status] += 1
        right = got.status == true
        if right and true == "sourced" and lab.get("executions"):
            right = got.source is not None and got.source.execution in lab["executions"]
        if right:
            scores.hit[true] += 1
        else:
            scores.misses.append(f"{where}: {got.status}, labelled {true}")
        if true == "unsourced" and got.status == "sourced":
            scores.unsourced_as_sourced.append(where)
    return scores


def timing(root: Path | None = None, runs: int = 7) -> str:
    """The engine's cost on the longest answer of the set, its sources already read (a
    session's outputs are read once, as each cell ends): min and median of ``runs``, wall
    clock and this process's CPU time (on a shared, loaded machine the wall clock also
    counts the time other processes ran)."""
    root = set_dir() if root is None else root
    case, answer = max(((c, a) for c in (root / "cases").iterdir() if c.is_dir()
                        for a in c.glob("answer.md")), key=lambda ca: len(ca[1].read_text()))
    sources, text = case_sources(case), answer.read_text()
    trace_answer(text, SourceIndex(sources))  # reads each source once
    times, cpu = [], []
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), time.process_time()
        trace_answer(text, SourceIndex(sources))
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    times.sort()
    cpu.sort()
    size = sum(len(s.text) for s in sources) / 1e6
    return (f"Cost on the longest answer ({case.name}, {len(text)} characters, {size:.1f} MB "
            f"of sources): {1000 * times[0]:.0f} ms min, {1000 * times[runs // 2]:.0f} ms "
            f"median of {runs} (CPU time {1000 * cpu[0]:.0f} ms min, "
            f"{1000 * cpu[runs // 2]:.0f} ms median).")


def report(root: Path | None = None) -> str:
    """The table, the engine's cost and every miss, for ``simagent bench provenance``."""
    s = evaluate(root)
    lines = ["Provenance engine on its labelled set (bench/provenance/):", "", s.table(),
             "", timing(root)]
    if s.missing:
        lines += ["", f"{len(s.missing)} labelled number(s) not read as labelled:",
                  *(f"- {m}" for m in s.missing)]
    if s.misses:
        lines += ["", "Misses:", *(f"- {m}" for m in s.misses)]
    return "\n".join(lines)
