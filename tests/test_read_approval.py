"""Reads outside the workspace wait, like writes; secret-looking paths wait everywhere but
in ``auto``; ``remember`` waits in ``ask`` (issue 40: ``read_file ~/.aws/credentials``
ran under ``ask``, its content stored and sent; ``remember`` wrote the next session's
prompt unasked). On the real graph with the scripted model where it matters."""

from __future__ import annotations

from pathlib import Path

import pytest

from simagent.agent import confine
from simagent.agent.approval import MODE_HELP, waits
from simagent.agent.builder import build_agent
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.config import Config, ConfigError, user_config_path
from simagent.paths import content_dir
from simagent.session import Session

KEY = "aws_secret_access_key = FAKE0123456789\n"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home folder of this test's own, holding cloud credentials."""
    home = (tmp_path / "home").resolve()
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text(KEY)
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.fixture
def opened(workspace):
    sessions: list[Session] = []

    def _open(steps: list, approval: str):
        session = Session.create(workspace, approval=approval)
        sessions.append(session)
        return session, TurnRunner(session, build_agent(
            session, ScriptedChatModel.from_steps(steps)))

    yield _open
    for s in sessions:
        s.close()


def read(path: str) -> dict:
    return {"tool": "read_file", "args": {"file_path": path}}


@pytest.mark.parametrize("mode", ["ask", "workspace"])
def test_reading_cloud_credentials_waits(mode, home, opened):
    _s, runner = opened([read("~/.aws/credentials"), {"final": "{out[-1]}"}], mode)
    paused = runner.run("what are my keys?")
    assert paused.status == "paused"
    request, = paused.interrupts[0].action_requests
    assert request["args"]["file_path"] == str(home / ".aws" / "credentials")
    assert "may hold a secret" in request["description"]
    done = runner.resume([{"type": "reject", "message": "no"}])
    assert done.status == "done" and "FAKE0123456789" not in done.final


def test_auto_reads_without_asking(home, opened):
    _s, runner = opened([read("~/.aws/credentials"), {"final": "{out[-1]}"}], "auto")
    result = runner.run("go")
    assert result.status == "done" and "aws_secret_access_key" in result.final


def test_a_dotenv_file_waits_even_inside_the_workspace(workspace, opened):
    (workspace / ".env").write_text("TOKEN=abc\n")
    (workspace / "data.csv").write_text("t,x\n0,1\n")
    _s, runner = opened([read(".env"), {"final": "{out[-1]}"}], "workspace")
    paused = runner.run("go")
    assert paused.status == "paused"
    assert ".env is where an application's secrets are kept" in \
        paused.interrupts[0].action_requests[0]["description"]
    _s, runner = opened([read("data.csv"), {"final": "{out[-1]}"}], "workspace")
    assert runner.run("go").status == "done"


@pytest.mark.parametrize("tool", ["read_file", "ls", "glob", "grep"])
def test_reading_outside_the_workspace_waits_in_workspace_mode(tool, workspace, tmp_path,
                                                               opened):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "notes.txt").write_text("private notes\n")
    args = {"read_file": {"file_path": str(outside / "notes.txt")},
            "ls": {"path": str(outside)},
            "glob": {"pattern": "*.txt", "path": str(outside)},
            "grep": {"pattern": "private", "path": str(outside)}}[tool]
    _s, runner = opened([{"tool": tool, "args": args}, {"final": "{out[-1]}"}], "workspace")
    paused = runner.run("go")
    assert paused.status == "paused"
    assert "outside the workspace" in paused.interrupts[0].action_requests[0]["description"]


def test_a_folder_in_files_readable_is_read_unasked(workspace, tmp_path, opened):
    data, other = tmp_path / "runs", tmp_path / "other"
    for d in (data, other):
        d.mkdir()
        (d / "result.txt").write_text(f"{d.name} result\n")
    user_config_path().write_text(f'[files]\nreadable = ["{data}"]\n')
    _s, runner = opened([read(str(data / "result.txt")), {"final": "{out[-1]}"}],
                        "workspace")
    result = runner.run("go")
    assert result.status == "done" and "runs result" in result.final
    _s, runner = opened([read(str(other / "result.txt")), {"final": "{out[-1]}"}],
                        "workspace")
    assert runner.run("go").status == "paused"  # the list names runs/, not other/


def test_what_simagent_reads_by_design_never_waits(workspace):
    """Bundled content, the session's own folder (offloaded results) and memory notes:
    simagent points the model at them, so reading them never waits, even in ask."""
    session = Session.create(workspace, approval="ask")
    try:
        offloaded = session.paths.root / "large_tool_results" / "call_1"
        offloaded.parent.mkdir(parents=True, exist_ok=True)
        offloaded.write_text("long result\n")
        skill = next(content_dir("skills").glob("*/SKILL.md"))
        paths = [str(skill), str(session.memory_dir / "MEMORY.md")]
        runner = TurnRunner(session, build_agent(session, ScriptedChatModel.from_steps([
            {"tools": [read(p) for p in paths]}, {"tool": "glob", "args": {"pattern": "*.py"}},
            {"tool": "grep", "args": {"pattern": "x"}}, read(str(offloaded)),
            {"final": "{out[-1]}"}])))
        result = runner.run("go")
        assert result.status == "done", [r.get("description") for i in result.interrupts
                                         for r in i.action_requests]
        assert "long result" in result.final
    finally:
        session.close()


def test_remember_waits_in_ask_only(workspace, opened):
    step = {"tool": "remember", "args": {"title": "Units", "content": "Use SI."}}
    session, runner = opened([step, {"final": "{out[-1]}"}], "ask")
    paused = runner.run("remember that")
    assert paused.status == "paused"
    assert paused.interrupts[0].action_requests[0]["name"] == "remember"
    assert "Units" not in (session.memory_dir / "MEMORY.md").read_text()
    _s, runner = opened([step, {"final": "{out[-1]}"}], "workspace")
    assert runner.run("remember that").status == "done"
    assert "Units" in (session.memory_dir / "MEMORY.md").read_text()
    assert "remember" in MODE_HELP["ask"] and "remember" not in MODE_HELP["workspace"]


@pytest.mark.parametrize("rel, in_home, elsewhere", [
    (".ssh/config", True, False), (".aws/config", True, False),
    (".gnupg/pubring.kbx", True, False), (".config/gcloud/credentials.db", True, False),
    (".config/gcloud/configurations/config_default", False, False), (".netrc", True, False),
    (".pgpass", True, False), (".ssh/id_ed25519", True, True), ("keys/id_rsa", True, True),
    ("keys/id_rsa.pub", False, False), ("proj/.env", True, True),
    ("proj/.env.production", True, True), ("proj/.envrc", False, False),
    ("proj/server.pem", True, True), ("proj/tls.key", True, True),
    ("proj/data.csv", False, False), ("proj/notes/.netrc.txt", False, False)])
def test_secret_looking_paths(rel, in_home, elsewhere, tmp_path):
    """In the home folder, and the same names elsewhere: the home-folder rules hold only
    there, the name rules (keys, .env) everywhere."""
    home = tmp_path / "home"
    assert (confine.secret_reason(home / rel, home) is not None) is in_home
    assert (confine.secret_reason(tmp_path / "ws" / rel, home) is not None) is elsewhere


def test_the_pure_decision(home, workspace):
    creds = {"file_path": str(home / ".aws" / "credentials")}
    assert waits("ask", "read_file", creds, workspace)
    assert waits("workspace", "read_file", creds, workspace)
    assert not waits("auto", "read_file", creds, workspace)
    assert waits("workspace", "ls", {"path": "~"}, workspace)
    assert not waits("workspace", "ls", {"path": "."}, workspace)
    # an allow-list never opens a secret-looking path
    assert waits("workspace", "read_file", creds, workspace, readable=[home])
    assert not waits("workspace", "glob", {"pattern": "*", "path": "/"}, workspace)


@pytest.mark.parametrize("value", ['"/data"', "[1, 2]", '["data/runs"]', '[""]'])
def test_files_readable_must_be_a_list_of_absolute_paths(value, workspace):
    user_config_path().write_text(f"[files]\nreadable = {value}\n")
    with pytest.raises(ConfigError, match=r"\[files\] readable"):
        Config.load(workspace).files_readable()


def test_files_readable_expands_the_home_folder(home, workspace):
    user_config_path().write_text('[files]\nreadable = ["~/data", "/srv/runs"]\n')
    assert Config.load(workspace).files_readable() == (home / "data", Path("/srv/runs"))
