"""A ``local:`` model's server that stops by itself comes back (issue 41).

Before: after the server died (the OOM killer, at ~20 GB), every message failed with
"cannot reach http://127.0.0.1:PORT/v1 ... start the model server or fix the URL", advice
a person cannot follow for a server simagent owns, and the dead server stayed a zombie
until /quit. Now the provider-retry layer asks the kind's watch (``ServerWatch``) when a
call cannot connect: the server is started again on its port, one notice says why it had
stopped and where its log is, and the call goes on; past ``MAX_RESTARTS`` the turn ends
with that reason instead. Real server (the tiny GGUF), real chat client, real SIGKILL.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from test_local_server import ONE_THREAD, servers_of
from tiny_gguf import write_tiny_gguf

from simagent.agent.provider_retry import ProviderRetryMiddleware
from simagent.local_model.llama_server import MAX_RESTARTS
from simagent.models import ModelError, resolve_model
from simagent.trace.log import TraceLog

pytest.importorskip("llama_cpp", reason="needs the local extra: pip install 'simagent[local]'")


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # gone from the process table, or a zombie
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state == "Z":
            return
        time.sleep(0.05)
    raise AssertionError(f"server {pid} did not die")


@pytest.mark.slow
def test_a_killed_server_is_restarted_on_its_port_said_once_and_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIMAGENT_HOME", str(tmp_path / "home"))
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    resolved = resolve_model(f"local:{model}", model_config={"window": 1024, **ONE_THREAD},
                             environ={})
    try:
        url, log = resolved.info["url"], resolved.info["log"]
        trace = TraceLog(tmp_path / "trace.sqlite")
        retry = ProviderRetryMiddleware(trace, revive=resolved.reviver)
        request = SimpleNamespace(model=resolved.chat_model)

        def call(req: SimpleNamespace) -> AIMessage:
            return req.model.invoke([HumanMessage("hi")], max_tokens=2)

        assert resolved.reviver() is None  # it runs: nothing to bring back
        for n in range(1, MAX_RESTARTS + 1):
            (pid,) = servers_of(model)
            kill(pid)
            reply = retry.wrap_model_call(request, call)  # the same call goes on
            assert isinstance(reply, AIMessage)
            (new_pid,) = servers_of(model)  # one server, the old one reaped
            assert new_pid != pid and resolved.chat_model.openai_api_base == url
            notices = [e.payload["notice"] for e in trace.events(["model_server_restart"])]
            assert len(notices) == n
            assert "killed by SIGKILL" in notices[-1] and log in notices[-1]
            assert f"({n} of {MAX_RESTARTS} restarts this session)" in notices[-1]
            assert "start the model server" not in notices[-1]
        (pid,) = servers_of(model)
        kill(pid)
        with pytest.raises(ModelError) as stopped:
            retry.wrap_model_call(request, call)
        said = str(stopped.value)
        assert f"after {MAX_RESTARTS} restarts this session" in said and log in said
        assert servers_of(model) == []
        assert len(trace.events(["model_server_restart"])) == MAX_RESTARTS
    finally:
        resolved.close()
    assert servers_of(model) == []
