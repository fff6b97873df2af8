"""MCP servers as tools inside simagent, and their schemas on demand (issue 28, parts 2-3).

The server is real (``tests/mcp_servers/forty_tools.py``, the official SDK over stdio),
the graph is real (deepagents with the ``scripted:`` model), and so are the session, the
trace and ``/context``. Every wait is bounded by the hub's own timeouts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cli_fork
import conftest
import psutil
import pytest
from langchain_core.messages import HumanMessage, ToolMessage

from simagent.agent.builder import build_agent
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.config import MCP_START_TIMEOUT_S, Config, ConfigError, parse_mcp_servers
from simagent.context import thresholds as th
from simagent.context.deferral_policy import (
    FIND_TOOLS,
    LOADED_PREFIX,
    display_name,
    exposed_name,
    loaded_names,
    search,
)
from simagent.context.panel import render_context
from simagent.context.settings import ContextSettings
from simagent.context.stats import stats_from_trace
from simagent.session import Session

SERVER = Path(__file__).parent / "mcp_servers" / "forty_tools.py"
TAG_ENV = "SIMAGENT_TEST_RUN"  # conftest's run tag: the leak check finds the servers by it


def write_config(workspace: Path, *, extra_args: tuple[str, ...] = (), timeout_s: float = 60,
                 context: str = "") -> None:
    args = json.dumps([str(SERVER), *extra_args])
    env = json.dumps(os.environ.get(TAG_ENV, ""))
    (workspace / ".simagent").mkdir(exist_ok=True)
    conftest.write_config(
        workspace,
        f"{context}\n[mcp.servers.lab]\ncommand = {json.dumps(sys.executable)}\n"
        f"args = {args}\ntimeout_s = {timeout_s}\nenv = {{ {TAG_ENV} = {env} }}\n")


@pytest.fixture
def opened(workspace):
    sessions: list[Session] = []

    def _open(steps, approval="auto", **kw):
        session = Session.create(workspace, approval=approval)
        sessions.append(session)
        built = build_agent(session, ScriptedChatModel.from_steps(steps), **kw)
        return session, TurnRunner(session, built), built

    yield _open
    for s in sessions:
        s.close()


def server_pids() -> set[int]:
    me = psutil.Process()
    return {p.pid for p in me.children(recursive=True)
            if "forty_tools" in " ".join(p.cmdline())}


def tool_messages(built, session) -> list[ToolMessage]:
    state = built.graph.get_state(session.thread_config).values
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


# ------------------------------------------------------------------ pure parts
@pytest.mark.parametrize("entry, says", [
    ({"bad.name": {"command": "x"}}, "the name may hold"),
    ({"a": {"command": "x", "url": "http://h/mcp"}}, "not both or neither"),
    ({"a": {}}, "not both or neither"),
    ({"a": {"command": "x", "args": "one"}}, "args must be a list of strings"),
    ({"a": {"url": "ftp://h"}}, "http:// or https://"),
    ({"a": {"command": "x", "env": {"K": 1}}}, "env must be a table of strings"),
    ({"a": {"url": "http://h/mcp", "env": {"K": "v"}}}, "env and args go with command"),
    ({"a": {"command": "x", "timeout_s": 0}}, "timeout_s must be a positive"),
    ({"a": {"command": "x", "start_timeout_s": -1}}, "start_timeout_s must be a positive"),
    ({"a": {"command": "x", "start_timeout_s": "3"}}, "start_timeout_s must be a positive"),
    ({"a": {"command": "x", "start_timeout_s": True}}, "start_timeout_s must be a positive"),
    ({"a": {"command": "x", "start_timeout_s": float("nan")}}, "start_timeout_s must be"),
    ({"a": {"url": "http://h/mcp", "timeout_s": float("inf")}}, "timeout_s must be a positive"),
    ({"a": {"command": "x", "cmd": "y"}}, "unknown key(s) cmd"),
    ({"a__b": {"command": "x"}}, "the name may hold"),
])
def test_bad_server_entries_are_config_errors_naming_them(entry, says):
    with pytest.raises(ConfigError) as err:
        parse_mcp_servers(entry)
    assert says in str(err.value) and f"[mcp.servers.{next(iter(entry))}]" in str(err.value)


@pytest.mark.slow
def test_a_bad_entry_stops_the_cli_with_one_line_and_exit_2(workspace, tmp_path):
    """Checked when the session opens (exit 2, like every configuration error), not when
    the agent is built (an internal error)."""
    (workspace / ".simagent").mkdir()
    conftest.write_config(
        workspace,
        '[mcp.servers.lab]\ncommand = "python"\nurl = "http://127.0.0.1:1/mcp"\n')
    steps = tmp_path / "steps.json"
    steps.write_text('[{"final": "hi"}]')
    run = cli_fork.run([sys.executable, "-m", "simagent", "run", "--model",
                        f"scripted:{steps}", "hi"], cwd=workspace, capture_output=True,
                       text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    err = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "[mcp.servers.lab]" in err[0] and "not both" in err[0], err
    assert "internal error" not in run.stderr


@pytest.mark.slow
def test_the_mcp_sdk_is_imported_only_when_a_server_is_configured(workspace, tmp_path):
    """A ``simagent run`` whose config names no MCP server never imports the MCP SDK or
    langchain-mcp-adapters (about half a CPU-second of every run); with a server it does.
    Read from the real CLI's ``-X importtime`` record, which names each module imported;
    a fresh interpreter (not cli_fork), since the imports are the point."""
    sdk = {"mcp", "langchain_mcp_adapters"}
    steps = tmp_path / "steps.json"
    steps.write_text('[{"final": "done"}]')

    def imported() -> set[str]:
        run = subprocess.run([sys.executable, "-X", "importtime", "-m", "simagent", "run",
                              "--model", f"scripted:{steps}", "hi"], cwd=workspace,
                             capture_output=True, text=True, timeout=180)
        assert run.returncode == 0 and run.stdout.strip() == "done", run.stderr[-3000:]
        names = {ln.rpartition("|")[2].strip() for ln in run.stderr.splitlines()
                 if ln.startswith("import time:")}
        assert "simagent.agent.builder" in names  # the graph was built
        return names & sdk

    assert imported() == set()
    write_config(workspace)
    assert imported() == sdk


def test_good_entries_parse():
    got = parse_mcp_servers({"lab": {"command": "python", "args": ["s.py"], "env": {"K": "v"}},
                             "web": {"url": "https://h/mcp", "headers": {"A": "b"},
                                     "timeout_s": 5}})
    assert got["lab"].transport == "stdio" and got["lab"].args == ("s.py",)
    assert got["web"].transport == "streamable_http" and got["web"].timeout_s == 5.0
    assert got["lab"].start_timeout_s == MCP_START_TIMEOUT_S  # the default: one constant
    short = parse_mcp_servers({"lab": {"command": "python", "start_timeout_s": 3}})
    assert short["lab"].start_timeout_s == 3.0 and short["lab"].timeout_s == 120.0


def test_names_search_and_what_is_loaded():
    assert exposed_name("lab", "get.temp") == "lab__get_temp"
    assert display_name("lab__get_temp") == "lab.get_temp"
    catalog = {"lab__molar_mass": "Look up the molar mass of a species.",
               "lab__boiling_point": "Look up the normal boiling point of a species.",
               "lab__band_gap": "Look up the band gap of a semiconductor."}
    assert search("molar mass", catalog)[0] == "lab__molar_mass"
    assert search("lab.band_gap", catalog) == ["lab__band_gap"]
    assert search("quantum chromodynamics", catalog) == []
    found = ToolMessage(f"...\n{LOADED_PREFIX}lab__band_gap, lab__nope", tool_call_id="1",
                        name=FIND_TOOLS)
    other = ToolMessage(f"{LOADED_PREFIX}lab__molar_mass", tool_call_id="2", name="run_python")
    assert loaded_names([HumanMessage("hi"), found, other], catalog) == {"lab__band_gap"}


def test_find_tools_never_waits_and_mcp_tools_wait_like_the_shell(workspace):
    from simagent.agent.approval import waits

    assert not waits("ask", FIND_TOOLS, {"query": "x"}, workspace)
    assert waits("ask", "lab__molar_mass", {}, workspace)
    assert waits("workspace", "lab__molar_mass", {}, workspace)
    assert not waits("auto", "lab__molar_mass", {}, workspace)


def test_loaded_schemas_unload_when_their_find_tools_result_is_cleared(workspace):
    """The middleware sends a deferred schema only while the ``find_tools`` result that
    loaded it is in the model's view: once clearing has that result, it is gone again."""
    from langchain.agents.middleware import ModelRequest
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool

    from simagent.agent.mcp_tools import McpHub, RemoteTool
    from simagent.agent.tool_deferral import ToolDeferral
    from simagent.context.state import CLEARED_KEY

    hub = McpHub({}, cwd=workspace, log_dir=workspace)
    try:
        for n in ("lab__a", "lab__b"):
            hub.catalog[n] = RemoteTool("lab", n[5:], n, f"tool {n}", {"type": "object"})
        deferral = ToolDeferral(hub, deferred=True, payload={}, agent="main", trace=None)

        @tool
        def core(x: str) -> str:
            """A built-in tool."""
            return x

        lab = [t for t in hub.tools()]
        call = AIMessage("", tool_calls=[{"name": FIND_TOOLS, "args": {"query": "a"},
                                          "id": "f1"}])
        found = ToolMessage(f"...\n{LOADED_PREFIX}lab__a", tool_call_id="f1",
                            name=FIND_TOOLS)
        msgs = [HumanMessage("go"), call, found]

        def sent(cleared: list[str]) -> list[str]:
            req = ModelRequest(model=None, messages=msgs, tools=[core, *lab],
                               state={"messages": msgs, CLEARED_KEY: cleared})
            return [t.name for t in deferral._filter(req).tools]

        assert sent([]) == ["core", "lab__a"]
        assert sent(["f1"]) == ["core"]
    finally:
        hub.close()


def test_deferral_share_is_one_pure_function():
    s = ContextSettings()
    limit = th.defer_tools_limit(128_000, s)
    assert limit == int(128_000 * th.DEFER_TOOLS_FRACTION)
    assert th.defer_tools(limit + 1, 128_000, s) and not th.defer_tools(limit, 128_000, s)
    assert not th.defer_tools(10**6, 128_000, ContextSettings(defer_tools=False))
    assert th.defer_tools(1, 128_000, ContextSettings.from_mapping({"defer_tools": True}))


# ------------------------------------------------------------------ the real graph
@pytest.mark.slow
def test_a_scripted_session_finds_a_tool_and_calls_it(opened, workspace):
    """40 tools' schemas exceed the deferral share, so the first request carries none of
    them; ``find_tools`` loads the match, the next request carries it, the call runs on
    the real server, and ``/context`` shows the server's schemas, loaded vs deferred."""
    write_config(workspace)
    session, runner, built = opened([
        {"tool": FIND_TOOLS, "args": {"query": "molar mass of a species"}},
        {"tool": "lab__molar_mass", "args": {"subject": "H2O"}},
        {"final": "Found: {out[-1]}"}])
    names = {t.name for t in built.tools}
    assert len([n for n in names if n.startswith("lab__")]) == 40
    result = runner.run("What is the molar mass of water?")
    assert result.status == "done", result
    assert "molar_mass(H2O, T=298.15 K, nist) = " in result.final and "g/mol" in result.final
    usage = [e.payload for e in session.trace.events(["model_usage"])
             if e.payload.get("agent", "main") == "main"]
    schemas = [u["request"]["tool_schemas"] for u in usage]
    stats = stats_from_trace(session.paths.trace, session.context_settings)
    view = stats.tools
    assert view is not None and view.deferred
    # the request after find_tools carries the few schemas it loaded, not all forty
    assert 1 <= len(view.loaded) <= 5
    assert 0 < schemas[1] - schemas[0] < view.deferred_tokens / 4, schemas
    assert [(s.name, s.tools, s.status) for s in view.servers] == [("lab", 40, "ok")]
    assert view.servers[0].tokens == view.deferred_tokens > view.limit
    assert "lab__molar_mass" in view.loaded
    panel = render_context(stats, width=100)
    assert "MCP tools: 40 from 1 server" in panel and "lab.molar_mass" in panel
    assert "deferred behind find_tools" in panel
    assert json.loads(json.dumps(stats.as_dict()))["tools"]["servers"][0]["tools"] == 40


@pytest.mark.slow
def test_without_deferral_every_schema_is_sent(opened, workspace):
    write_config(workspace, context="[context]\ndefer_tools = false")
    session, runner, built = opened([{"tool": "lab__band_gap", "args": {"subject": "Si"}},
                                     {"final": "{out[-1]}"}])
    assert FIND_TOOLS not in {t.name for t in built.tools}
    assert "band_gap(Si" in runner.run("go").final
    view = stats_from_trace(session.paths.trace, session.context_settings).tools
    assert view is not None and not view.deferred and view.loaded == ()


@pytest.mark.slow
def test_each_server_fault_is_one_clear_error_and_the_session_goes_on(opened, workspace):
    """Crash, hang, malformed result: each gives one error the model can read, a notice
    and a trace event; the next call restarts the server; every call and result is in
    the trace."""
    write_config(workspace, timeout_s=4)
    calls = [("lab__crash_now", {}), ("lab__molar_mass", {"subject": "CO2"}),
             ("lab__hang_forever", {}), ("lab__malformed_result", {}),
             ("lab__band_gap", {"subject": "GaAs"})]
    session, runner, built = opened(
        [{"tool": name, "args": args} for name, args in calls] + [{"final": "done"}],
        context_settings=ContextSettings(defer_tools=False))
    events: list = []
    result = runner.run("exercise the faults", on_event=events.append)
    assert result.status == "done", result
    msgs = {m.name: m for m in tool_messages(built, session)}
    crash, hang, bad = (msgs["lab__crash_now"], msgs["lab__hang_forever"],
                        msgs["lab__malformed_result"])
    assert crash.status == "error" and "MCP server 'lab' stopped during the call" in crash.text
    assert hang.status == "error" and "gave no answer within 4 s" in hang.text
    assert bad.status == "error" and "not a tool result" in bad.text
    for m in (crash, hang, bad):
        assert "started afresh on the next call" in m.text and m.text.count("MCP server") == 1
    assert "molar_mass(CO2" in msgs["lab__molar_mass"].text  # restarted after the crash
    assert "band_gap(GaAs" in msgs["lab__band_gap"].text  # ... and after hang, malformed
    kinds = [e.payload["what"] for e in session.trace.events(["mcp_server"])]
    assert [k for k in kinds if k != "started"] == ["died", "timeout", "malformed"]
    notices = [e for e in events if type(e).__name__ == "ContextEvent"
               and e.kind == "mcp_server"]
    assert len(notices) == 3
    traced = [e.payload for e in session.trace.events(["tool_result"])]
    assert len(traced) == len(calls)


@pytest.mark.slow
def test_a_server_that_cannot_restart_is_one_error_until_it_can(opened, workspace, tmp_path):
    """After a crash the next call restarts the server; while it cannot start, each call
    says so (one error), and once it can, calls work again, all in one turn."""
    marker = tmp_path / "refuse-to-start"
    write_config(workspace, extra_args=("--fail-start-if", str(marker)))
    session, runner, built = opened([
        {"tool": "lab__crash_now", "args": {}},
        {"tool": "run_python", "args": {"code": f"open({str(marker)!r}, 'w').close()"}},
        {"tool": "lab__band_gap", "args": {"subject": "Si"}},
        {"tool": "run_python", "args": {"code": f"import os; os.remove({str(marker)!r})"}},
        {"tool": "lab__band_gap", "args": {"subject": "Ge"}},
        {"final": "{out[-1]}"}], context_settings=ContextSettings(defer_tools=False))
    result = runner.run("go")
    assert result.status == "done" and "band_gap(Ge" in result.final
    refused = next(m for m in tool_messages(built, session) if m.name == "lab__band_gap")
    assert refused.status == "error"
    assert "MCP server 'lab' could not be started" in refused.text
    assert [e.payload["what"] for e in session.trace.events(["mcp_server"])] == [
        "started", "died", "failed"]


@pytest.mark.slow
def test_a_10_mb_result_is_capped_like_any_result_and_kept_whole_on_disk(opened, workspace):
    write_config(workspace, timeout_s=300)
    session, runner, built = opened([{"tool": "lab__ten_megabytes", "args": {}},
                                     {"final": "done"}],
                                    context_settings=ContextSettings(defer_tools=False))
    assert runner.run("big").status == "done"
    big = {m.name: m for m in tool_messages(built, session)}["lab__ten_megabytes"]
    assert big.status != "error"
    assert len(big.text) < th.TOOL_CAP_CHARS + 2_000
    assert "row 0000000" in big.text and "MIDDLE-MARKER" not in big.text
    full = [Path(p) for p in big.text.split() if "large_tool_results" in p]
    assert full, big.text[-600:]
    path = Path(full[0].as_posix().rstrip(".,;:)]"))
    assert "MIDDLE-MARKER found at row 200000" in path.read_text()


@pytest.mark.slow
def test_a_server_that_cannot_start_leaves_the_session_usable(opened, workspace):
    write_config(workspace, extra_args=("--fail-start",))
    session, runner, built = opened([{"final": "still here"}])
    assert not [t for t in built.tools if t.name.startswith("lab__")]
    assert runner.run("hello").final == "still here"
    failed = [e.payload for e in session.trace.events(["mcp_server"])]
    assert failed and failed[0]["what"] == "failed"
    assert "could not be started" in failed[0]["notice"]
    view = stats_from_trace(session.paths.trace, session.context_settings).tools
    assert view is not None and view.servers[0].status.startswith("failed")


@pytest.mark.slow
def test_ask_waits_for_the_person_before_an_mcp_call(opened, workspace):
    write_config(workspace)
    session, runner, built = opened(
        [{"tool": "lab__molar_mass", "args": {"subject": "N2"}}, {"final": "{out[-1]}"}],
        approval="ask", context_settings=ContextSettings(defer_tools=False))
    paused = runner.run("go")
    assert paused.status == "paused"
    assert paused.interrupts[0].action_requests[0]["name"] == "lab__molar_mass"
    assert tool_messages(built, session) == []  # nothing ran while it waits
    done = runner.resume([{"type": "approve"}])
    assert done.status == "done" and "molar_mass(N2" in done.final


@pytest.mark.slow
def test_doctor_says_which_servers_answer_and_how_many_tools(workspace, tmp_path):
    from simagent.doctor import check_mcp, render

    env = json.dumps(os.environ.get(TAG_ENV, ""))
    (workspace / ".simagent").mkdir()
    conftest.write_config(
        workspace,
        f"[mcp.servers.lab]\ncommand = {json.dumps(sys.executable)}\n"
        f"args = {json.dumps([str(SERVER)])}\nenv = {{ {TAG_ENV} = {env} }}\n"
        f"[mcp.servers.down]\ncommand = {json.dumps(sys.executable)}\n"
        f"args = {json.dumps([str(SERVER), '--fail-start'])}\nenv = {{ {TAG_ENV} = {env} }}\n")
    checks = {c.name: c for c in check_mcp(workspace, Config.load(workspace))}
    assert checks["mcp lab"].ok and "reachable (stdio" in checks["mcp lab"].detail
    assert "40 tools" in checks["mcp lab"].detail
    down = checks["mcp down"]
    assert not down.ok and "refusing to start (--fail-start)" in down.detail
    assert "[mcp.servers.down]" in down.fix and "mcp down" in render(list(checks.values()))
    assert server_pids() == set()


@pytest.fixture
def http_server(tmp_path):
    """The 40-tool server over streamable HTTP on a free loopback port (token 's3cret');
    ready once its port accepts a connection (bounded), stopped after the test."""
    import socket
    import time

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(SERVER), "--http", str(port), "--token",
                             "s3cret"], stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / "http.log", "w"))  # noqa: SIM115
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((tmp_path / "http.log").read_text()) from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.mark.slow
def test_a_streamable_http_server_with_headers(opened, workspace, http_server):
    """``url`` + ``headers``: the bearer header reaches the server and its tools work; a
    wrong token is one failed server at start, with the 401 in the notice."""
    (workspace / ".simagent").mkdir()
    conftest.write_config(
        workspace,
        f'[mcp.servers.web]\nurl = "{http_server}"\n'
        'headers = { Authorization = "Bearer s3cret" }\n'
        f'[mcp.servers.denied]\nurl = "{http_server}"\n'
        'headers = { Authorization = "Bearer wrong" }\n')
    session, runner, built = opened([{"tool": "web__band_gap", "args": {"subject": "Si"}},
                                     {"final": "{out[-1]}"}],
                                    context_settings=ContextSettings(defer_tools=False))
    assert len([t for t in built.tools if t.name.startswith("web__")]) == 40
    assert not [t for t in built.tools if t.name.startswith("denied__")]
    assert "band_gap(Si" in runner.run("go").final
    failed = [e.payload for e in session.trace.events(["mcp_server"])
              if e.payload["what"] == "failed"]
    assert [f["server"] for f in failed] == ["denied"] and "401" in failed[0]["notice"]


@pytest.mark.slow
def test_closing_the_session_stops_its_servers(workspace):
    write_config(workspace)
    session = Session.create(workspace, approval="auto")
    try:
        build_agent(session, ScriptedChatModel.from_steps([{"final": "x"}]))
        assert len(server_pids()) == 1
        build_agent(session, ScriptedChatModel.from_steps([{"final": "x"}]))  # a rebuild
        assert len(server_pids()) == 1  # ... reuses the held session
    finally:
        session.close()
    assert server_pids() == set()


@pytest.mark.slow
def test_the_bench_deferral_sends_under_a_third_per_request_same_verdict():
    """``simagent bench tool-schemas`` on the 40-tool server: input tokens per request
    with deferral at most 0.3x all schemas loaded, the same answer both ways."""
    from simagent.bench.tool_schema_bench import format_table, run_tool_schema_bench

    r = run_tool_schema_bench(SERVER)
    assert r["verdict_unchanged"], format_table(r)
    assert r["loaded"]["verdict"] == r["deferred"]["verdict"] == "pass"
    assert r["per_request_ratio"] <= 0.3, format_table(r)
    assert r["deferred"]["requests"] == r["loaded"]["requests"] + 1  # the find_tools reply
    assert server_pids() == set()
