"""simagent in JupyterLab's chat, in a real browser (``make test-browser``; issue 39).

JupyterLab with jupyter-ai and simagent's persona runs on loopback in folders of its own;
a notebook session's kernel holds ``k = 0.37``; Debian's Chromium, driven by Playwright,
opens a chat made through the contents API, picks simagent and asks for the half-life.
A scripted model (``$SIMAGENT_MODEL``, simagent's own config: the persona adds nothing for
tests) computes ``log(2)/k`` with run_python in the notebook's kernel. Checked: the tool
card and the streamed ``1.8734`` in the chat panel; ``k`` still in the kernel and the
agent's ``t_half`` there too (one namespace, both ways); ``/notebook`` puts the agent's
cell, with its output, into the notebook on disk and into the page; a chat in a folder
with no running notebook gets a kernel of simagent's own, and says so; after a page
reload the first chat goes on without its history shown twice. Prompt-to-first-text
latency in the browser is printed (median of 3 turns after the first). A screenshot goes
to docs/images/jupyterlab-chat.png.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from jupyter_client import BlockingKernelClient

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "jupyterlab-chat.png"
TOKEN = "simagent-browser-test"
#: Bounded waits (s): the server's /api/status, a kernel's first answer, a reply.
SERVER_UP_S = 120.0
KERNEL_UP_S = 60.0
REPLY_S = 180.0
STOP_S = 30.0
ROOT = ".jp-lab-chat-main-panel:not(.lm-mod-hidden)"
MESSAGES = ".jp-lab-chat-main-panel .jp-chat-messages-container"
QUESTION = "What is the half-life for the decay rate k in my notebook?"
STEPS = {"steps": [
    {"tool": "run_python", "args": {
        "code": "import math\nt_half = round(math.log(2) / k, 4)\nprint(t_half)"}},
    {"final": "The half-life is {out[-1]|(\\d+\\.\\d+)} (ln 2 / k, with k from your "
              "notebook)."},
    {"final": "Reply one: t_half stays in your kernel."},
    {"final": "Reply two: t_half stays in your kernel."},
    {"final": "Reply three: t_half stays in your kernel."},
]}


@dataclass
class Lab:
    url: str
    root: Path
    runtime: Path
    log: Path
    proc: subprocess.Popen[bytes]

    def api(self, method: str, path: str, body: Any = None) -> Any:
        req = urllib.request.Request(
            f"{self.url}{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    pytest.importorskip("jupyter_ai_acp_client", reason="the jupyter extra is not installed "
                        "(make test-browser installs it)")
    root, home, config, runtime = (tmp_path / d for d in ("work", "home", "config", "runtime"))
    for d in (root, home, config, runtime):
        d.mkdir()
    # JupyterLab's "get notified about news?" toast covers the send button: answered no
    news = config / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps(STEPS))
    env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_TEST_KERNEL"}
    env.update(HOME=str(home), JUPYTER_CONFIG_DIR=str(config), JUPYTER_RUNTIME_DIR=str(runtime),
               JUPYTER_DATA_DIR=str(tmp_path / "data"), SIMAGENT_MODEL=f"scripted:{steps}")
    port = _free_port()
    log = tmp_path / "server.log"
    cmd = [str(Path(sys.executable).with_name("jupyter")), "lab", "--no-browser",
           "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={TOKEN}",
           f"--ServerApp.root_dir={root}"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    server = Lab(f"http://127.0.0.1:{port}", root, runtime, log, proc)
    try:
        deadline = time.monotonic() + SERVER_UP_S
        while True:
            try:
                server.api("GET", "/api/status")
                break
            except (OSError, urllib.error.URLError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not answer /api/status in {SERVER_UP_S:.0f} s "
                                f"(exit {proc.poll()}):\n{server.log_tail()}")
                time.sleep(0.5)
        yield server
    finally:
        _stop(server)


def _stop(server: Lab) -> None:
    """Shut the kernels down through the server, then end its process group (the
    persona's agent runs in a group of its own, which the server ends as it stops)."""
    try:
        for s in server.api("GET", "/api/sessions") or []:
            server.api("DELETE", f"/api/sessions/{s['id']}")
    except (OSError, urllib.error.URLError, ValueError):
        pass
    for sig, wait in ((signal.SIGTERM, STOP_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(server.proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            server.proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue


def _notebook_kernel(server: Lab) -> Any:
    """A notebook session (the REST call JupyterLab makes when it opens one) whose kernel
    holds ``k = 0.37``, run through jupyter_client on its connection file."""
    nb = {"cells": [{"cell_type": "code", "id": "set-k", "metadata": {},
                     "execution_count": None, "outputs": [], "source": "k = 0.37"}],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                      "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    server.api("PUT", "/api/contents/decay.ipynb",
               {"type": "notebook", "format": "json", "content": nb})
    session = server.api("POST", "/api/sessions", {
        "path": "decay.ipynb", "type": "notebook", "name": "decay.ipynb",
        "kernel": {"name": "python3"}})
    kid = session["kernel"]["id"]
    conn = server.runtime / f"kernel-{kid}.json"
    kc = BlockingKernelClient(connection_file=str(conn))
    kc.load_connection_file()
    kc.start_channels()
    deadline = time.monotonic() + KERNEL_UP_S
    while True:
        try:
            kc.wait_for_ready(timeout=max(1.0, deadline - time.monotonic()))
            break
        except RuntimeError:  # a slow start reads as "died" before the first heartbeat
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)
    assert kc.execute_interactive("k = 0.37", timeout=KERNEL_UP_S)["content"]["status"] == "ok"
    return kc


def _kernel_prints(kc: Any, code: str) -> str:
    out: list[str] = []

    def keep(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])

    reply = kc.execute_interactive(code, timeout=KERNEL_UP_S, output_hook=keep)
    assert reply["content"]["status"] == "ok", reply["content"]
    return "".join(out)


def _send(page: Any, text: str) -> float:
    box = page.locator(f"{ROOT} .jp-chat-input-container textarea[placeholder]")
    box.fill(text)
    if text.startswith("/"):
        page.keyboard.press("Escape")  # the slash-command menu stays open otherwise
    started = time.monotonic()
    page.click(f"{ROOT} .jp-chat-send-button")
    return started


def _wait_text(page: Any, text: str, timeout_s: float = REPLY_S) -> float:
    page.wait_for_function(
        "([sel, t]) => [...document.querySelectorAll(sel)].some(e => e.textContent.includes(t))",
        arg=[MESSAGES, text], timeout=timeout_s * 1000)
    return time.monotonic()


def test_simagent_in_the_jupyterlab_chat(lab: Lab) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not "
                                   "installed (make test-browser installs it)")
    if not CHROMIUM.exists():
        pytest.skip(f"no {CHROMIUM} (make test-browser installs Debian's chromium)")
    kc = _notebook_kernel(lab)
    lab.api("PUT", "/api/contents/decay.chat", {"type": "file", "format": "text", "content": ""})
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                        args=["--no-sandbox", "--disable-gpu",
                                              "--disable-dev-shm-usage"])
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 860})
                try:
                    _chat_turns(lab, page, kc)
                except Exception:
                    _evidence(lab, page)
                    raise
            finally:
                browser.close()
    finally:
        kc.stop_channels()


def _evidence(lab: Lab, page: Any) -> None:
    """What a failure leaves to read: the page as a picture, the chat's text and the
    server's log (the persona's and the agent's lines are in it)."""
    shot = lab.root.parent / "failure.png"
    try:
        page.screenshot(path=str(shot))
        chat = " | ".join(page.locator(MESSAGES).all_text_contents())
    except Exception as exc:  # the page itself may be what failed
        chat = f"(page unreadable: {exc})"
    print(f"\n--- failure screenshot: {shot}\n--- chat: {chat}\n--- server log tail:\n"
          f"{lab.log_tail(6000)}")


def _chat_turns(lab: Lab, page: Any, kc: Any) -> None:
    _side_by_side(lab)
    page.goto(f"{lab.url}/lab?token={TOKEN}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    page.locator(f"{ROOT} .jp-chat-input-container textarea[placeholder]").wait_for(
        timeout=60_000)
    _pick_simagent(page)
    cold = _send(page, QUESTION)
    done = _wait_text(page, "The half-life is 1.8734")
    print(f"\nfirst turn (agent start, kernel attach, one cell): {done - cold:.2f} s")
    text = page.locator(MESSAGES).first.text_content() or ""
    assert "run_python" in text, text  # the tool card
    assert "simagent works in the kernel of decay.ipynb" in text, text

    # one namespace both ways: the person's k is still there, the agent's t_half too
    assert _kernel_prints(kc, "print(k, t_half)").split() == ["0.37", "1.8734"]

    _send(page, "/notebook")
    _wait_text(page, "/notebook: 1 cell of session")
    cells = lab.api("GET", "/api/contents/decay.ipynb")["content"]["cells"]
    assert [c["source"].splitlines()[0] for c in cells] == ["k = 0.37", "import math"]
    inserted = cells[1]
    assert "1.8734" in "".join(o.get("text", "") for o in inserted["outputs"])
    assert inserted["metadata"]["simagent"]["n"] >= 1
    # the page reloaded the notebook from disk: the cell and its output are there
    page.wait_for_function(
        "() => [...document.querySelectorAll('.jp-Notebook .jp-OutputArea-output')]"
        ".some(e => e.textContent.includes('1.8734'))", timeout=30_000)
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.mouse.move(1000, 600)  # no tooltip in the picture (hover, focus)
    page.evaluate("document.activeElement && document.activeElement.blur()")
    page.wait_for_function("() => !document.querySelector('[role=tooltip]')", timeout=5_000)
    page.screenshot(path=str(SCREENSHOT))

    latencies = []
    for word in ("one", "two", "three"):
        started = _send(page, f"Turn {word}: is t_half still there?")
        latencies.append(_wait_text(page, f"Reply {word}:") - started)
    print("prompt to first text in the browser: "
          + ", ".join(f"{s:.2f}" for s in latencies)
          + f" s; median {statistics.median(latencies):.2f} s")

    # a chat in a folder where no notebook runs: simagent starts a kernel of its own and
    # says so. Opening it reloads the page: decay.chat reconnects, and its session loads
    # again at its next message without its history landing in the chat twice.
    lab.api("PUT", "/api/contents/solo", {"type": "directory"})
    lab.api("PUT", "/api/contents/solo/own.chat", {"type": "file", "format": "text",
                                                   "content": ""})
    page.goto(f"{lab.url}/lab/tree/solo/own.chat?token={TOKEN}")
    page.locator(".lm-TabBar-tab.lm-mod-current", has_text="own.chat").wait_for(
        timeout=60_000)
    _pick_simagent(page)
    _send(page, "And in a kernel of your own?")
    _wait_text(page, "simagent started its own")
    assert _kernel_prints(kc, "print(sorted(n for n in ('k', 't_half') if n in globals()))") \
        == "['k', 't_half']\n"  # the notebook's kernel: untouched by the other chat

    page.locator(".lm-TabBar-tab", has_text="decay.chat").first.click()
    page.locator(".lm-TabBar-tab.lm-mod-current", has_text="decay.chat").wait_for(
        timeout=10_000)
    _send(page, "Once more, after the reload?")
    page.wait_for_function(
        "([sel, t]) => [...document.querySelectorAll(sel)].some(e => "
        "e.textContent.split(t).length > 2)",
        arg=[MESSAGES, "The half-life is 1.8734"], timeout=REPLY_S * 1000)
    bodies = [m.get("body", "") for m in json.loads(
        lab.api("GET", "/api/contents/decay.chat")["content"])["messages"]]
    assert sum("Reply one:" in b for b in bodies) == 1, bodies  # no replayed history


def _pick_simagent(page: Any) -> None:
    picker = page.locator(f"{ROOT} .jp-jai-personaControls-persona-btn")
    picker.click()
    page.get_by_role("menuitem", name="simagent").click()
    assert "simagent" in picker.inner_text()


def _side_by_side(server: Lab) -> None:
    """JupyterLab's saved layout (its workspace API): the notebook and the chat side by
    side in the main area, as a person works with them (and as the screenshot shows)."""
    server.api("PUT", "/lab/api/workspaces/default", {"data": {
        "layout-restorer:data": {"main": {
            "dock": {"type": "split-area", "orientation": "horizontal", "sizes": [0.5, 0.5],
                     "children": [
                         {"type": "tab-area", "currentIndex": 0,
                          "widgets": ["notebook:decay.ipynb"]},
                         {"type": "tab-area", "currentIndex": 0,
                          "widgets": ["chat:decay.chat"]}]},
            "current": "chat:decay.chat"}},
        "notebook:decay.ipynb": {"data": {"path": "decay.ipynb", "factory": "Notebook"}},
        "chat:decay.chat": {"data": {"filepath": "decay.chat", "inSidePanel": False}},
    }, "metadata": {"id": "default"}})
