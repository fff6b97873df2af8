"""The ruler: real BPE counts, offline, per model family, cached, and used by every layer."""

from __future__ import annotations

import gzip
import math
import os
import subprocess
import sys
import textwrap

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from simagent.context import tokens
from simagent.context.counting import (
    count_message,
    count_request,
    count_text,
    measure,
)
from simagent.context.settings import ContextConfigError, ContextSettings
from simagent.context.tokens import Ruler, encoding_for_model, resolve_ruler, using

NUMERIC = "\n".join(f"{k:5d} {k * 1.234567e-3:.6e} {math.sin(k):+.8f} {k ** 2:>10d}"
                    for k in range(400))


def test_encodings_are_tiktokens_own():
    # token ids tiktoken's published encodings give for this text
    assert tokens.encoding("o200k_base").encode("hello world") == [24912, 2375]
    assert tokens.encoding("cl100k_base").encode("hello world") == [15339, 1917]
    assert tokens.encoding("o200k_base").n_vocab == 200019


def test_model_families():
    assert encoding_for_model("openai:gpt-4") == "cl100k_base"
    assert encoding_for_model("openai:gpt-4-turbo-2024-04-09") == "cl100k_base"
    assert encoding_for_model("gpt-3.5-turbo") == "cl100k_base"
    assert encoding_for_model("openai-compatible:gpt-4@http://127.0.0.1:8000/v1") == \
        "cl100k_base"
    for model in ("openai:gpt-4o", "openai:gpt-4.1-mini", "openai:gpt-5", "openai:o3",
                  "anthropic:claude-sonnet-4-5", "ollama:qwen3:8b", "replay:x", None):
        assert encoding_for_model(model) == "o200k_base", model
    assert resolve_ruler("openai:gpt-4").name == "cl100k_base"
    assert resolve_ruler("openai:gpt-4", "approx").name == "approx"
    with pytest.raises(ValueError, match="unknown tokenizer"):
        resolve_ruler("x", "bpe-9000")


def test_numbers_cost_more_than_chars_over_four():
    real, approx = Ruler("o200k_base").count(NUMERIC), Ruler("approx").count(NUMERIC)
    assert approx == math.ceil(len(NUMERIC) / 4)
    assert real > 1.5 * approx  # the reason for the issue: chars/4 under-counts numbers


def test_counts_are_cached_by_content(monkeypatch):
    calls = []
    real_encode = tokens._encode
    monkeypatch.setattr(tokens, "_encode", lambda n, t: calls.append(len(t)) or real_encode(n, t))
    tokens.clear_cache()
    ruler = Ruler("o200k_base")
    first = ruler.count(NUMERIC)
    again = ruler.count("".join([NUMERIC]))  # an equal string, another object
    assert first == again and calls == [len(NUMERIC)]
    tokens.clear_cache()
    assert ruler.count(NUMERIC) == first and len(calls) == 2


@pytest.mark.slow
def test_runs_offline_with_the_network_unreachable(tmp_path):
    """No download: sockets refuse, proxies point nowhere, tiktoken's cache is empty."""
    code = textwrap.dedent("""
        import socket
        def refuse(*a, **k):
            raise OSError("network used")
        socket.socket.connect = refuse
        socket.create_connection = refuse
        from simagent.context.counting import count_text
        from simagent.context.tokens import Ruler
        print(count_text("hello world"), Ruler("cl100k_base").count("hello world"))
    """)
    env = {**os.environ, "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
           "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
           "TIKTOKEN_CACHE_DIR": str(tmp_path / "empty"), "DATA_GYM_CACHE_DIR": str(tmp_path),
           "HOME": str(tmp_path), "NO_PROXY": "", "no_proxy": ""}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "2"]
    cache = tmp_path / "empty"
    assert not cache.exists() or not any(cache.iterdir())  # tiktoken fetched nothing


def test_a_corrupt_encoding_file_is_a_clear_error(tmp_path, monkeypatch):
    good = gzip.decompress((tokens.ENCODINGS_DIR / "cl100k_base.tiktoken.gz").read_bytes())
    (tmp_path / "cl100k_base.tiktoken.gz").write_bytes(gzip.compress(good[:-40]))
    monkeypatch.setattr(tokens, "ENCODINGS_DIR", tmp_path)
    monkeypatch.setattr(tokens, "_ENCODINGS", {})
    with pytest.raises(tokens.EncodingFileError, match="sha256 mismatch"):
        tokens.encoding("cl100k_base")
    monkeypatch.setattr(tokens, "ENCODINGS_DIR", tmp_path / "nowhere")
    with pytest.raises(tokens.EncodingFileError, match="missing"):
        tokens.encoding("cl100k_base")


def test_messages_count_text_calls_and_framing():
    ruler = Ruler("o200k_base")
    human = HumanMessage(NUMERIC)
    assert count_message(human, ruler) == ruler.count(NUMERIC) + ruler.count("user") + 3
    call = AIMessage("", tool_calls=[{"name": "run_python", "args": {"code": "print(1)"},
                                      "id": "c1"}])
    assert count_message(call, ruler) > count_message(AIMessage(""), ruler) + 5
    image = HumanMessage([{"type": "text", "text": "see"},
                          {"type": "image_url", "image_url": {"url": "data:..."}}])
    assert count_message(image, ruler) >= 765


def test_measure_splits_the_whole_request():
    system = SystemMessage("You are simagent.\n\n## Skills\n- pybamm: batteries\n")
    msgs = [HumanMessage("go"), AIMessage("", tool_calls=[{"name": "t", "args": {}, "id": "1"}]),
            ToolMessage(NUMERIC, tool_call_id="1")]
    size = measure(system, msgs, [])
    assert size.total == count_request([system, *msgs], [])
    assert size.tool_results == count_message(msgs[2])
    assert count_text(NUMERIC) == Ruler("o200k_base").count(NUMERIC)


def test_active_ruler_follows_the_agent():
    assert count_text(NUMERIC) == Ruler("o200k_base").count(NUMERIC)
    with using(Ruler("approx")):
        assert count_text(NUMERIC) == math.ceil(len(NUMERIC) / 4)
    assert count_text(NUMERIC) == Ruler("o200k_base").count(NUMERIC)


def test_tokenizer_setting_is_validated():
    assert ContextSettings.from_mapping({"tokenizer": "cl100k_base"}).tokenizer == "cl100k_base"
    with pytest.raises(ContextConfigError, match="tokenizer"):
        ContextSettings.from_mapping({"tokenizer": "gpt2"})


def test_middleware_measures_with_its_models_ruler(tmp_path):
    from simagent.context.compaction import Compactor
    from simagent.context.middleware import ContextMiddleware
    from simagent.context.summary import ExtractiveSummarizer
    from simagent.trace.log import TraceLog

    def mw(model_id, settings=None):
        settings = settings or ContextSettings()
        return ContextMiddleware(trace=TraceLog(tmp_path / "t.sqlite"),
                                 compactor=Compactor(tmp_path / "h.md", ExtractiveSummarizer()),
                                 settings=settings, model_id=model_id, window=None,
                                 max_output=None)

    assert mw("openai:gpt-4").ruler.name == "cl100k_base"
    assert mw("anthropic:claude-sonnet-4-5").ruler.name == "o200k_base"
    assert mw("openai:gpt-4o", ContextSettings(tokenizer="approx")).ruler.name == "approx"
    # and measures with it: the same request is larger in real tokens than in chars/4
    from types import SimpleNamespace

    request = SimpleNamespace(system_message=None, tools=[])
    view = [HumanMessage("go"), ToolMessage(NUMERIC, tool_call_id="c1")]
    real = mw("openai:gpt-4o")._measure(request, view)[0].total
    approx = mw("openai:gpt-4o", ContextSettings(tokenizer="approx"))._measure(request, view)
    assert real == count_request(view, []) and real > 1.5 * approx[0].total


def test_eviction_counts_real_tokens(tmp_path):
    """A numeric result under the limit by chars/4 but over it in real tokens is evicted;
    with the approx ruler (what deepagents does) the same result stays."""
    from deepagents.backends import FilesystemBackend

    from simagent.agent.context_layers import TracedFilesystemMiddleware

    limit = int(Ruler("approx").count(NUMERIC) * 1.2)
    assert Ruler("o200k_base").count(NUMERIC) > limit
    backend = FilesystemBackend(root_dir=tmp_path, virtual_mode=False)
    msg = ToolMessage(NUMERIC, tool_call_id="call_1", name="execute")

    def evict(ruler):
        mw = TracedFilesystemMiddleware(trace=None, backend=backend, ruler=ruler,
                                        tool_token_limit_before_evict=limit)
        mw._large_tool_results_prefix = str(tmp_path / "large")
        return mw._process_large_message(msg, backend)

    out, evicted = evict(Ruler("approx"))
    assert not evicted and out is msg
    out, evicted = evict(Ruler("o200k_base"))
    assert evicted and len(out.text) < len(NUMERIC)
    assert (tmp_path / "large" / "call_1").read_text() == NUMERIC


def test_doctor_checks_the_shipped_encodings(tmp_path, monkeypatch):
    from simagent.doctor import check_tokenizer

    ok = check_tokenizer()
    assert ok.ok and "o200k_base" in ok.detail
    monkeypatch.setattr(tokens, "ENCODINGS_DIR", tmp_path)  # files gone
    monkeypatch.setattr(tokens, "_ENCODINGS", {})
    tokens.clear_cache()
    bad = check_tokenizer()
    assert not bad.ok and "missing" in bad.detail and bad.fix == "reinstall simagent"


def test_a_broken_install_counts_chars_over_four_instead_of_failing(tmp_path, monkeypatch):
    monkeypatch.setattr(tokens, "ENCODINGS_DIR", tmp_path / "nowhere")
    monkeypatch.setattr(tokens, "_ENCODINGS", {})
    monkeypatch.setattr(tokens, "_BROKEN", {})
    tokens.clear_cache()
    assert Ruler("cl100k_base").count(NUMERIC) == math.ceil(len(NUMERIC) / 4)
    assert "missing" in tokens.broken_encodings()["cl100k_base"]
    msgs = [HumanMessage(NUMERIC)]
    assert count_request(msgs, [], Ruler("cl100k_base")) > 0  # a model call goes on


def test_function_tools_get_their_own_schema():
    from simagent.context.counting import tool_schema

    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    def fetch_a_very_long_named_thing(url: str) -> str:
        """Fetch a page."""
        return url

    assert tool_schema(add)["function"]["name"] == "add"
    assert tool_schema(fetch_a_very_long_named_thing)["function"]["name"] == \
        "fetch_a_very_long_named_thing"


def test_media_blocks_cost_a_fixed_amount_not_their_base64():
    pdf = HumanMessage([{"type": "file", "base64": "A" * 300_000, "mime_type": "application/pdf"}])
    assert count_message(pdf) < 1_000
