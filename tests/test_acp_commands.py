"""``simagent acp``'s slash commands: what a client is told, what counts as one, and each
served on a real session after a scripted turn (issue 39)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simagent.acp import commands
from simagent.acp.commands import Context, available_commands, parse, serve
from simagent.agent.approval import MODE_HELP
from simagent.agent.builder import build_agent
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.context.settings import ContextSettings
from simagent.session import Session


def test_the_advertised_commands_and_their_hints() -> None:
    wire = [c.model_dump(by_alias=True, exclude_none=True) for c in available_commands()]
    assert [c["name"] for c in wire] == ["context", "compact", "done", "restore", "notebook",
                                         "approval"]
    assert all(c["description"] for c in wire)
    by_name = {c["name"]: c for c in wire}
    assert "input" not in by_name["context"]
    assert by_name["approval"]["input"] == {"hint": "ask | workspace | auto"}
    assert by_name["compact"]["input"]["hint"]


@pytest.mark.parametrize(("text", "want"), [
    ("/context", ("context", "")),
    ("  /Compact  the fit values ", ("compact", "the fit values")),
    ("/approval auto", ("approval", "auto")),
    ("/data/run.csv: plot column 2", None),  # a path, not a command
    ("/unknown", None),
    ("what is /context?", None),
    ("", None),
])
def test_parse(text: str, want: tuple[str, str] | None) -> None:
    assert parse(text) == want


@pytest.fixture
def ran(workspace: Path):
    session = Session.create(workspace, approval="auto")
    model = ScriptedChatModel.from_steps([
        {"tool": "run_python", "args": {"code": "k = 0.37\nprint('k =', k)"}},
        {"final": "k is set"}], window=128_000)
    agent = build_agent(session, model, context_settings=ContextSettings())
    runner = TurnRunner(session, agent)
    assert runner.run("set k").status == "done"
    yield session, runner
    session.close()


def test_context_notebook_and_done_on_a_real_session(ran, workspace: Path) -> None:
    session, runner = ran
    ctx = Context(session=session, runner=runner)
    panel = serve("context", "", ctx)
    assert panel.startswith("```text\n") and panel.endswith("\n```")
    assert "tokens" in panel and "128,000" in panel  # the window the scripted model reports
    reply = serve("notebook", "k.ipynb", ctx)  # relative: in the workspace, whatever the cwd
    nb = json.loads((workspace / "k.ipynb").read_text())
    assert any("k = 0.37" in "".join(c["source"]) for c in nb["cells"])
    assert "k.ipynb" in reply
    done = serve("done", "k found", ctx)
    assert done.startswith("~ ")
    assert "nothing to checkpoint" in serve("done", "", ctx)
    assert "needs a model" in serve("compact", "", Context(session=session))


def test_restore_replays_the_cells_that_defined_state(ran) -> None:
    session, runner = ran
    reply = serve("restore", "", session, runner)  # the (session, runner) form
    assert "the kernel was restarted" in reply and "replayed" in reply
    assert session.kernel.execute("print(k)").stdout.strip() == "0.37"
    assert "no cells are waiting" in serve("restore", "run", session)
    assert "takes no argument" in serve("restore", "now", session)


def test_approval_shows_and_switches_through_the_runtime(ran) -> None:
    session, runner = ran
    shown = serve("approval", "", Context(session=session))
    assert "approval: **auto**" in shown
    assert all(help_text in shown for help_text in MODE_HELP.values())
    switched: list[str] = []

    def switch(mode: str) -> None:
        switched.append(mode)
        session.approval = mode

    ctx = Context(session=session, runner=runner, set_approval=switch)
    assert serve("approval", "ask", ctx) == "approval: ask" and switched == ["ask"]
    assert serve("approval", "ask", ctx) == "approval: ask (unchanged)"
    assert "must be one of" in serve("approval", "sometimes", ctx)
    assert "cannot switch" in serve("approval", "auto", Context(session=session))

    def broken(mode: str) -> None:
        raise RuntimeError("the graph could not be rebuilt")

    failed = serve("approval", "workspace", Context(session=session, set_approval=broken))
    assert failed == "/approval failed: RuntimeError: the graph could not be rebuilt"
    assert session.approval == "ask"


def test_unknown_command_lists_the_served_ones(ran) -> None:
    session, _ = ran
    assert serve("model", "", session).startswith("unknown command /model")
    assert set(commands.COMMANDS) == {"context", "compact", "done", "restore", "notebook",
                                      "approval"}


@pytest.mark.real
def test_restore_offers_a_cell_that_wrote_a_file_and_runs_it_on_run(workspace: Path) -> None:
    """The kernel's effect record (a real kernel's audit hook) keeps a cell that appended
    to a file out of the replay; ``/restore run`` runs it when the person says so."""
    session = Session.create(workspace, approval="auto")
    try:
        model = ScriptedChatModel.from_steps([
            {"tool": "run_python", "args": {"code": "k = 0.37"}},
            {"tool": "run_python", "args": {"code": "open('log.txt', 'a').write('k set\\n')"}},
            {"final": "logged"}])
        runner = TurnRunner(session, build_agent(session, model))
        assert runner.run("set k and log it").status == "done"
        reply = serve("restore", "", session, runner)
        assert "log.txt" in reply and "`/restore run`" in reply
        assert (workspace / "log.txt").read_text() == "k set\n"  # not run again unasked
        assert session.kernel.execute("print(k)").stdout.strip() == "0.37"
        ran = serve("restore", "run", session, runner)
        assert ran.startswith("- `_out[") and ": ok" in ran
        assert (workspace / "log.txt").read_text() == "k set\nk set\n"
        assert "no cells are waiting" in serve("restore", "run", session, runner)
    finally:
        session.close()
