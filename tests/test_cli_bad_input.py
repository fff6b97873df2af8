"""What a person is told when the input or the machine is not what simagent expects
(issue 30, items 7-10 and 14): every case through the real ``simagent`` command in a
subprocess, with its own state home; the model is scripted or a real HTTP endpoint.

Read-only folders are real read-only mounts in a private mount namespace (``unshare``):
``chmod`` stops nobody when the tests run as root.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import cli_fork
import pytest
from conftest import write_config

README = Path(__file__).resolve().parents[1] / "README.md"
DOCS = README.parent / "docs"  # the pages README's details moved to (issue 37)
SIMAGENT = [sys.executable, "-m", "simagent"]


def cli(workspace: Path, *args: str | bytes, env: dict[str, str] | None = None,
        prefix: list[str] | None = None, timeout: float = 180
        ) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_MODEL"}
    full_env.update(env or {})
    return cli_fork.run([*(prefix or []), *SIMAGENT, *args], cwd=workspace, env=full_env,
                        text=True, capture_output=True, timeout=timeout)


def scripted(tmp_path: Path, steps: list[dict]) -> str:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(steps))
    return f"scripted:{path}"


def sessions(workspace: Path) -> list[dict]:
    proc = cli(workspace, "sessions", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout or "[]")


def events(state_dir: str, kind: str) -> list[dict]:
    db = sqlite3.connect(Path(state_dir) / "trace.sqlite")
    try:
        return [json.loads(p) for (p,) in db.execute(
            "SELECT payload FROM events WHERE kind = ? ORDER BY id", (kind,))]
    finally:
        db.close()


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("simagent: ")]


# ------------------------------------------------------------------ item 7: bytes
@pytest.mark.slow
def test_a_prompt_byte_that_is_not_utf8_is_replaced_and_said(workspace, tmp_path):
    model = scripted(tmp_path, [{"final": "noted"}])
    proc = cli(workspace, "run", "--json", "--model", model, b"caf\xe9 au lait")
    assert proc.returncode == 0, proc.stderr
    assert "internal error" not in proc.stderr
    (note,) = [ln for ln in proc.stderr.splitlines() if "not UTF-8" in ln]
    assert "\\xe9" in note and "\ufffd" in note
    out = json.loads(proc.stdout)
    (user,) = events(out["state_dir"], "message_user")
    assert user["content"] == "caf\ufffd au lait"
    assert [s["id"] for s in sessions(workspace)] == [out["session_id"]]


@pytest.mark.slow
def test_a_path_whose_bytes_are_not_utf8_is_refused_before_any_session(workspace, tmp_path):
    """A prompt is prose (a replaced byte keeps its meaning); a path is a name (a replaced
    byte names another file), so it is refused with exit 2 instead."""
    script = os.fsencode(tmp_path) + b"/caf\xe9.json"
    Path(os.fsdecode(script)).write_text(json.dumps([{"final": "x"}]))
    proc = cli(workspace, "run", "--model", b"scripted:" + script, "hi")
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("simagent: error: model ") and "not UTF-8 (\\xe9)" in line
    odd = os.fsencode(tmp_path) + b"/w\xe9"
    os.mkdir(odd)
    proc = cli(workspace, "run", "--model", scripted(tmp_path, [{"final": "x"}]),
               "--workspace", odd, "hi")
    assert proc.returncode == 2 and "workspace " in proc.stderr, proc.stderr
    assert sessions(workspace) == [] and "internal error" not in proc.stderr


# ------------------------------------------------------- item 9: empty prompts
@pytest.mark.slow
@pytest.mark.parametrize("prompt", ["", "   "])
def test_an_empty_prompt_is_refused_and_leaves_no_session(workspace, tmp_path, prompt):
    proc = cli(workspace, "run", "--model", scripted(tmp_path, [{"final": "x"}]), prompt)
    assert proc.returncode == 2
    (line,) = error_lines(proc.stderr)
    assert "empty PROMPT" in line
    assert sessions(workspace) == []


# ------------------------------------------- item 7: no session for no turn
@pytest.mark.real
def test_a_run_whose_kernel_cannot_start_leaves_no_session(workspace, tmp_path):
    (workspace / ".simagent").mkdir()
    write_config(workspace,
        '[kernel]\nname = "no-such-kernel-spec"\n')
    proc = cli(workspace, "run", "--model", scripted(tmp_path, [{"final": "x"}]), "hi")
    assert proc.returncode == 6, proc.stderr
    assert sessions(workspace) == []
    assert "internal error" not in proc.stderr


# ------------------------------------------------- item 9: missing key is config
@pytest.mark.slow
def test_a_missing_api_key_is_a_configuration_error(workspace):
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    proc = cli_fork.run([*SIMAGENT, "run", "--model", "openai:gpt-4o", "hi"], cwd=workspace,
                        env=env, text=True, capture_output=True, timeout=60)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "OPENAI_API_KEY" in line
    assert re.search(r"Exit codes: 0 ok, 2 usage/config \(an empty prompt, a missing API key",
                     " ".join((DOCS / "getting-started.md").read_text().split()))


# -------------------------------------- item 9: refused on this machine is final
@pytest.mark.slow
def test_a_refused_local_endpoint_fails_at_once(workspace):
    with socket.socket() as sock:  # bound, never listening: connects are refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        proc = cli(workspace, "run", "--json", "--model",
                   f"openai-compatible:m@http://127.0.0.1:{port}/v1", "hi")
    assert proc.returncode == 4, proc.stderr
    assert " retry " not in proc.stderr  # no "— retry 1/5 in ..." line
    (line,) = [ln for ln in error_lines(proc.stderr) if ln.startswith("simagent: error")]
    assert "connection refused" in line and "nothing is listening" in line
    out = json.loads(proc.stdout)
    assert [e for e in events(out["state_dir"], "provider_retry") if "retry" in e] == []


def test_a_refused_remote_endpoint_is_still_retried():
    """Only this machine's refusals are final: a remote one may be a node restarting."""
    import httpx

    from simagent.agent.provider_retry import classify

    for url, final in (("http://127.0.0.1:9/v1", True), ("http://localhost:9/v1", True),
                       ("http://[::1]:9/v1", True), ("http://10.1.2.3:9/v1", False),
                       ("https://api.example.org/v1", False)):
        request = httpx.Request("POST", url + "/chat/completions")
        exc = httpx.ConnectError("[Errno 111] Connection refused", request=request)
        assert (classify(exc) is None) is final, url
        reset = httpx.ConnectError("[Errno 104] Connection reset by peer", request=request)
        assert classify(reset) is not None, url  # only a refusal is final


# ----------------------------------------------------- item 8: read-only folders
def _ro_mount_prefix(target: Path) -> list[str] | None:
    """``unshare`` running the command with ``target`` mounted read-only in a private
    mount namespace (root: directly; others: in a user namespace), or None."""
    if shutil.which("unshare") is None:
        return None
    userns = [] if os.geteuid() == 0 else ["-r"]
    script = ('mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" && shift && '
              'exec "$@"')
    prefix = ["unshare", "-m", *userns, "sh", "-c", script, "sh", str(target)]
    probe = subprocess.run([*prefix, "sh", "-c", f'! touch "{target}/.probe" 2>/dev/null'],
                           capture_output=True, timeout=30)
    return prefix if probe.returncode == 0 else None


@pytest.mark.slow
def test_init_in_a_read_only_workspace_names_it(workspace):
    prefix = _ro_mount_prefix(workspace)
    if prefix is None:
        pytest.skip("no read-only mount possible here (unshare/mount refused)")
    proc = cli(workspace, "init", "--no-check", prefix=prefix)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert str(workspace / ".simagent") in line and "Read-only file system" in line
    assert "writable folder" in line and "internal error" not in line


@pytest.mark.slow
def test_a_read_only_output_path_is_named_with_its_own_fix(workspace, tmp_path):
    model = scripted(tmp_path, [{"final": "fine"}])
    assert cli(workspace, "run", "--model", model, "hi").returncode == 0
    out = tmp_path / "out"
    out.mkdir()
    prefix = _ro_mount_prefix(out)
    if prefix is None:
        pytest.skip("no read-only mount possible here (unshare/mount refused)")
    proc = cli(workspace, "transcript", "-o", str(out / "t.md"), prefix=prefix)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"cannot write {out / 't.md'} (Read-only file system); choose a writable " \
           "location" in line


@pytest.mark.slow
def test_run_with_a_read_only_state_home_names_it(workspace, tmp_path, _state_home):
    model = scripted(tmp_path, [{"final": "fine"}])
    prefix = _ro_mount_prefix(_state_home)
    if prefix is None:
        pytest.skip("no read-only mount possible here (unshare/mount refused)")
    fresh = cli(workspace, "run", "--model", model, "hi", prefix=prefix)
    assert fresh.returncode == 2, fresh.stderr
    (line,) = error_lines(fresh.stderr)
    assert f"cannot write simagent's state folder {_state_home}" in line
    assert "SIMAGENT_HOME" in line and "internal error" not in line
    # a session that exists, continued while the home is read-only
    assert cli(workspace, "run", "--model", model, "hi").returncode == 0
    again = cli(workspace, "run", "--continue", "--model", model, "hi", prefix=prefix)
    assert again.returncode == 2, again.stderr
    (line,) = error_lines(again.stderr)
    assert f"cannot write simagent's state folder {_state_home}" in line


# ------------------------------------- item 10: a person's words out of view
@pytest.mark.slow
def test_a_huge_prompt_moved_to_a_file_is_said_traced_and_counted(workspace, tmp_path):
    # Many arguments (one is capped at 128 KiB by the OS), joined as `simagent run` does.
    words = [f"line{i} " + "lorem ipsum dolor sit amet " * 2_000 for i in range(6)]
    proc = cli(workspace, "run", "--json", "--model", scripted(tmp_path, [{"final": "ok"}]),
               *words)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    (note,) = [ln for ln in proc.stderr.splitlines() if "your message" in ln]
    path = re.search(r"is saved to (\S+\.md);", note).group(1)
    assert Path(path).parent == Path(out["state_dir"]) / "conversation_history"
    assert Path(path).read_text() == " ".join(words)
    (event,) = events(out["state_dir"], "context_eviction")
    assert event["source"] == "user" and event["path"] == path
    assert event["chars"] == len(" ".join(words)) and event["tokens_after"] < 2_000
    shown = cli(workspace, "context", out["session_id"])
    assert "Context events: none yet" not in shown.stdout
    assert re.search(r"evictions\s+1", shown.stdout), shown.stdout
    page = " ".join((DOCS / "context.md").read_text().split())
    assert "`conversation_history/<uuid>.md`" in page


# ----------------------------------------------------------------- item 14: docs
def _headings() -> set[str]:
    return {m.group(1).strip() for m in re.finditer(r"^#+ (.+)$", README.read_text(),
                                                     re.MULTILINE)}


@pytest.mark.slow
def test_every_readme_reference_the_program_prints_names_a_section(workspace):
    """``(see README: X)`` in any message or file simagent writes names a real heading."""
    package = Path(__file__).resolve().parents[1] / "simagent"
    refs = {m.group(1) for f in package.rglob("*.py")
            for m in re.finditer(r"README: ([A-Z][\w ]+)", f.read_text())}
    assert refs, "no README references found: the pattern is stale"
    assert refs <= _headings(), refs - _headings()
    proc = cli(workspace, "init", "--no-check")
    assert proc.returncode == 0, proc.stderr
    written = (workspace / ".simagent" / "config.toml").read_text()
    assert re.search(r"see README: Configuration", written)


def test_the_readme_names_every_bundled_simulator():
    from simagent.simulators import discover

    text = README.read_text()
    missing = [name for name in discover() if f"**{name}**" not in text]
    assert not missing, f"README does not name {missing}"


# ------------------------------------- item 7's class: a TUI opened and left
class _Tmux:
    """``simagent`` (the TUI) in a tmux pane: keys in, the pane's text back."""

    def __init__(self, command: str) -> None:
        import uuid

        self.sock = f"simagent-test-{uuid.uuid4().hex[:8]}"
        self.tmux("new-session", "-d", "-s", "tui", "-x", "110", "-y", "40",
                  f"{command}; echo SIMAGENT-EXITED-$?; sleep 30")

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.sock, *args], capture_output=True,
                              text=True, timeout=20).stdout

    def send(self, text: str) -> None:
        self.tmux("send-keys", "-t", "tui", "-l", text)
        self.tmux("send-keys", "-t", "tui", "Enter")

    def wait_for(self, text: str, timeout: float = 90.0) -> str:
        import time

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if text in (screen := self.tmux("capture-pane", "-p", "-J", "-t", "tui")):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"no {text!r}; the pane shows:\n"
                             + self.tmux("capture-pane", "-p", "-t", "tui"))

    def close(self) -> None:
        self.tmux("kill-server")


def _tui_command(workspace: Path, home: Path, model: str, prefix: list[str] = ()) -> str:
    import shlex

    return (f"cd {workspace} && env -u SIMAGENT_MODEL SIMAGENT_HOME={home} "
            f"TERM=xterm-256color {shlex.join([*prefix, *SIMAGENT, '--model', model])}")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_a_tui_left_without_a_word_leaves_no_session(workspace, tmp_path, _state_home):
    model = scripted(tmp_path, [{"final": "Hello there."}])

    def visit(words: str | None) -> None:
        pane = _Tmux(_tui_command(workspace, _state_home, model))
        try:
            pane.wait_for("kernel idle")
            if words:
                pane.send(words)
                pane.wait_for("Hello there.")
            pane.send("/quit")
            pane.wait_for("SIMAGENT-EXITED-0")
        finally:
            pane.close()

    visit(None)
    assert sessions(workspace) == []
    visit("hi")
    assert [s["turns"] for s in sessions(workspace)] == [1]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_the_tui_with_a_read_only_state_home_names_it(workspace, tmp_path, _state_home):
    prefix = _ro_mount_prefix(_state_home)
    if prefix is None:
        pytest.skip("no read-only mount possible here (unshare/mount refused)")
    pane = _Tmux(_tui_command(workspace, _state_home, scripted(tmp_path, [{"final": "x"}]),
                              prefix))
    try:
        screen = pane.wait_for("SIMAGENT-EXITED-2")
    finally:
        pane.close()
    text = " ".join(screen.split())
    assert f"cannot write simagent's state folder {_state_home}" in text, text
    assert "SIMAGENT_HOME" in text and "OSError" not in text


def test_the_tui_shows_a_huge_message_moved_to_a_file(workspace, tmp_path):
    """The same notice in the TUI as on headless stderr, from the same event."""
    from simagent.config import SessionOptions
    from simagent.tui.controller import TuiController
    from simagent.tui.entries import NoticeEntry

    model = scripted(tmp_path, [{"final": "Read it."}])
    ctl = TuiController(SessionOptions(workspace=workspace, model=model))
    try:
        assert ctl.open()
        assert ctl.submit("measure this:\n" + "0.125 0.25 0.5\n" * 20_000)
        ctl.wait(120)
        notes = [e.text for e in ctl.conversation.entries if isinstance(e, NoticeEntry)
                 and "your message" in e.text]
        assert len(notes) == 1, [getattr(e, "text", e) for e in ctl.conversation.entries]
        path = re.search(r"is saved to (\S+\.md);", notes[0]).group(1)
        assert Path(path).parent == ctl.session.paths.conversation_history
        assert Path(path).read_text().startswith("measure this:")
    finally:
        ctl.close()
