"""The JupyterLab persona's own pieces (simagent/jupyter/persona.py), without a server:
the command it runs, what it tells the chat of the kernel, and the prompt's ``_meta``.
tests/browser/ runs it for real. Importing the persona runs ``simagent acp --help`` (its
requirement check), so these are slow."""

from __future__ import annotations

import asyncio
import subprocess
from typing import Any

import pytest

pytest.importorskip("jupyter_ai_acp_client", reason="the jupyter extra is not installed")

from simagent.jupyter import persona
from simagent.jupyter.kernel_choice import KernelChoice, choose

pytestmark = pytest.mark.slow


def test_agent_command_runs_simagent_acp():
    cmd = persona.agent_command()
    assert cmd[-1] == "acp"
    done = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "Agent Client Protocol" in done.stdout


def test_first_line_says_which_kernel_or_why_none():
    one = choose([{"path": "fit.ipynb", "type": "notebook", "kernel": {"id": "k1"}}], "c.chat")
    assert persona.first_line(one) == ("simagent works in the kernel of fit.ipynb: the one "
                                       "notebook running in the chat's folder (the root)")
    two = choose([{"path": f"{n}.ipynb", "kernel": {"id": n}} for n in "ab"], "c.chat")
    line = persona.first_line(two) or ""
    assert line.startswith("simagent: 2 notebooks run") and "a kernel of its own" in line
    assert "name the notebook in the first message of a new chat" in line
    dead = KernelChoice("x.ipynb", None, "x.ipynb (attached to the message) runs no kernel")
    assert "runs no kernel, so it works in a kernel of its own" in (persona.first_line(dead)
                                                                     or "")
    # nothing runs: simagent acp says it started its own kernel
    assert persona.first_line(choose([], "c.chat")) is None


class Connection:
    """The part of acp's ClientSideConnection the wrapper touches: what prompt got."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.closed = False

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> str:
        self.calls.append({"session_id": session_id, "prompt": prompt, **kwargs})
        return "done"

    async def close(self) -> None:
        self.closed = True


def test_prompt_meta_names_the_kernel_per_session():
    conn = Connection()
    meta = {"s1": {persona.KERNEL_META: "/run/kernel-1.json"}}
    wrapped = persona._MetaPrompt(conn, meta)
    assert asyncio.run(wrapped.prompt(session_id="s1", prompt=["hi"])) == "done"
    asyncio.run(wrapped.prompt(session_id="s2", prompt=["hi"]))
    assert conn.calls == [
        {"session_id": "s1", "prompt": ["hi"], "simagent.kernel": "/run/kernel-1.json"},
        {"session_id": "s2", "prompt": ["hi"]}]
    asyncio.run(wrapped.close())  # everything else is the connection's own
    assert conn.closed
