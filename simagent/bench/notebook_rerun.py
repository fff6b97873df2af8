"""Bench: do the bundled workflows' sessions export to notebooks that re-run?

After a replay bench run, each workflow's session under the ``simagent`` policy (epoch 0)
is exported (:mod:`simagent.notebooks.export`) and the notebook executed with
``nbclient`` in a fresh kernel, in a fresh folder holding only the workflow's inputs;
it counts as re-run when no cell fails and every number its reports gave comes out the
same to the digits shown (:mod:`simagent.notebooks.rerun`). Results are kept in
``notebooks.jsonl`` per workflow and commit, so a resumed run does not redo them, and
the report states how many re-ran (:func:`report_section`).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from simagent.jsonl import append_jsonl, read_jsonl
from simagent.notebooks.export import ExportError, build
from simagent.notebooks.rerun import rerun_session
from simagent.trace.sessions import find_session

RESULTS = "notebooks.jsonl"
#: The policy whose session is exported (the one simagent users get).
POLICY = "simagent"
#: Seconds a re-run cell may take before the workflow counts as not re-run.
CELL_TIMEOUT_S = 600
#: A workflow whose notebook cells took longer than this in its session is not re-run
#: by ``make run``: a re-run takes about as long again, and the three slowest bundled
#: ones (118, 211 and 222 s of cells) would add about 10 minutes to the 6 the other ten
#: took on a loaded 2-core machine. The report names them; tests/test_notebook_rerun.py
#: re-runs one.
MAX_CELL_S = 60.0


def policy_session(out_dir: Path, workflow: str) -> Path | None:
    """The session folder of ``workflow``'s ``simagent`` run (epoch 0), if it ran."""
    workspace = out_dir / "runs" / f"{workflow}--{POLICY}--0" / "workspace"
    if not workspace.is_dir():
        return None
    try:
        return find_session(workspace, None)
    except LookupError:
        return None


def rerun_workflow(wf: Any, session_dir: Path, scratch: Path, max_s: float = MAX_CELL_S
                   ) -> dict[str, Any]:
    """Export and re-run one workflow's session; a row for ``notebooks.jsonl``."""
    row: dict[str, Any] = {"workflow": wf.id, "session": session_dir.name}
    try:
        _, plan = build(session_dir)
    except ExportError as exc:
        return row | {"ok": False, "error": str(exc)}
    row["cell_s"] = round(sum(c.elapsed_s for c in plan.kept), 1)
    if row["cell_s"] > max_s:
        return row | {"ok": False, "skipped": f"its cells took {row['cell_s']:.0f} s in the "
                                              f"session, over the {max_s:.0f} s budget"}
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    wf.write_fixtures(scratch)
    try:
        result, export_s = rerun_session(session_dir, scratch, timeout_s=CELL_TIMEOUT_S)
    except ExportError as exc:
        return row | {"ok": False, "error": str(exc)}
    row |= {"ok": result.ok, "error": result.error, "export_s": round(export_s, 2),
            "rerun_s": round(result.seconds, 1), "values": len(result.checks),
            "mismatched": [f"{c.name}: {c.shown} -> {c.got}" for c in result.mismatched]}
    shutil.rmtree(scratch, ignore_errors=True)
    return row


def run(workflows: Iterable[Any], out_dir: Path, commit: str | None,
        progress: Callable[[str], None] | None = None, max_s: float = MAX_CELL_S
        ) -> list[dict[str, Any]]:
    """Re-run each workflow's notebook not yet done at ``commit``; every row for them."""
    path = out_dir / RESULTS
    done = {(r.get("workflow"), r.get("commit")): r for r in read_jsonl(path)}
    rows = []
    for wf in workflows:
        if (wf.id, commit) in done:
            rows.append(done[(wf.id, commit)])
            continue
        session = policy_session(out_dir, wf.id)
        if session is None:
            continue
        if progress:
            progress(f"notebook of {wf.id}: export and re-run")
        row = rerun_workflow(wf, session, out_dir / "notebook-runs" / wf.id, max_s) | {
            "commit": commit}
        append_jsonl(path, json.dumps(row, default=str))
        rows.append(row)
    return rows


def report_section(out_dir: Path, workflows: Sequence[str] | None = None) -> str:
    """The report's lines: how many workflows' notebooks re-ran, and which did not."""
    rows = {r.get("workflow"): r for r in read_jsonl(out_dir / RESULTS)}  # latest wins
    if workflows is not None:
        rows = {k: v for k, v in rows.items() if k in workflows}
    if not rows:
        return ""
    skipped = {k: r for k, r in rows.items() if r.get("skipped")}
    rows = {k: r for k, r in rows.items() if k not in skipped}
    good = sorted(k for k, r in rows.items() if r.get("ok"))
    seconds = sum(float(r.get("rerun_s") or 0) for r in rows.values())
    lines = ["", "## Notebooks", "",
             f"{len(good)} of {len(rows)} bundled workflows' sessions exported to notebooks "
             f"that re-ran top to bottom in a fresh kernel (nbclient, inputs only) with the "
             f"reported key values the same to the digits shown "
             f"({sum(int(r.get('values') or 0) for r in rows.values())} values checked, "
             f"{seconds:.0f} s of re-runs)."]
    for name in sorted(set(rows) - set(good)):
        r = rows[name]
        why = r.get("error") or "; ".join(r.get("mismatched") or []) or "?"
        lines.append(f"- {name}: {why}")
    for name in sorted(skipped):
        lines.append(f"- {name}: not re-run, {skipped[name]['skipped']}")
    return "\n".join(lines) + "\n"
