"""``simagent mcp`` end to end: the real CLI as a subprocess, driven by the MCP SDK's own
clients (stdio and streamable HTTP), a real kernel behind it, the trace read after.

Every request is bounded (the client session's read timeout and ``anyio.fail_after``);
the servers stop when their client leaves, which the worker's leak check holds them to.
"""

from __future__ import annotations

import base64
import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import cli_fork
import httpx
import pytest
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_http import SIMAGENT, serving

from simagent.context.thresholds import TOOL_CAP_CHARS
from simagent.mcp_server import ops

#: Bound on any one request (a kernel start and the scipy warm-up included).
CALL_S = 240


def _text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


@asynccontextmanager
async def _stdio(workspace: Path, errlog: Path, *args: str) -> AsyncIterator[ClientSession]:
    line = cli_fork.command(["mcp", "--workspace", str(workspace), *args])
    params = StdioServerParameters(command=line[0], args=line[1:], env=dict(os.environ))
    with open(errlog, "w") as err:
        async with stdio_client(params, errlog=err) as (read, write), \
                ClientSession(read, write, read_timeout_seconds=timedelta(seconds=CALL_S)) as s:
            with anyio.fail_after(CALL_S):
                await s.initialize()
            yield s


def _events(workspace: Path) -> list[tuple[str, dict[str, Any]]]:
    from simagent.trace.sessions import find_session

    db = sqlite3.connect(find_session(workspace, None) / "trace.sqlite")
    try:
        return [(k, json.loads(p)) for k, p in db.execute("SELECT kind, payload FROM events "
                                                          "ORDER BY id")]
    finally:
        db.close()


async def _cancel_when(s: ClientSession, code: str, started: str, notify: bool = True) -> None:
    """Call run_python, and once its streamed output shows ``started``, cancel the
    request as a host does: drop the wait and send ``notifications/cancelled``
    (mcp 1.30's client sends none by itself); ``notify=False`` only drops the wait."""
    seen = anyio.Event()

    async def progress(_p: float, _t: float | None, message: str | None) -> None:
        if message and started in message:
            seen.set()

    request_id = s._request_id  # the id the next request gets
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: s.call_tool("run_python", {"code": code},
                                          progress_callback=progress))
        with anyio.fail_after(CALL_S):
            await seen.wait()
        tg.cancel_scope.cancel()
    if not notify:
        return
    await s.send_notification(types.ClientNotification(types.CancelledNotification(
        params=types.CancelledNotificationParams(requestId=request_id, reason="test"))))


@pytest.mark.real
def test_stdio_runs_cells_caps_greps_reports_progress_and_cancels(workspace: Path,
                                                                  tmp_path: Path) -> None:
    async def main() -> dict[str, Any]:
        got: dict[str, Any] = {}
        async with _stdio(workspace, tmp_path / "server.err") as s:
            tools = (await s.list_tools()).tools
            got["tools"] = {t.name: t.description or "" for t in tools}
            got["first"] = _text(await s.call_tool("run_python", {"code": "x = 41\nprint(x + 1)"}))
            messages: list[str] = []

            async def progress(_p: float, _t: float | None, message: str | None) -> None:
                messages.append(message or "")

            got["tqdm"] = _text(await s.call_tool("run_python", {
                "code": "from tqdm import tqdm\nimport time\n"
                        "for i in tqdm(range(12)): time.sleep(0.05)"},
                progress_callback=progress))
            got["progress"] = messages
            got["big"] = _text(await s.call_tool("run_python", {
                "code": "import sys\nfor i in range(0, 500_000, 1000):\n"
                        "    sys.stdout.write(''.join(f'row {j} ' + 'x' * 90 + '\\n' "
                        "for j in range(i, i + 1000)))"}))
            n = int(re.search(r"_out\[(\d+)\]", got["big"])[1])
            got["grep"] = _text(await s.call_tool("output", {"n": n, "op": "grep",
                                                             "arg": "^row 250000 "}))
            got["tail"] = _text(await s.call_tool("output", {"n": -1, "op": "tail", "arg": "1"}))
            await _cancel_when(s, "y = 5\nprint('spinning', flush=True)\nwhile True: pass",
                               "spinning")
            got["after"] = _text(await s.call_tool("run_python", {"code": "print(x, y)"}))
            got["state"] = _text(await s.call_tool("state", {}))
            # the client leaves while a cell runs: the cell is interrupted and traced
            # before the session closes and its kernel stops
            await _cancel_when(s, "print('leaving', flush=True)\nwhile True: pass", "leaving",
                               notify=False)
        return got

    got = anyio.run(main)
    assert set(got["tools"]) == set(ops.TOOLS)
    assert all(0 < len(d) < 500 and "\n" not in d and "  " not in d  # short, one line
               for d in got["tools"].values())
    assert got["first"] == "42"
    # progress: the tqdm bar's redraws arrived while it ran; the result is its final state
    assert len(got["progress"]) >= 2 and any("it/s" in m for m in got["progress"])
    assert "12/12" in got["tqdm"] and got["tqdm"].count("it/s") == 1
    # 50 MB printed: the answer is within the agent's cap, marker included, and names
    # the raw file
    raw = re.search(r"full output: (\S+\.txt)", got["big"])[1]
    assert Path(raw).stat().st_size > 48_000_000
    assert len(got["big"]) <= TOOL_CAP_CHARS, len(got["big"])
    assert "row 499999 " in got["big"] and "row 250000 " not in got["big"]
    assert got["grep"].splitlines()[1].startswith(" 250001: row 250000 xxx")
    assert got["tail"].splitlines()[1].startswith(" 500000: row 499999 ")
    # the cancelled busy loop was interrupted and its variable kept
    assert got["after"] == "41 5"
    assert "- y = 5 (int)" in got["state"] and "- x = 41 (int)" in got["state"]

    events = _events(workspace)
    assert events[0][0] == "session_start" and events[0][1]["model"] == ops.SESSION_MODEL
    calls = [p for k, p in events if k == "tool_call"]
    results = {p["tool_call_id"]: p for k, p in events if k == "tool_result"}
    assert [c["name"] for c in calls] == ["run_python"] * 3 + ["output"] * 2 + \
        ["run_python"] * 2 + ["state", "run_python"]
    assert all(c["id"] in results for c in calls)  # each call has its result
    spin = next(c["id"] for c in calls if "spinning" in c["args"].get("code", ""))
    assert results[spin]["outcome"] == "interrupted"
    execs = {p["tool_call_id"]: p for k, p in events if k == "kernel_exec"}
    assert execs[spin]["status"] == "interrupted"
    assert results[calls[-1]["id"]]["outcome"] == "interrupted"  # the one running at exit
    assert events[-1][0] == "session_end"  # the kernel stopped when the client left
    md = cli_fork.run([SIMAGENT, "transcript", "--workspace", str(workspace), "-o", "-"],
                      capture_output=True, text=True, timeout=120)
    assert md.returncode == 0, md.stderr
    assert "print(x, y)" in md.stdout and "41 5" in md.stdout


@pytest.mark.real
def test_stdio_bad_input_gives_one_clear_error_and_the_session_goes_on(
        workspace: Path, tmp_path: Path) -> None:
    async def main() -> list[tuple[bool, str]]:
        out = []
        async with _stdio(workspace, tmp_path / "server.err") as s:
            for name, args in [
                    ("run_python", {"code": "x = 41"}),
                    ("no_such_tool", {}),
                    ("output", {"n": "first", "op": "head"}),
                    ("run_python", {}),
                    ("output", {"n": 1, "op": "sed"}),
                    ("run_python", {"code": "name = input('name? ')"}),
                    ("run_python", {"code": "import os\nos._exit(3)"}),
                    ("run_python", {"code": "print(x + 1)"})]:
                r = await s.call_tool(name, args)
                out.append((r.isError, _text(r)))
            # figures and raw outputs by tool and by resource URI
            plot = _text(await s.call_tool("run_python", {"code": (
                "import matplotlib.pyplot as plt\nplt.plot([0, 1, 2], [3, 5, 4])\n"
                "plt.xlabel('t [s]'); plt.show()\nprint('plotted')")}))
            fig = await s.call_tool("figure", {"n": "-1"})
            fid = re.search(r"\[figure (fig-\w+)", plot)[1]
            n = int(re.search(r"_out\[(\d+)\]", (await s.call_tool(
                "output", {"n": -1, "op": "head"})).content[0].text)[1])
            raw = await s.read_resource(f"simagent://outputs/{n}")
            image = await s.read_resource(f"simagent://figures/{fid}")
            outside = await s.call_tool("figure", {"n": "../../trace.sqlite"})
            out.append((plot, fig, raw, image, outside))
        return out

    (ok, first), unknown, bad_n, no_code, bad_op, stdin, died, after, figs = anyio.run(main)
    assert not ok and first == "(no output)"
    assert unknown == (True, "Unknown tool: no_such_tool")
    assert bad_n == (True, "Error executing tool output: n must be an integer, not 'first'")
    assert no_code == (True, "Error executing tool run_python: code is required: a string")
    assert bad_op[0] and "op must be one of head, tail, grep, slice, not 'sed'" in bad_op[1]
    assert "input() and getpass() are unavailable" in stdin[1]
    assert "kernel process exited with code 3" in died[1]
    # the next request restarts the kernel and replays the cell that defined x
    assert after[1].startswith("42\n") and "restarted" in after[1] and not after[0]

    plot, fig, raw, image, outside = figs
    assert plot.startswith("plotted\n[figure fig-") and "axes: x \"t [s]\"" in plot
    assert [c.type for c in fig.content] == ["text", "image"] and not fig.isError
    assert fig.content[0].text.startswith("[figure fig-") and "t [s]" in fig.content[0].text
    assert base64.b64decode(fig.content[1].data).startswith(b"\x89PNG")
    assert raw.contents[0].text.startswith("[figure fig-")  # the raw file, uncapped
    assert raw.contents[0].text.endswith("\nplotted\n")
    assert base64.b64decode(image.contents[0].blob).startswith(b"\x89PNG")
    assert outside.isError and "no figure '../../trace.sqlite'" in _text(outside)

    events = _events(workspace)
    calls = [p for k, p in events if k == "tool_call"]
    results = {p["tool_call_id"]: p for k, p in events if k == "tool_result"}
    assert len(calls) == 12 and all(c["id"] in results for c in calls)
    assert [results[c["id"]]["status"] for c in calls] == \
        ["success", "error", "error", "error", "error", "success", "success", "success",
         "success", "success", "success", "error"]
    assert any(k == "kernel_recovery" for k, _ in events)


@pytest.mark.slow
def test_ask_mode_refuses_code_and_says_which_flag(workspace: Path, tmp_path: Path) -> None:
    async def main() -> types.CallToolResult:
        async with _stdio(workspace, tmp_path / "server.err", "--approval", "ask") as s:
            return await s.call_tool("run_python", {"code": "open('ran.txt', 'w').write('x')"})

    result = anyio.run(main)
    assert result.isError and "--approval workspace" in _text(result)
    assert not (workspace / "ran.txt").exists()


@pytest.mark.slow
def test_http_needs_the_token_and_runs_nothing_without_it(workspace: Path,
                                                           tmp_path: Path) -> None:
    token = "t0ken-for-the-test-1234"
    write_file = "open('ran.txt', 'w').write('ran')"
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "run_python", "arguments": {"code": write_file}}}
    accept = {"Accept": "application/json, text/event-stream"}
    with serving(workspace, tmp_path / "server.err", token) as url:
        async def main() -> dict[str, Any]:
            got: dict[str, Any] = {}
            got["no token"] = httpx.post(url, json=call, headers=accept, timeout=10)
            got["wrong token"] = httpx.post(url, json=call, timeout=10, headers={
                **accept, "Authorization": f"Bearer {token}x"})
            got["file after refusals"] = (workspace / "ran.txt").exists()
            messages: list[str] = []

            async def progress(_p: float, _t: float | None, message: str | None) -> None:
                messages.append(message or "")

            headers = {"Authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=CALL_S)
                                         ) as http, \
                    streamable_http_client(url, http_client=http) as (read, write, _), \
                    ClientSession(read, write,
                                  read_timeout_seconds=timedelta(seconds=CALL_S)) as s:
                with anyio.fail_after(CALL_S):
                    await s.initialize()
                got["tools"] = [t.name for t in (await s.list_tools()).tools]
                got["tqdm"] = _text(await s.call_tool("run_python", {
                    "code": "from tqdm import tqdm\nimport time\n"
                            "for i in tqdm(range(12)): time.sleep(0.05)\n" + write_file},
                    progress_callback=progress))
                got["progress"] = messages
                await _cancel_when(s, "z = 7\nprint('spinning', flush=True)\nwhile True: pass",
                                   "spinning")
                got["after"] = _text(await s.call_tool("run_python", {"code": "print(z)"}))
            # a second MCP session gets its own simagent session and kernel
            async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=CALL_S)
                                         ) as http, \
                    streamable_http_client(url, http_client=http) as (read, write, _), \
                    ClientSession(read, write,
                                  read_timeout_seconds=timedelta(seconds=CALL_S)) as s:
                with anyio.fail_after(CALL_S):
                    await s.initialize()
                got["second"] = _text(await s.call_tool("run_python",
                                                        {"code": "print('z' in dir())"}))
            return got

        got = anyio.run(main)
    assert got["no token"].status_code == 401 and got["wrong token"].status_code == 401
    assert got["file after refusals"] is False  # refused requests ran nothing
    assert token not in (tmp_path / "server.err").read_text()  # from the env: not printed
    assert set(got["tools"]) == set(ops.TOOLS)
    assert "12/12" in got["tqdm"] and any("it/s" in m for m in got["progress"])
    assert (workspace / "ran.txt").read_text() == "ran"  # the authorised call ran
    assert got["after"] == "7"
    assert got["second"] == "False"
    from simagent.trace.sessions import sessions_dir

    sessions = [p for p in sessions_dir(workspace).iterdir() if p.is_dir()]
    assert len(sessions) == 2
    for folder in sessions:  # each MCP session's kernel stopped when its client left
        db = sqlite3.connect(folder / "trace.sqlite")
        try:
            assert db.execute("SELECT kind FROM events ORDER BY id DESC").fetchone()[0] == \
                "session_end"
        finally:
            db.close()


@pytest.mark.slow
@pytest.mark.parametrize("args", [["--http", "nope"], ["--sim", "no-such-simulator"]])
def test_bad_command_lines_fail_in_one_line(workspace: Path, args: list[str]) -> None:
    done = cli_fork.run([SIMAGENT, "mcp", "--workspace", str(workspace), *args],
                        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("simagent: error: ") and done.stderr.count("\n") == 1


@pytest.mark.real
@pytest.mark.slow
def test_a_client_no_one_here_wrote_runs_a_cell(workspace: Path) -> None:
    """The MCP Inspector's CLI (npm, pinned: later releases need node 22) as the host."""
    import shutil

    npx = shutil.which("npx")
    if npx is None:
        pytest.skip("npx is not installed")
    server = cli_fork.command(["mcp", "--workspace", str(workspace)])
    done = subprocess.run([npx, "-y", "@modelcontextprotocol/inspector@0.15.0", "--cli",
                           *server, "--method", "tools/call", "--tool-name", "run_python",
                           "--tool-arg", "code=print(6 * 7)"],
                          capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0 and re.search(r"ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ETIMEDOUT",
                                          done.stderr):
        pytest.skip("npm's registry is not reachable for npx")
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout[done.stdout.index("{"):])
    assert answer == {"content": [{"type": "text", "text": "42"}], "isError": False}


_NOISY_SERVER = """
import os, sys
from simagent.mcp_server.server import build_server, serve_stdio
from simagent.session import Session
mcp = build_server(lambda: Session.create(sys.argv[1], approval="workspace"))
@mcp.tool()
def noisy() -> str:
    "Writes to stdout the ways stray debug output does."
    print("stray print", flush=True)
    os.write(1, b"raw write to fd 1\\n")
    print("glued to the next line", end="", flush=True)
    return "the answer"
serve_stdio(mcp)
"""


@pytest.mark.slow
def test_stray_stdout_in_the_server_cannot_corrupt_the_protocol(workspace: Path,
                                                                 tmp_path: Path) -> None:
    """On stdio, stdout is the protocol: a print (even one without a newline, which would
    glue onto the next response) or a raw write to fd 1 lands in stderr instead."""
    params = StdioServerParameters(command=sys.executable, env=dict(os.environ),
                                   args=["-c", _NOISY_SERVER, str(workspace)])

    async def main() -> list[str]:
        with open(tmp_path / "server.err", "w") as err:
            async with stdio_client(params, errlog=err) as (read, write), \
                    ClientSession(read, write, read_timeout_seconds=timedelta(seconds=60)) as s:
                with anyio.fail_after(CALL_S):
                    await s.initialize()
                return [_text(await s.call_tool("noisy", {})) for _ in range(2)]

    assert anyio.run(main) == ["the answer", "the answer"]
    err = (tmp_path / "server.err").read_text()
    assert "stray print" in err and "raw write to fd 1" in err
