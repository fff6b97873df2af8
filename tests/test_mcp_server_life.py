"""``simagent mcp`` over the SDK's stdio client: ``restore`` and ``reset``, a figure
resource's MIME type, a cancel that arrives while the kernel is still starting, and
``simagent transcript`` / ``simagent notebook`` reading the MCP session afterwards.

Real CLI subprocess, real kernel; every wait is bounded (``anyio.fail_after``, the
client's read timeout, subprocess timeouts).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import anyio
import cli_fork
import httpx
import nbformat
import psutil
import pytest
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from test_mcp_server import CALL_S, SIMAGENT, _events, _stdio, _text

from simagent.mcp_server import ops

_SVG = ('<svg xmlns="http://www.w3.org/2000/svg" width="20" height="10">'
        '<rect width="20" height="10" fill="teal"/></svg>')


@pytest.mark.real
def test_restore_replays_reset_clears_and_the_session_exports(workspace: Path,
                                                              tmp_path: Path) -> None:
    async def main() -> dict[str, object]:
        got: dict[str, object] = {}
        async with _stdio(workspace, tmp_path / "server.err") as s:
            await s.call_tool("run_python", {"code": "import math\nx = 41\ny = math.sqrt(16)"})
            await s.call_tool("run_python", {"code": f"from IPython.display import SVG, "
                                                     f"display\ndisplay(SVG({_SVG!r}))"})
            got["died"] = _text(await s.call_tool("run_python",
                                                  {"code": "import os\nos._exit(3)"}))
            got["restore"] = await s.call_tool("restore", {})
            got["after restore"] = _text(await s.call_tool("run_python",
                                                           {"code": "print(x + 1, y)"}))
            templates = (await s.list_resource_templates()).resourceTemplates
            got["templates"] = {t.uriTemplate: t.mimeType for t in templates}
            fid = next(p["id"] for k, p in _events(workspace)
                       if k == "artifact" and p.get("id"))
            got["svg"] = (await s.read_resource(f"simagent://figures/{fid}")).contents[0]
            got["figure 1"] = await s.call_tool("figure", {"n": 1})  # a number, as it says
            got["bad op"] = _text(await s.call_tool("output", {"n": -1, "op": "sed"}))
            got["reset"] = await s.call_tool("reset", {})
            got["after reset"] = _text(await s.call_tool("run_python",
                                                         {"code": "print('x' in dir())"}))
            await s.call_tool("run_python", {"code": "z = 7"})
        return got

    got = anyio.run(main)
    assert "kernel process exited with code 3" in got["died"]
    # restore: restarted and replayed the state-defining cells; the next cell needs no
    # recovery of its own (no restart notice) and finds the variables
    restore = got["restore"]
    assert not restore.isError and "replayed" in _text(restore), _text(restore)
    assert got["after restore"] == "42 4.0"
    # reset: says what it did, and the variables are gone
    reset = got["reset"]
    assert not reset.isError and "every variable" in _text(reset) and "gone" in _text(reset)
    assert got["after reset"] == "False"
    # the figure resource is labelled by what the file is (an SVG here, not PNG)
    assert got["templates"][ops.FIGURE_URI] is None
    assert got["svg"].mimeType == "image/svg+xml"
    assert got["svg"].uri.scheme == "simagent"
    figure = got["figure 1"]
    assert not figure.isError and _text(figure).startswith("[figure fig-")
    assert "(no image sent: .svg is not PNG or JPEG)" in _text(figure)
    # an error names its tool once (the SDK heads it "Error executing tool NAME:")
    assert got["bad op"] == ("Error executing tool output: op must be one of head, tail, "
                             "grep, slice, not 'sed'")

    events = _events(workspace)
    recoveries = [p for k, p in events if k == "kernel_recovery"]
    assert [r.get("trigger") for r in recoveries] == ["restore"], recoveries
    # the MCP session reads back as any session does
    md = cli_fork.run([SIMAGENT, "transcript", "--workspace", str(workspace), "-o", "-"],
                      capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert md.returncode == 0, md.stderr
    assert "print(x + 1, y)" in md.stdout and "42 4.0" in md.stdout
    assert "restore" in md.stdout and "reset" in md.stdout
    nb_path = tmp_path / "mcp.ipynb"
    nb = cli_fork.run([SIMAGENT, "notebook", "--workspace", str(workspace), "-o",
                       str(nb_path)], capture_output=True, text=True, timeout=120,
                      stdin=subprocess.DEVNULL)
    assert nb.returncode == 0, nb.stderr
    notebook = nbformat.read(nb_path, as_version=4)
    nbformat.validate(notebook)
    sources = [c.source for c in notebook.cells if c.cell_type == "code"]
    headings = [c.source for c in notebook.cells if c.cell_type == "markdown"]
    # the cell after the reset defines the state; the earlier ones are kept apart
    assert "z = 7" in sources and "import math\nx = 41\ny = math.sqrt(16)" in sources
    assert any("Before a /reset" in h for h in headings), headings
    assert sources.index("import math\nx = 41\ny = math.sqrt(16)") < sources.index("z = 7")


_HOLD = """
import os, signal, sys, time
hold = os.environ.get("SIMAGENT_TEST_HOLD")
if hold and "simagent.kernel.launcher" in sys.orig_argv:
    # a kernel that takes its time to start, as a loaded machine's does: SIGINT has
    # nothing to interrupt yet
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    open(os.path.join(hold, "starting"), "w").close()
    deadline = time.monotonic() + 300
    while not os.path.exists(os.path.join(hold, "go")) and time.monotonic() < deadline:
        time.sleep(0.05)
    signal.signal(signal.SIGINT, old)
"""


@pytest.mark.real
def test_a_cancel_while_the_kernel_starts_means_the_cell_never_runs(workspace: Path,
                                                                    tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    hold.mkdir()
    (hold / "sitecustomize.py").write_text(_HOLD)
    env = {**os.environ, "SIMAGENT_TEST_HOLD": str(hold),
           "PYTHONPATH": os.pathsep.join([str(hold), os.environ.get("PYTHONPATH", "")])}
    # PYTHONPATH acts in the kernel's launcher, a fresh interpreter simagent starts with
    # this environment, not in simagent itself: a forked simagent passes it on the same
    line = cli_fork.command(["mcp", "--workspace", str(workspace)])
    params = StdioServerParameters(command=line[0], args=line[1:], env=env)

    async def wait_for(check: Callable[[], bool]) -> None:
        with anyio.fail_after(CALL_S):
            while not check():
                await anyio.sleep(0.05)

    def cancelled() -> bool:
        return any(k == "tool_cancelled" for k, _ in _events(workspace))

    async def main() -> str:
        with open(tmp_path / "server.err", "w") as err:
            async with stdio_client(params, errlog=err) as (read, write), \
                    ClientSession(read, write) as s:
                with anyio.fail_after(CALL_S):
                    await s.initialize()
                request_id = s._request_id  # the id the next request gets
                async with anyio.create_task_group() as tg:
                    tg.start_soon(lambda: s.call_tool(
                        "run_python", {"code": "open('ran.txt', 'w').write('ran')"}))
                    await wait_for((hold / "starting").exists)
                    tg.cancel_scope.cancel()
                await s.send_notification(types.ClientNotification(types.CancelledNotification(
                    params=types.CancelledNotificationParams(requestId=request_id,
                                                             reason="test"))))
                await wait_for(cancelled)  # the server has the cancel: let the kernel up
                (hold / "go").touch()
                with anyio.fail_after(CALL_S):
                    return _text(await s.call_tool("run_python", {
                        "code": "import os\nprint(os.path.exists('ran.txt'))"}))

    assert anyio.run(main) == "False"
    assert not (workspace / "ran.txt").exists()
    events = _events(workspace)
    stop = next(p for k, p in events if k == "tool_cancelled")
    assert stop["stage"] == "starting"
    result = next(p for k, p in events
                  if k == "tool_result" and p["tool_call_id"] == stop["tool_call_id"])
    assert result["status"] == "error"
    assert "not run: the request was cancelled while the kernel was starting" in \
        result["content"]
    assert stop["tool_call_id"] not in {p.get("tool_call_id") for k, p in events
                                        if k == "kernel_exec"}


@pytest.mark.slow
def test_a_port_in_use_fails_in_one_line_before_any_announcement(workspace: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli_fork.run([SIMAGENT, "mcp", "--workspace", str(workspace), "--http",
                             str(port)], capture_output=True, text=True, timeout=120,
                            stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (f"simagent: error: cannot serve on 127.0.0.1:{port}: Address "
                           f"already in use (another server has this port: choose another)\n")


@pytest.mark.real
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_a_cell_runs_interrupts_it_and_stops_the_kernel(
        workspace: Path, tmp_path: Path, signum: int) -> None:
    """A host (or a person) stopping the server: the cell is interrupted and traced, the
    session closed, the kernel gone, and the server exits without waiting for stdin."""
    got: dict[str, object] = {}

    async def main() -> None:
        spinning = anyio.Event()

        async def progress(_p: float, _t: float | None, message: str | None) -> None:
            if message and "spinning" in message:
                spinning.set()

        async def run(s: ClientSession) -> None:
            try:
                await s.call_tool("run_python", {"code": "print('spinning', flush=True)\n"
                                                         "while True: pass"},
                                  progress_callback=progress)
            except Exception as exc:  # the server went away under the call
                got["call"] = type(exc).__name__

        async with _stdio(workspace, tmp_path / "server.err") as s, \
                anyio.create_task_group() as tg:
            tg.start_soon(run, s)
            with anyio.fail_after(CALL_S):
                await spinning.wait()
            # the process the client started (cli_fork's trampoline, which passes the
            # signal on and ends as the server does); the server's kernel is a process of
            # this test's, the server forked from cli_fork's
            server = next(p for p in psutil.Process().children()
                          if str(workspace) in " ".join(p.cmdline()))
            got["kernels"] = [p for p in psutil.Process().children(recursive=True)
                              if "simagent.kernel.launcher" in " ".join(p.cmdline())]
            server.send_signal(signum)
            # stdin stays open: the server must end by itself
            # (its exit code: whoever reaps it first, psutil or the SDK's child watcher)
            await anyio.to_thread.run_sync(server.wait, CALL_S)  # raises if still there
            got["ended"] = True
            tg.cancel_scope.cancel()

    with contextlib.suppress(Exception):  # the client's own exit, its server gone
        anyio.run(main)
    assert got.get("ended"), got
    assert got["kernels"] and not any(k.is_running() and k.status() != psutil.STATUS_ZOMBIE
                                      for k in got["kernels"])  # type: ignore[attr-defined]
    events = _events(workspace)
    result = next(p for k, p in events if k == "tool_result")
    assert result["outcome"] == "interrupted", result
    assert events[-1][0] == "session_end"
    assert f"simagent mcp: {signal.Signals(signum).name}: stopping the kernel" in \
        (tmp_path / "server.err").read_text()


async def _answered(url: str) -> None:
    with anyio.fail_after(CALL_S):
        while True:
            try:
                async with httpx.AsyncClient(timeout=10) as http:
                    await http.get(url)
                return
            except httpx.TransportError:
                await anyio.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_ctrl_c_stops_the_http_server_with_130(workspace: Path, inherited: str) -> None:
    """Also when it inherits SIGINT ignored, as a script's background job does: the
    SIGINT uvicorn raises again after its shutdown was then lost, and it exited 0."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [SIMAGENT, "mcp", "--workspace", str(workspace), "--http", str(port)]
    if inherited == "ignored":  # exec keeps the ignored disposition; a command cli_fork
        # forks would not inherit it, so sh starts a fresh interpreter (popen's fallback)
        command = ["sh", "-c", 'trap "" INT; exec "$0" "$@"', *command]
    server = cli_fork.popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr is not None
        first = server.stderr.readline()  # announced once the port is bound
        assert first == f"simagent mcp: streamable HTTP at http://127.0.0.1:{port}/mcp\n"
        anyio.run(_answered, f"http://127.0.0.1:{port}/mcp")  # uvicorn's handlers are set
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=CALL_S) == 130
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=30)
        if server.stderr is not None:
            server.stderr.close()


@pytest.mark.slow
def test_run_by_hand_in_a_terminal_it_says_what_it_waits_for(workspace: Path) -> None:
    import pty
    import select

    primary, secondary = pty.openpty()
    server = cli_fork.popen([SIMAGENT, "mcp", "--workspace", str(workspace)],
                            stdin=secondary, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    os.close(secondary)
    try:
        assert server.stderr is not None
        ready, _, _ = select.select([server.stderr], [], [], CALL_S)  # bounded wait
        assert ready, "nothing on stderr: the server does not say what it waits for"
        line = server.stderr.readline()
        assert line.startswith("simagent mcp: serving MCP over stdin/stdout for an MCP host")
    finally:  # no cell ran, so no kernel: a kill leaves nothing behind
        if server.poll() is None:
            server.kill()
            server.wait(timeout=30)
        os.close(primary)
        if server.stderr is not None:
            server.stderr.close()
