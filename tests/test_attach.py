"""``--kernel EXISTING``: simagent drives a kernel the person already runs (issue 24 §2).

Kernels are started the way a person starts them: ``jupyter kernel`` (jupyter_client's
standalone kernel) and a ``jupyter server`` on 127.0.0.1 with a token (``POST
/api/kernels``), with ``JUPYTER_RUNTIME_DIR`` in the test's folder. The person's side is a
second ``BlockingKernelClient``, as JupyterLab would be. simagent runs as the real CLI with
the scripted model driving the real graph, or as the supervisor's ``Kernel``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cli_fork
import psutil
import pytest
from jupyter_client import BlockingKernelClient
from waiting import until

from simagent import exit_codes
from simagent.kernel import Kernel
from simagent.kernel.connection import MODEL_MAY_NOT_RESET
from simagent.kernel.ladder import DECLINED
from simagent.outcomes import NOT_RUN
from simagent.paths import SessionPaths

#: the kernel process is what these tests are about (make test-real)
pytestmark = pytest.mark.real

SIMAGENT = [sys.executable, "-m", "simagent"]
JUPYTER = str(Path(sys.executable).parent / "jupyter")
START_S = 90.0  # a kernel or server start on a loaded machine
FIGURE_MIME = "application/vnd.simagent.figure+json"


def client(path: Path) -> BlockingKernelClient:
    """The person's client, once the kernel answers (its file is written before it binds
    its ports, so an early ``wait_for_ready`` reads "died": try again, bounded)."""
    kc = BlockingKernelClient(connection_file=str(path))
    kc.load_connection_file()
    kc.start_channels()
    deadline = time.monotonic() + START_S
    while True:
        try:
            kc.wait_for_ready(timeout=max(1.0, deadline - time.monotonic()))
            return kc
        except RuntimeError:
            if time.monotonic() > deadline:
                kc.stop_channels()
                raise
            time.sleep(0.2)


def run(kc: BlockingKernelClient, code: str, timeout: float = 60,
        aborted_ok: bool = False) -> str | None:
    """The person runs ``code`` in their client: its stdout and result text (None when
    ``aborted_ok`` and the kernel aborted it: sent while an interrupted cell failed)."""
    out: list[str] = []

    def hook(msg: dict) -> None:
        c = msg["content"]
        if msg["msg_type"] == "stream":
            out.append(c["text"])
        elif msg["msg_type"] == "execute_result":
            out.append(c["data"]["text/plain"] + "\n")

    reply = kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    if aborted_ok and reply["content"]["status"] == "aborted":
        return None
    assert reply["content"]["status"] == "ok", reply["content"]
    return "".join(out)


def stubborn(flag: Path) -> str:
    """A cell that ignores every interrupt and runs until ``flag`` exists (bounded)."""
    return ("import os, signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "try:\n    t0 = time.monotonic()\n"
            f"    while not os.path.exists({str(flag)!r}) and time.monotonic() - t0 < 300:\n"
            "        time.sleep(0.05)\nfinally:\n"
            "    signal.signal(signal.SIGINT, signal.default_int_handler)\n")


def user_names(kc: BlockingKernelClient) -> set[str]:
    return set(json.loads(run(kc, "import json as _j; print(_j.dumps(sorted(k for k in "
                                  "get_ipython().user_ns if not k.startswith('_'))))")))


def stop(proc: subprocess.Popen, kids: list[psutil.Process]) -> None:
    """SIGTERM (the wrapper then shuts its kernels down), SIGKILL what is left."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    _gone, alive = psutil.wait_procs(kids, timeout=15)
    for p in alive:
        p.kill()
    psutil.wait_procs(alive, timeout=10)


def cli(workspace: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_MODEL"}
    return cli_fork.run([*SIMAGENT, *args], cwd=workspace, env=env, text=True,
                        capture_output=True, timeout=timeout)


def scripted(path: Path, steps: list[dict]) -> str:
    path.write_text(json.dumps(steps))
    return f"scripted:{path}"


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "runtime"
    folder.mkdir()
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(folder))
    return folder


@pytest.fixture
def jupyter_kernel(runtime: Path, tmp_path: Path) -> Iterator[SimpleNamespace]:
    """``jupyter kernel`` as a person starts it, with the person's client attached."""
    kid = f"demo-{uuid.uuid4().hex[:8]}"
    path = runtime / f"kernel-{kid}.json"
    with open(tmp_path / "jupyter-kernel.log", "wb") as log:
        proc = subprocess.Popen([JUPYTER, "kernel", f"--KernelManager.connection_file={path}"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    kids: list[psutil.Process] = []
    kc = None
    try:
        until(path.exists, START_S, "the connection file")
        kids = until(lambda: psutil.Process(proc.pid).children(recursive=True), START_S,
                     "the kernel process")
        kc = client(path)
        yield SimpleNamespace(path=path, id=kid, proc=proc, kc=kc, pid=kids[0].pid)
    finally:
        if kc is not None:
            kc.stop_channels()
        stop(proc, kids)


def _http(url: str, token: str, method: str = "GET", body: dict | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        text = resp.read()
    return json.loads(text) if text else None


@pytest.fixture
def server_kernel(runtime: Path, tmp_path: Path) -> Iterator[SimpleNamespace]:
    """A kernel of a token-protected ``jupyter server`` on 127.0.0.1 (POST /api/kernels)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = uuid.uuid4().hex
    root = tmp_path / "server-root"
    root.mkdir()
    cmd = [JUPYTER, "server", "--ip=127.0.0.1", f"--port={port}", "--no-browser",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={root}"] + (["--allow-root"] if os.geteuid() == 0 else [])
    with open(tmp_path / "server.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    base = f"http://127.0.0.1:{port}/api/"
    kids: list[psutil.Process] = []
    kc = None

    def up() -> bool:
        try:
            return bool(_http(base + "status", token))
        except OSError:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            return False

    try:
        until(up, START_S, "jupyter server answering")
        kid = _http(base + "kernels", token, "POST", {"name": "python3"})["id"]
        path = runtime / f"kernel-{kid}.json"
        until(path.exists, START_S, "the server kernel's connection file")
        kc = client(path)
        kids = psutil.Process(proc.pid).children(recursive=True)
        yield SimpleNamespace(path=path, id=kid, proc=proc, kc=kc, base=base, token=token)
    finally:
        if kc is not None:
            kc.stop_channels()
        stop(proc, kids)


# ---------------------------------------------------------------- the agent attaches
def test_the_agent_sees_the_persons_variables_and_leaves_the_kernel_running(
        jupyter_kernel, workspace, tmp_path):
    """By connection file: variables set before attaching are the agent's to use; after
    simagent exits the kernel runs on with every variable, and the only helper name left
    is ``_out``, which ``_out.remove()`` takes out again."""
    kc = jupyter_kernel.kc
    run(kc, "import numpy as np\nx = 41\ndata = np.arange(6)")
    before = user_names(kc)
    model = scripted(tmp_path / "s.json", [
        {"tool": "run_python", "args": {"code": "y = x + 1\nprint(y, data.sum())"}},
        {"final": "seen: {out[-1]}"}])
    proc = cli(workspace, "run", "--kernel", str(jupyter_kernel.path), "--model", model,
               "--json", "use x")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["final"] == "seen: 42 15"
    assert jupyter_kernel.proc.poll() is None and psutil.pid_exists(jupyter_kernel.pid)
    assert run(kc, "print(x, y, data.sum(), type(_out).__name__, _out[1].text.strip())") \
        == "41 42 15 AttachedOutputs 42 15\n"
    assert user_names(kc) - before == {"y"}  # the agent's work; simagent's own: _out only
    assert run(kc, "_out.remove()") == "\"simagent's helpers are removed from this kernel\"\n"
    assert run(kc, f"print('_out' in globals(), {FIGURE_MIME!r} in "
                   f"get_ipython().display_formatter.formatters)") == "False False\n"


def test_a_server_kernel_by_id_survives_a_sigkilled_simagent(server_kernel, workspace,
                                                             tmp_path):
    """By kernel id, on a jupyter server with a token: simagent SIGKILLed mid-cell leaves
    the kernel running with the person's variables and the agent's."""
    kc = server_kernel.kc
    run(kc, "x = 41")
    flag = tmp_path / "cell-started"
    model = scripted(tmp_path / "s.json", [
        {"tool": "run_python", "args": {"code": f"z = x * 2\nopen({str(flag)!r}, 'w')"
                                                f".close()\nimport time\ntime.sleep(300)"}},
        {"final": "done"}])
    env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_MODEL"}
    agent = cli_fork.popen([*SIMAGENT, "run", "--kernel", server_kernel.id, "--model",
                            model, "go"], cwd=workspace, env=env, start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        until(flag.exists, 180, "the agent's cell running in the server kernel")
    finally:
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait(30)
    _http(f"{server_kernel.base}kernels/{server_kernel.id}/interrupt", server_kernel.token,
          "POST", {})  # the person stops the sleeping cell from the server
    assert until(lambda: run(kc, "print(x, z)", aborted_ok=True), 60,
                 "the person's client served after the interrupt") == "41 82\n"
    kernels = _http(server_kernel.base + "kernels", server_kernel.token)
    assert [k["id"] for k in kernels] == [server_kernel.id]


def test_another_clients_cells_never_reach_simagent(jupyter_kernel, workspace):
    """JupyterLab's cell runs while simagent's waits behind it, and the other way round:
    each side gets its own output only (iopub is filtered by parent header)."""
    other = jupyter_kernel.kc
    paths = SessionPaths.for_session(workspace, "s1")
    kernel = Kernel(paths, cwd=workspace, existing=jupyter_kernel.id)
    kernel.start()
    try:
        seen: list[str] = []
        started = threading.Event()

        def lab(code: str) -> None:
            def hook(msg: dict) -> None:
                if msg["msg_type"] == "stream":
                    seen.append(msg["content"]["text"])
                    started.set()
            other.execute_interactive(code, timeout=60, output_hook=hook)

        t = threading.Thread(target=lab, args=(
            "import time\nfor i in range(4):\n    print('LAB', i, flush=True)\n"
            "    time.sleep(0.3)",))
        t.start()
        assert started.wait(60)
        mine = kernel.execute("print('AGENT')", timeout=60)
        t.join(60)
        assert mine.status == "ok" and mine.stdout.splitlines() == ["AGENT"]
        assert "".join(seen) == "".join(f"LAB {i}\n" for i in range(4))

        seen.clear()
        started.clear()
        result: list[Any] = []
        t = threading.Thread(target=lambda: result.append(kernel.execute(
            "import time\nfor i in range(4):\n    print('AGENT', i, flush=True)\n"
            "    time.sleep(0.3)", on_output=lambda _e: started.set(), timeout=60)))
        t.start()
        assert started.wait(60)
        lab("print('LAB')")
        t.join(60)
        assert result[0].stdout.splitlines() == [f"AGENT {i}" for i in range(4)]
        assert "LAB" not in paths.outputs.joinpath(result[0].raw_path.name).read_text()
        assert seen == ["LAB\n"]
    finally:
        kernel.shutdown()
    assert run(other, "print(i)") == "3\n"  # disconnecting left the kernel and its names


def test_the_ladder_stops_after_the_interrupt_steps_and_never_restarts_it(
        jupyter_kernel, workspace, tmp_path):
    """A cell that ignores interrupts: simagent tries every interrupt step, then leaves the
    person's kernel running (same process, variables intact) instead of restarting it, and
    refuses to run cells until it answers again."""
    kc = jupyter_kernel.kc
    run(kc, "x = 41")
    kernel = Kernel(SessionPaths.for_session(workspace, "s1"), cwd=workspace,
                    existing=str(jupyter_kernel.path), interrupt_grace_s=2.0)
    kernel.start()
    try:
        flag = tmp_path / "let-it-end"
        r = kernel.execute(stubborn(flag), timeout=0.5)
        assert r.status == "timeout" and not r.state_lost, r.notice
        assert DECLINED in r.notice and r.recovery["needs_consent"] is True
        assert not r.recovery["restarted"]
        assert [s["step"] for s in r.recovery["steps"]] == ["control_interrupt"]
        refused = kernel.execute("print('not yet')")
        assert refused.status == NOT_RUN and refused.notice.startswith("not run: ")
        assert refused.recovery["needs_consent"] and refused.stdout == ""
        flag.touch()  # the person's cell ends by itself
        back = until(lambda: (res := kernel.execute("print(x)")).status == "ok" and res, 60,
                     "the kernel answering again once the cell ended")
        assert back.stdout.splitlines() == ["41"]
        assert jupyter_kernel.proc.poll() is None and psutil.pid_exists(jupyter_kernel.pid)
        assert run(kc, "import os; print(os.getpid())") == f"{jupyter_kernel.pid}\n"
    finally:
        kernel.shutdown()


def test_headless_reports_a_kernel_it_may_not_restart_and_exits(jupyter_kernel, workspace,
                                                                tmp_path):
    kc = jupyter_kernel.kc
    run(kc, "x = 41")
    flag = tmp_path / "let-it-end"
    model = scripted(tmp_path / "s.json", [
        {"tool": "run_python", "args": {"code": stubborn(flag), "timeout_s": 1}},
        {"final": "done"}])
    proc = cli(workspace, "run", "--kernel", "latest", "--model", model, "go")
    assert proc.returncode == exit_codes.KERNEL_CONSENT, proc.stderr
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("simagent: ")][1:]
    assert len(line) == 2 and "only its owner may allow" in line[0], proc.stderr
    assert f"({jupyter_kernel.path}) is still running; resume with: simagent run " \
        "--resume " in line[1]  # its last word
    assert "left it running, variables untouched" in line[0]
    assert "simagent run --resume " in line[0] and line[0].endswith(
        f"--kernel {jupyter_kernel.path}'")
    flag.touch()  # the cell simagent left running ends; the person's client is served
    assert run(kc, "print(x)", timeout=60) == "41\n"


def test_the_models_reset_kernel_leaves_the_persons_kernel_alone(jupyter_kernel, workspace,
                                                                 tmp_path):
    """``reset_kernel`` is the model's call, not the person's consent: on their kernel it
    restarts nothing (a ``jupyter kernel`` would have stopped) and says whom to ask."""
    kc = jupyter_kernel.kc
    run(kc, "x = 41")
    model = scripted(tmp_path / "s.json", [{"tool": "reset_kernel", "args": {}},
                                           {"final": "reset said: {out[-1]}"}])
    proc = cli(workspace, "run", "--kernel", jupyter_kernel.id, "--model", model, "reset it")
    assert proc.returncode == 0, proc.stderr
    assert f"reset said: {MODEL_MAY_NOT_RESET}" in proc.stdout
    assert jupyter_kernel.proc.poll() is None
    assert run(kc, "import os; print(x, os.getpid())") == f"41 {jupyter_kernel.pid}\n"


# -------------------------------------------------------------------- bad input
def test_no_running_kernel_gets_one_line_exit_6_and_changes_nothing(runtime, workspace,
                                                                   tmp_path):
    socks = [socket.socket() for _ in range(5)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()  # nothing listens there now: a kernel that stopped
    dead = runtime / "kernel-dead0001.json"
    dead.write_text(json.dumps({
        "shell_port": ports[0], "iopub_port": ports[1], "stdin_port": ports[2],
        "control_port": ports[3], "hb_port": ports[4], "ip": "127.0.0.1", "key": "k",
        "transport": "tcp", "signature_scheme": "hmac-sha256", "kernel_name": ""}))
    before = sorted(p.name for p in runtime.iterdir())
    model = scripted(tmp_path / "s.json", [{"final": "x"}])
    (tmp_path / "notes.json").write_text("not JSON {")
    for existing, words in [(str(dead), "stale connection file"),
                            ("no-such-id", "no kernel with that id"),
                            ("latest", "no running kernel"),
                            (str(runtime), "that is a folder; name a connection file in it"),
                            (str(tmp_path / "notes.json"), "is not a kernel connection file "
                                                           "(not JSON: ")]:
        proc = cli(workspace, "run", "--kernel", existing, "--model", model, "hi", timeout=120)
        assert proc.returncode == exit_codes.KERNEL, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith("simagent: error: --kernel ") and words in line, line
    assert sorted(p.name for p in runtime.iterdir()) == before
    listed = cli(workspace, "sessions", "--json")
    assert json.loads(listed.stdout or "[]") == []


def test_doctor_lists_the_kernels_it_can_attach_to(jupyter_kernel, runtime):
    from simagent.doctor import check_attachable, render

    (runtime / "kernel-gone.json").write_text(json.dumps(
        {"shell_port": 1, "hb_port": 1, "ip": "127.0.0.1", "transport": "tcp"}))
    text = render(check_attachable())
    assert f"--kernel {jupyter_kernel.id}  ({jupyter_kernel.path}, the newest" in text
    assert "1 stale connection file(s)" in text and "--kernel gone" not in text


def test_with_the_persons_consent_its_server_restarts_it(server_kernel, workspace):
    """The TUI's "y" (``Session.restart_attached_kernel``): the kernel's own server
    restarts it in place (same id); nothing is replayed into it, ``_out`` comes back."""
    from simagent.session import Session

    kc = server_kernel.kc
    run(kc, "x = 41")
    session = Session.create(workspace, kernel_existing=server_kernel.id)
    try:
        session.start_kernel()
        before = session.execute("import os\nprint(os.getpid(), x)").stdout.split()
        assert before[1] == "41"
        rec = session.restart_attached_kernel()
        assert rec.restarted and rec.attached and not rec.state_restored, rec.message()
        assert "nothing was replayed into it" in rec.message()
        after = session.execute("import os\nprint(os.getpid(), 'x' in globals(), "
                                "type(_out).__name__)").stdout.split()
        assert after[0] != before[0] and after[1:] == ["False", "AttachedOutputs"]
    finally:
        session.close()
    kernels = _http(server_kernel.base + "kernels", server_kernel.token)
    assert [k["id"] for k in kernels] == [server_kernel.id]


def test_ctrl_c_stops_the_agents_cell_and_leaves_the_kernel_running(jupyter_kernel,
                                                                   workspace, tmp_path):
    """ctrl+C (SIGINT) in ``simagent run``: the agent's cell is interrupted through the
    control channel, simagent exits 130, the kernel runs on with every variable."""
    kc = jupyter_kernel.kc
    run(kc, "x = 41")
    flag = tmp_path / "cell-started"
    model = scripted(tmp_path / "s.json", [
        {"tool": "run_python", "args": {"code": f"z = x * 2\nopen({str(flag)!r}, 'w')"
                                                f".close()\nimport time\ntime.sleep(300)"}},
        {"final": "done"}])
    env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_MODEL"}
    agent = cli_fork.popen([*SIMAGENT, "run", "--kernel", jupyter_kernel.id, "--model",
                            model, "go"], cwd=workspace, env=env, start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        until(flag.exists, 180, "the agent's cell running")
        agent.send_signal(signal.SIGINT)
        _out, err = agent.communicate(timeout=120)
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait(30)
    assert agent.returncode == exit_codes.CANCELLED, err
    assert run(kc, "import os\nprint(x, z, os.getpid())") == f"41 82 {jupyter_kernel.pid}\n"
