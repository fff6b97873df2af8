"""simagent.models: spec parsing, key checks, windows, and a real OpenAI-compatible round trip.

No langchain mocks: provider models are constructed for real (construction is offline) and the
openai-compatible path talks HTTP to tests/openai_stub.py.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from openai_stub import OpenAIStub, Reply, error_reply  # tests/ is on sys.path (rootdir conftest)

from simagent.models import (
    ModelError,
    ModelSpec,
    context_window,
    describe_provider_error,
    parse_model_spec,
    resolve_model,
)

# ---- parse_model_spec -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("anthropic:claude-sonnet-4-5",
         ModelSpec("anthropic:claude-sonnet-4-5", "provider", "anthropic", "claude-sonnet-4-5")),
        ("openai:gpt-4.1", ModelSpec("openai:gpt-4.1", "provider", "openai", "gpt-4.1")),
        ("ollama:qwen3:8b", ModelSpec("ollama:qwen3:8b", "provider", "ollama", "qwen3:8b")),
        ("google_genai:gemini-2.5-pro",
         ModelSpec("google_genai:gemini-2.5-pro", "provider", "google_genai", "gemini-2.5-pro")),
        ("openai-compatible:qwen@http://localhost:8080/v1",
         ModelSpec("openai-compatible:qwen@http://localhost:8080/v1", "openai-compatible",
                   "openai-compatible", "qwen", "http://localhost:8080/v1")),
        # split at the LAST '@': model names may contain '@'
        ("openai-compatible:org@model@https://h.example/v1",
         ModelSpec("openai-compatible:org@model@https://h.example/v1", "openai-compatible",
                   "openai-compatible", "org@model", "https://h.example/v1")),
        ("scripted:bench/x.toml", ModelSpec("scripted:bench/x.toml", "scripted", "scripted",
                                            "bench/x.toml")),
        ("replay:wf-01", ModelSpec("replay:wf-01", "replay", "replay", "wf-01")),
        ("  openai:gpt-4o-mini ", ModelSpec("openai:gpt-4o-mini", "provider", "openai",
                                            "gpt-4o-mini")),
    ],
)
def test_parse_valid(spec: str, expected: ModelSpec) -> None:
    assert parse_model_spec(spec) == expected


@pytest.mark.parametrize(
    "spec",
    [
        "", "   ", "gpt-4.1", ":gpt-4.1", "anthropic:", "anthropic:  ", "1abc:model",
        "http://localhost:8080/v1", "openai-compatible:qwen", "openai-compatible:@http://x/v1",
        "openai-compatible:qwen@localhost:8080", "openai-compatible:qwen@ftp://x",
        "scripted:", "replay:", "bad provider:x",
    ],
)
def test_parse_malformed(spec: str) -> None:
    with pytest.raises(ModelError) as info:
        parse_model_spec(spec)
    err = info.value
    assert err.code == 2
    assert err.env_var is None
    text = str(err)
    assert "\n" not in text
    assert "provider:model" in text and "openai-compatible:MODEL@BASE_URL" in text
    assert "scripted:PATH" in text


def test_unknown_provider_is_usage_error() -> None:
    with pytest.raises(ModelError) as info:
        resolve_model("nosuchprovider:model-x", environ={})
    assert info.value.code == 2
    assert "nosuchprovider" in str(info.value)
    assert "\n" not in str(info.value)


def test_replay_plays_a_bench_workflow() -> None:
    with pytest.raises(ModelError) as info:
        resolve_model("replay:wf-01", environ={})
    assert info.value.code == 2
    assert "unknown workflow 'wf-01'" in str(info.value) and "bench list" in str(info.value)
    resolved = resolve_model("replay:canary", environ={})
    assert resolved.workflow.id == "canary" and resolved.id == "replay:canary"
    assert resolved.workflow.prompt and resolved.window == resolved.workflow.window


@pytest.mark.slow
def test_models_module_imports_no_langchain() -> None:
    code = ("import sys, simagent.models; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('langchain', 'langchain_core', 'openai', 'anthropic', 'httpx')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=120)
    assert out.stdout.strip() == "[]"


# ---- providers via init_chat_model -------------------------------------------------------------


def test_missing_anthropic_key_is_one_line() -> None:
    with pytest.raises(ModelError) as info:
        resolve_model("anthropic:claude-sonnet-4-5", environ={})
    err = info.value
    assert err.code == 2  # configuration, like every other setting to fix (README)
    assert err.env_var == "ANTHROPIC_API_KEY"
    assert "\n" not in str(err)
    assert "ANTHROPIC_API_KEY" in str(err) and "anthropic:claude-sonnet-4-5" in str(err)


def test_empty_key_counts_as_missing() -> None:
    with pytest.raises(ModelError) as info:
        resolve_model("openai:gpt-4.1", environ={"OPENAI_API_KEY": ""})
    assert info.value.env_var == "OPENAI_API_KEY"


def test_anthropic_with_dummy_key_uses_profile_window() -> None:
    resolved = resolve_model("anthropic:claude-sonnet-4-5",
                             environ={"ANTHROPIC_API_KEY": "sk-ant-dummy"})
    assert type(resolved.chat_model).__name__ == "ChatAnthropic"
    assert resolved.id == "anthropic:claude-sonnet-4-5"
    assert resolved.window == 200000
    assert resolved.max_output == 64000
    assert context_window(resolved.chat_model) == 200000


def test_openai_keeps_default_api_and_config_window_wins() -> None:
    resolved = resolve_model("openai:gpt-4.1", model_config={"window": 100000},
                             environ={"OPENAI_API_KEY": "sk-dummy"})
    assert resolved.window == 100000
    # the config window reaches the profile that deepagents' summarization reads
    assert resolved.chat_model.profile["max_input_tokens"] == 100000
    assert resolved.chat_model.profile["max_output_tokens"] == 32768
    assert resolved.chat_model.use_responses_api is not False  # langchain's default kept


def test_gemini_key_alias_accepted() -> None:
    resolved = resolve_model("google_genai:gemini-2.5-flash",
                             environ={"GEMINI_API_KEY": "dummy"})
    assert resolved.window and resolved.window > 100000


def test_bad_config_window_is_usage_error() -> None:
    with pytest.raises(ModelError) as info:
        resolve_model("openai:gpt-4.1", model_config={"window": "big"},
                      environ={"OPENAI_API_KEY": "x"})
    assert info.value.code == 2


def test_a_bad_model_setting_names_the_file_that_set_it(tmp_path: Path, workspace: Path,
                                                          _state_home: Path) -> None:
    """``[model]`` merges both files: each bad key is named with the file that set it,
    for simagent's checks and a kind's own (``local:``'s port) alike."""
    from functools import partial

    from conftest import write_config
    from tiny_gguf import write_tiny_gguf

    from simagent.config import Config

    user = _state_home / "config.toml"
    user.write_text('[model]\nretries = -1\nport = "x"\n')
    ws = write_config(workspace, '[model]\nwindow = "big"\n')

    def error(spec: str) -> str:
        config = Config.load(workspace, trust=True)
        with pytest.raises(ModelError) as info:
            resolve_model(spec, model_config=config.model_settings,
                          settings_at=partial(config.where, "model"), environ={})
        assert info.value.code == 2
        return str(info.value)

    script = tmp_path / "s.json"
    script.write_text(json.dumps([{"final": "done"}]))
    assert error(f"scripted:{script}") == \
        f"{ws}: [model] window must be a positive integer, got 'big'"
    ws.write_text("[model]\nwindow = 4000\n")
    assert error(f"scripted:{script}") == \
        f"{user}: [model] retries must be a whole number >= 0, got -1"
    user.write_text('[model]\nport = "x"\n')
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    assert error(f"local:{gguf}") == f"{user}: [model] port must be a TCP port number, got 'x'"
    with pytest.raises(ModelError, match=r"^model config: window must be a positive integer"):
        resolve_model(f"scripted:{script}", model_config={"window": 0})


def test_ollama_window_or_extra_hint() -> None:
    spec = "ollama:qwen3:8b"
    if importlib.util.find_spec("langchain_ollama") is not None:
        resolved = resolve_model(spec, model_config={"num_ctx": 16384}, environ={})
        assert resolved.window == 16384
        assert resolved.chat_model.num_ctx == 16384
        assert resolved.chat_model.model == "qwen3:8b"
        assert resolve_model(spec, environ={}).window == 32768
    else:
        with pytest.raises(ModelError) as info:
            resolve_model(spec, model_config={"num_ctx": 16384}, environ={})
        err = info.value
        assert err.code == 4
        assert "simagent[ollama]" in str(err) and "langchain-ollama" in str(err)
        assert "\n" not in str(err)


def test_missing_partner_package_names_pip_package() -> None:
    if importlib.util.find_spec("langchain_mistralai") is not None:
        pytest.skip("langchain-mistralai is installed")
    with pytest.raises(ModelError) as info:
        resolve_model("mistralai:mistral-large-latest", environ={"MISTRAL_API_KEY": "x"})
    assert info.value.code == 4
    assert "pip install langchain-mistralai" in str(info.value)


# ---- scripted --------------------------------------------------------------------------------


def test_scripted_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelError) as info:
        resolve_model(f"scripted:{tmp_path / 'nope.json'}")
    assert info.value.code == 2
    assert "nope.json" in str(info.value)


def test_scripted_from_file(tmp_path: Path) -> None:
    pytest.importorskip("simagent.agent.scripted")
    script = tmp_path / "s.json"
    script.write_text(json.dumps([{"final": "done"}]))
    resolved = resolve_model(f"scripted:{script}", model_config={"window": 5000})
    assert resolved.window == 5000
    assert resolved.chat_model.profile["max_input_tokens"] == 5000
    assert resolve_model(f"scripted:{script}").window == 128000
    assert resolved.chat_model.invoke("hi").content == "done"
    script.write_text("not json")
    with pytest.raises(ModelError) as info:
        resolve_model(f"scripted:{script}")
    assert info.value.code == 2 and "s.json" in str(info.value)


# ---- openai-compatible against a real local HTTP server ------------------------------------


def _compatible(stub: OpenAIStub, **cfg: object):
    return resolve_model(f"openai-compatible:local-model@{stub.base_url}",
                         model_config={"max_retries": 0, **cfg}, environ={})


def test_compatible_invoke_text_and_window() -> None:
    with OpenAIStub([Reply(text="hello there", prompt_tokens=40, completion_tokens=2,
                           cached_tokens=16)]) as stub:
        resolved = _compatible(stub, window=32768)
        msg = resolved.chat_model.invoke("hi")
    assert resolved.window == 32768
    assert resolved.chat_model.profile["max_input_tokens"] == 32768
    assert msg.content == "hello there"
    usage = msg.usage_metadata
    assert usage["input_tokens"] == 40 and usage["output_tokens"] == 2
    assert usage["input_token_details"]["cache_read"] == 16
    (req,) = stub.chat_requests
    assert req.path == "/v1/chat/completions"  # Chat Completions, not the Responses API
    assert req.body["model"] == "local-model"
    assert req.headers["authorization"] == "Bearer not-needed"


def test_compatible_window_unknown_without_config() -> None:
    with OpenAIStub() as stub:
        resolved = _compatible(stub)
    assert resolved.window is None
    assert resolved.max_output is None


def test_compatible_api_key_env() -> None:
    with OpenAIStub(["ok"]) as stub:
        url = f"openai-compatible:m@{stub.base_url}"
        resolve_model(url, environ={"OPENAI_COMPATIBLE_API_KEY": "k1"}).chat_model.invoke("x")
        cfg = {"api_key_env": "MY_KEY"}
        with pytest.raises(ModelError) as info:
            resolve_model(url, model_config=cfg, environ={})
        assert info.value.env_var == "MY_KEY" and info.value.code == 2
        resolve_model(url, model_config=cfg, environ={"MY_KEY": "k2"})
    assert stub.chat_requests[0].headers["authorization"] == "Bearer k1"


def test_compatible_stream_with_usage() -> None:
    with OpenAIStub([Reply(text="streamed reply text", prompt_tokens=120, completion_tokens=9,
                           cached_tokens=64)]) as stub:
        chunks = list(_compatible(stub).chat_model.stream("go"))
    assert len(chunks) > 2
    full = chunks[0]
    for c in chunks[1:]:
        full = full + c
    assert "".join(str(c.content) for c in chunks) == "streamed reply text"
    assert full.usage_metadata["input_tokens"] == 120
    assert full.usage_metadata["output_tokens"] == 9
    assert full.usage_metadata["input_token_details"]["cache_read"] == 64
    body = stub.chat_requests[0].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_compatible_tool_call_round_trip() -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    replies = [Reply(tool_calls=[("add", '{"a": 2, "b": 3}')], prompt_tokens=200,
                     completion_tokens=12), Reply(text="The sum is 5.")]
    with OpenAIStub(replies) as stub:
        model = _compatible(stub).chat_model.bind_tools([add])
        first = model.invoke([HumanMessage("add 2 and 3")])
        assert first.tool_calls == [
            {"name": "add", "args": {"a": 2, "b": 3}, "id": "call_0", "type": "tool_call"}]
        assert first.usage_metadata["input_tokens"] == 200
        call = first.tool_calls[0]
        result = ToolMessage(str(add.invoke(call["args"])), tool_call_id=call["id"])
        final = model.invoke([HumanMessage("add 2 and 3"), first, result])
    assert final.content == "The sum is 5."
    assert all(r.path == "/v1/chat/completions" for r in stub.requests if r.method == "POST")
    sent = stub.chat_requests[0].body
    assert [t["function"]["name"] for t in sent["tools"]] == ["add"]
    follow_up = stub.chat_requests[1].body["messages"]
    assert follow_up[-1] == {"role": "tool", "tool_call_id": "call_0", "content": "5"}


def test_compatible_streamed_tool_call() -> None:
    from langchain_core.tools import tool

    @tool
    def run_cell(code: str) -> str:
        """Run code."""
        return code

    args = json.dumps({"code": "print(1 + 1)"})
    with OpenAIStub([Reply(tool_calls=[("run_cell", args)])]) as stub:
        chunks = list(_compatible(stub).chat_model.bind_tools([run_cell]).stream("go"))
    full = chunks[0]
    for c in chunks[1:]:
        full = full + c
    assert full.tool_calls[0]["name"] == "run_cell"
    assert full.tool_calls[0]["args"] == {"code": "print(1 + 1)"}


# ---- describe_provider_error -----------------------------------------------------------------


def test_describe_auth_error() -> None:
    stub = OpenAIStub([error_reply(401, "Incorrect API key provided")])
    with stub, pytest.raises(Exception) as info:
        _compatible(stub).chat_model.invoke("hi")
    line = describe_provider_error(info.value)
    assert line is not None and "\n" not in line
    assert "authentication" in line and "401" in line
    assert "OPENAI_COMPATIBLE_API_KEY" in line  # not api.openai.com, so the compatible key


def test_describe_server_and_context_errors() -> None:
    replies = [error_reply(400, "This model's maximum context length is 4096 tokens",
                           code="context_length_exceeded"),
               error_reply(500, "kaboom"), error_reply(404, "model 'x' not found")]
    errors = []
    with OpenAIStub(replies) as stub:
        model = _compatible(stub).chat_model
        for _ in replies:
            with pytest.raises(Exception) as info:
                model.invoke("hi")
            errors.append(describe_provider_error(info.value))
    overflow, server, missing = errors
    assert overflow and "context overflow" in overflow
    assert server and "500" in server and "kaboom" in server
    assert missing and "404" in missing


def test_unknown_path_is_404() -> None:
    import urllib.error
    import urllib.request

    with OpenAIStub() as stub:
        req = urllib.request.Request(stub.base_url + "/responses", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=5)
    assert info.value.code == 404
    assert stub.requests[0].path == "/v1/responses"


def test_describe_connection_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}/v1"
    resolved = resolve_model(f"openai-compatible:m@{base}", model_config={"max_retries": 0},
                             environ={})
    with pytest.raises(Exception) as info:
        resolved.chat_model.invoke("hi")
    line = describe_provider_error(info.value)
    assert line == (f"provider error: cannot reach {base} (connection refused: nothing is "
                    "listening on that port of this machine; start the model server or fix "
                    "the URL)")


def test_describe_non_provider_errors() -> None:
    assert describe_provider_error(ValueError("x")) is None
    assert describe_provider_error(KeyError("k")) is None
    assert describe_provider_error(ModelError("no key", env_var="X")) is None


def test_describe_anthropic_errors_and_wrapped_causes() -> None:
    anthropic = pytest.importorskip("anthropic")
    httpx = pytest.importorskip("httpx")
    request = httpx.Request("POST", "https://api.anthropic.com/v1/messages")

    def status_error(cls, status: int, message: str):
        body = {"type": "error", "error": {"type": "x", "message": message}}
        return cls(message, response=httpx.Response(status, request=request), body=body)

    auth = status_error(anthropic.AuthenticationError, 401, "invalid x-api-key")
    assert describe_provider_error(auth) == (
        "provider error: authentication failed (401) — check ANTHROPIC_API_KEY")
    too_long = status_error(anthropic.BadRequestError, 400,
                            "prompt is too long: 210000 tokens > 200000 maximum")
    line = describe_provider_error(too_long)
    assert line and "context overflow" in line and "210000" in line
    rate = status_error(anthropic.RateLimitError, 429, "slow down")
    try:
        try:
            raise rate
        except Exception as exc:
            raise RuntimeError("graph step failed") from exc
    except RuntimeError as wrapped:
        assert describe_provider_error(wrapped) == "provider error: rate limited (429): slow down"
    refused = httpx.ConnectError("[Errno 111] Connection refused", request=request)
    assert describe_provider_error(refused) == (
        "provider error: cannot reach https://api.anthropic.com/v1 (connection refused)")


def test_a_kind_offers_its_suggestions_to_the_front_ends() -> None:
    """``/model``'s Tab lists what each registered kind suggests: the bench's replay kind
    offers its workflows through the registry, so the TUI never imports the bench."""
    from simagent.models import kind_suggestions
    from simagent.tui.slash import SUGGESTED_MODELS, complete_models

    offered = dict(kind_suggestions())
    assert "replay:canary" in offered and all(s.startswith("replay:") for s in offered)
    assert complete_models(None) == [*SUGGESTED_MODELS, *kind_suggestions()]  # type: ignore[arg-type]
