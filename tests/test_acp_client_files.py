"""``simagent acp`` reads and writes an editor's open buffers through the client.

The SDK's own client (``spawn_agent_process``) offers ``fs.readTextFile`` and
``fs.writeTextFile``; its buffer of a workspace file holds an unsaved edit the disk does
not. A scripted turn reads the file (the model gets the buffer's text), edits it (the
client receives the edited buffer, the disk is unchanged), and reads a file outside the
workspace, which waits for approval as before and, rejected, is never asked of the
client. Real command, graph, approval and trace; in-memory kernel (slow group). acpx, a
client nobody here wrote, serves the same file tools, and a write its person denies is
written nowhere.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import cli_fork
import pytest
from acp import PROTOCOL_VERSION
from acp.schema import (
    ClientCapabilities,
    FileSystemCapabilities,
    Implementation,
    ReadTextFileResponse,
    WriteTextFileResponse,
)
from test_acp_acpx import acpx_binary
from test_acp_protocol import WAIT_S, Recorder, prompt, run, script, start

from simagent.paths import SessionPaths
from simagent.trace import TraceLog

pytestmark = pytest.mark.slow

DISK = "k = 0.37\nhalf_life = 1.87\n"
BUFFER = "k = 0.37\nhalf_life = 1.8734  # unsaved\n"


class Editor(Recorder):
    """The SDK client with a file system: one buffer with unsaved edits, the disk for
    the rest (as an editor answers), and every request it got."""

    def __init__(self, buffers: dict[str, str], answers: list[str | None]) -> None:
        super().__init__(answers=answers)
        self.buffers = buffers
        self.reads: list[str] = []
        self.writes: list[tuple[str, str]] = []

    async def read_text_file(self, path: str, session_id: str, limit: int | None = None,
                             line: int | None = None, **kw: Any) -> ReadTextFileResponse:
        self.reads.append(path)
        text = self.buffers.get(path)
        return ReadTextFileResponse(content=text if text is not None
                                    else Path(path).read_text())

    async def write_text_file(self, content: str, path: str, session_id: str,
                              **kw: Any) -> WriteTextFileResponse | None:
        self.writes.append((path, content))
        self.buffers[path] = content
        return WriteTextFileResponse()


def test_a_turn_reads_and_edits_the_editors_buffer_not_the_disk(tmp_path, workspace):
    ws = workspace.resolve()
    target = ws / "decay.py"
    target.write_text(DISK)
    outside = tmp_path.resolve() / "outside.txt"
    outside.write_text("not the workspace's\n")
    model = script(tmp_path, [
        {"tool": "read_file", "args": {"file_path": "decay.py"}},
        {"tool": "edit_file", "args": {"file_path": "decay.py",
                                       "old_string": "1.8734  # unsaved",
                                       "new_string": "1.8734  # from log(2)/k"}},
        {"tool": "read_file", "args": {"file_path": str(outside)}},
        {"final": "edited"}])

    async def main() -> None:
        client = Editor({str(target): BUFFER}, answers=["reject_once"])
        async with await start(client, model, "--approval", "workspace") as (conn, proc):
            await asyncio.wait_for(conn.initialize(
                protocol_version=PROTOCOL_VERSION,
                client_capabilities=ClientCapabilities(fs=FileSystemCapabilities(
                    read_text_file=True, write_text_file=True)),
                client_info=Implementation(name="pytest-editor", version="0")), WAIT_S)
            sid = (await asyncio.wait_for(conn.new_session(cwd=str(ws), mcp_servers=[]),
                                          WAIT_S)).session_id
            r = await prompt(conn, sid, "fix the comment in decay.py")
            assert r.stop_reason == "end_turn"
            seen = client.take()
            done = [u for k, u in seen if k == "tool_call_update" and u.status == "completed"]
            assert "1.8734  # unsaved" in done[0].content[0].content.text
            # the outside read waited, was rejected, and never reached the client
            assert len(client.asked) == 1 and str(outside) in str(client.asked[0][0].raw_input)
            assert client.reads == [str(target), str(target)]  # the read, then the edit's
            assert client.writes == [(str(target),
                                      "k = 0.37\nhalf_life = 1.8734  # from log(2)/k\n")]
            assert target.read_text() == DISK
        assert proc.returncode == 0
        trace = TraceLog(SessionPaths.for_session(ws, sid).trace, readonly=True)
        try:
            results = [e.payload for e in trace.events(["tool_result"])]
            assert "half_life = 1.8734  # unsaved" in results[0]["content"]
            assert "half_life = 1.87\n" not in results[0]["content"]
            assert results[1]["status"] == "success"
            assert not trace.events(["client_files"])  # nothing fell back to the disk
        finally:
            trace.close()

    run(main())


# ------------------------------------------------------- a client nobody here wrote
def acpx_turn(tmp_path: Path, ws: Path, steps: list[dict[str, Any]], *flags: str
              ) -> subprocess.CompletedProcess[str]:
    """One ``acpx exec`` turn against ``simagent acp`` (acpx offers fs read and write)."""
    acpx = acpx_binary()
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    model = script(tmp_path, steps, name=f"acpx-{len(list(tmp_path.iterdir()))}.json")
    agent = shlex.join(cli_fork.command(["acp", "--model", model, "--approval", "auto"]))
    return subprocess.run([str(acpx), *flags, "--agent", agent, "exec", "change files"],
                          cwd=ws, env={**os.environ, "HOME": str(home)},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=300)


def test_acpx_serves_the_file_tools_and_its_denial_stands(tmp_path, workspace):
    """acpx answers fs/read_text_file and fs/write_text_file from its cwd; with
    --approve-all its writes land; without a terminal it denies each write, and then
    simagent writes nothing either and the model is told so."""
    ws = workspace.resolve()
    (ws / "a.py").write_text("k = 1\n")
    steps = [{"tool": "read_file", "args": {"file_path": "a.py"}},
             {"tool": "edit_file", "args": {"file_path": "a.py", "old_string": "k = 1",
                                            "new_string": "k = 3"}},
             {"tool": "write_file", "args": {"file_path": "b.py", "content": "b = 2\n"}},
             {"final": "done"}]
    denied = acpx_turn(tmp_path, ws, steps)
    out = denied.stdout
    assert "[client] fs/read_text_file" in out and "[client] fs/write_text_file" in out, out
    assert out.count("simagent did not write it either") == 2, out
    assert (ws / "a.py").read_text() == "k = 1\n" and not (ws / "b.py").exists()

    done = acpx_turn(tmp_path, ws, steps, "--approve-all")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stdout.count("[client] fs/write_text_file") == 2, done.stdout
    assert (ws / "a.py").read_text() == "k = 3\n"
    assert (ws / "b.py").read_text() == "b = 2\n"
