"""Approval modes' reach, on the real graph: ``ask`` gates kernel code, a tool nobody
classified waits, and the bundled ``memory/`` content is read-only like ``skills/``."""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.tools import tool

from simagent.agent.approval import MODE_HELP, NEVER_WAIT, interrupt_on_for_mode
from simagent.agent.builder import build_agent
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.config import APPROVAL_MODES
from simagent.paths import CONTENT_FOLDERS, content_dir
from simagent.session import Session


@pytest.fixture
def opened(workspace):
    sessions: list[Session] = []

    def _open(steps, approval, **kw):
        session = Session.create(workspace, approval=approval)
        sessions.append(session)
        built = build_agent(session, ScriptedChatModel.from_steps(steps), **kw)
        return session, TurnRunner(session, built), built

    yield _open
    for s in sessions:
        s.close()


def test_ask_shows_the_cell_and_waits_before_running_it(opened, workspace):
    code = "open('made-by-cell.txt', 'w').write('x')\nprint('ran')"
    _session, runner, _ = opened([{"tool": "run_python", "args": {"code": code}},
                                 {"final": "{out[-1]}"}], "ask")
    paused = runner.run("go")
    assert paused.status == "paused"
    request = paused.interrupts[0].action_requests[0]
    assert request["name"] == "run_python" and request["args"]["code"] == code
    assert not (workspace / "made-by-cell.txt").exists()  # nothing ran yet
    done = runner.resume([{"type": "approve"}])
    assert done.status == "done" and "ran" in done.final
    assert (workspace / "made-by-cell.txt").read_text() == "x"


def test_ask_rejected_cell_never_runs(opened, workspace):
    _session, runner, _ = opened([
        {"tool": "run_python", "args": {"code": "open('no.txt', 'w').write('x')"}},
        {"final": "said: {out[-1]}"}], "ask")
    assert runner.run("go").status == "paused"
    done = runner.resume([{"type": "reject", "message": "not now"}])
    assert done.status == "done" and "not now" in done.final
    assert not (workspace / "no.txt").exists()


def test_workspace_mode_runs_kernel_code_unasked(opened, workspace):
    _session, runner, _ = opened([{"tool": "run_python", "args": {"code": "print(6 * 7)"}},
                                  {"final": "{out[-1]}"}], "workspace")
    result = runner.run("go")
    assert result.status == "done" and "42" in result.final


def test_a_tool_nobody_classified_waits_until_approved(opened, workspace, tmp_path):
    """An extra tool (as an MCP server's would be) cannot slip past approval by being
    new: it waits in ask and workspace modes, whatever its arguments are called."""
    target = tmp_path / "outside.txt"

    @tool
    def put_text(target: str, text: str) -> str:
        """Write text to a file."""
        Path(target).write_text(text)
        return "written"

    for mode in ("ask", "workspace"):
        _s, runner, _ = opened([{"tool": "put_text", "args": {"target": str(target),
                                                               "text": "x"}},
                                {"final": "{out[-1]}"}], mode, extra_tools=[put_text])
        paused = runner.run("go")
        assert paused.status == "paused", mode
        assert paused.interrupts[0].action_requests[0]["name"] == "put_text"
        assert runner.resume([{"type": "reject", "message": "no"}]).status == "done"
        assert not target.exists()
    _s, runner, _ = opened([{"tool": "put_text", "args": {"target": str(target), "text": "x"}},
                            {"final": "{out[-1]}"}], "auto", extra_tools=[put_text])
    assert runner.run("go").status == "done" and target.read_text() == "x"


def test_every_tool_of_the_graph_is_classified(opened, workspace):
    """In ask mode every tool the built graph offers (middleware's included) waits
    unless it is on the never-wait list: nothing is left out of the decision."""
    _s, _r, probe = opened([{"final": "x"}], "ask")
    names = sorted(probe.graph.nodes["tools"].bound.tools_by_name)
    _s, runner, _ = opened([{"tools": [{"tool": n, "args": {}} for n in names]},
                            {"final": "x"}], "ask")
    paused = runner.run("call everything")
    assert paused.status == "paused"
    waited = {r["name"] for r in paused.interrupts[0].action_requests}
    # glob and grep without a path search the workspace, which needs no approval
    assert waited == set(names) - set(NEVER_WAIT) - {"glob", "grep"}
    assert {"run_python", "reset_kernel", "execute", "write_file", "edit_file",
            "delete", "remember", "read_file", "ls"} <= waited
    assert interrupt_on_for_mode("auto", workspace, names) == {}


def test_help_names_every_mode():
    assert set(MODE_HELP) == set(APPROVAL_MODES)
    assert "kernel code" in MODE_HELP["ask"] and "kernel code" in MODE_HELP["workspace"]


@pytest.mark.parametrize("tool_name", ["edit_file", "write_file", "delete"])
def test_bundled_memory_is_read_only(opened, tool_name):
    index = content_dir("memory").resolve() / "MEMORY.md"
    before = index.read_text()
    new = index.parent / "planted.md"
    args = {"edit_file": {"file_path": str(index), "old_string": before.splitlines()[0],
                          "new_string": "# planted"},
            "write_file": {"file_path": str(new), "content": "planted\n"},
            "delete": {"file_path": str(index)}}[tool_name]
    _s, runner, _ = opened([{"tool": tool_name, "args": args}, {"final": "{out[-1]}"}],
                           "auto")
    result = runner.run("change the seed")
    assert "read-only" in result.final
    assert index.read_text() == before and not new.exists()


def test_every_content_folder_is_read_only(opened):
    _s, _runner, built = opened([{"final": "x"}], "auto")
    roots = built.backend.default.read_only
    assert all(content_dir(n).resolve() in roots for n in CONTENT_FOLDERS)


def test_the_approval_prompt_shows_the_whole_cell():
    from simagent.tui.render import action_preview

    code = "import numpy as np\nx = np.arange(3)\nnp.save('x.npy', x)"
    assert action_preview("run_python", {"code": code}, None) == code


def test_slash_approval_alone_says_what_each_mode_gates():
    """``/approval`` prints each mode's reach from ``MODE_HELP`` (one home)."""
    from types import SimpleNamespace

    from simagent.tui.slash import cmd_approval

    panels: list[tuple[str, str]] = []
    ctl = SimpleNamespace(session=SimpleNamespace(approval="workspace"),
                          panel=lambda title, text: panels.append((title, text)))
    cmd_approval(ctl, "")
    (_title, text), = panels
    assert "now: workspace" in text
    for mode, reach in MODE_HELP.items():
        assert f"{mode}: {reach}" in text


def test_headless_shows_the_whole_cell_that_waits():
    """``simagent run`` exits 3 on an ask-mode cell; stderr shows every line of it, so
    the person can decide on ``--approve`` knowing what it runs."""
    import io

    from simagent.agent.events import Interrupt
    from simagent.headless import StreamPrinter

    err = io.StringIO()
    code = "import shutil\nshutil.rmtree('old_runs')\nprint('gone')"
    StreamPrinter(io.StringIO(), err, stream_text=False)(
        Interrupt("i1", [{"name": "run_python", "args": {"code": code}}]))
    text = err.getvalue()
    assert "waiting for approval: run_python" in text
    assert all(f"    {line}" in text for line in code.splitlines())


def test_a_subagents_approval_is_asked_once(opened, workspace, tmp_path):
    """A subagent's interrupt surfaces in its own namespace and again at the root of the
    stream; the person (and ``simagent run``'s stderr) must see one request, not two."""
    outside = tmp_path / "outside.txt"
    steps = [{"tool": "task", "args": {"description": "write it",
                                        "subagent_type": "general-purpose"},
              "steps": [{"tool": "write_file",
                         "args": {"file_path": str(outside), "content": "hi"}},
                        {"final": "wrote"}]},
             {"final": "done"}]
    _session, runner, _ = opened(steps, "workspace")
    from simagent.agent.events import Interrupt

    seen: list[Interrupt] = []
    paused = runner.run("go", lambda e: seen.append(e) if isinstance(e, Interrupt) else None)
    assert paused.status == "paused"
    assert len(seen) == 1 and len(paused.interrupts) == 1
    assert paused.interrupts[0].action_requests[0]["name"] == "write_file"
    assert not outside.exists()
