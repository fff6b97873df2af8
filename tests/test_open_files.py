"""The file tools' open-buffer seam (``agent.backend.OpenFiles``) and its ACP port.

The back end reads and writes a workspace file through the editor's buffers when a
front end hands it them, and never for a path confinement keeps on the disk's rules
(outside the workspace, a link pointing out, a read-only place, the session's state).
``Buffers`` here is a stand-in editor: the seam is simagent's own, so a small object
that keeps texts is the honest other side. ``ClientFiles`` runs against a real event
loop on a thread with a connection object whose requests fail or hang, as a client's
can; the SDK client itself is in ``test_acp_protocol.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from acp import RequestError
from acp.schema import ClientCapabilities, FileSystemCapabilities

from simagent.acp.client_files import ClientFiles, offered
from simagent.agent.backend import ON_DISK, WorkspaceBackend
from simagent.agent.builder import build_agent
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.session import Session

DISK = "alpha = 1\nbeta = 2\n"
BUFFER = "alpha = 1\nbeta = 3  # unsaved\n"


class Buffers:
    """An editor: the texts it holds open, the writes it took, the paths it refuses."""

    def __init__(self, held: dict[str, str] | None = None, refuse: tuple[str, ...] = (),
                 deny: tuple[str, ...] = ()):
        self.held = dict(held or {})
        self.refuse = refuse
        self.deny = deny
        self.asked: list[tuple[str, str]] = []
        self.writes: list[tuple[str, str]] = []

    def read(self, path: str) -> str | None:
        self.asked.append(("read", path))
        return self.held.get(path)

    def write(self, path: str, text: str) -> bool | str:
        self.asked.append(("write", path))
        if path.endswith(self.deny):
            return f"the person said no to {path}"
        if path.endswith(self.refuse):
            return False
        self.writes.append((path, text))
        self.held[path] = text
        return True


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path.resolve()
    ws, out = root / "ws", root / "out"
    (ws / "sub").mkdir(parents=True)
    out.mkdir()
    (ws / "sub" / "m.py").write_text(DISK)
    (out / "o.py").write_text(DISK)
    (ws / "linkout").symlink_to(out / "o.py")
    return ws, out


def test_reads_edits_and_writes_of_a_workspace_file_go_through_the_buffers(tree):
    ws, _out = tree
    path = str(ws / "sub" / "m.py")
    editor = Buffers({path: BUFFER})
    backend = WorkspaceBackend(ws, open_files=editor)

    read = backend.read("sub/m.py")  # a relative spelling lands on the same file
    assert read.file_data["content"] == BUFFER
    assert backend.read(path, offset=1, limit=1).file_data["content"] == \
        "beta = 3  # unsaved\n"

    edit = backend.edit(path, "beta = 3", "beta = 4")
    assert edit.error is None and edit.path == path and edit.occurrences == 1
    assert editor.writes == [(path, "alpha = 1\nbeta = 4  # unsaved\n")]
    # a string only the disk holds is not there: the edit is on what the person sees
    assert "not found" in backend.edit(path, "beta = 2", "x").error.lower()
    assert backend.write(path, "new\n").path == path
    assert editor.held[path] == "new\n"
    assert (ws / "sub" / "m.py").read_text() == DISK  # the disk untouched throughout


def test_a_file_the_editor_does_not_hold_or_refuses_is_the_disks(tree):
    ws, _out = tree
    nb = ws / "n.ipynb"
    nb.write_text("{}\n")
    editor = Buffers({str(nb): '{"cells": []}\n'}, refuse=(".ipynb",))
    backend = WorkspaceBackend(ws, open_files=editor)

    assert backend.read(str(ws / "sub" / "m.py")).file_data["content"] == DISK  # not held
    assert backend.edit(str(ws / "sub" / "m.py"), "beta = 2", "beta = 5").path == \
        str(ws / "sub" / "m.py")
    assert (ws / "sub" / "m.py").read_text() == "alpha = 1\nbeta = 5\n"

    # JupyterLab refuses .ipynb writes: the disk takes it, and the result says so
    written = backend.write(str(nb), '{"cells": [1]}\n')
    assert written.error is None and written.path == f"{nb} {ON_DISK}"
    assert nb.read_text() == '{"cells": [1]}\n'
    edited = backend.edit(str(nb), "[]", "[2]")  # read from the buffer, refused there
    assert edited.path == f"{nb} {ON_DISK}" and nb.read_text() == '{"cells": [2]}\n'


def test_a_write_the_editors_person_denied_is_written_nowhere(tree):
    ws, _out = tree
    path = ws / "sub" / "m.py"
    editor = Buffers({str(path): BUFFER}, deny=(".py",))
    backend = WorkspaceBackend(ws, open_files=editor)
    assert backend.write(str(path), "x\n").error == f"the person said no to {path}"
    assert backend.edit(str(path), "beta = 3", "beta = 4").error == \
        f"the person said no to {path}"
    assert backend.write(str(ws / "new.py"), "x\n").error is not None
    assert path.read_text() == DISK and not (ws / "new.py").exists()
    assert editor.writes == []


def test_confinement_keeps_the_editor_out_of_what_it_keeps_on_the_disks_rules(tree):
    """Outside the workspace, a link pointing out, the state folder, a read-only place,
    a file with a second name, a binary file: the editor is never asked, and a refused
    change is refused as before."""
    ws, out = tree
    state, ro = ws / "state", ws / "ro"
    state.mkdir()
    ro.mkdir()
    (state / "s.txt").write_text(DISK)
    (ro / "r.py").write_text(DISK)
    (ws / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (ws / "twice.py").write_text(DISK)
    (out / "twice.py").hardlink_to(ws / "twice.py")
    held = {str(p): BUFFER for p in (out / "o.py", state / "s.txt", ro / "r.py",
                                     ws / "twice.py", ws / "img.png")}
    editor = Buffers(held)
    backend = WorkspaceBackend(ws, read_only=[ro], state_dir=state, open_files=editor)

    for path in (out / "o.py", ws / "linkout", state / "s.txt", ro / "r.py",
                 ws / "twice.py"):
        assert backend.read(str(path)).file_data["content"] == DISK, path
    assert backend.read(str(ws / "img.png")).file_data["encoding"] == "base64"
    assert "read-only" in backend.edit(str(ro / "r.py"), "beta", "b").error
    assert "read-only" in backend.write(str(ro / "r.py"), "x").error
    backend.write(str(out / "o.py"), "out\n")  # approval decided; the disk's rules act
    backend.edit("linkout", "out", "still out")  # relative: resolved through the link
    assert (out / "o.py").read_text() == "still out\n"
    assert editor.asked == []


def test_the_graph_reads_the_buffer_and_edits_it(tree):
    """Through the real graph (scripted model, in-memory kernel): the model's read_file
    result is the buffer's text, its edit_file reaches the editor, the disk stays."""
    ws, _out = tree
    path = str(ws / "sub" / "m.py")
    editor = Buffers({path: BUFFER})
    steps = [{"tool": "read_file", "args": {"file_path": "sub/m.py"}},
             {"tool": "edit_file", "args": {"file_path": "sub/m.py",
                                            "old_string": "beta = 3",
                                            "new_string": "beta = 4"}},
             {"final": "done"}]
    session = Session.create(ws, approval="auto")
    try:
        runner = TurnRunner(session, build_agent(session, ScriptedChatModel.from_steps(steps),
                                                 open_files=editor))
        assert runner.run("look and fix").status == "done"
        results = [e.payload for e in session.trace.events(["tool_result"])]
        assert "beta = 3  # unsaved" in results[0]["content"], results[0]
        assert results[1]["status"] == "success", results[1]
        assert editor.writes == [(path, "alpha = 1\nbeta = 4  # unsaved\n")]
        assert (ws / "sub" / "m.py").read_text() == DISK
    finally:
        session.close()


# ----------------------------------------------------------- the ACP port
class Conn:
    """A client connection's fs methods: a read that fails, one that never answers, a
    write refused for ``.ipynb`` (JupyterLab's words), one its person denied (acpx's),
    one never answered."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str]] = []

    async def read_text_file(self, session_id: str, path: str, **kw: Any) -> Any:
        if path.endswith("slow.py"):
            await asyncio.sleep(30)
        if path.endswith("gone.py"):
            raise RequestError(-32603, "no such buffer")
        return type("Answer", (), {"content": f"buffer of {path}"})()

    async def write_text_file(self, session_id: str, path: str, content: str,
                              **kw: Any) -> None:
        if path.endswith(".ipynb"):
            raise RequestError.invalid_params(
                {"path": "writing .ipynb files directly is not allowed; use the Jupyter "
                         "notebook MCP tools"})
        if path.endswith("no.py"):
            raise RequestError.internal_error(
                {"details": "Permission denied for fs/write_text_file"})
        if path.endswith("slow.py"):
            await asyncio.sleep(30)
        self.writes.append((path, content))


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)
    loop.close()


def test_the_client_port_falls_back_to_the_disk_and_says_so(loop):
    notes: list[dict[str, Any]] = []
    conn = Conn()
    files = ClientFiles(conn, loop, "s1", read=True, write=True, note=notes.append,
                        read_timeout_s=0.3, write_timeout_s=0.3)
    assert files.read("/w/a.py") == "buffer of /w/a.py"
    assert files.read("/w/gone.py") is None and files.read("/w/gone.py") is None
    assert [n["op"] for n in notes] == ["read"]  # a failed read is said once
    assert "no such buffer" in notes[0]["reason"]
    assert files.write("/w/a.py", "x") is True and conn.writes == [("/w/a.py", "x")]
    # JupyterLab does not take a notebook: the disk does
    assert files.write("/w/n.ipynb", "{}") is False
    assert notes[-1]["then"] == "disk" and "notebook MCP tools" in notes[-1]["reason"]
    # acpx's person (or its --deny-all) said no: nothing is written, and the model is told
    denied = files.write("/w/no.py", "x")
    assert isinstance(denied, str) and "Permission denied" in denied
    assert notes[-1]["then"] == "refused"

    t0 = time.monotonic()
    late = files.write("/w/slow.py", "y")  # no answer: bounded, not overruled on disk
    assert isinstance(late, str) and "no answer" in late
    assert time.monotonic() - t0 < 5
    assert files.read("/w/a.py") is None and files.write("/w/a.py", "y") is False
    assert conn.writes == [("/w/a.py", "x")]


def test_a_read_without_an_answer_is_bounded_and_the_client_not_asked_again(loop):
    conn = Conn()
    files = ClientFiles(conn, loop, "s1", read=True, write=True, note=lambda p: None,
                        read_timeout_s=0.3)
    t0 = time.monotonic()
    assert files.read("/w/slow.py") is None
    assert time.monotonic() - t0 < 5
    assert files.read("/w/a.py") is None and files.write("/w/a.py", "y") is False
    assert conn.writes == []


def test_only_what_initialize_offered_is_used(loop):
    assert offered(None) == (False, False)
    assert offered(ClientCapabilities()) == (False, False)
    caps = ClientCapabilities(fs=FileSystemCapabilities(read_text_file=True))
    assert offered(caps) == (True, False)
    conn = Conn()
    files = ClientFiles(conn, loop, "s1", read=True, write=False, note=lambda p: None)
    assert files.write("/w/a.py", "x") is False and conn.writes == []
