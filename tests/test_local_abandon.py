"""An abandoned reply stops the real llama.cpp server's generation.

llama-cpp-python's server generates a streamed reply for as long as the connection is
open (it looks for a disconnect only between chunks) and serves one request at a time. A
reply the user abandoned (ctrl+C twice, or a cancel the call did not answer) used to be
read to its end on a lingering thread, so the server went on writing up to the token
limit and the user's next message waited behind it. The client now closes the stream at
the abandoned reply's next chunk (``compatible_chat``, ``turns.check_abandoned``).
"""

from __future__ import annotations

import contextvars
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("llama_cpp", reason="needs the local extra: pip install 'simagent[local]'")

from langchain_core.messages import HumanMessage
from test_local_server import ENDLESS, servers_of
from tiny_gguf import write_tiny_gguf

from simagent.agent.recorder import TraceRecorder
from simagent.models import resolve_model
from simagent.trace.log import TraceLog
from simagent.trace.usage import UsageTotals
from simagent.turns import TurnAbandoned, TurnRegistry

#: The abandoned reply's limit: the server would write all of it unless the disconnect
#: stops it (nearly the whole window, so it outlasts the client's two chunks by far).
LIMIT = 900
#: Greedy, end-of-text forbidden (``ENDLESS``) and bytes >= 0x80 too (ids 131-258 in
#: tiny_gguf): every token is a whole character, so the server sends a chunk per token.
#: Random bytes often make no character for many tokens, and the server, which looks for a
#: disconnect only when it sends, then runs on without a chunk.
ASCII_ENDLESS = {**ENDLESS, "logit_bias": {str(i): -100 for i in (2, *range(131, 259))}}


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    tiny = write_tiny_gguf(tmp_path / "abandon.gguf")
    monkeypatch.setenv("SIMAGENT_HOME", str(tmp_path / "home"))
    resolved = resolve_model(f"local:{tiny}", model_config={"window": 1024, "threads": 1},
                             environ={})
    yield resolved
    resolved.close()
    assert servers_of(tiny) == []


def decode_runs(text: str) -> list[int]:
    """Tokens llama.cpp generated per request it finished, from its log."""
    return [int(m) for m in re.findall(r"\s eval time =.*?/\s*(\d+) runs", text)]


@pytest.mark.slow
def test_an_abandoned_stream_stops_the_servers_generation(served, tmp_path: Path) -> None:
    log = Path(served.info["log"])
    start = log.stat().st_size
    registry = TurnRegistry()
    turn = registry.begin()
    trace = TraceLog(tmp_path / "trace.sqlite")
    recorder = TraceRecorder(trace, UsageTotals(), turns=registry)
    request = SimpleNamespace(system_message=None, messages=[HumanMessage("write")], tools=[])
    seen: list[object] = []

    def model_call(_request: object) -> object:
        for chunk in served.chat_model.stream(_request.messages, max_tokens=LIMIT,
                                              **ASCII_ENDLESS):
            seen.append(chunk)
            if len(seen) == 1:
                registry.abandon(turn)  # the runner gives the turn up mid-reply
        return seen

    def abandoned_turn() -> None:  # what the turn's model node does, in the turn's context
        registry.bind(turn)
        recorder.wrap_model_call(request, model_call)

    with pytest.raises(TurnAbandoned):
        contextvars.copy_context().run(abandoned_turn)
    assert len(seen) == 1  # the stream ended at the chunk after the abandon
    # the request was sent and read: counted, as dropped (as a late reply was)
    (usage,) = [e.payload for e in trace.events(["model_usage"])]
    assert usage["dropped"] and usage["input_tokens"] > 0
    assert not trace.events(["message_assistant"])
    # The next request: the server holds one request at a time, so it is answered only
    # once the abandoned one stopped generating.
    assert served.chat_model.invoke([HumanMessage("hi")], max_tokens=2,
                                    **ASCII_ENDLESS).content
    text = log.read_bytes()[start:].decode(errors="replace")
    # the server saw the disconnect before it served the next request, and the only
    # reply it finished is that one (2 tokens); reading the abandoned reply to its end, it
    # logged a finished reply of LIMIT tokens first
    assert "Disconnected from client" in text
    assert text.index("Disconnected from client") < text.rindex("prompt eval time")
    assert decode_runs(text) and max(decode_runs(text)) <= 3
