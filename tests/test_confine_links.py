"""Writes judge the file, not the name (issue 40, defect 3).

A hard link inside the workspace to an outside file is a change outside (it waits in
``workspace`` mode, for the main agent and a subagent alike, and the prompt says so); a
hard link to the read-only ``--from-notebook`` file is that file; a link swapped in
after the decision cannot redirect the act; ``.simagent/`` and the trust store are
written by no file tool in any mode. On the real graph with the scripted model, and on
the real file back end.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from langchain.agents.middleware import AgentMiddleware

from simagent.agent import confine
from simagent.agent.approval import file_reason, waits
from simagent.agent.backend import WorkspaceBackend
from simagent.agent.builder import build_agent
from simagent.agent.events import Interrupt
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.headless import StreamPrinter
from simagent.paths import trust_store_path
from simagent.session import Session

SECRET = "outside, keep me\n"


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """(workspace, an outside file), the outside file hard-linked in as ``shared.txt``."""
    ws, out = tmp_path / "ws", tmp_path / "out"
    ws.mkdir()
    out.mkdir()
    outside = out / "profile.txt"
    outside.write_text(SECRET)
    os.link(outside, ws / "shared.txt")
    return ws.resolve(), outside.resolve()


@pytest.fixture
def opened():
    sessions: list[Session] = []

    def _open(ws: Path, steps: list, approval: str, **kw):
        session = Session.create(ws, approval=approval, **kw)
        sessions.append(session)
        return session, TurnRunner(session, build_agent(
            session, ScriptedChatModel.from_steps(steps)))

    yield _open
    for s in sessions:
        s.close()


def write_step(path: str, content: str = "overwritten\n") -> dict:
    return {"tool": "write_file", "args": {"file_path": path, "content": content}}


def edit_step(path: str) -> dict:
    return {"tool": "edit_file", "args": {"file_path": path, "old_string": "keep me",
                                          "new_string": "changed"}}


def test_the_decision_counts_a_hard_linked_file_as_outside(tree):
    ws, _outside = tree
    (ws / "own.txt").write_text("mine\n")
    for tool in ("write_file", "edit_file"):
        assert waits("workspace", tool, {"file_path": "shared.txt"}, ws)
        assert not waits("workspace", tool, {"file_path": "own.txt"}, ws)
        assert not waits("auto", tool, {"file_path": "shared.txt"}, ws)
    # delete removes one name only: the other keeps the file as it was
    assert not waits("workspace", "delete", {"file_path": "shared.txt"}, ws)


@pytest.mark.parametrize("agent", ["main", "general-purpose"])
@pytest.mark.parametrize("step", [write_step, edit_step])
def test_a_hard_link_waits_in_workspace_mode_and_the_prompt_says_why(agent, step, tree,
                                                                     opened):
    ws, outside = tree
    calls = [step("shared.txt"), {"final": "{out[-1]}"}]
    steps = calls if agent == "main" else [
        {"tool": "task", "args": {"description": "change it",
                                  "subagent_type": "general-purpose"}, "steps": calls},
        {"final": "{out[-1]}"}]
    _session, runner = opened(ws, steps, "workspace")
    paused = runner.run("change shared.txt")
    assert paused.status == "paused"
    request, = paused.interrupts[0].action_requests
    assert request["args"]["file_path"] == str(ws / "shared.txt")
    assert "2 hard links" in request["description"]
    assert "outside the workspace" in request["description"]
    assert outside.read_text() == SECRET  # nothing happened while it waits
    assert runner.resume([{"type": "reject", "message": "no"}]).status == "done"
    assert outside.read_text() == SECRET


def test_an_approved_write_through_a_hard_link_happens_only_then(tree, opened):
    ws, outside = tree
    _session, runner = opened(ws, [write_step("shared.txt"), {"final": "{out[-1]}"}],
                              "workspace")
    assert runner.run("go").status == "paused"
    assert outside.read_text() == SECRET
    assert runner.resume([{"type": "approve"}]).status == "done"
    assert outside.read_text() == "overwritten\n"  # the person said yes, knowing


def test_ask_and_simagent_run_show_the_link_count(tree):
    """ask's prompt named the inside path only; the description names the file and its
    links, and ``simagent run``'s stderr prints it."""
    ws, _outside = tree
    line = file_reason("ask", "write_file", {"file_path": "shared.txt"}, ws)
    assert line is not None and str(ws / "shared.txt") in line and "2 hard links" in line
    err = io.StringIO()
    StreamPrinter(io.StringIO(), err, stream_text=False)(Interrupt("i1", [
        {"name": "write_file", "args": {"file_path": str(ws / "shared.txt")},
         "description": line}]))
    assert f"    {line}" in err.getvalue()


def test_a_hard_link_to_the_read_only_notebook_is_refused_in_auto(tmp_path, opened):
    ws = (tmp_path / "ws").resolve()
    ws.mkdir()
    notebook = ws / "study.ipynb"
    notebook.write_text('{"cells": []}')
    os.link(notebook, ws / "alias.ipynb")
    _session, runner = opened(ws, [write_step("alias.ipynb", "{}"),
                                   edit_step("alias.ipynb"),
                                   {"final": "{out[-2]} | {out[-1]}"}],
                              "auto", notebook=notebook)
    result = runner.run("go")
    assert result.status == "done"
    assert result.final.count("is the notebook this session started from") == 2
    assert notebook.read_text() == '{"cells": []}'


@pytest.mark.parametrize("where", ["settings", "trust"])
def test_simagent_settings_are_written_by_no_tool_even_in_auto(where, tmp_path, opened):
    ws = (tmp_path / "ws").resolve()
    ws.mkdir()
    if where == "settings":
        (ws / ".simagent").mkdir()
        target = ws / ".simagent" / "config.toml"
        target.write_text('approval = "workspace"\n')
    else:
        target = trust_store_path()
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("{}")
    before = target.read_text()
    _session, runner = opened(ws, [write_step(str(target), 'approval = "auto"\n'),
                                   {"tool": "edit_file", "args": {
                                       "file_path": str(target), "old_string": before[:3],
                                       "new_string": "xx"}},
                                   {"tool": "delete", "args": {"file_path": str(target)}},
                                   {"final": "{out[-3]} | {out[-2]} | {out[-1]}"}], "auto")
    result = runner.run("turn approval off for next time")
    assert result.status == "done"
    assert result.final.count("never a file tool") == 3, result.final
    assert target.read_text() == before
    if where == "settings":  # nor a new file in the folder
        _s, runner = opened(ws, [write_step(".simagent/extra.toml"),
                                 {"final": "{out[-1]}"}], "auto")
        assert "never a file tool" in runner.run("go").final
        assert not (ws / ".simagent" / "extra.toml").exists()


# --------------------------------------------------- a link swapped after the decision
def swap_to_link(path: Path, target: Path) -> None:
    """Put a symbolic link to ``target`` where ``path`` is (a file or a folder)."""
    if path.is_dir() and not path.is_symlink():
        for child in path.iterdir():
            child.unlink()
        path.rmdir()
    else:
        path.unlink()
    path.symlink_to(target)


@pytest.mark.parametrize("part", ["file", "folder"])
@pytest.mark.parametrize("op", ["write", "edit"])
def test_the_back_end_does_not_follow_a_link_swapped_in_after_resolving(part, op, tmp_path):
    ws, out = (tmp_path / "ws"), (tmp_path / "out")
    (ws / "sub").mkdir(parents=True)
    out.mkdir()
    (ws / "sub" / "notes.txt").write_text("keep me\n")
    (out / "notes.txt").write_text(SECRET)
    backend = WorkspaceBackend(ws)
    decided = confine.resolve("sub/notes.txt", ws)  # what the decision judged: inside
    assert confine.inside(str(decided), ws)
    if part == "file":
        swap_to_link(ws / "sub" / "notes.txt", out / "notes.txt")
    else:
        swap_to_link(ws / "sub", out)
    result = (backend.write(str(decided), "redirected\n") if op == "write"
              else backend.edit(str(decided), "keep me", "redirected"))
    assert result.error and "nothing was written" in result.error, result
    assert (out / "notes.txt").read_text() == SECRET


def test_a_hard_link_swapped_in_between_look_and_open_is_refused(tmp_path, monkeypatch):
    """The act opens what its name held when it looked; a new name added to it by the
    time it is opened (a hard link put in its place) fails the check on the opened file."""
    ws, out = (tmp_path / "ws"), (tmp_path / "out")
    ws.mkdir()
    out.mkdir()
    (out / "notes.txt").write_text(SECRET)
    target = (ws / "notes.txt").resolve()
    real_stat = os.stat

    def stat_then_swap(path, *args, **kw):
        try:
            return real_stat(path, *args, **kw)
        finally:
            if path == "notes.txt" and kw.get("dir_fd") is not None:  # the act's look...
                os.link(out / "notes.txt", target)  # ... and a hard link lands right after

    with pytest.raises(FileNotFoundError):
        real_stat(target)
    monkeypatch.setattr(confine.os, "stat", stat_then_swap)
    result = WorkspaceBackend(ws).write(str(target), "redirected\n")
    monkeypatch.undo()
    assert result.error and "nothing was written" in result.error
    assert (out / "notes.txt").read_text() == SECRET


class SwapBeforeTheAct(AgentMiddleware):
    """Outermost tool hook: once the decision let the call through, a link replaces what
    it judged (as a concurrent process could)."""

    def __init__(self, path: Path, to: Path) -> None:
        super().__init__()
        self.path, self.to = path, to

    def wrap_tool_call(self, request, handler):
        if request.tool_call["name"] in ("write_file", "edit_file"):
            swap_to_link(self.path, self.to)
        return handler(request)


@pytest.mark.parametrize("part", ["file", "folder"])
def test_through_the_graph_a_link_swapped_after_the_decision_redirects_nothing(
        part, tmp_path):
    ws, out = (tmp_path / "ws").resolve(), (tmp_path / "out").resolve()
    (ws / "sub").mkdir(parents=True)
    out.mkdir()
    (ws / "sub" / "notes.txt").write_text("keep me\n")
    (out / "notes.txt").write_text(SECRET)
    swap = (SwapBeforeTheAct(ws / "sub" / "notes.txt", out / "notes.txt") if part == "file"
            else SwapBeforeTheAct(ws / "sub", out))
    session = Session.create(ws, approval="workspace")
    try:
        runner = TurnRunner(session, build_agent(
            session, ScriptedChatModel.from_steps([write_step("sub/notes.txt"),
                                                   {"final": "{out[-1]}"}]),
            middleware=[swap]))
        result = runner.run("update the notes")
        assert result.status == "done"  # inside: it went ahead unasked
        assert "nothing was written" in result.final
    finally:
        session.close()
    assert (out / "notes.txt").read_text() == SECRET
