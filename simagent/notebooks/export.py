"""A session's notebook, built with ``nbformat`` from its :class:`~simagent.notebooks.plan.Plan`.

Outputs are what the session really produced: stream text as the model saw it (the
tool result of the cell, capped again at :data:`STREAM_CAP` with a note naming the raw
output file), the cell's value as ``execute_result``, its error, and its figures as
``image/png`` from the PNGs the session saved. ``execution_count`` is simagent's
execution number, so ``In [12]`` in Jupyter is ``_out[12]`` and ``outputs/0012.txt`` of
the session. An answer's numbers carry footnotes (``presentation/footnotes``) that link
to the cells they came from: each cited cell has a small heading with its anchor before
it, and the answer cell's metadata holds the numbers as ``run --json`` writes them.
Every string goes through the redaction that guards the trace before the
file is written: no secret from the environment reaches the notebook.
"""

from __future__ import annotations

import base64
import os
import platform
import re
import sqlite3
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from simagent import __version__
from simagent.kernel import replay
from simagent.kernel_api.outputs import HANDLE, number_of
from simagent.notebooks.plan import Code, Plan, Text, plan
from simagent.presentation.footnotes import (
    Note,
    cell_anchor,
    cited_cells,
    footnote,
    markdown_marker,
    markdown_sources,
    turn_answers,
)
from simagent.records import format_value
from simagent.trace.log import TraceLog
from simagent.trace.redact import redact_data

#: Characters of a cell's stream text kept in the notebook (head and tail around a note).
STREAM_CAP = 20_000
#: The kernelspec a notebook names: the Python kernel of the interpreter simagent runs
#: on (ipykernel's own spec), so Jupyter and nbclient start the session's interpreter.
KERNEL_NAME = "python3"
#: The default file name of a session's notebook, in its workspace.
DEFAULT_NAME = "{session_id}.ipynb"
#: Where a figure line of the model's text starts (``Display.text`` of an image).
_FIGURE = re.compile(r"^\[figure ", re.M)


class ExportError(Exception):
    """Why a session cannot be exported (one line for the person)."""


def load(session_dir: Path) -> tuple[list[Any], list[dict[str, Any]]]:
    """The trace events and execution records of a session folder. Records live in the
    folder of each execution's raw output (a bench replay serves a recording's)."""
    with TraceLog(session_dir / "trace.sqlite", readonly=True) as log:
        events = log.events()
    folders = {Path(ev.payload["raw_path"]).parent for ev in events
               if ev.kind == "kernel_exec" and number_of(ev.payload.get("raw_path"))}
    folders.add(session_dir / "outputs")
    records: dict[int, dict[str, Any]] = {}
    for folder in sorted(folders):
        for rec in replay.load_records(folder):
            records.setdefault(rec["n"], rec)
    return events, [records[n] for n in sorted(records)]


def build(session_dir: Path, *, all_cells: bool = False, earlier: bool = True
          ) -> tuple[nbformat.NotebookNode, Plan]:
    """The notebook of the session in ``session_dir`` and the plan it was made from.
    Raises :class:`ExportError` when the session ran no code to export (beyond the
    simulator's warm-up)."""
    events, records = load(session_dir)
    raw = {}
    for ev in events:  # cells no model ran (the warm-up): their raw output
        p = ev.payload
        if ev.kind == "kernel_exec" and not p.get("tool_call_id") and \
                (n := number_of(p.get("raw_path"))) is not None:
            raw[n] = _read(Path(p["raw_path"]))
    workspace = next((ev.payload.get("workspace") for ev in events
                      if ev.kind == "session_start"), None)
    numbers = turn_answers(events)
    pl = plan(events, records, session_dir.name, all_cells=all_cells, earlier=earlier,
              raw=raw, base=workspace, cited=cited_cells(numbers))
    pl.numbers = numbers
    mine = [c for c in (pl.code if all_cells else pl.kept) if not c.warmup]
    if not mine:  # the simulator's warm-up alone is not a notebook
        raise ExportError(f"session {session_dir.name} ran no code that defines state: "
                          f"there is no notebook to write"
                          + ("" if all_cells else " (--all writes failed and display-only "
                             "cells too)"))
    return notebook(pl), pl


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def notebook(pl: Plan) -> nbformat.NotebookNode:
    nb = new_notebook(metadata={
        "kernelspec": {"name": KERNEL_NAME, "display_name": "Python 3 (ipykernel)",
                       "language": "python"},
        "language_info": {"name": "python", "version": platform.python_version()},
        "simagent": {"session_id": pl.session_id, "version": __version__,
                     "interpreter": sys.executable,
                     **{k: v for k, v in pl.meta.items() if v and k != "outputs"}}})
    nb.cells.append(new_markdown_cell(_title(pl)))
    if pl.concerns:
        nb.cells.append(new_markdown_cell(
            "## Cells that may not re-run by themselves\n\n"
            + "\n".join(f"- {c}" for c in pl.concerns)))
    if folder := pl.meta.get("outputs"):
        nb.cells.append(new_code_cell(
            f"# simagent: later cells read {HANDLE}[n], what execution n printed; here it "
            f"reads the session's saved outputs\n"
            f"from simagent.kernel_api.outputs import Outputs\n\n"
            f"{HANDLE} = Outputs({str(folder)!r})",
            metadata={"simagent": {"setup": True}, "tags": ["simagent-setup"]}))
    shown = {c.n for c in pl.items if isinstance(c, Code)}
    cited = cited_cells(pl.numbers) & shown
    for item in pl.items:
        if isinstance(item, str):
            nb.cells.append(new_markdown_cell(f"## {item}"))
        elif isinstance(item, Text):
            nb.cells.append(_text_cell(item, pl, shown))
        else:
            if item.n in cited:
                nb.cells.append(new_markdown_cell(
                    f'#### <a id="{cell_anchor(item.n)}"></a>Cell {item.n}\n\n'
                    f"An answer's numbers come from this cell.",
                    metadata={"simagent": {"anchor": cell_anchor(item.n)}}))
            nb.cells.append(_code_cell(item, pl.session_id))
    safe = redact_data(_plain(nb))
    for cell, clean in zip(nb.cells, safe["cells"], strict=True):
        cell.source = clean["source"]
        for out, c_out in zip(cell.get("outputs", []), clean.get("outputs", []), strict=True):
            for key in ("text", "evalue", "traceback"):
                if key in out:
                    out[key] = c_out[key]
            if "data" in out:  # images stay byte for byte; their text is redacted
                out["data"] = {k: v if k.startswith("image/") else c_out["data"][k]
                               for k, v in out["data"].items()}
    nbformat.validate(nb)
    return nb


def _plain(nb: nbformat.NotebookNode) -> dict[str, Any]:
    return {"cells": [{"source": c.source,
                       "outputs": [dict(o) for o in c.get("outputs", [])]} for c in nb.cells]}


def _title(pl: Plan) -> str:
    m = pl.meta
    facts = ", ".join(f"{k} {m[k]}" for k in ("simulator", "model") if m.get(k))
    kept = len(pl.kept)
    return (f"# simagent session {pl.session_id}\n\n"
            f"Written by simagent {__version__} from the session's trace"
            + (f" ({facts})" if facts else "") + f". Run from the top, its {kept} code "
            f"cell{'s' * (kept != 1)} rebuild the session's state; the outputs shown are "
            "the session's own. Cells tagged `skip-execution` are shown, not run.")


def _text_cell(t: Text, pl: Plan, shown: set[int]) -> nbformat.NotebookNode:
    """A markdown cell; an answer's numbers footnoted, each linked to its cell's anchor
    (a cell this notebook shows), the sources block under it, and the numbers in the
    cell's metadata."""
    prov = pl.numbers.get(t.event_id) if t.event_id is not None else None
    if prov is None or not prov.claims:
        return new_markdown_cell(_markdown(t))

    def linked(n: Note) -> bool:
        return n.execution in shown

    f = footnote(t.body, prov, markdown_marker(linked))
    text = _markdown(Text(t.kind, t.title, f.text, t.key_values))
    return new_markdown_cell(text + markdown_sources(f, linked), metadata={
        "simagent": {"numbers": redact_data(prov.as_json())}})


def _markdown(t: Text) -> str:
    body = t.body.strip()
    if t.kind == "user":
        body = "\n".join(f"> {line}" if line else ">" for line in body.splitlines())
    text = f"**{t.title}**\n\n{body}" if body else f"**{t.title}**"
    if t.key_values:
        rows = ["| key value | value | unit |", "|---|---|---|"]
        for kv in t.key_values:
            value = format_value(kv).split(" = ", 1)[-1]
            unit = str(kv.get("unit") or "")
            value = value[: -len(unit) - 1] if unit and value.endswith(" " + unit) else value
            rows.append(f"| {_cell(kv.get('name'))} | {_cell(value)} | {_cell(unit)} |")
        text += "\n\n" + "\n".join(rows)
    return text


def _cell(value: Any) -> str:
    return str(value if value is not None else "").replace("|", "\\|").replace("\n", " ")


def _code_cell(c: Code, session_id: str) -> nbformat.NotebookNode:
    meta: dict[str, Any] = {"n": c.n, "session_id": session_id, "status": c.status,
                            "duration_s": c.elapsed_s, "agent": c.agent}
    if c.raw_path:
        meta["raw_output"] = c.raw_path
    if c.warmup:
        meta["warmup"] = True
    if c.effects:
        meta["effects"] = list(c.effects)
    if c.why and c.kind not in ("kept", "needed"):
        meta["skipped"] = c.why
    cell = new_code_cell(c.code, execution_count=c.n, outputs=outputs(c),
                         metadata={"simagent": meta})
    if c.tags:
        cell.metadata["tags"] = c.tags
    return cell


def outputs(c: Code) -> list[nbformat.NotebookNode]:
    """The cell's outputs, from the model's text of it, its error and its PNGs."""
    text = c.text
    error = (c.error or "").strip()
    cut = len(text)
    if c.status != "ok" and error and (at := text.rfind(error)) >= 0:
        cut = at
    marker = f"Out[{c.n}]: "
    value_at = -1
    for m in re.finditer(r"(?m)^Out\[\d+\]: ", text[:cut]):
        value_at, marker = m.start(), m.group(0)
    figure_at = next((m.start() for m in _FIGURE.finditer(text[:cut])), -1)
    ends = [i for i in (value_at, figure_at) if i >= 0]
    stream_end = min([*ends, cut])
    streams = text[:stream_end].rstrip("\n")
    if c.status != "ok":
        streams = re.sub(r"\n?\[[^\n]*\]\s*$", "", streams) if not error else streams
    out: list[nbformat.NotebookNode] = []
    stdout, _, stderr = streams.partition("[stderr]\n")
    stdout = stdout.rstrip("\n")
    if stdout and stdout != "(no output)":
        out.append(new_output("stream", name="stdout", text=_capped(stdout, c) + "\n"))
    if stderr:
        out.append(new_output("stream", name="stderr", text=_capped(stderr, c)))
    if value_at >= 0:
        end = figure_at if figure_at > value_at else cut
        value = text[value_at + len(marker): end].rstrip("\n")
        out.append(new_output("execute_result", data={"text/plain": value},
                               execution_count=c.n))
    lines = _FIGURE.split(text[figure_at:cut]) if figure_at >= 0 else []
    descriptions = [("[figure " + d).rstrip("\n") for d in lines if d.strip()]
    for i, path in enumerate(c.figures):
        png = _png(path)
        if png is None:
            continue
        plain = descriptions[i] if i < len(descriptions) else os.path.basename(path)
        out.append(new_output("display_data", data={"image/png": png, "text/plain": plain}))
    if c.status != "ok":
        ename, evalue = _error_head(error, c.status)
        out.append(new_output("error", ename=ename, evalue=evalue,
                              traceback=error.splitlines() or [f"{ename}: {evalue}"]))
    return out


def _capped(text: str, c: Code) -> str:
    if len(text) <= STREAM_CAP:
        return text
    head, tail = text[: STREAM_CAP // 4], text[-(STREAM_CAP - STREAM_CAP // 4):]
    where = f"the full output is {c.raw_path}" if c.raw_path else "the full output was not kept"
    return (f"{head}\n[simagent: {len(text) - len(head) - len(tail):,} characters of this "
            f"output are not shown here; {where}]\n{tail}")


def _png(path: str) -> str | None:
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    return base64.b64encode(data).decode("ascii") if data.startswith(b"\x89PNG") else None


def _error_head(error: str, status: str) -> tuple[str, str]:
    last = error.strip().splitlines()[-1] if error.strip() else ""
    m = re.match(r"^([A-Za-z_][\w.]*)(?::\s*(.*))?$", last)
    if m:
        return m.group(1), m.group(2) or ""
    return status, last or f"the cell ended {status}"


def write(nb: nbformat.NotebookNode, path: Path) -> None:
    """Write ``nb`` to ``path`` whole or not at all (a temporary file beside it, renamed)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            nbformat.write(nb, fh)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def record(session_dir: Path, path: Path, pl: Plan) -> None:
    """Say in the session's trace that a notebook was written (the transcript links it,
    ``simagent sessions`` shows it); appended, like every event."""
    with TraceLog(session_dir / "trace.sqlite") as log:
        log.append("notebook_written", {"path": str(path), "cells": len(pl.kept),
                                        "concerns": list(pl.concerns)})


def summary(path: Path, pl: Plan) -> str:
    """The one-line message of an export, with the cells that may not re-run."""
    kept = len(pl.kept)
    line = f"notebook written: {path} ({kept} code cell{'s' * (kept != 1)} to re-run"
    shown = len(pl.code) - kept
    line += f", {shown} more shown, not re-run)" if shown else ")"
    if pl.concerns:
        line += f"; {len(pl.concerns)} may not re-run by themselves: " + "; ".join(pl.concerns)
    return line


def target(output: str | os.PathLike[str] | None, workspace: str | os.PathLike[str],
           session_id: str) -> Path:
    """Where the notebook goes (``output``, else :data:`DEFAULT_NAME` in ``workspace``);
    :class:`ExportError` when it cannot be written, before anything is built."""
    path = Path(output or Path(workspace) / DEFAULT_NAME.format(session_id=session_id))
    path = path.expanduser().resolve()
    if path.is_dir():
        raise ExportError(f"{path} is a folder: give the notebook's file name, "
                          f"e.g. {path / DEFAULT_NAME.format(session_id=session_id)}")
    if not path.parent.is_dir():
        raise ExportError(f"cannot write {path}: folder {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ExportError(f"cannot write {path}: permission denied")
    return path


def export(session_dir: Path, output: str | os.PathLike[str] | None = None,
           workspace: str | os.PathLike[str] = ".", *, all_cells: bool = False,
           earlier: bool = True) -> tuple[Path, Plan, str]:
    """Build, write and record the notebook of a session: (its path, the plan, the
    message to show). The CLI, ``/notebook`` and ``simagent run --notebook`` call this."""
    path = target(output, workspace, session_dir.name)
    nb, pl = build(session_dir, all_cells=all_cells, earlier=earlier)
    try:
        write(nb, path)
    except OSError as exc:  # a folder the checks could not see into (/proc, a full disk)
        raise ExportError(f"cannot write {path}: {exc.strerror or exc}") from exc
    try:
        record(session_dir, path, pl)
    except (OSError, sqlite3.Error) as exc:  # a read-only state home: export only reads
        return path, pl, (f"{summary(path, pl)} (not noted in the session's trace: "
                          f"{getattr(exc, 'strerror', None) or exc})")
    return path, pl, summary(path, pl)


def stream_text(cells: Sequence[Any]) -> list[str]:
    """The text outputs of each cell of a notebook (streams, values, display text)."""
    out = []
    for cell in cells:
        parts = []
        for o in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            if o.get("output_type") == "stream":
                parts.append(o.get("text", ""))
            elif "data" in o:
                parts.append(str(o["data"].get("text/plain", "")))
        out.append("\n".join(parts))
    return out
