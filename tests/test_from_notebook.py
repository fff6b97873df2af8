"""``--from-notebook PATH`` as a person runs it: the real CLI in a new process, a real
kernel, the real graph with the scripted model, notebooks built with nbformat.

What is proved: the notebook's names are in the kernel and the model reads them in a
compact account (names, types, shapes, headings; not the cells' code); a failing cell
stops the run naming it (exit 7) and leaves no session; a missing, non-JSON or invalid
notebook costs one line and exit 2 before anything exists; the file tools cannot change
the notebook unless ``--notebook-writable``; ctrl+C stops the cells keeping state.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import cli_fork
import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

SIMAGENT = [sys.executable, "-m", "simagent"]
WAIT_S = 180
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}
#: The sample notebook's cells; the account must not carry their code.
CELLS = [new_markdown_cell("# Cooling study\nNewton's law, fitted."),
         new_code_cell("import numpy as np\nimport math"),
         new_markdown_cell("## Data\n```\n# a comment in a fence, not a heading\n```"),
         new_code_cell("t = np.linspace(0, 10, 501)\ntemps = 300 * np.exp(-t / 4.2)\n"
                       "label = 'newton cooling'"),
         new_code_cell("def halftime(tau):\n    return tau * math.log(2)\n"
                       "results = {'tau': 4.2, 'half': halftime(4.2)}\nprint(results)"),
         new_markdown_cell("### Done")]


def write_notebook(path: Path, cells: list) -> Path:
    nb = new_notebook(metadata={"kernelspec": KERNELSPEC})
    nb.cells = cells
    nbformat.write(nb, path)
    return path


def cli(workspace: Path, *args: str, timeout: float = WAIT_S) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_MODEL"}
    return cli_fork.run([*SIMAGENT, *args], cwd=workspace, env=env, text=True,
                        capture_output=True, timeout=timeout)


def script(path: Path, steps: list[dict]) -> str:
    path.write_text(json.dumps(steps))
    return f"scripted:{path}"


def events(state_dir: str | Path, *kinds: str) -> list[tuple[str, dict]]:
    db = sqlite3.connect(Path(state_dir) / "trace.sqlite")
    try:
        rows = db.execute("SELECT kind, payload FROM events ORDER BY id").fetchall()
    finally:
        db.close()
    return [(k, json.loads(p)) for k, p in rows if not kinds or k in kinds]


def sessions(workspace: Path) -> list:
    proc = cli(workspace, "sessions", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout or "[]")


@pytest.mark.slow
def test_the_notebooks_state_is_in_the_kernel_and_the_model_gets_a_compact_account(
        workspace, tmp_path):
    write_notebook(workspace / "study.ipynb", CELLS)
    model = script(tmp_path / "s.json", [
        {"tool": "run_python", "args": {"code": "print(temps.shape, label, results['tau'])"}},
        {"final": "saw {out[-1]}"}])
    proc = cli(workspace, "run", "--model", model, "--json", "--from-notebook",
               "study.ipynb", "what is loaded?")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["final"] == "saw (501,) newton cooling 4.2"  # the agent's cell saw them
    # progress on stderr, one start and one end line per code cell
    assert proc.stderr.count("· notebook code cell") == 3
    assert "code cell 2 of 3 (cell 4 in the file): t = np.linspace(0, 10, 501)" in proc.stderr
    assert proc.stderr.count("  ✓ ok (") == 3
    # the cells ran through simagent's kernel path: traced like any cell
    ran = [p["code"] for _k, p in events(data["state_dir"], "kernel_exec")]
    assert [c.source for c in CELLS if c.cell_type == "code"] == \
        [c for c in ran if c in {x.source for x in CELLS}]
    first = events(data["state_dir"], "message_user")[0][1]["content"]
    account, _, words = first.rpartition("\n\n")
    assert words == "what is loaded?"
    for line in ("- t: numpy.ndarray (501,) float64", "- temps: numpy.ndarray (501,) float64",
                 "- results: dict len 2 keys ['tau', 'half']",
                 "- label = 'newton cooling' (str)", "functions/classes: halftime",
                 "  # Cooling study", "  ## Data", "  ### Done", 'cells="6" code_cells="3"',
                 "ran 3 of 3 code cells"):
        assert line in account
    assert "a comment in a fence" not in account  # fenced lines are not headings
    for cell in CELLS:  # no cell's text, only what it left
        if cell.cell_type == "code":
            assert cell.source not in account
    assert "np.linspace" not in account and "math.log" not in account
    load = events(data["state_dir"], "notebook_load")[0][1]
    assert load["status"] == "ok" and load["ran"] == 3 and load["account_chars"] == \
        len(account)


@pytest.mark.slow
def test_a_failing_cell_stops_the_run_names_it_and_leaves_nothing(workspace, tmp_path):
    path = write_notebook(workspace / "broken.ipynb", [
        new_markdown_cell("# Broken"), new_code_cell("x = 1"),
        new_code_cell("y = x / 0"),
        new_code_cell("open('after.txt', 'w').write('ran')")])
    before = path.read_bytes()
    model = script(tmp_path / "s.json", [{"final": "never asked"}])
    proc = cli(workspace, "run", "--model", model, "--from-notebook", str(path), "go")
    assert proc.returncode == 7, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("simagent: error: broken.ipynb: code cell 2 of 3 (cell 3 in the "
                           "file) failed: ZeroDivisionError: division by zero;"), last
    assert "never asked" not in proc.stdout
    assert not (workspace / "after.txt").exists()  # the cells after it did not run
    assert path.read_bytes() == before
    assert sessions(workspace) == []  # no half-made session to --continue


@pytest.mark.parametrize("content, says", [
    (None, "does not exist"),
    ("{not json", "is not a notebook: it is not JSON"),
    (json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                 "cells": [{"cell_type": "code", "source": "x = 1"}]}),
     "is not a valid nbformat 4 notebook"),
])
@pytest.mark.slow
def test_a_bad_notebook_gets_one_line_and_changes_nothing(workspace, tmp_path, content, says):
    path = workspace / "bad.ipynb"
    if content is not None:
        path.write_text(content)
    model = script(tmp_path / "s.json", [{"final": "never asked"}])
    proc = cli(workspace, "run", "--model", model, "--from-notebook", "bad.ipynb", "go")
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("simagent: error: ") and says in lines[0]
    assert str(path) in lines[0]
    assert sessions(workspace) == []
    assert path.exists() == (content is not None)
    if content is not None:
        assert path.read_text() == content


@pytest.mark.slow
@pytest.mark.parametrize("writable", [False, True])
def test_the_notebook_is_read_only_to_the_agent_unless_allowed(workspace, tmp_path, writable):
    path = write_notebook(workspace / "study.ipynb", CELLS[:2])
    before = path.read_bytes()
    model = script(tmp_path / "s.json", [
        {"tool": "edit_file", "args": {"file_path": "study.ipynb",
                                       "old_string": "Cooling study",
                                       "new_string": "Heating study"}},
        {"tool": "write_file", "args": {"file_path": str(path), "content": "{}"}},
        {"final": "edit: {out[-2]} | write: {out[-1]}"}])
    extra = ["--notebook-writable"] if writable else []
    proc = cli(workspace, "run", "--model", model, "--from-notebook", "study.ipynb", *extra,
               "retitle it")
    assert proc.returncode == 0, proc.stderr
    if writable:
        assert path.read_text() == "{}"  # edited, then overwritten: both went through
        assert "read-only" not in proc.stdout
    else:
        assert path.read_bytes() == before
        assert proc.stdout.count("is the notebook this session started from; it is "
                                 "read-only to the agent") == 2, proc.stdout


def test_notebook_writable_needs_from_notebook(workspace):
    proc = cli(workspace, "run", "--notebook-writable", "go")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("simagent: error: --notebook-writable goes with "
                                   "--from-notebook PATH")


@pytest.mark.slow
def test_ctrl_c_stops_the_cells_and_no_turn_runs(workspace, tmp_path):
    # short sleeps: the in-memory kernel's interrupt lands between them, not after 30 s
    # (the TUI test below stops one long C-level sleep in a kernel process)
    path = write_notebook(workspace / "slow.ipynb", [
        new_code_cell("a = 1"), new_code_cell("import time\nfor _ in range(300):\n"
                                              "    time.sleep(0.1)"),
        new_code_cell("b = 2")])
    model = script(tmp_path / "s.json", [{"final": "never asked"}])
    env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_MODEL"}
    proc = cli_fork.popen([*SIMAGENT, "run", "--model", model, "--from-notebook", str(path),
                           "go"], cwd=workspace, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen: list[str] = []
    try:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:  # an ordering: the sleeping cell was sent
            line = proc.stderr.readline()
            seen.append(line)
            if "code cell 2 of 3" in line or not line:
                break
        assert "code cell 2 of 3" in seen[-1], seen
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "stopped by the user at code cell 2 of 3" in err
    assert "1 of 3 code cells ran" in err
    assert "never asked" not in out


@pytest.mark.real
def test_tui_shows_progress_and_ctrl_c_keeps_the_state_and_the_session(workspace, tmp_path):
    """The TUI's engine room (``post`` calls at once): one notice follows the cells, ctrl+C
    stops the sleeping cell, what ran stays in the kernel, and the first prompt carries
    the account of how far it got."""
    from simagent.config import SessionOptions
    from simagent.tui.controller import TuiController
    from simagent.tui.entries import NoticeEntry
    from simagent.tui.render import RenderCache

    path = write_notebook(workspace / "slow.ipynb", [
        new_markdown_cell("# Slow"), new_code_cell("a = 41"),
        new_code_cell("import time\ntime.sleep(30)"), new_code_cell("b = 2")])
    model = script(tmp_path / "s.json", [
        {"tool": "run_python", "args": {"code": "print(a + 1)"}}, {"final": "{out[-1]}"}])
    ctl = TuiController(SessionOptions(workspace=workspace, model=model, from_notebook=path))
    try:
        assert ctl.open()

        def progress() -> str:
            notes = [e.text for e in ctl.conversation.entries if isinstance(e, NoticeEntry)]
            return notes[0] if notes else ""

        deadline = time.monotonic() + WAIT_S
        while not ("code cell 2 of 3" in progress() and ctl.session.kernel_state == "busy"):
            assert time.monotonic() < deadline, progress()
            time.sleep(0.05)
        assert progress().startswith("· notebook code cell 2 of 3 (cell 3 in the file): "
                                     "import time")
        cache = RenderCache()  # what the screen shows, drawn as the app draws it
        cache.render(ctl.conversation.entries, 200, False)
        assert ctl.busy and ctl.cancel_turn()  # ctrl+C
        ctl.wait(WAIT_S)
        notes = [e.text for e in ctl.conversation.entries if isinstance(e, NoticeEntry)]
        assert any("stopped by the user at code cell 2 of 3" in n for n in notes), notes
        assert "■ interrupted" in progress()
        drawn = "\n".join("".join(text for _style, text, *_ in line)
                          for line in cache.render(ctl.conversation.entries, 200, False))
        shown = [row for row in drawn.splitlines() if "code cell 2 of 3" in row]
        assert any("code cell 2 of 3 (cell 3 in the file): import time ■ interrupted" in row
                   for row in shown), (shown, notes)
        assert not ctl.busy
        assert ctl.submit("what is a?")
        ctl.wait(WAIT_S)
        answer = [e for e in ctl.conversation.entries if type(e).__name__ == "AssistantEntry"]
        assert answer and answer[-1].text.strip() == "42"  # a kept; the session goes on
        first = events(ctl.session.paths.root, "message_user")[0][1]["content"]
        assert first.startswith('<notebook path="') and first.endswith("\n\nwhat is a?")
        assert "stopped by the user at code cell 2 of 3" in first and "- a = 41 (int)" in first
        assert ctl.preface == ""  # sent once
        assert ctl.session.kernel.execute("b").status == "error"  # the last cell never ran
    finally:
        ctl.close()


def _card_facts(text: str) -> tuple[list[str], list[str]]:
    """(the name lines, the imports and functions lines) of a state card: what a
    notebook can carry from one kernel to another (figures, files and execution numbers
    belong to the session, not to the kernel's state). Two things differ between any two
    runs and are masked: an object id in a repr (``0x1dd4…``, and the rest of that
    repr, cut at a length the id sets) and the value of a plain
    float, which a workflow's clock readings are (``t0 = time.perf_counter()``)."""
    import re

    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("names ("))
    names = []
    for ln in lines[start + 1:]:
        if not ln.startswith("- "):
            break
        ln = re.sub(r"-?0x[0-9a-f]+.*$", "0x?…", ln)  # the repr's cut moves with the id
        names.append(re.sub(r"^(- \w+) = .* \(float\)$", r"\1 = ? (float)", ln))
    others = [ln for ln in lines if ln.startswith(("imports: ", "functions/classes: "))]
    return names, others


def _loaded(ctl, deadline: float) -> None:
    while ctl.busy or not ctl.kernel_ready:
        assert time.monotonic() < deadline, "the session never became idle"
        time.sleep(0.05)
    ctl.wait(WAIT_S)


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("workflow", [  # pybamm's replay and rerun take 45 s: test-deep
    "scipy-fit-report", pytest.param("pybamm-rate-capability", marks=pytest.mark.deep)])
def test_a_sessions_notebook_starts_a_session_with_the_same_state_card(workspace, tmp_path,
                                                                       workflow):
    """Acceptance (issue 24): a bundled workflow's replay session, exported with
    ``simagent notebook``, and ``--from-notebook`` on that notebook give the same
    state card: every name with its type and shape, the imports and the functions."""
    from simagent.config import SessionOptions
    from simagent.context.state_card import render_card
    from simagent.tui.controller import TuiController

    budget = 100_000  # the whole card: a trimmed one would compare less
    first = TuiController(SessionOptions(workspace=workspace,
                                         model=f"replay:{workflow}"))
    try:
        assert first.open()
        assert first.submit(first.draft)  # the workflow's own prompt
        _loaded(first, time.monotonic() + WAIT_S * 2)
        card = render_card(first.session.state_snapshot(), reason="x", budget=budget)
        session_id = first.session.id
    finally:
        first.close()
    path = tmp_path / "fit.ipynb"
    proc = cli(workspace, "notebook", session_id, "-o", str(path))
    assert proc.returncode == 0, proc.stderr
    nbformat.validate(nbformat.read(path, as_version=4))
    model = script(tmp_path / "s.json", [{"final": "unused"}])
    second = TuiController(SessionOptions(workspace=workspace, model=model,
                                          from_notebook=path))
    try:
        assert second.open()
        _loaded(second, time.monotonic() + WAIT_S * 2)
        assert "ran " in (second.preface or ""), second.preface
        again = render_card(second.session.state_snapshot(), reason="x", budget=budget)
    finally:
        second.close()
    names, others = _card_facts(card["text"])
    assert len(names) >= 10, card["text"]  # the workflow left real state behind
    got = _card_facts(again["text"])
    lost = [ln for ln in names + others if ln not in got[0] + got[1]]
    new = [ln for ln in got[0] + got[1] if ln not in names + others]
    assert got == (names, others), f"lost: {lost}; new: {new}"
