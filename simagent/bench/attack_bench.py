"""``simagent bench attacks``: every attack simagent claims to hold against, run for real.

A security claim is only as good as the attacks it was tried against, so each row here
is one attack as someone else would mount it: a cloned folder's config, a notebook that
was mailed, a link an earlier cell made, a hostile MCP server, a second local user. The
attack runs against the real product (the ``simagent`` CLI in subprocesses, its real
kernel and graph, real MCP servers, a real listener on 127.0.0.1, a second uid through
``setpriv``) in a fresh :mod:`~simagent.bench.attack_lab`, and the row says:

* **held**: whether what the person is promised held (``skipped`` with the reason where
  the machine cannot mount the attack, e.g. no second uid);
* **evidence**: what was observed, in one line (a marker file absent, connections to the
  listener, the exit code, a notice).

After every attack the lab's state home, the workspace's ``.simagent/`` and any export
are read for the planted fake secrets (ANSI sequences read away first): a planted value
found in plain text breaks the row whatever else held.

The catalogue lives in :mod:`simagent.bench.attack_cases`; this module holds the
running and the reports (text table, JSON, markdown, and the README's security table,
rendered from a run's ``attacks.json``). ``fast`` cases are the subset ``make test`` runs.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from simagent.bench.attack_lab import Lab, Launch, Verdict, lab

#: What a row's result is called, in every report.
HELD, BROKEN, SKIPPED = "held", "BROKEN", "skipped"


@dataclass(frozen=True)
class AttackCase:
    """One catalogue entry: ``run`` mounts the attack in a fresh :class:`Lab`."""

    id: str
    cls: str  # trust notebook paths links reads memory mcp-client mcp-http dask secrets permissions
    attack: str  # one line: what the attacker does
    expected: str  # one line: what the person is promised
    run: Callable[[Lab], Verdict]
    fast: bool = False


@dataclass
class AttackRow:
    id: str
    cls: str
    attack: str
    expected: str
    held: bool | None  # None: skipped
    skipped: str | None
    evidence: str
    wall_s: float = 0.0

    @property
    def result(self) -> str:
        return SKIPPED if self.held is None else (HELD if self.held else BROKEN)


def run_attacks(cases: Sequence[AttackCase], *,
                progress: Callable[[str], None] | None = None,
                popen: Launch = subprocess.Popen) -> list[AttackRow]:
    """Run ``cases`` one after another, each in a fresh lab (``popen``: :class:`Lab`)."""
    return [attempt(case, progress, popen) for case in cases]


def attempt(case: AttackCase, progress: Callable[[str], None] | None = None,
            popen: Launch = subprocess.Popen) -> AttackRow:
    """Mount one attack in a fresh lab, then read the lab for planted secrets. A crash of
    the bench's own harness is a broken row naming the error, never a lost run."""
    if progress:
        progress(f"attack {case.id}: {case.attack}")
    t0 = time.monotonic()
    with lab(popen) as made:
        try:
            out = case.run(made)
        except Exception as exc:  # the harness failed: the row says so
            out = Verdict(False, f"bench error: {type(exc).__name__}: {exc}"[:300])
        if out.held is not None:
            out = _with_leaks(out, made)
    return AttackRow(case.id, case.cls, case.attack, case.expected, out.held, out.skipped,
                     out.evidence or out.skipped or "", round(time.monotonic() - t0, 1))


def _with_leaks(out: Verdict, made: Lab) -> Verdict:
    found = made.leaks()
    if found:
        return Verdict(False, f"planted value at rest: {', '.join(found[:3])}"
                              f"{f' (+{len(found) - 3} more)' if len(found) > 3 else ''}; "
                              f"{out.evidence}")
    return Verdict(out.held, f"{out.evidence}; no planted value in "
                             f"{len(made.scanned())} files at rest")


def failed(rows: Sequence[AttackRow]) -> list[AttackRow]:
    return [r for r in rows if r.held is False]


# ---------------------------------------------------------------------------- reports
def format_table(rows: Sequence[AttackRow]) -> str:
    """The terminal table: one line per attack, then what was expected and observed."""
    width = max((len(r.id) for r in rows), default=6)
    cls_width = max((len(r.cls) for r in rows), default=5)
    lines = []
    for r in rows:
        lines.append(f"{r.id:<{width}}  {r.cls:<{cls_width}}  {r.result:<7}  {r.attack}")
        lines.append(f"{'':<{width}}  expected: {r.expected}")
        lines.append(f"{'':<{width}}  {'skipped' if r.held is None else 'observed'}: "
                     f"{r.evidence}")
    lines.append(f"\n{summary(rows)}")
    return "\n".join(lines)


def summary(rows: Sequence[AttackRow]) -> str:
    held = sum(r.held is True for r in rows)
    skipped = sum(r.held is None for r in rows)
    return (f"{held}/{len(rows) - skipped} attacks held"
            + (f", {skipped} skipped" if skipped else "")
            + (f"; broken: {', '.join(r.id for r in failed(rows))}" if failed(rows) else ""))


def as_json(rows: Sequence[AttackRow], commit: str | None = None) -> dict[str, Any]:
    """What ``--json`` prints and ``attacks.json`` holds: the commit and the rows."""
    return {"commit": commit, "rows": [{**asdict(r), "result": r.result} for r in rows]}


def rows_of(data: dict[str, Any]) -> list[AttackRow]:
    """The rows of an ``attacks.json``."""
    fields = AttackRow.__dataclass_fields__
    return [AttackRow(**{k: v for k, v in row.items() if k in fields}) for row in data["rows"]]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: Sequence[AttackRow]) -> str:
    """``attacks.md``: every column, one row per attack."""
    lines = ["| attack | class | what the attacker does | expected | result | evidence |",
             "|---|---|---|---|---|---|"]
    lines += [f"| `{r.id}` | {r.cls} | {_cell(r.attack)} | {_cell(r.expected)} | "
              f"{r.result} | {_cell(r.evidence)} |" for r in rows]
    return "\n".join(lines) + f"\n\n{summary(rows)}\n"


def readme_table(data: dict[str, Any]) -> str:
    """The README's security table, rendered from a run's ``attacks.json``: what was
    tried and what holds, without timings or per-run paths, so the same results render
    the same text byte for byte (the README section is generated from it)."""
    rows = rows_of(data)
    lines = ["| attack | what is tried | what holds | result |", "|---|---|---|---|"]
    lines += [f"| `{r.id}` | {_cell(r.attack)} | {_cell(r.expected)} | {_readme_result(r)} |"
              for r in rows]
    at = f" at {data['commit']}" if data.get("commit") else ""
    return ("\n".join(lines) + f"\n\n{summary(rows)} (`simagent bench attacks`{at}).\n")


#: The README's security table lies between these lines; ``splice_readme`` replaces it.
README_BEGIN = "<!-- attacks:begin (rendered from docs/results/attacks.json) -->"
README_END = "<!-- attacks:end -->"


def splice_readme(readme: str, table: str) -> str:
    """``readme`` with the text between the markers replaced by ``table``; ``ValueError``
    when the markers are missing (the README then keeps what a person wrote)."""
    head, sep, rest = readme.partition(README_BEGIN)
    _old, sep2, tail = rest.partition(README_END)
    if not (sep and sep2):
        raise ValueError(f"the README has no {README_BEGIN!r} ... {README_END!r} section")
    return f"{head}{README_BEGIN}\n{table}{README_END}{tail}"


def _readme_result(row: AttackRow) -> str:
    return row.result if row.held is not None else f"skipped ({_cell(row.skipped or '')})"


def write_out(rows: Sequence[AttackRow], out: Path, commit: str | None) -> tuple[Path, Path]:
    """``attacks.json`` and ``attacks.md`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    data, table = out / "attacks.json", out / "attacks.md"
    data.write_text(json.dumps(as_json(rows, commit), indent=2) + "\n")
    table.write_text(markdown_table(rows))
    return data, table
