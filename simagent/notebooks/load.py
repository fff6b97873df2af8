"""A notebook as a session's starting point (``simagent --from-notebook PATH``).

A scientist's work often already lives in a notebook; the session should start where the
notebook ends, not from an empty kernel. Three steps, each with one job:

* :func:`read_notebook` reads and validates the file with ``nbformat`` before anything
  exists (no session, no kernel), so a file that is missing, not JSON or not a valid
  notebook costs one line and changes nothing (:class:`NotebookError`). A notebook
  ``simagent notebook`` wrote names its session's simulator; the new session takes it
  unless ``--sim`` says otherwise, so its cells meet the same environment and the state
  card labels the same registry objects.
* Under ``--approval ask`` its cells wait for the person first (``approval.notebook_waits``
  decides): one decision for all (:data:`PLAN_CHOICES`: run all, cell by cell, none), and
  cell by cell each cell's source is shown before it runs (:data:`CELL_CHOICES`). A
  front end that cannot ask (``simagent run`` without a terminal) runs none and says how
  to allow them (:func:`held_line`).
* :func:`run_cells` runs its code cells, top to bottom, through ``Session.execute``: the
  same traced path as the agent's own cells, so the trace, the raw outputs, ``_out`` and
  the replay selection of the recovery ladder know them like any cell. It stops at the
  first failing cell (naming it) or at ctrl+C (the session's cancel, which interrupts the
  kernel and keeps its state). nbclient's cell tags mean what they mean there:
  ``skip-execution`` is not run, ``raises-exception`` may fail.
* :func:`account` gives the model a compact account instead of the cells' text: the
  cell counts, how the run ended, the markdown headings, and the kernel state card
  (``simagent.context.state_card``: names with types and shapes, imports, functions,
  files) read from the live kernel, so it says what the notebook *left*, exactly, and
  costs a few hundred tokens whatever the notebook's length. It travels with the first
  user turn (:func:`first_prompt`): in the checkpoint and the trace like any message,
  so a resumed session still has it, and compaction treats it like any user words.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from simagent.agent.approval import notebook_waits
from simagent.context.state_card import render_card
from simagent.context.thresholds import state_card_tokens
from simagent.outcomes import mark, outcome_of
from simagent.simulators import discover

#: nbclient's tags, honoured the same way here.
SKIP_TAG = "skip-execution"
RAISES_TAG = "raises-exception"
#: Headings listed in the account (the rest are counted), and characters per heading.
MAX_HEADINGS = 40
HEADING_CHARS = 100
#: The trace event of a load, and the account's tag (one home).
TRACE_KIND = "notebook_load"
TAG = "notebook"
#: Under ``ask``: the one decision for all cells (answer -> plan) and, cell by cell, the
#: decision for each (answer -> what happens to that cell).
PLAN_CHOICES = {"a": "all", "c": "each", "n": "none"}
CELL_CHOICES = {"y": "run", "n": "skip", "q": "stop"}


class NotebookError(ValueError):
    """A notebook that cannot be used: the message is one line naming the file."""


@dataclass(frozen=True)
class Notebook:
    """A validated notebook: its path, its cells as (kind, source, tags), and the
    simulator of the session that wrote it (``simagent notebook`` records it in the
    metadata), when this installation knows that simulator."""

    path: Path
    cells: tuple[tuple[str, str, tuple[str, ...]], ...]
    simulator: str | None = None

    @property
    def code_cells(self) -> list[tuple[int, str, tuple[str, ...]]]:
        """(1-based position in the file, source, tags) of each code cell."""
        return [(i, src, tags) for i, (kind, src, tags) in enumerate(self.cells, 1)
                if kind == "code"]

    @property
    def headings(self) -> list[str]:
        """Markdown headings (``#`` lines outside code fences), in order."""
        found: list[str] = []
        for kind, src, _tags in self.cells:
            if kind != "markdown":
                continue
            fenced = False
            for line in src.splitlines():
                if line.lstrip().startswith(("```", "~~~")):
                    fenced = not fenced
                elif not fenced and line.startswith("#"):
                    text = " ".join(line.split())
                    found.append(text if len(text) <= HEADING_CHARS
                                 else text[: HEADING_CHARS - 1] + "…")
        return found


def read_notebook(path: str | Path) -> Notebook:
    """The notebook at ``path``, validated (``nbformat.validate``); else NotebookError."""
    import nbformat  # heavy (jsonschema): only when a notebook is read, not at TUI start
    from nbformat.reader import NotJSONError  # heavy, as above

    p = Path(path).expanduser()
    if not p.exists():
        raise NotebookError(f"notebook {p} does not exist")
    if p.is_dir():
        raise NotebookError(f"notebook {p} is a folder, not a .ipynb file")
    try:
        node = nbformat.read(p, as_version=4)
        nbformat.validate(node)
    except NotJSONError:
        raise NotebookError(f"{p} is not a notebook: it is not JSON") from None
    except nbformat.ValidationError as exc:
        what = str(exc.message).splitlines()[0] if getattr(exc, "message", None) else \
            str(exc).splitlines()[0]
        raise NotebookError(f"{p} is not a valid nbformat 4 notebook: {what}") from None
    except UnicodeDecodeError:
        raise NotebookError(f"{p} is not a notebook: it is not UTF-8 text") from None
    except OSError as exc:
        raise NotebookError(f"cannot read notebook {p}: {exc.strerror or exc}") from None
    except Exception as exc:  # nbformat raises plain errors for odd shapes (no "cells")
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise NotebookError(f"{p} is not a valid notebook: {first}") from None
    cells = tuple((str(c.cell_type), str(c.source),
                   tuple(str(t) for t in (c.get("metadata") or {}).get("tags") or ()))
                  for c in node.cells)
    meta = (node.get("metadata") or {}).get("simagent") or {}
    sim = meta.get("simulator") if isinstance(meta, dict) else None
    return Notebook(path=p.resolve(), cells=cells,
                    simulator=sim if isinstance(sim, str) and sim in discover() else None)


@dataclass
class CellRun:
    """One code cell's progress: ``result`` is None while it runs."""

    number: int  # among the code cells, 1-based
    of: int  # code cells in the notebook
    position: int  # among all cells of the file, 1-based
    source: str
    result: Any = None
    skipped: bool = False
    declined: bool = False  # the person chose not to run it (cell by cell, under ask)

    @property
    def label(self) -> str:
        return f"code cell {self.number} of {self.of} (cell {self.position} in the file)"


@dataclass
class LoadOutcome:
    """How running a notebook's cells ended."""

    path: Path
    code_cells: int
    ran: int = 0
    skipped: int = 0
    declined: int = 0
    status: str = "ok"  # ok | error | interrupted | declined (the person ran none)
    failed: CellRun | None = None
    error: str = ""
    elapsed_s: float = 0.0
    cells: list[CellRun] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def summary(self) -> str:
        """One line for the person (and the account's first line)."""
        name = self.path.name
        if self.status == "declined":
            return (f"{name}: not run: the person declined its {self.code_cells} code "
                    "cells, so the kernel holds nothing of it")
        if self.status == "interrupted":
            at = f" at {self.failed.label}" if self.failed else ""
            return (f"{name}: stopped by the user{at}; {self.ran} of {self.code_cells} code "
                    "cells ran and the kernel keeps what they defined")
        if self.status == "error" and self.failed is not None:
            return (f"{name}: {self.failed.label} failed: {self.error}; {self.ran} of "
                    f"{self.code_cells} code cells ran before it, the rest did not run")
        skipped = f", {self.skipped} skipped (tag {SKIP_TAG})" if self.skipped else ""
        declined = f", {self.declined} declined by the person" if self.declined else ""
        return (f"{name}: ran {self.ran} of {self.code_cells} code cells in "
                f"{self.elapsed_s:.1f}s{skipped}{declined}")


def first_line(source: str, width: int = 60) -> str:
    line = next((ln.strip() for ln in source.splitlines() if ln.strip()), "")
    return line if len(line) <= width else line[: width - 1] + "…"


def progress_line(cell: CellRun) -> str:
    """What a person sees of a cell, in the style of tool activity: ``· notebook code cell
    2 of 8 (cell 3 in the file): import numpy…`` as it starts, ``  ✓ ok (0.4s)`` as it
    ends (``  ✗ error (0.1s): NameError: …``), ``  – skipped`` for a tagged cell."""
    if cell.skipped:
        return f"· notebook {cell.label}: skipped (tag {SKIP_TAG})"
    if cell.declined:
        return f"· notebook {cell.label}: declined, not run"
    if cell.result is None:
        return f"· notebook {cell.label}: {first_line(cell.source)}"
    m = mark(outcome_of(None, cell.result.status, cell.result.recovery))
    why = f": {_error_text(cell.result)}" if cell.result.status != "ok" else ""
    return f"  {m.glyph} {m.word} ({cell.result.elapsed_s:.1f}s){why}"


def status_line(cell: CellRun) -> str:
    """:func:`progress_line`'s start and end as one line (a display updated in place)."""
    if cell.result is None or cell.skipped or cell.declined:
        return progress_line(cell)
    running = CellRun(cell.number, cell.of, cell.position, cell.source)
    return progress_line(running) + progress_line(cell).replace("  ", " ", 1)


def _error_text(result: Any) -> str:
    if result.error is not None:
        err = result.error
        return f"{err.ename}: {err.evalue}" if err.evalue else str(err.ename)
    return result.notice or result.status


def held_line(notebook: Notebook, mode: str, declined: bool = False) -> str:
    """Why a starting notebook's cells did not run (``simagent run`` under ``ask``:
    nobody could be asked, or the person said no), and how to allow them."""
    n = len(notebook.code_cells)
    why = "you declined them" if declined else \
        f"approval mode {mode} asks before kernel code and nobody could be asked here"
    return (f"{notebook.path.name}: its {n} code cell{'s' * (n != 1)} were not run ({why}) "
            "and no turn ran; to run them, use --approval workspace, or answer in the TUI "
            f"(simagent --from-notebook {notebook.path})")


def withheld(session: Any, notebook: Notebook, err: TextIO,
             stdin: TextIO | None = None) -> str | None:
    """``simagent run``: None when the starting notebook's cells may run (asked before
    the kernel starts), else why they may not, the line it printed.

    Where kernel code waits (``approval.notebook_waits``) a terminal on stdin is shown
    the cells and asked once, y/N for all; without one nobody can be asked, so none
    runs and one line on ``err`` says how to allow them (the caller exits 3, "paused
    for approval", and ``--json`` reports the line as its error).
    """
    if not notebook_waits(session.approval):
        return None
    stdin = sys.stdin if stdin is None else stdin
    declined = False
    if stdin.isatty():
        listing = "".join(f"\n    {ln}" for ln in cells_listing(notebook).splitlines())
        print(f"simagent: approval mode {session.approval}: {notebook.path.name}'s code "
              f"cells wait for you:{listing}", file=err, flush=True)
        n = len(notebook.code_cells)
        err.write(f"run all {n} code cell{'s' * (n != 1)} in the kernel? [y/N] ")
        err.flush()
        if stdin.readline().strip().lower() in ("y", "yes"):
            return None
        declined = True
    line = held_line(notebook, session.approval, declined)
    print(f"simagent: {line}", file=err, flush=True)
    return line


def none_run(notebook: Notebook) -> LoadOutcome:
    """How it ended when the person declined all the cells (the TUI under ``ask``)."""
    return LoadOutcome(path=notebook.path, code_cells=len(notebook.code_cells),
                       status="declined")


def plan_question(notebook: Notebook) -> str:
    """The one decision for all of a starting notebook's cells (:data:`PLAN_CHOICES`)."""
    n = len(notebook.code_cells)
    return (f"run {notebook.path.name}'s {n} code cell{'s' * (n != 1)} (shown above) in "
            "the kernel? a runs all · c asks cell by cell · n runs none")


def cell_question(cell: CellRun) -> str:
    """Cell by cell, the decision for one cell (:data:`CELL_CHOICES`)."""
    return f"run {cell.label}? y runs it · n skips it · q stops here (the rest do not run)"


def cells_listing(notebook: Notebook) -> str:
    """Every code cell's source, numbered: what the person decides on."""
    code = notebook.code_cells
    parts = []
    for k, (position, source, tags) in enumerate(code, 1):
        tag = f" [tag {SKIP_TAG}: not run]" if SKIP_TAG in tags else ""
        parts.append(f"── code cell {k} of {len(code)} (cell {position} in the file){tag}\n"
                     f"{source.rstrip()}")
    return "\n".join(parts)


def choice(text: str, choices: dict[str, str]) -> str | None:
    """What an answer means among ``choices`` (its first letter, any case); None when it
    means none of them."""
    word = text.strip().lower()
    return choices.get(word[:1]) if word else None


def run_cells(session: Any, notebook: Notebook,
              on_progress: Callable[[CellRun], None] | None = None,
              approve: Callable[[CellRun], str] | None = None) -> LoadOutcome:
    """Run ``notebook``'s code cells in ``session``'s kernel; stop at the first failure.

    Each cell goes through ``session.execute`` (traced as ``kernel_exec``, recorded for
    ``_out`` and the replay). A cancel (``session.cancel_requested``: ctrl+C) stops the
    run with the kernel's state kept; the caller clears the cancel afterwards.
    ``approve`` (cell by cell, under ``ask``) is asked before each cell and answers a
    :data:`CELL_CHOICES` value: ``run``, ``skip`` (declined, the next is asked) or
    ``stop`` (the rest do not run, as after ctrl+C).
    """
    code = notebook.code_cells
    outcome = LoadOutcome(path=notebook.path, code_cells=len(code))
    notify = on_progress or (lambda _cell: None)
    started = time.monotonic()
    for k, (position, source, tags) in enumerate(code, 1):
        cell = CellRun(number=k, of=len(code), position=position, source=source)
        outcome.cells.append(cell)
        if SKIP_TAG in tags or not source.strip():
            cell.skipped = SKIP_TAG in tags
            outcome.skipped += cell.skipped
            if cell.skipped:
                notify(cell)
            continue
        if session.cancel_requested.is_set():
            outcome.status, outcome.failed = "interrupted", cell
            break
        decision = approve(cell) if approve is not None else "run"
        if decision == "stop" or session.cancel_requested.is_set():
            outcome.status, outcome.failed = "interrupted", cell
            break
        if decision != "run":
            cell.declined = True
            outcome.declined += 1
            notify(cell)
            continue
        notify(cell)
        cell.result = session.execute(source)
        notify(cell)
        status = cell.result.status
        if status == "interrupted" or session.cancel_requested.is_set():
            outcome.status, outcome.failed = "interrupted", cell
            outcome.ran += status == "ok"
            break
        if status != "ok" and RAISES_TAG not in tags:
            outcome.status, outcome.failed = "error", cell
            outcome.error = _error_text(cell.result)
            break
        outcome.ran += 1
    outcome.elapsed_s = time.monotonic() - started
    return outcome


@contextlib.contextmanager
def sigint_stops(session: Any) -> Iterator[None]:
    """While cells run in the main thread (``simagent run``), ctrl+C stops the run as a
    turn's cancel does: the kernel is interrupted and keeps its state, and no
    ``KeyboardInterrupt`` lands inside a lock's wait. Elsewhere it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    done = threading.Event()

    def on_sigint(_signum: int, _frame: Any) -> None:
        session.cancel_requested.set()
        threading.Thread(target=session.interrupt_kernel, daemon=True).start()
        threading.Thread(target=session.keep_interrupting, daemon=True,
                         args=(lambda: not done.is_set(),)).start()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        done.set()
        signal.signal(signal.SIGINT, previous)


def card_budget(session: Any, window: int | None) -> int:
    """Tokens the account's state card may take: the state card's own budget."""
    settings = session.context_settings
    return state_card_tokens(window, settings) if window else settings.state_card_tokens


def account(notebook: Notebook, outcome: LoadOutcome, card_text: str) -> str:
    """The compact account the model gets instead of the notebook's text (pure)."""
    code = len(notebook.code_cells)
    heads = notebook.headings
    lines = [f'<{TAG} path="{notebook.path}" cells="{len(notebook.cells)}" code_cells="{code}">',
             "This session started from the notebook above: simagent ran its code cells in "
             "this kernel before the conversation. Their code is not shown here; read the "
             "file for a cell's code.",
             "run: " + outcome.summary()]
    counts = [c.result.execution_count for c in outcome.cells
              if c.result is not None and c.result.execution_count]
    if counts:
        lines.append(f"their outputs: _out[{counts[0]}] to _out[{counts[-1]}], in order"
                     if len(counts) > 1 else f"its output: _out[{counts[0]}]")
    if heads:
        more = f" (+{len(heads) - MAX_HEADINGS} more)" if len(heads) > MAX_HEADINGS else ""
        lines.append(f"headings{more}:")
        lines += [f"  {h}" for h in heads[:MAX_HEADINGS]]
    else:
        lines.append("headings: none")
    lines += [card_text, f"</{TAG}>"]
    return "\n".join(lines)


def build_account(session: Any, notebook: Notebook, outcome: LoadOutcome,
                  window: int | None = None) -> str:
    """:func:`account` with the state card of the live kernel, traced as ``notebook_load``."""
    card = render_card(session.state_snapshot(), reason=TAG, budget=card_budget(session, window))
    text = account(notebook, outcome, card["text"])
    session.trace.append(TRACE_KIND, {
        "path": str(notebook.path), "cells": len(notebook.cells),
        "code_cells": outcome.code_cells, "ran": outcome.ran, "skipped": outcome.skipped,
        "status": outcome.status, "failed_cell": outcome.failed.number if outcome.failed
        and outcome.status != "ok" else None, "error": outcome.error or None,
        "elapsed_s": round(outcome.elapsed_s, 3), "account_chars": len(text),
        "card_tokens": card["tokens"], "names": len(card["names"])})
    return text


def first_prompt(account_text: str | None, prompt: str) -> str:
    """The first user turn: the account, then the person's words."""
    return f"{account_text}\n\n{prompt}" if account_text else prompt
