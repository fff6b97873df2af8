"""Workspace memory: notes and a deduplicated index; only the index reaches the model."""

from __future__ import annotations

import sys

import cli_fork
import pytest

from simagent.agent.builder import build_agent
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.context import memory as mem
from simagent.paths import content_dir
from simagent.session import Session


def test_new_workspace_memory_is_seeded_from_the_bundled_folder(workspace):
    folder = mem.ensure_memory(workspace)
    seed = (content_dir("memory") / "MEMORY.md").read_text()
    assert (folder / "MEMORY.md").read_text() == seed
    assert mem.list_notes(folder) == []


def test_remember_dedups_the_index_and_replaces_the_note(workspace):
    folder = mem.ensure_memory(workspace)
    first = mem.remember(folder, "Chen2020 capacity", "Nominal 5.0 Ah.", "simulator")
    again = mem.remember(folder, "  Chen2020   capacity ", "Measured 4.95 Ah at 1C.\nmore",
                         "simulator")
    assert first.created and not again.created and first.path == again.path
    notes = mem.list_notes(folder)
    assert [(n.title, n.file, n.kind, n.summary) for n in notes] == [
        ("Chen2020 capacity", "chen2020-capacity.md", "simulator", "Measured 4.95 Ah at 1C.")]
    assert "Nominal" not in first.path.read_text()
    mem.remember(folder, "Data location", "/data/run1.csv", "nonsense-kind")
    assert [n.kind for n in mem.list_notes(folder)] == ["simulator", "project"]


def test_read_note_by_file_slug_or_title_prefix(workspace):
    folder = mem.ensure_memory(workspace)
    mem.remember(folder, "Chen2020 capacity", "Measured 4.95 Ah.")
    mem.remember(folder, "Cantera mechanism", "Use gri30.yaml.")
    for key in ("chen2020-capacity.md", "chen2020-capacity", "Chen2020 capacity", "chen"):
        path, text = mem.read_note(folder, key)
        assert path.name == "chen2020-capacity.md" and "4.95 Ah" in text
    with pytest.raises(LookupError, match=r"cantera-mechanism\.md"):
        mem.read_note(folder, "c")  # ambiguous: both start with c
    (folder / "cantera-mechanism.md").unlink()
    listing = mem.render_notes(mem.list_notes(folder), folder)
    assert "Cantera mechanism" in listing and "[file missing]" in listing


def test_only_the_index_enters_the_prompt_and_notes_are_read_on_demand(workspace):
    session = Session.create(workspace, approval="auto")
    try:
        folder = session.memory_dir
        saved = mem.remember(folder, "Solver choice", "Use BDF for the stiff ODE; RK45 "
                             "diverged at t=3 s.\nSECRET-DETAIL-7781 only in the body.")
        model = ScriptedChatModel.from_steps([
            {"tool": "read_file", "args": {"file_path": str(saved.path)}},
            {"final": "{out[-1]|(SECRET-DETAIL-\\d+)}"}])
        result = TurnRunner(session, build_agent(session, model)).run("which solver?")
        first = model.requests[0]
        assert "[Solver choice](solver-choice.md)" in first[0].text
        assert not any("SECRET-DETAIL-7781" in m.text for m in first)
        assert result.final == "SECRET-DETAIL-7781"
    finally:
        session.close()


@pytest.mark.slow
def test_memory_command_lists_and_shows(workspace):
    folder = mem.ensure_memory(workspace)
    mem.remember(folder, "Chen2020 capacity", "Measured 4.95 Ah.", "simulator")
    run = [sys.executable, "-m", "simagent", "memory", "--workspace", str(workspace)]
    listing = cli_fork.run(run, capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0 and "Chen2020 capacity  simulator" in listing.stdout
    shown = cli_fork.run([*run, "chen"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "Measured 4.95 Ah." in shown.stdout
    missing = cli_fork.run([*run, "nope"], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no single memory note matches 'nope'" in missing.stderr


def test_brackets_in_a_title_keep_the_note_listed(workspace):
    folder = mem.ensure_memory(workspace)
    saved = mem.remember(folder, "Solver [BDF] settings", "rtol 1e-8")
    [note] = mem.list_notes(folder)
    assert note.title == "Solver (BDF) settings" and note.exists
    assert mem.read_note(folder, saved.path.name)[0] == saved.path
