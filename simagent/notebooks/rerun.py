"""Re-run a session's notebook in a fresh kernel and check it reproduces the session.

A notebook written by :mod:`simagent.notebooks.export` claims that running it from the
top rebuilds the session's state. :func:`execute` tests the claim with ``nbclient``: a
fresh kernel (the notebook's kernelspec), the given folder as its working directory,
cells tagged ``skip-execution`` skipped, stop at the first error. :func:`compare` then
checks that the numbers the session reported (its task records' and subagents' key
values) come out the same, to the digits shown: each is found in the session's outputs,
and the re-run output of such a cell must show the same number on the line that begins
the same way.
"""

from __future__ import annotations

import copy
import re
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

from simagent.kernel.result import strip_ansi
from simagent.notebooks.export import build, load, stream_text
from simagent.notebooks.plan import SKIP_TAG

#: A number as printed (``2.30316``, ``-1.2e-05``, ``1637``).
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
#: Seconds one cell of a re-run may take.
CELL_TIMEOUT_S = 600
#: Lines of the kernel's own log an error shows when the kernel died.
KERNEL_LOG_LINES = 5


@dataclass(frozen=True)
class Check:
    """One reported number: ``shown`` as the session reported it, ``got`` from the
    re-run (None: not found), ``where``: the cell it was checked in."""

    name: str
    shown: str
    got: str | None
    ok: bool
    where: str = ""


@dataclass
class Rerun:
    ok: bool
    seconds: float
    error: str | None = None
    checks: list[Check] = field(default_factory=list)
    notebook: nbformat.NotebookNode | None = None

    @property
    def mismatched(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]


def reported_values(events: Iterable[Any]) -> list[Mapping[str, Any]]:
    """Key values the session reported: its task records' and its subagents' reports'."""
    out: list[Mapping[str, Any]] = []
    for ev in events:
        p = ev.payload if isinstance(ev.payload, dict) else {}
        holder = p.get("report") if ev.kind == "subagent_end" else \
            p.get("record") if ev.kind == "context_checkpoint" else None
        if isinstance(holder, dict):
            out += [kv for kv in holder.get("key_values") or () if isinstance(kv, Mapping)]
    return out


def execute(nb: nbformat.NotebookNode, cwd: Path, *, timeout_s: int = CELL_TIMEOUT_S
            ) -> tuple[nbformat.NotebookNode, float, str | None]:
    """Run a copy of ``nb`` top to bottom in a fresh kernel in ``cwd``: (the executed
    copy, seconds, None or the first error as one line naming the cell)."""
    run = copy.deepcopy(nb)
    for cell in run.cells:
        if cell.cell_type == "code" and SKIP_TAG not in cell.metadata.get("tags", []):
            cell.outputs, cell.execution_count = [], None
    client = NotebookClient(run, timeout=timeout_s, kernel_name=nb.metadata.kernelspec.name,
                            skip_cells_with_tag=SKIP_TAG,
                            resources={"metadata": {"path": str(cwd)}})
    started = time.perf_counter()
    error = None
    # The kernel's stderr (ipykernel warns about plain TCP on every start) goes to a log
    # that is shown only when the kernel dies, where it says why.
    with tempfile.TemporaryFile("w+", errors="replace") as log:
        try:
            client.execute(stdout=log, stderr=log)
        except (CellExecutionError, CellTimeoutError) as exc:
            error = _failed(run, exc)
        except DeadKernelError as exc:
            log.seek(0)
            tail = [ln for ln in log.read().splitlines() if ln.strip()][-KERNEL_LOG_LINES:]
            error = _failed(run, exc) + "".join(f"\n  kernel: {ln}" for ln in tail)
    return run, time.perf_counter() - started, error


def _failed(run: nbformat.NotebookNode, exc: Exception) -> str:
    cell = next((c for c in run.cells if c.cell_type == "code" and any(
        o.get("output_type") == "error" for o in c.outputs)), None)
    where = f"cell [{cell.metadata.get('simagent', {}).get('n', '?')}]" if cell else "a cell"
    ename = getattr(exc, "ename", None) or type(exc).__name__
    evalue = getattr(exc, "evalue", None) or str(exc).strip().splitlines()[-1:] or [""]
    evalue = evalue if isinstance(evalue, str) else evalue[0]
    return f"{where} failed on re-run: {strip_ansi(ename)}: {strip_ansi(evalue)[:300]}"


def compare(original: nbformat.NotebookNode, rerun: nbformat.NotebookNode,
            values: Sequence[Mapping[str, Any]]) -> list[Check]:
    """A :class:`Check` per numeric reported value found in the session's outputs."""
    before, after = stream_text(original.cells), stream_text(rerun.cells)
    runs = [i for i, c in enumerate(original.cells) if c.cell_type == "code"
            and SKIP_TAG not in c.metadata.get("tags", [])]
    checks = []
    for kv in values:
        shown = str(kv.get("value", "")).strip()
        if not NUMBER.fullmatch(shown):
            continue
        found = _find(shown, [(i, before[i]) for i in reversed(runs)])
        name = str(kv.get("name", "?"))
        if not found:
            checks.append(Check(name, shown, None, False, "not in any re-run cell's output"))
            continue
        tried = []
        for i, prefix in found:
            n = original.cells[i].metadata.get("simagent", {}).get("n", i)
            got = _after(prefix, after[i])
            tried.append(Check(name, shown, got, got is not None and same(shown, got),
                               f"cell [{n}]"))
            if tried[-1].ok:
                break
        checks.append(tried[-1] if tried[-1].ok else tried[0])
    return checks


def _find(shown: str, cells: Sequence[tuple[int, str]]) -> list[tuple[int, str]]:
    """Every (cell index, the line's text before the number) where the outputs show it,
    ``cells`` latest first (a report quotes the output just before it). A value counts
    as reproduced when one of them shows it again: a coincidence (a timing that printed
    the same digits) must not fail the check."""
    out = []
    for i, text in cells:
        for line in text.splitlines():
            for m in NUMBER.finditer(line):
                if m.group(0).lstrip("+") == shown.lstrip("+") or _same_text(m.group(0), shown):
                    out.append((i, line[: m.start()]))
    return out


def _same_text(a: str, b: str) -> bool:
    try:
        return float(a) == float(b) and digits(a) == digits(b)
    except ValueError:
        return False


def _after(prefix: str, text: str) -> str | None:
    """The number after the line that begins like ``prefix``; other numbers in the prefix
    (a timing) may differ, when no line begins exactly like it."""
    for line in text.splitlines():
        if line.startswith(prefix) and (m := NUMBER.match(line, len(prefix))):
            return m.group(0)
    parts = NUMBER.split(prefix)
    pattern = re.compile("^" + NUMBER.pattern.join(re.escape(p) for p in parts)
                         + f"({NUMBER.pattern})")
    for line in text.splitlines():
        if m := pattern.match(line):
            return m.group(1)
    return None


def digits(shown: str) -> float:
    """Half a unit in the last place shown: ``2.30316`` -> 5e-06, ``1.2e-05`` -> 5e-07."""
    mantissa, _, exp = shown.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 0.5 * 10.0 ** (int(exp or 0) - decimals)


def same(shown: str, got: str) -> bool:
    """Whether ``got`` equals ``shown`` within the digits ``shown`` has."""
    try:
        return abs(float(got) - float(shown)) <= digits(shown) * (1 + 1e-9)
    except ValueError:
        return False


def rerun(nb: nbformat.NotebookNode, cwd: Path, values: Sequence[Mapping[str, Any]], *,
          timeout_s: int = CELL_TIMEOUT_S) -> Rerun:
    """Execute ``nb`` in ``cwd`` and compare the reported ``values``."""
    done, seconds, error = execute(nb, cwd, timeout_s=timeout_s)
    checks = compare(nb, done, values) if error is None else []
    ok = error is None and all(c.ok for c in checks)
    return Rerun(ok, seconds, error, checks, done)


def rerun_session(session_dir: Path, cwd: Path, *, timeout_s: int = CELL_TIMEOUT_S
                  ) -> tuple[Rerun, float]:
    """Export the session's notebook (not written anywhere) and re-run it in ``cwd``:
    (the result, seconds the export took)."""
    started = time.perf_counter()
    nb, _ = build(session_dir)
    export_s = time.perf_counter() - started
    events, _ = load(session_dir)
    return rerun(nb, cwd, reported_values(events), timeout_s=timeout_s), export_s


def workflow_folder(path: Path, fixtures: Any) -> Path:
    """A fresh folder with only a workflow's inputs, for a re-run (``fixtures``: the
    workflow's ``write_fixtures``)."""
    path.mkdir(parents=True, exist_ok=True)
    fixtures(path)
    return path
