"""No secret in a card or a log (issue 40, defects 5-8 and the MCP HTTP kernel's environment).

Real parts throughout: a real ipykernel (simagent's own, and a ``jupyter kernel`` started
as a person starts one, with its own environment), the real deepagents graph driven by
the scripted model, real SQLite, a real MCP server over stdio (``tests/mcp_servers/
leaky.py``), and ``simagent mcp --http`` as a subprocess driven by the MCP SDK's client.
Every secret is random per test; a cell's code never holds one literally (it reads it
from a file or the environment), so any copy found at rest was written by simagent.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import anyio
import httpx
import psutil
import pytest
from jupyter_client import BlockingKernelClient
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp_http import serving
from waiting import until

from simagent.agent.builder import build_agent
from simagent.agent.mcp_tools import McpHub
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.config import parse_mcp_servers
from simagent.context.counting import is_state_card
from simagent.context.manual import compact_now
from simagent.context.settings import ContextSettings
from simagent.kernel import Kernel
from simagent.kernel.env_secrets import may_set_env
from simagent.kernel.process import inherited_env
from simagent.kernel.terminal import ESC_SEQ_RE
from simagent.kernel_api.state_probe import string_shown
from simagent.session import Session
from simagent.trace.redact import SECRET_NAME_PATTERN

pytestmark = pytest.mark.timeout(600)

LEAKY = Path(__file__).parent / "mcp_servers" / "leaky.py"
JUPYTER = str(Path(sys.executable).parent / "jupyter")
START_S = 90.0
CALL_S = 240
SECRET_NAME = re.compile(SECRET_NAME_PATTERN, re.IGNORECASE)


def _hits(root: Path, needles: list[str]) -> list[str]:
    """``path: needle`` for every file under ``root`` whose bytes hold a needle (plain, or
    put together once terminal escapes are dropped)."""
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            seen = ESC_SEQ_RE.sub("", data.decode("utf-8", "replace")).encode()
            found += [f"{path}: {n}" for n in needles if n.encode() in data or n.encode() in seen]
    return found


def _turns(session: Session, steps: list[dict], window: int = 128_000,
           settings: ContextSettings | None = None):
    model = ScriptedChatModel.from_steps(steps, window=window, enforce_window=True)
    agent = build_agent(session, model, context_settings=settings or ContextSettings())
    return model, agent, TurnRunner(session, agent)


# ------------------------------------------------------------------ 5. the state card
@pytest.mark.parametrize("name, value, shown", [
    ("label", "Chen2020 1C", True),
    ("mechanism", "h2o2.yaml", True),
    ("termination", "event: Minimum voltage [V]", True),
    ("db_password", "hunter2", False),  # the name says it
    ("api_token", "abc", False),
    ("Authorization", "Bearer x", False),
    ("dsn", "pg://alice:Zq-4471-hunter@db/x", False),  # a URL with a password
    ("dsn", "host=db password=Zq-4471", False),  # the value names one
    ("key_id", "AKIAIOSFODNN7EXAMPLE", False),  # a token-like run
    ("digest", "9f86d081884c7d659a2feaa0c55ad015", False),
    ("path", "results/run_2024_final.csv", True),
    ("long", "x" * 41, False),
])
def test_which_string_values_the_card_may_show(name, value, shown):
    assert string_shown(name, value, SECRET_NAME) is shown


def test_the_card_and_its_updates_hold_no_secret_value(workspace):
    """A cell reads a password, a URL with a password and a token from a file: the full
    card and every update the model got list the names by type and length, and neither
    the card, trace.sqlite nor checkpoints.sqlite (nor any session file) holds a value."""
    password = "hunter2-very-secret-value"
    url_password = f"Zq-{secrets.randbelow(9000) + 1000}-hunter"
    url = f"pg://alice:{url_password}@db/x"
    token = "tk" + secrets.token_hex(4)
    (workspace / "creds.json").write_text(json.dumps({"pw": password, "url": url,
                                                      "tok": token}))
    load = ("import json\nc = json.load(open('creds.json'))\ndb_password = c['pw']\n"
            "dsn = c['url']\napi_token = c['tok']\nlabel = 'Chen2020 1C'\ndel c")
    steps = ([{"tool": "run_python", "args": {"code": "import numpy as np\n"
                                                       "field = np.ones((50, 40))"}}]
             + [{"tool": "run_python", "args": {"code": f"print('R{i}', 'v' * 3000)"}}
                for i in range(8)]
             + [{"tool": "run_python", "args": {"code": load}}]
             + [{"tool": "run_python", "args": {"code": f"print('S{i}', 'v' * 3000)"}}
                for i in range(8)]
             + [{"final": "done"}, {"final": "two"}])
    settings = ContextSettings(summarize=False, budget_check=False)  # updates: default
    session = Session.create(workspace, approval="auto")
    try:
        model, agent, runner = _turns(session, steps, 30_000, settings)
        assert runner.run("go").status == "done"
        updates = [m.text for m in model.requests[-1] if is_state_card(m)]
        assert compact_now(agent.graph, session.thread_config, agent.context).done
        assert runner.run("two").status == "done"
        full = next(m.text for m in model.requests[-1] if is_state_card(m))
        assert any(t.startswith("<kernel_state_update") for t in updates), updates
        said = "\n".join(updates)
        assert "- db_password: str (25 chars)" in said  # the update that saw them
        assert f"- dsn: str ({len(url)} chars)" in said
        assert "- db_password: str (25 chars)" in full and "- api_token: str (10 chars)" in full
        assert "- label = 'Chen2020 1C' (str)" in full  # a plain value is still shown
        for text in [*updates, full]:
            assert password not in text and url_password not in text and token not in text
    finally:
        session.close()
    assert session.paths.trace.exists() and session.paths.checkpoints.exists()
    assert _hits(session.paths.root, [password, url_password, token]) == []


# ------------------------------------------------ 6. the kernel's own environment
@pytest.fixture
def foreign_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """``jupyter kernel`` as a person starts it, with ``FOO_TOKEN`` in its environment
    and not in this process's."""
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime))
    monkeypatch.delenv("FOO_TOKEN", raising=False)
    value = "fake-" + secrets.token_hex(10)
    path = runtime / f"kernel-{uuid.uuid4().hex[:8]}.json"
    with open(tmp_path / "jupyter-kernel.log", "wb") as log:
        proc = subprocess.Popen([JUPYTER, "kernel", f"--KernelManager.connection_file={path}"],
                                env={**os.environ, "FOO_TOKEN": value}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    kids: list[psutil.Process] = []
    try:
        until(path.exists, START_S, "the connection file")
        kids = until(lambda: psutil.Process(proc.pid).children(recursive=True), START_S,
                      "the kernel process")
        kc = BlockingKernelClient(connection_file=str(path))
        kc.load_connection_file()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=START_S)
        finally:
            kc.stop_channels()
        yield SimpleNamespace(path=path, value=value)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        _gone, alive = psutil.wait_procs(kids, timeout=15)
        for p in alive:
            p.kill()
        psutil.wait_procs(alive, timeout=10)


@pytest.mark.slow
def test_an_attached_kernels_own_secrets_are_redacted_everywhere(foreign_kernel, workspace):
    """The person's kernel has FOO_TOKEN, simagent does not: a cell prints it and keeps it
    as ``api_token``; the model got it redacted, and outputs/, the trace, the checkpoints
    and the state card hold no plain copy."""
    value = foreign_kernel.value
    cell = ("import os\nprint('token is', os.environ['FOO_TOKEN'])\n"
            "api_token = os.environ['FOO_TOKEN']")
    session = Session.create(workspace, approval="auto",
                             kernel_existing=str(foreign_kernel.path))
    try:
        model, agent, runner = _turns(session, [
            {"tool": "run_python", "args": {"code": cell}}, {"final": "said: {out[-1]}"},
            {"final": "two"}])
        assert runner.run("go").status == "done"
        assert "token is [redacted:FOO_TOKEN]" in model.requests[-1][-1].text
        assert compact_now(agent.graph, session.thread_config, agent.context).done
        assert runner.run("two").status == "done"
        card = next(m.text for m in model.requests[-1] if is_state_card(m))
        assert f"- api_token: str ({len(value)} chars)" in card
    finally:
        session.close()
    assert list(session.paths.outputs.glob("*.txt"))  # it was written, and searched
    assert _hits(session.paths.root, [value]) == []


def test_a_secret_a_cell_puts_in_simagents_own_kernel_is_redacted_later(session_paths,
                                                                         tmp_path):
    """``os.environ['X_TOKEN'] = ...`` in a cell: the next cell's print of it is redacted
    in its raw output and its text (the cell's reply told simagent the value)."""
    value = "fake-" + secrets.token_hex(10)
    with Kernel(session_paths, cwd=tmp_path) as kernel:
        kernel.execute(f"import os\nos.environ['X_TOKEN'] = {value[::-1]!r}[::-1]")
        out = kernel.execute("print(os.environ['X_TOKEN'])")
    assert out.stdout == "[redacted:X_TOKEN]"
    assert _hits(session_paths.outputs, [value]) == []


@pytest.mark.real
def test_a_secret_set_by_code_that_does_not_say_env_is_learned_at_the_state_probe(
        session_paths, tmp_path):
    """A module the cell imports sets Y_TOKEN (the cell's code does not say ``env``, so its
    reply carries no environment read): the next state probe reads it, and a later print
    is redacted."""
    value = "fake-" + secrets.token_hex(10)
    (tmp_path / "lab_login.py").write_text(
        f"import os\nVALUE = {value[::-1]!r}[::-1]\nos.environ['Y_TOKEN'] = VALUE\n")
    assert may_set_env("os.environ['X'] = 1") and may_set_env("%env X=1")
    assert may_set_env("load_dotenv()") and not may_set_env("import lab_login")
    with Kernel(session_paths, cwd=tmp_path) as kernel:
        kernel.execute("import lab_login")
        assert kernel.probe_state() is not None
        out = kernel.execute("print(lab_login.VALUE)")
    assert out.stdout == "[redacted:Y_TOKEN]"
    assert _hits(session_paths.outputs, [value]) == []


# ------------------------------------------------------------ 7. MCP client files
def _leaky(key_file: Path) -> dict:
    tag = os.environ.get("SIMAGENT_TEST_RUN", "")
    return parse_mcp_servers({"leaky": {"command": sys.executable,
                                        "args": [str(LEAKY), "--key-file", str(key_file)],
                                        "env": {"SIMAGENT_TEST_RUN": tag}}})


@pytest.mark.slow
def test_an_mcp_servers_log_is_private_and_redacted_line_by_line(session_paths, tmp_path,
                                                                 monkeypatch):
    key = "sk-" + secrets.token_hex(16)
    monkeypatch.setenv("FAKE_API_KEY", key)  # simagent knows the key the server prints
    (tmp_path / "key").write_text(key)
    hub = McpHub(_leaky(tmp_path / "key"), cwd=tmp_path, log_dir=session_paths.root)
    try:
        hub.start_all()
        assert hub.status["leaky"] == "ok", hub.status
    finally:
        hub.close()
    log = session_paths.root / "mcp-leaky.log"
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    text = log.read_text()
    assert "leaky: starting with key [redacted:FAKE_API_KEY]" in text and key not in text


# ------------------------------------------------- 8. a key split by an ANSI code
def test_a_key_split_by_a_colour_code_is_not_whole_in_the_raw_output(session_paths, tmp_path,
                                                                     monkeypatch):
    key = "sk-ant-" + secrets.token_hex(16)
    monkeypatch.setenv("FAKE_API_KEY", key)
    code = ("import os\nk = os.environ['FAKE_API_KEY']\n"
            "print('plain \\x1b[32mgreen\\x1b[0m')\n"
            "print('key:', k[:12] + '\\x1b[31m' + k[12:] + '\\x1b[0m', 'end')\n"
            "print(k[:5], end='', flush=True)\nimport time; time.sleep(0.2)\n"
            "print('\\x1b[1m' + k[5:] + '\\x1b[0m')")
    with Kernel(session_paths, cwd=tmp_path) as kernel:
        out = kernel.execute(code)
    assert out.status == "ok"
    assert key not in out.stdout and "key: [redacted:FAKE_API_KEY] end" in out.stdout
    raw = out.raw_path.read_text()
    assert "key: [redacted:FAKE_API_KEY] end" in raw
    assert "plain \x1b[32mgreen\x1b[0m" in raw  # a line with no secret keeps its colours
    assert key not in ESC_SEQ_RE.sub("", raw) and key not in raw
    assert raw.count("[redacted:FAKE_API_KEY]") == 2  # the one split across two prints


# ------------------------------------------------------- MCP HTTP kernel environment
def test_a_kernel_served_to_others_gets_no_secret_named_variable():
    environ = {"PATH": "/bin", "FAKE_API_KEY": "k" * 20, "DB_PASSWORD": "p" * 12,
               "PYTEST_CURRENT_TEST": "x", "HOME": "/h"}
    assert inherited_env(environ, None) == {k: v for k, v in environ.items()
                                            if k != "PYTEST_CURRENT_TEST"}
    assert inherited_env(environ, frozenset()) == {"PATH": "/bin", "HOME": "/h"}
    assert inherited_env(environ, frozenset({"DB_PASSWORD"})) == {
        "PATH": "/bin", "HOME": "/h", "DB_PASSWORD": "p" * 12}


def _served_env(workspace: Path, tmp_path: Path, key: str, *extra: str) -> str:
    """What a cell run through ``simagent mcp --http`` prints of FAKE_API_KEY."""
    token = "t0ken-" + secrets.token_hex(8)
    env = {**os.environ, "FAKE_API_KEY": key}
    with serving(workspace, tmp_path / f"server-{token}.err", token, "--approval", "auto",
                 *extra, env=env) as url:
        async def main() -> str:
            headers = {"Authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=CALL_S)
                                         ) as http, \
                    streamable_http_client(url, http_client=http) as (read, write, _), \
                    ClientSession(read, write,
                                  read_timeout_seconds=timedelta(seconds=CALL_S)) as s:
                with anyio.fail_after(CALL_S):
                    await s.initialize()
                result = await s.call_tool("run_python", {
                    "code": "import os\nprint(os.environ.get('FAKE_API_KEY', 'absent'))"})
                return "\n".join(c.text for c in result.content
                                 if isinstance(c, types.TextContent))

        return anyio.run(main)


@pytest.mark.real
def test_mcp_http_kernels_get_no_secret_named_variable_unless_passed(workspace, tmp_path):
    key = "sk-" + secrets.token_hex(12)
    assert _served_env(workspace, tmp_path, key) == "absent"
    assert _served_env(workspace, tmp_path, key, "--pass-env", "OTHER,FAKE_API_KEY") == \
        "[redacted:FAKE_API_KEY]"  # passed on purpose, and still redacted
