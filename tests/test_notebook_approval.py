"""``--from-notebook`` obeys approval: under ``ask`` no cell runs before the person says so.

A real kernel, a real notebook whose first cell writes a marker file into the workspace,
the real CLI in a new process (``simagent run``: no terminal, a terminal on a pty) and the
TUI's engine room in-process (``post`` calls at once; the person's lines go through
``submit`` as the app sends them). Before the fix every cell ran unasked in every mode.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import cli_fork
import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from simagent import exit_codes
from simagent.agent.approval import notebook_waits
from simagent.config import APPROVAL_MODES, SessionOptions
from simagent.tui.controller import TuiController
from simagent.tui.entries import NoticeEntry, PanelEntry

WAIT_S = 180
MARKER_CELL = "open('marker.txt', 'w').write('ran')"
SECOND_CELL = "second = 2"


def write_notebook(ws: Path) -> Path:
    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                               "language": "python"}})
    nb.cells = [new_markdown_cell("# Marks"), new_code_cell(MARKER_CELL),
                new_code_cell(SECOND_CELL)]
    path = ws / "marks.ipynb"
    nbformat.write(nb, path)
    return path


def scripted(tmp_path: Path) -> str:
    path = tmp_path / "s.json"
    path.write_text(json.dumps([{"final": "turn ran"}]))
    return f"scripted:{path}"


def run_cli(ws: Path, model: str, mode: str, stdin=subprocess.DEVNULL) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_MODEL"}
    return cli_fork.popen([sys.executable, "-m", "simagent", "run", "--model", model,
                           "--approval", mode, "--from-notebook", "marks.ipynb", "go"],
                          cwd=ws, env=env, text=True, stdin=stdin,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_the_decision_lives_with_the_approval_policy():
    assert [notebook_waits(m) for m in APPROVAL_MODES] == [True, False, False]
    with pytest.raises(ValueError):
        notebook_waits("never")


@pytest.mark.slow
def test_headless_ask_without_a_terminal_runs_no_cell_and_exits_paused(workspace, tmp_path):
    write_notebook(workspace)
    proc = run_cli(workspace, scripted(tmp_path), "ask")
    out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == exit_codes.APPROVAL == 3, err
    assert not (workspace / "marker.txt").exists()
    assert "turn ran" not in out
    line = err.strip().splitlines()[-1]
    assert line == ("simagent: marks.ipynb: its 2 code cells were not run (approval mode ask "
                    "asks before kernel code and nobody could be asked here) and no turn ran; "
                    "to run them, use --approval workspace, or answer in the TUI (simagent "
                    f"--from-notebook {(workspace / 'marks.ipynb').resolve()})"), err


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["workspace", "auto"])
def test_headless_workspace_and_auto_run_the_cells_as_before(workspace, tmp_path, mode):
    write_notebook(workspace)
    proc = run_cli(workspace, scripted(tmp_path), mode)
    out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0, err
    assert (workspace / "marker.txt").read_text() == "ran"
    assert "turn ran" in out


@pytest.mark.slow
@pytest.mark.parametrize("answer, runs", [("y", True), ("n", False)])
def test_headless_ask_on_a_terminal_shows_the_cells_and_asks_once(workspace, tmp_path,
                                                                  answer, runs):
    write_notebook(workspace)
    main, child = pty.openpty()
    try:
        proc = run_cli(workspace, scripted(tmp_path), "ask", stdin=child)
        os.write(main, f"{answer}\n".encode())
        out, err = proc.communicate(timeout=WAIT_S)
    finally:
        os.close(main)
        os.close(child)
    assert f"    {MARKER_CELL}" in err and f"    {SECOND_CELL}" in err  # shown before
    assert "run all 2 code cells in the kernel? [y/N]" in err
    assert (workspace / "marker.txt").exists() == runs
    if runs:
        assert proc.returncode == 0 and "turn ran" in out, err
    else:
        assert proc.returncode == exit_codes.APPROVAL, err
        assert "were not run (you declined them) and no turn ran" in err


def _notes(ctl) -> list[str]:
    return [e.text for e in ctl.conversation.entries if isinstance(e, NoticeEntry)]


def _wait_for(ctl, words: str, count: int = 1) -> None:
    deadline = time.monotonic() + WAIT_S
    while sum(words in n for n in _notes(ctl)) < count:
        assert time.monotonic() < deadline, _notes(ctl)
        time.sleep(0.05)


def _settle(ctl) -> None:
    deadline = time.monotonic() + WAIT_S
    while ctl.busy or not ctl.kernel_ready:
        assert time.monotonic() < deadline, _notes(ctl)
        time.sleep(0.05)
    ctl.wait(WAIT_S)


@pytest.fixture
def tui(workspace, tmp_path):
    write_notebook(workspace)
    ctl = TuiController(SessionOptions(workspace=workspace, model=scripted(tmp_path),
                                       approval="ask",
                                       from_notebook=workspace / "marks.ipynb"))
    try:
        assert ctl.open()
        _wait_for(ctl, "a runs all · c asks cell by cell · n runs none")
        listing = [e for e in ctl.conversation.entries if isinstance(e, PanelEntry)
                   and e.title == "marks.ipynb: its code cells"]
        assert len(listing) == 1 and MARKER_CELL in listing[0].text \
            and SECOND_CELL in listing[0].text
        assert not (workspace / "marker.txt").exists()  # shown, waiting: nothing ran
        yield ctl
    finally:
        ctl.close()


def test_tui_declining_runs_nothing_and_the_model_is_told(tui, workspace):
    assert tui.submit("n")
    _settle(tui)
    assert not (workspace / "marker.txt").exists()
    assert "not run: the person declined its 2 code cells" in tui.preface
    assert tui.session.kernel.execute("second").status == "error"


def test_tui_run_all_runs_every_cell(tui, workspace):
    assert tui.submit("a")
    _settle(tui)
    assert (workspace / "marker.txt").read_text() == "ran"
    assert "ran 2 of 2 code cells" in tui.preface


def test_tui_cell_by_cell_shows_each_cell_and_runs_only_the_approved(tui, workspace):
    assert tui.submit("maybe")  # none of the choices: asked again
    _wait_for(tui, "a runs all · c asks cell by cell · n runs none", 2)
    assert tui.submit("c")
    _wait_for(tui, "run code cell 1 of 2 (cell 2 in the file)? y runs it")
    shown = [e for e in tui.conversation.entries if isinstance(e, PanelEntry)]
    assert shown[-1].title == "code cell 1 of 2 (cell 2 in the file)"
    assert shown[-1].text == MARKER_CELL
    assert not (workspace / "marker.txt").exists()
    assert tui.submit("y")
    _wait_for(tui, "run code cell 2 of 2 (cell 3 in the file)? y runs it")
    assert (workspace / "marker.txt").read_text() == "ran"
    assert tui.submit("n")
    _settle(tui)
    assert tui.session.kernel.execute("second").status == "error"  # declined: never ran
    assert "ran 1 of 2 code cells" in tui.preface and "1 declined by the person" in tui.preface
    assert any("code cell 2 of 2 (cell 3 in the file): declined, not run" in n
               for n in _notes(tui)), _notes(tui)
