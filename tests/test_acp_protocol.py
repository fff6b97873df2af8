"""``simagent acp`` driven by the ACP SDK's own client (``acp.spawn_agent_process``).

Each test starts the real command (``simagent acp``, forked by :mod:`cli_fork` behind the
command line the SDK starts) with a scripted model, so
the graph, the runner, approval, the trace and the kernel are the real ones; only the
model's words are fixed. The in-memory kernel serves the slow group; the ``real`` test
runs a kernel process (cancel keeps a variable; a client that goes mid-turn leaves no
kernel behind). Every wait is bounded (``asyncio.wait_for``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import cli_fork
import psutil
import pytest
from acp import PROTOCOL_VERSION, Client, RequestError, spawn_agent_process, text_block
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    DeniedOutcome,
    EnvVariable,
    Implementation,
    McpServerStdio,
    RequestPermissionResponse,
    SseMcpServer,
)
from test_attach import jupyter_kernel, runtime  # noqa: F401  (fixtures: a person's kernel)
from test_attach import run as attach_run

from simagent.kernel.connection import KERNEL_META
from simagent.paths import SessionPaths
from simagent.trace import TraceLog

pytestmark = pytest.mark.slow

SERVER = Path(__file__).parent / "mcp_servers" / "forty_tools.py"
WAIT_S = 120.0
#: How jupyter-ai-acp-client 0.3.3 starts a session's first prompt (BaseAcpPersona).
GUIDANCE = ("System note: When creating or editing Jupyter notebooks (.ipynb), use the "
            "Jupyter notebook MCP tools (for example insert_cell, edit_cell, delete_cell, "
            "read_notebook). Do not write or edit .ipynb files directly with generic "
            "file-write/edit tools — direct writes are blocked to prevent notebook "
            "corruption.")  # any one protocol call (a kernel start on a loaded machine included)


class Recorder(Client):
    """Keeps every update in arrival order; answers permission requests from a list of
    option ids (None: cancelled)."""

    def __init__(self, answers: list[str | None] | None = None) -> None:
        self.updates: list[tuple[str, Any]] = []
        self.answers = list(answers or [])
        self.asked: list[Any] = []
        self.first_chunk_at: float | None = None
        self.event = asyncio.Event()

    async def session_update(self, session_id: str, update: Any, **kw: Any) -> None:
        if update.session_update == "agent_message_chunk" and self.first_chunk_at is None:
            self.first_chunk_at = time.perf_counter()
        self.updates.append((update.session_update, update))
        self.event.set()

    async def request_permission(self, session_id: str, tool_call: Any, options: Any,
                                 **kw: Any) -> RequestPermissionResponse:
        self.asked.append((tool_call, [o.option_id for o in options]))
        answer = self.answers.pop(0) if self.answers else None
        if answer is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected",
                                                                option_id=answer))

    def take(self) -> list[tuple[str, Any]]:
        out, self.updates = self.updates, []
        return out

    async def wait_for(self, pred: Any, timeout: float = WAIT_S) -> None:
        deadline = time.monotonic() + timeout
        while not any(pred(kind, u) for kind, u in self.updates):
            self.event.clear()
            left = deadline - time.monotonic()
            assert left > 0, f"not seen in {timeout} s: {[k for k, _ in self.updates]}"
            try:
                await asyncio.wait_for(self.event.wait(), left)
            except TimeoutError:
                pass


def text_of(updates: list[tuple[str, Any]]) -> str:
    return "".join(u.content.text for kind, u in updates if kind == "agent_message_chunk")


def script(tmp_path: Path, steps: list[dict[str, Any]], name: str = "script.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(steps))
    return f"scripted:{path}"


def agent_args(model: str, *extra: str) -> list[str]:
    """The command line a client starts: cli_fork's trampoline, which ends as the forked
    ``simagent acp`` does and passes signals on."""
    return cli_fork.command(["acp", "--model", model, *extra])


async def start(client: Recorder, model: str, *extra: str) -> Any:
    """The spawned agent (context manager), with the test's environment (spawn trims it)
    and the agent's stderr passed through."""
    cmd = agent_args(model, *extra)
    return spawn_agent_process(client, cmd[0], *cmd[1:], env=dict(os.environ),
                               transport_kwargs={"stderr": None})


async def init(conn: Any) -> Any:
    return await asyncio.wait_for(conn.initialize(
        protocol_version=PROTOCOL_VERSION, client_capabilities=ClientCapabilities(),
        client_info=Implementation(name="pytest", version="0")), WAIT_S)


async def prompt(conn: Any, sid: str, text: str, **meta: Any) -> Any:
    return await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text_block(text)],
                                              **meta), WAIT_S)


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 600))


def kernel_execs(workspace: Path, sid: str) -> list[str]:
    trace = TraceLog(SessionPaths.for_session(workspace, sid).trace, readonly=True)
    try:
        return [e.payload["code"] for e in trace.events(["kernel_exec"])
                if not e.payload.get("warmup")]
    finally:
        trace.close()


# ------------------------------------------------------------------------ a turn
def test_a_turn_streams_every_update_kind_in_order_and_permission_both_ways(
        tmp_path, workspace):
    """One turn: the kernel note, the tool card pending → in_progress → completed with
    the cell's text, then the answer; the approval mode as an ACP mode; a waiting cell
    asked with request_permission: allowed it runs, rejected it does not; a second
    prompt while one runs is refused with a clear error."""
    model = script(tmp_path, [
        {"tool": "run_python", "args": {"code": "x = 41\nprint('x is', x)"}},
        {"final": "Done: {out[-1]}"},
        {"tool": "run_python", "args": {"code": "y = 1"}},
        {"final": "allowed"},
        {"tool": "run_python", "args": {"code": "z = 2"}},
        {"final": "rejected then"},
        {"final": "slow answer", "wait": 3},
        {"final": "after"}])

    async def main() -> None:
        client = Recorder(answers=["allow_once", "reject_once"])
        async with await start(client, model, "--approval", "auto") as (conn, proc):
            t0 = time.perf_counter()
            init_r = await init(conn)
            print(f"\ninitialize answered {time.perf_counter() - t0:.2f} s after the "
                  "request")
            assert init_r.agent_info.name == "simagent"
            assert init_r.agent_capabilities.load_session is True
            new = await asyncio.wait_for(conn.new_session(cwd=str(workspace),
                                                          mcp_servers=[]), WAIT_S)
            sid = new.session_id
            assert SessionPaths.for_session(workspace, sid).root.is_dir()
            assert new.modes.current_mode_id == "auto"
            assert {m.id for m in new.modes.available_modes} == {"ask", "workspace", "auto"}
            await client.wait_for(lambda k, u: k == "available_commands_update")
            client.take()

            r = await prompt(conn, sid, GUIDANCE + "\n\nset x")  # JupyterLab's first
            assert r.stop_reason == "end_turn"
            assert "cost_usd" in r.field_meta["simagent"], r.field_meta
            trace = TraceLog(SessionPaths.for_session(workspace, sid).trace, readonly=True)
            try:  # the persona's note is not the person's words; the trace says so
                assert [e.payload["content"] for e in trace.events(["message_user"])] \
                    == ["set x"]
                assert "JupyterLab" in trace.events(["prompt_note"])[0].payload["note"]
            finally:
                trace.close()
            seen = client.take()
            kinds = [(k, getattr(u, "status", None)) for k, u in seen
                     if k != "agent_thought_chunk"]
            text = text_of(seen)
            assert text.startswith("no notebook kernel named; simagent started its own.")
            assert "Done: x is 41" in text
            tool = [(k, s) for k, s in kinds if k.startswith("tool_call")]
            assert tool[0] == ("tool_call", "pending"), kinds
            assert ("tool_call_update", "in_progress") in tool
            assert tool[-1] == ("tool_call_update", "completed"), kinds
            done = [u for k, u in seen if k == "tool_call_update" and u.status == "completed"]
            assert "x is 41" in done[-1].content[0].content.text
            first_tool = next(i for i, (k, _) in enumerate(kinds) if k == "tool_call")
            answer_at = max(i for i, (k, _) in enumerate(kinds) if k == "agent_message_chunk")
            assert first_tool < answer_at  # the card, then the answer that quotes it

            await asyncio.wait_for(conn.set_session_mode(session_id=sid, mode_id="ask"),
                                   WAIT_S)
            await client.wait_for(lambda k, u: k == "current_mode_update")
            assert [u.current_mode_id for k, u in client.take()
                    if k == "current_mode_update"] == ["ask"]

            r = await prompt(conn, sid, "set y")  # asked: allow once
            assert r.stop_reason == "end_turn"
            call, options = client.asked[-1]
            assert options == ["allow_once", "allow_always", "reject_once"]
            assert "y = 1" in json.dumps(call.raw_input)
            assert "allowed" in text_of(client.take())

            r = await prompt(conn, sid, "set z")  # asked: rejected
            assert r.stop_reason == "end_turn"
            assert len(client.asked) == 2
            ended = [u for k, u in client.take() if k == "tool_call_update"
                     and u.status == "failed"]  # its card ends at the answer
            assert ended and ended[0].content[0].content.text == "rejected: not run"
            codes = kernel_execs(workspace, sid)
            assert any("y = 1" in c for c in codes) and not any("z = 2" in c for c in codes)

            slow = asyncio.create_task(prompt(conn, sid, "slow"))
            await asyncio.sleep(1.0)
            with pytest.raises(RequestError) as busy:
                await prompt(conn, sid, "meanwhile")
            assert "already running" in str(busy.value)
            assert (await slow).stop_reason == "end_turn"
            r = await prompt(conn, sid, "next")
            assert "after" in text_of(client.take())
            r = await prompt(conn, sid, "/approval workspace")  # a slash command, served
            seen = client.take()
            assert "approval: workspace" in text_of(seen)
            assert [u.current_mode_id for k, u in seen if k == "current_mode_update"] \
                == ["workspace"]
        assert proc.returncode == 0

    run(main())


def test_a_permission_the_client_cancels_ends_the_prompt_and_the_next_one_moves_on(
        tmp_path, workspace):
    """The client cancels while it asks (JupyterLab does so for a superseded prompt): the
    prompt answers ``cancelled`` and the cell never runs; the next prompt rejects the
    call still waiting and goes on with the new words."""
    model = script(tmp_path, [
        {"tool": "run_python", "args": {"code": "w = 5"}},
        {"final": "not run, fine"},
        {"final": "fresh start"}])

    async def main() -> None:
        client = Recorder(answers=[None])
        async with await start(client, model, "--approval", "ask") as (conn, _proc):
            await init(conn)
            sid = (await asyncio.wait_for(conn.new_session(cwd=str(workspace),
                                                           mcp_servers=[]), WAIT_S)).session_id
            r = await prompt(conn, sid, "set w")
            assert r.stop_reason == "cancelled" and len(client.asked) == 1
            client.take()
            r = await prompt(conn, sid, "something else")
            assert r.stop_reason == "end_turn" and len(client.asked) == 1
            assert "fresh start" in text_of(client.take())
            assert not any("w = 5" in c for c in kernel_execs(workspace, sid))

    run(main())


# ----------------------------------------------------------------- bad input, raw
def test_bad_input_gets_one_clear_error_each_and_the_agent_stays_up(tmp_path, workspace):
    """A malformed line, a non-object, an unknown method, a prompt for an unknown
    session, loading a session that is not there: one JSON-RPC error each, and the agent
    still answers; stdin closed: exit 0."""
    model = script(tmp_path, [{"final": "unused"}])

    async def main() -> None:
        proc = await asyncio.create_subprocess_exec(
            *agent_args(model), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, env=dict(os.environ))

        async def send(obj: Any) -> None:
            line = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
            proc.stdin.write(line + b"\n")
            await proc.stdin.drain()

        async def answer() -> dict[str, Any]:
            line = await asyncio.wait_for(proc.stdout.readline(), WAIT_S)
            assert line, "the agent closed stdout"
            return json.loads(line)

        await send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": {"protocolVersion": 1}})
        assert (await answer())["result"]["agentInfo"]["name"] == "simagent"
        await send(b"{this is not json")
        err = await answer()
        assert err["id"] is None and err["error"]["code"] == -32700
        await send(b"[1, 2]")
        assert (await answer())["error"]["code"] == -32600
        await send({"jsonrpc": "2.0", "id": 2, "method": "session/teleport", "params": {}})
        err = await answer()
        assert err["id"] == 2 and err["error"]["code"] == -32601
        await send({"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": {
            "sessionId": "nope", "prompt": [{"type": "text", "text": "hi"}]}})
        err = await answer()
        assert err["id"] == 3 and "unknown session 'nope'" in err["error"]["message"]
        await send({"jsonrpc": "2.0", "id": 4, "method": "session/load", "params": {
            "sessionId": "20990101-000000-dead", "cwd": str(workspace), "mcpServers": []}})
        err = await answer()
        assert err["id"] == 4 and "no simagent session" in err["error"]["message"]
        for n, method in enumerate(("session/list", "authenticate"), 5):
            await send({"jsonrpc": "2.0", "id": n, "method": method,
                        "params": {"methodId": "x"} if method == "authenticate" else {}})
            err = await answer()
            assert err["id"] == n and "error" in err, err
        await send({"jsonrpc": "2.0", "id": 9, "method": "initialize",
                    "params": {"protocolVersion": 1}})
        assert (await answer())["id"] == 9  # still up
        proc.stdin.close()
        assert await asyncio.wait_for(proc.wait(), WAIT_S) == 0

    run(main())


def test_jupyterlabs_sigint_and_sigterm_mid_cell_close_the_session_within_its_5_s(
        tmp_path, workspace):
    """JupyterLab closes a chat's agent with SIGINT and SIGTERM together and SIGKILLs it
    5 s later: the agent stops the turn, closes the session in its trace and exits 0
    before that."""
    model = script(tmp_path, [
        {"tool": "run_python", "args": {"code": "import time\ntime.sleep(60)"}},
        {"final": "never"}])

    async def main() -> None:
        client = Recorder()
        async with await start(client, model, "--approval", "auto") as (conn, proc):
            await init(conn)
            sid = (await asyncio.wait_for(conn.new_session(cwd=str(workspace),
                                                           mcp_servers=[]), WAIT_S)).session_id
            going = asyncio.create_task(prompt(conn, sid, "sleep"))
            await client.wait_for(lambda k, u: k == "tool_call_update"
                                  and u.status == "in_progress")
            t0 = time.monotonic()
            proc.send_signal(signal.SIGINT)
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 5.0) == 0
            print(f"\nexit {time.monotonic() - t0:.2f} s after SIGINT+SIGTERM")
            going.cancel()
        trace = TraceLog(SessionPaths.for_session(workspace, sid).trace, readonly=True)
        try:
            assert trace.events(["session_end"]), "the session was not closed"
        finally:
            trace.close()

    run(main())


# ------------------------------------------------------------- load after restart
def test_load_session_replays_history_after_a_restart(tmp_path, workspace):
    """A session made by one agent process is loaded by the next: its history comes back
    as updates before session/load answers, and the session goes on. Also measured (not
    asserted): prompt to first agent_message_chunk, median of 5."""
    model = script(tmp_path, [
        {"tool": "run_python", "args": {"code": "print(6 * 7)"}},
        {"final": "The answer is {out[-1]}"},
        *({"final": f"quick {i}"} for i in range(5))])

    async def first() -> str:
        client = Recorder()
        async with await start(client, model, "--approval", "auto") as (conn, _proc):
            await init(conn)
            sid = (await asyncio.wait_for(conn.new_session(cwd=str(workspace),
                                                           mcp_servers=[]), WAIT_S)).session_id
            r = await prompt(conn, sid, "what is six times seven?")
            assert r.stop_reason == "end_turn"
            assert "The answer is 42" in text_of(client.take())
            lags = []
            for i in range(5):
                client.first_chunk_at = None
                t0 = time.perf_counter()
                await prompt(conn, sid, f"quick {i}")
                assert client.first_chunk_at is not None
                lags.append(client.first_chunk_at - t0)
            print(f"\nprompt to first agent_message_chunk (scripted model): median "
                  f"{statistics.median(lags) * 1000:.0f} ms of {len(lags)} "
                  f"({', '.join(f'{x * 1000:.0f}' for x in lags)} ms)")
            return sid

    async def second(sid: str) -> None:
        client = Recorder()
        again = script(tmp_path, [{"final": "still here"}], "again.json")
        async with await start(client, again, "--approval", "auto") as (conn, _proc):
            await init(conn)
            loaded = await asyncio.wait_for(conn.load_session(
                cwd=str(workspace), session_id=sid, mcp_servers=[]), WAIT_S)
            assert loaded.modes.current_mode_id == "auto"
            replay = client.take()
            kinds = [k for k, _ in replay]
            assert "user_message_chunk" in kinds and "tool_call" in kinds, kinds
            said = "".join(u.content.text for k, u in replay
                           if k == "user_message_chunk")
            assert "what is six times seven?" in said
            assert "The answer is 42" in text_of(replay)
            r = await prompt(conn, sid, "and now?")
            assert r.stop_reason == "end_turn" and "still here" in text_of(client.take())

    sid = run(first())
    run(second(sid))


# --------------------------------------------------------------- client MCP server
def test_a_client_mcp_server_is_a_tool_gated_by_approval(tmp_path, workspace):
    """session/new's stdio MCP server becomes the session's tools, as [mcp.servers]
    does: in workspace mode its call waits for a permission, then runs on the server."""
    model = script(tmp_path, [
        {"tool": "find_tools", "args": {"query": "molar mass of a species"}},
        {"tool": "lab__molar_mass", "args": {"subject": "H2O"}},
        {"final": "Found: {out[-1]}"}])
    server = McpServerStdio(name="lab", command=sys.executable, args=[str(SERVER)],
                            env=[EnvVariable(name="SIMAGENT_TEST_RUN",
                                             value=os.environ.get("SIMAGENT_TEST_RUN", ""))])

    broken = McpServerStdio(name="broken", command=sys.executable,
                            args=[str(SERVER), "--fail-start"], env=server.env)
    sse = SseMcpServer(type="sse", name="old", url="http://127.0.0.1:9/sse", headers=[])

    async def main() -> None:
        client = Recorder(answers=["allow_once"])
        async with await start(client, model, "--approval", "workspace") as (conn, _proc):
            await init(conn)
            sid = (await asyncio.wait_for(conn.new_session(
                cwd=str(workspace), mcp_servers=[server, broken, sse]), WAIT_S)).session_id
            r = await prompt(conn, sid, "molar mass of water?")
            assert r.stop_reason == "end_turn"
            assert client.asked and client.asked[0][0].title.startswith("lab__molar_mass")
            said = text_of(client.take())
            assert "molar_mass(H2O, T=298.15 K, nist) = " in said
            # what could not be used is said to the person, before the reply
            assert "MCP server 'old': the sse transport is not supported" in said
            assert "broken" in said.split("molar_mass(")[0], said

    run(main())


# ----------------------------------------------------- a real kernel: cancel, gone
@pytest.mark.real
def test_cancel_keeps_the_kernel_state_and_a_client_gone_mid_turn_leaves_nothing(
        tmp_path, workspace):
    """session/cancel mid-cell answers ``cancelled`` and the kernel keeps ``x``: the next
    prompt's ``x + 1`` prints 42. Then stdin closes while a cell runs: the agent exits 0,
    the session is closed in its trace and the kernel process is gone."""
    model = script(tmp_path, [
        {"tool": "run_python", "args": {"code": "x = 41"}},
        {"final": "set"},
        {"tool": "run_python", "args": {"code": "import time\ntime.sleep(120)"}},
        {"tool": "run_python", "args": {"code": "print(x + 1)"}},
        {"final": "x + 1 = {out[-1]}"},
        {"tool": "run_python", "args": {"code": "import time\ntime.sleep(120)"}},
        {"final": "never"}])
    env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_TEST_KERNEL"}

    async def main() -> None:
        client = Recorder()
        cmd = agent_args(model, "--approval", "auto")
        async with spawn_agent_process(client, cmd[0], *cmd[1:], env=env,
                                       transport_kwargs={"stderr": None}) as (conn, proc):
            await init(conn)
            sid = (await asyncio.wait_for(conn.new_session(cwd=str(workspace),
                                                           mcp_servers=[]), WAIT_S)).session_id
            assert (await prompt(conn, sid, "set x")).stop_reason == "end_turn"
            client.take()
            slow = asyncio.create_task(prompt(conn, sid, "sleep"))
            await client.wait_for(lambda k, u: k == "tool_call_update"
                                  and u.status == "in_progress")
            await asyncio.sleep(1.0)
            await conn.cancel(session_id=sid)
            assert (await slow).stop_reason == "cancelled"
            client.take()
            r = await prompt(conn, sid, "x + 1?")
            assert r.stop_reason == "end_turn"
            assert "x + 1 = 42" in text_of(client.take())

            # the agent is forked from cli_fork's server, not a child of ``proc`` (its
            # trampoline): its kernel is this test's only one
            kernels = [p for p in psutil.Process().children(recursive=True)
                       if "simagent.kernel.launcher" in " ".join(p.cmdline())]
            assert kernels, "no kernel process of the agent's"
            going = asyncio.create_task(prompt(conn, sid, "sleep again"))
            await client.wait_for(lambda k, u: k == "tool_call_update"
                                  and u.status == "in_progress")
            await asyncio.sleep(1.0)
            proc.stdin.close()  # the client goes
            assert await asyncio.wait_for(proc.wait(), WAIT_S) == 0
            going.cancel()
            _, alive = psutil.wait_procs(kernels, timeout=15)
            assert not alive, alive
        trace = TraceLog(SessionPaths.for_session(workspace, sid).trace, readonly=True)
        try:
            assert trace.events(["session_end"]), "the session was not closed"
        finally:
            trace.close()

    run(main())


@pytest.mark.real
def test_the_kernel_named_in_the_prompts_meta_is_attached_and_left_running(
        jupyter_kernel, tmp_path, workspace):  # noqa: F811 - the fixture
    """The JupyterLab persona's way: ``_meta`` ``simagent.kernel`` on the prompt names the
    notebook's kernel; the agent computes with the person's ``k``, says nothing about a
    kernel of its own, and when the client goes the kernel runs on with the agent's
    name in it."""
    kc = jupyter_kernel.kc
    attach_run(kc, "k = 0.37")
    model = script(tmp_path, [
        {"tool": "run_python", "args": {"code": "import math\nhalf = math.log(2) / k\n"
                                                "print(round(half, 4))"}},
        {"final": "half-life: {out[-1]}"}])
    env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_TEST_KERNEL"}

    async def main() -> None:
        client = Recorder()
        cmd = agent_args(model, "--approval", "auto")
        async with spawn_agent_process(client, cmd[0], *cmd[1:], env=env,
                                       transport_kwargs={"stderr": None}) as (conn, proc):
            await init(conn)
            sid = (await asyncio.wait_for(conn.new_session(cwd=str(workspace),
                                                           mcp_servers=[]), WAIT_S)).session_id
            r = await prompt(conn, sid, "half-life for k?",
                             **{KERNEL_META: str(jupyter_kernel.path)})
            assert r.stop_reason == "end_turn"
            said = text_of(client.take())
            assert "half-life: 1.8734" in said and "started its own" not in said, said
            proc.stdin.close()
            assert await asyncio.wait_for(proc.wait(), WAIT_S) == 0

    run(main())
    assert jupyter_kernel.proc.poll() is None and psutil.pid_exists(jupyter_kernel.pid)
    assert attach_run(kc, "print(round(half, 4), k)") == "1.8734 0.37\n"
