"""No secret at rest, state private, every tool result redacted (issue 26, items 3, 4, 6).

The acceptance test drives the real CLI (real graph, scripted model, real kernel, real
shell, real SQLite) with two keys in a fake environment, then greps every byte simagent
could have left: the state home, the workspace's ``.simagent`` and the kernel's IPython
profile. The other tests pin the parts: the checkpoint serializer, the stderr lines,
the permission helpers.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import subprocess
import sys
from pathlib import Path

import cli_fork
import pytest
from conftest import write_config
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from simagent.agent.secrets import redact_tool_result
from simagent.paths import private_dir, private_file
from simagent.presentation.notices import one_line
from simagent.trace.checkpoint_redaction import RedactingSerializer
from simagent.trace.redact import Redactor

pytestmark = pytest.mark.timeout(600)

FAKE = "fk-" + secrets.token_hex(12)
OPENAI = "sk-" + secrets.token_hex(12)


def _hits(roots: list[Path], needles: list[str]) -> list[str]:
    """``path: needle`` for every file under ``roots`` whose bytes or name hold a
    needle (a note's file name comes from its title)."""
    found = []
    for root in roots:
        for path in root.rglob("*") if root.exists() else ():
            found += [f"{path}: {n} in the name" for n in needles if n in path.name]
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                found += [f"{path}: {n}" for n in needles if n.encode() in data]
    return found


def _wrong_modes(root: Path) -> list[str]:
    """Every folder under (and including) ``root`` not 0700, every file not 0600."""
    bad = []
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        want = 0o700 if path.is_dir() else 0o600
        if not path.is_symlink() and mode != want:
            bad.append(f"{oct(mode)} {path}")
    return bad


def _simagent(args: list[str], env: dict[str, str], cwd: Path,
              script: list[dict]) -> subprocess.CompletedProcess[str]:
    path = cwd.parent / f"script-{secrets.token_hex(3)}.json"
    path.write_text(json.dumps(script))
    return cli_fork.run([sys.executable, "-m", "simagent", "run", "--model",
                         f"scripted:{path}", "--approval", "auto", *args],
                        cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_two_keys_reach_no_file_and_every_state_file_is_private(tmp_path):
    """A cell prints one key and holds the other as a literal, the shell echoes one (in
    the main agent and in a subagent), an attempt and a memory note quote both, a file is
    written, the model repeats a key verbatim, and the next turn's prompt carries one:
    zero hits in the state home, the workspace's ``.simagent`` and ``~/.ipython``; the
    model got the shell's output redacted; every state folder is 0700, every file 0600."""
    home, state, ws = tmp_path / "home", tmp_path / "state", tmp_path / "ws"
    for d in (home, ws / ".simagent"):
        d.mkdir(parents=True)
    write_config(ws, '[model]\nname = "scripted"\n')
    env = {**os.environ, "HOME": str(home), "SIMAGENT_HOME": str(state),
           "FAKE_API_KEY": FAKE, "OPENAI_API_KEY": OPENAI}
    cell = f"import os\nprint('fake', os.environ['FAKE_API_KEY'])\nliteral = {OPENAI!r}"
    first = _simagent(["go"], env, ws, [
        {"tool": "run_python", "args": {"code": cell}},
        {"tool": "task", "args": {"description": "echo the key", "subagent_type":
                                  "general-purpose"},
         "steps": [{"tool": "execute", "args": {"command": "echo sub $FAKE_API_KEY"}},
                   {"final": "digest {out[-1]}"}]},
        {"tool": "record_attempt", "args": {"rationale": f"try {OPENAI}",
                                            "parameters": {"key": FAKE}, "outcome": FAKE}},
        {"tool": "remember", "args": {"title": f"key {FAKE}",
                                      "content": f"the key is {OPENAI}"}},
        {"tool": "write_file", "args": {"file_path": "notes.txt", "content": FAKE}},
        {"tool": "execute", "args": {"command": "echo shell $OPENAI_API_KEY"}},
        {"final": "the shell said: {out[-1]} / verbatim " + OPENAI}])
    assert first.returncode == 0, first.stderr
    # finding 4: the model got the shell's output redacted (it quotes what it got)
    assert "the shell said: shell [redacted:OPENAI_API_KEY]" in first.stdout
    assert (ws / "notes.txt").read_text() == FAKE  # the live run kept what it wrote

    second = _simagent(["--continue", f"my key is {FAKE}"], env, ws, [{"final": "noted"}])
    assert second.returncode == 0, second.stderr  # the redacted checkpoint reloads
    assert "noted" in second.stdout

    for run in (first, second):
        assert FAKE not in run.stderr and OPENAI not in run.stderr, run.stderr
    roots = [state, ws / ".simagent", home / ".ipython"]
    assert _hits(roots, [FAKE, OPENAI]) == []
    assert list((state / "workspaces").rglob("checkpoints.sqlite"))  # it was searched
    assert _wrong_modes(state) == []


def test_checkpoint_serializer_redacts_every_string_and_keeps_the_shape():
    """Tool-call arguments, replies, tool results, the user's words, dict keys and
    nested values: redacted at rest, the objects load back whole; with no secret in
    them the bytes are exactly langgraph's."""
    key = "sk-" + secrets.token_hex(10)
    redactor = Redactor({key: "OPENAI_API_KEY"})
    serde, plain = RedactingSerializer(redactor=redactor), JsonPlusSerializer()
    messages = [HumanMessage(f"use {key}"),
                AIMessage(f"ok {key}", tool_calls=[{"name": "execute", "id": "c1",
                                                    "args": {"command": f"echo {key}"}}]),
                ToolMessage(f"out {key}\n", tool_call_id="c1")]
    state = {"messages": messages, "files": {f"/k/{key}": {"content": [key]}}, "n": 3}
    kind, data = serde.dumps_typed(state)
    assert key.encode() not in data
    back = serde.loads_typed((kind, data))
    tag = "[redacted:OPENAI_API_KEY]"
    assert [m.text for m in back["messages"]] == [f"use {tag}", f"ok {tag}", f"out {tag}\n"]
    assert back["messages"][1].tool_calls[0]["args"] == {"command": f"echo {tag}"}
    assert back["files"] == {f"/k/{tag}": {"content": [tag]}} and back["n"] == 3
    clean = {"messages": [HumanMessage("nothing secret")], "n": 1}
    assert serde.dumps_typed(clean) == plain.dumps_typed(clean)


def test_a_tool_result_is_redacted_whatever_its_form():
    key = "tok-" + secrets.token_hex(10)
    from simagent.trace import redact as redact_mod

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SOME_TOKEN", key)
        text = redact_tool_result(ToolMessage(f"echo {key}", tool_call_id="a"))
        blocks = redact_tool_result(ToolMessage([{"type": "text", "text": key}],
                                                tool_call_id="b"))
        assert redact_mod.redact(key) == "[redacted:SOME_TOKEN]"
    assert text.content == "echo [redacted:SOME_TOKEN]"
    assert blocks.content == [{"type": "text", "text": "[redacted:SOME_TOKEN]"}]


def test_an_activity_line_is_redacted_before_it_is_cut(monkeypatch):
    """The stderr summary cuts long arguments: cutting first left all but the tail of
    a key on screen and in any log of it."""
    key = "sk-" + secrets.token_hex(20)
    monkeypatch.setenv("OPENAI_API_KEY", key)
    line = one_line({"command": "x" * 40 + key})
    assert key[:20] not in line and "[redacted:OPENAI_API_KEY" in line


def test_private_dir_creates_and_tightens(tmp_path):
    old = tmp_path / "old"
    old.mkdir(mode=0o755)
    os.chmod(old, 0o755)
    private_dir(old / "a" / "b")
    private_dir(old)  # a state home an older simagent left open
    private_file(old / "a" / "b" / "db.sqlite")
    assert _wrong_modes(old) == []


def test_a_long_message_deepagents_offloads_is_private_and_redacted(workspace, monkeypatch):
    """deepagents saves a very long user message whole under the session's
    ``conversation_history/`` through the back end: state like any other file. The
    tree is also walked while the databases are open, so their -wal/-shm files count."""
    from simagent.agent.builder import build_agent
    from simagent.agent.runner import TurnRunner
    from simagent.agent.scripted import ScriptedChatModel
    from simagent.session import Session

    monkeypatch.setenv("OPENAI_API_KEY", OPENAI)
    session = Session.create(workspace, approval="auto")
    try:
        session._warmed = True  # no kernel needed
        model = ScriptedChatModel.from_steps([{"final": "ok"}])
        long = " ".join(f"w{i}" for i in range(45_000))
        assert TurnRunner(session, build_agent(session, model)).run(
            f"my key {OPENAI} {long}").status == "done"
        home = Path(os.environ["SIMAGENT_HOME"])
        open_dbs = [p.name for p in session.paths.root.glob("*.sqlite-*")]
        assert {"trace.sqlite-wal", "checkpoints.sqlite-wal"} <= set(open_dbs)
        assert _wrong_modes(home) == []  # while open: -wal and -shm files included
    finally:
        session.close()
    offloaded = list(session.paths.root.rglob("conversation_history/*"))
    assert offloaded  # deepagents did offload it
    assert _hits([home], [OPENAI]) == [] and _wrong_modes(home) == []


def test_a_cell_that_held_a_key_is_not_replayed_as_its_redacted_code(session_paths, workspace,
                                                                      monkeypatch):
    """The record keeps the code redacted; replaying that would run ``key =
    '[redacted:...]'``. The cell is listed as skipped instead, and says why."""
    from simagent.kernel import Kernel
    from simagent.kernel.replay import load_records

    monkeypatch.setenv("OPENAI_API_KEY", OPENAI)
    with Kernel(session_paths, cwd=workspace) as kernel:
        assert kernel.execute("x = 41").ok
        assert kernel.execute(f"key = {OPENAI!r}").ok
        record = load_records(session_paths.outputs)[-1]
        assert OPENAI not in record["code"] and record["secret"] is True
        recovery = kernel.restore()
        assert recovery.replayed == [1]
        assert [(s.n, s.kind) for s in recovery.skipped] == [(2, "secret")]
        assert "it held a secret" in recovery.message()
        assert kernel.execute("x + 1").value == "42"
        assert "NameError" in (kernel.execute("key").error.ename or "")


@pytest.mark.slow
def test_an_mcp_server_that_prints_a_key_and_returns_an_image_leaves_no_key(tmp_path):
    """A session whose MCP server (``tests/mcp_servers/leaky.py``, from the user's config)
    prints the key to its stderr at start and on each call, and answers with an image:
    its log, the image and its sidecar are private (0600 in 0700 folders) and no file
    under the state home holds the key (issue 40, defect 7)."""
    home, state, ws = tmp_path / "home", tmp_path / "state", tmp_path / "ws"
    for d in (home, ws, state):
        d.mkdir(parents=True)
    key_file = tmp_path / "server-key"
    key_file.write_text(FAKE)
    server = Path(__file__).parent / "mcp_servers" / "leaky.py"
    tag = json.dumps(os.environ.get("SIMAGENT_TEST_RUN", ""))
    fd = os.open(state / "config.toml", os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as fh:  # the user's own config: no workspace trust involved
        fh.write(f"[mcp.servers.leaky]\ncommand = {json.dumps(sys.executable)}\n"
                 f"args = {json.dumps([str(server), '--key-file', str(key_file)])}\n"
                 f"env = {{ SIMAGENT_TEST_RUN = {tag} }}\n")
    env = {**os.environ, "HOME": str(home), "SIMAGENT_HOME": str(state), "FAKE_API_KEY": FAKE}
    run = _simagent(["plot it"], env, ws, [
        {"tool": "leaky__leak", "args": {"subject": "H2O"}}, {"final": "got {out[-1]}"}])
    assert run.returncode == 0, run.stderr
    assert "plot of H2O" in run.stdout and FAKE not in run.stdout + run.stderr
    logs = list(state.rglob("mcp-leaky.log"))
    assert logs and "[redacted:FAKE_API_KEY]" in logs[0].read_text()
    images = list(state.rglob("fig-*.png"))
    assert images and images[0].with_suffix(".json").exists()  # the image and its sidecar
    assert _hits([state, ws], [FAKE]) == []
    assert _wrong_modes(state) == []
