"""Thresholds are pure functions of the window and the model id, overridable in config."""

from __future__ import annotations

import pytest
from conftest import write_config

from simagent.config import Config, ConfigError
from simagent.context import thresholds as th
from simagent.context.capping import cap_text
from simagent.context.overflow import is_context_overflow
from simagent.context.settings import ContextSettings


def test_defaults_follow_the_seeds_except_the_earlier_lossless_clearing():
    t = th.thresholds_for(200_000, "anthropic:claude-opus-4-7", ContextSettings())
    # the seeds evict at 20k chars/4-tokens; re-derived on the bench with real tokens: 10k
    assert (t.window, t.tier, t.evict_tokens) == (200_000, "frontier", 10_000)
    # the seeds clear at 60 %; our placeholders keep a path, so we clear at 30 % (bench)
    # ... and keep the newest result, not the seeds' 6 (issue 31: the cost model)
    assert (t.clear_trigger, t.clear_keep, t.clear_min_freed) == (60_000, 1, 20_000)
    assert (t.summary_trigger, t.summary_keep) == (170_000, 20_000)


@pytest.mark.parametrize("model, tier, fraction", [
    ("anthropic:claude-opus-4-7", "frontier", 0.85), ("gemini-3.5-pro", "frontier", 0.85),
    ("anthropic:claude-sonnet-4-6", "mid", 0.65), ("gemini-2.5-pro", "mid", 0.65),
    ("anthropic:claude-haiku-4-5", "small", 0.35), ("gemini-2.5-flash", "small", 0.35),
    ("openai:gpt-4o-mini", "small", 0.35), ("ollama:llama3.1:8b", "small", 0.35),
    ("ollama:qwen3.6:27b", "mid", 0.65), ("scripted:x.json", None, 0.85),
    ("openai-compatible:my-model@http://127.0.0.1:8000/v1", None, 0.85),
])
def test_summary_trigger_by_tier(model, tier, fraction):
    assert th.model_tier(model) == tier
    trigger = th.summary_trigger_tokens(100_000, model, ContextSettings())
    assert trigger == int(100_000 * fraction)


def test_every_window_keeps_the_newest_result_and_unknown_windows_fall_back():
    s = ContextSettings()
    # one default since issue 31 (CLEAR_KEEP): the kept share of the window, not a count
    # per window size, keeps fewer in a small window
    assert th.clear_keep(99_999, s) == th.clear_keep(100_000, s) == th.CLEAR_KEEP == 1
    assert th.clear_keep(16_000, ContextSettings(clear_keep=4)) == 4
    assert th.effective_window(None, s) == th.FALLBACK_WINDOW
    assert th.effective_window(None, ContextSettings(window=32_768)) == 32_768


def test_history_budget_formula():
    assert th.history_budget(100_000, system=3_000, summary=2_000, tool_defs=4_000,
                             max_output_tokens=8_000) == 83_000


def test_config_overrides_and_clear_errors(workspace):
    write_config(workspace, "[context]\nclear_fraction = 0.5\nclear_keep = 2\n"
                 "watchdog = 'enforce'\n[context.summary_tiers]\nsmall = 0.3\n"
                 "[context.tool_caps]\nrun_python = 9000\n")
    s = ContextSettings.from_config(Config.load(workspace))
    assert th.clear_trigger_tokens(100_000, s) == 50_000 and th.clear_keep(50_000, s) == 2
    assert th.summary_fraction("claude-haiku-4-5", s) == 0.3
    assert th.summary_fraction("claude-sonnet-4-5", s) == 0.65  # other tiers keep defaults
    assert th.tool_cap("run_python", s) == 9000 and th.tool_cap("grep", s) == th.TOOL_CAP_CHARS
    for bad, word in (("clear_fraction = 1.5", "clear_fraction"), ("nonsense = 1", "nonsense"),
                      ("watchdog = 'loud'", "watchdog")):
        write_config(workspace, f"[context]\n{bad}\n")
        with pytest.raises(ConfigError, match=word):
            ContextSettings.from_config(Config.load(workspace))


def test_a_bad_context_key_names_the_file_that_set_it(workspace, _state_home):
    """The two files' [context] tables merge: the line names the one holding the bad key
    (issue 37: it said ``[context] ...`` with no file), and says what to fix there."""
    user = _state_home / "config.toml"
    ws = write_config(workspace, "[context]\nclear_keep = 2\n")
    for bad, line in (
            ("watchdog = 'loud'", "[context] watchdog must be one of off, warn, enforce"),
            ("repl_watchdog = 'loud'", "[context] repl_watchdog must be one of off, warn, "
                                       "enforce (unset: by front end)"),
            ("repl_failed_run = -1", "[context] repl_failed_run must be a whole number of "
                                     "cells (0 switches that signal off)"),
            ("tokenizer = 'gpt2'", "[context] tokenizer must be one of auto, "),
            ("state_card_tokens = 1.5", "[context] state_card_tokens must be a whole number "
                                        "of tokens"),
            ("clear_fraction = 1.5", "[context] clear_fraction: clear_fraction must be a "
                                     "fraction in (0, 1]"),
            ("[context.summary_tiers]\nsmall = 2", "[context] summary_tiers: small must be a "
                                                   "fraction in (0, 1]"),
            ("[context.tool_caps]\ngrep = -1", "[context.tool_caps] values must be whole "
                                               "numbers of characters (0 disables a tool's "
                                               "cap)"),
            ("nonsense = 1", "[context]: unknown setting(s) nonsense; known: ")):
        user.write_text(f"[context]\n{bad}\n")
        with pytest.raises(ConfigError) as err:
            ContextSettings.from_config(Config.load(workspace))
        assert str(err.value).startswith(f"{user}: {line}"), str(err.value)
    user.write_text("[context]\nwatchdog = 'warn'\n")
    ws.write_text("[context]\nclear_fraction = 0\n")  # the workspace's own bad key
    with pytest.raises(ConfigError) as err:
        ContextSettings.from_config(Config.load(workspace, trust=True))
    assert str(err.value) == (f"{ws}: [context] clear_fraction: clear_fraction must be a "
                              "fraction in (0, 1]")
    # without a file (a bench policy's overrides) the line names the key alone
    with pytest.raises(ConfigError, match=r"^\[context\] watchdog must be one of"):
        ContextSettings.from_mapping({"watchdog": "loud"})


def test_cap_text_keeps_head_and_tail_and_names_the_file():
    text = "HEAD\n" + "".join(f"line {i}\n" for i in range(10_000)) + "TAIL"
    out = cap_text(text, 2_000, "/tmp/full.txt")
    assert out.startswith("HEAD\n") and out.endswith("TAIL") and len(out) < 2_200
    assert "full result: /tmp/full.txt" in out
    assert cap_text("short", 2_000, "x") == "short"


@pytest.mark.parametrize("message", [
    "This model's maximum context length is 8192 tokens", "Error: context_length_exceeded",
    "prompt exceeds the context window", "too many tokens in request",
    "Please reduce the length of the messages.", "input token limit reached"])
def test_overflow_messages_are_recognised(message):
    assert is_context_overflow(ValueError(message))


def test_other_errors_are_not_overflows():
    assert not is_context_overflow(ValueError("invalid api key"))
    assert not is_context_overflow(RuntimeError("rate limit exceeded"))


def test_clearing_always_comes_before_summarization():
    s = ContextSettings()
    for model in ("anthropic:claude-opus-4", "openai:gpt-4o", "anthropic:claude-haiku-4-5",
                  None):
        t = th.thresholds_for(128_000, model, s)
        assert t.clear_trigger < t.summary_trigger, model
    assert th.thresholds_for(128_000, "anthropic:claude-opus-4", s).clear_trigger == int(
        th.CLEAR_FRACTION * 128_000)
    small = th.thresholds_for(128_000, "anthropic:claude-haiku-4-5", s)
    assert abs(small.clear_trigger - 128_000 * th.CLEAR_BEFORE_SUMMARY * 0.35) <= 1
    off = th.thresholds_for(128_000, None, ContextSettings(summarize=False))
    assert off.clear_trigger == int(th.CLEAR_FRACTION * 128_000)


# ------------------------------------------------------------------ small windows
def test_an_unplaced_model_with_a_small_window_is_small():
    assert th.model_tier("replay:ase-eos-md", 16_000) == "small"
    assert th.model_tier("openai-compatible:x@http://127.0.0.1:1/v1", 32_000) == "small"
    assert th.model_tier("replay:ase-eos-md", 128_000) is None
    # a model the name places keeps its tier whatever it is served with
    assert th.model_tier("anthropic:claude-opus-4-7", 16_000) == "frontier"
    t = th.thresholds_for(16_000, "scripted:x", ContextSettings())
    assert (t.tier, t.summary_fraction) == ("small", 0.35)


def test_the_summary_trigger_is_a_share_of_the_room_the_fixed_prompt_leaves():
    s = ContextSettings()
    # at 16k the small tier's share of the window would sit under a 5.5k fixed prompt
    assert th.summary_trigger_tokens(16_000, "scripted:x", s) == int(16_000 * 0.35) <= 5_600
    trigger = th.summary_trigger_tokens(16_000, "scripted:x", s, fixed=5_500)
    assert trigger == 5_500 + int(10_500 * 0.35)
    t = th.thresholds_for(16_000, "scripted:x", s)
    assert t.for_prompt(5_500).summary_trigger == trigger  # middleware and /context
    assert t.for_prompt(5_500).clear_trigger == t.clear_trigger  # only the summary moves
    # at 128k the difference is under 1 %
    big = th.thresholds_for(128_000, "anthropic:claude-opus-4-7", s)
    assert 0 < big.for_prompt(5_500).summary_trigger - big.summary_trigger < 0.01 * 128_000
    off = th.thresholds_for(16_000, "scripted:x", ContextSettings(summarize=False))
    assert off.for_prompt(5_500).summary_trigger is None


def test_a_summary_at_the_trigger_waits_for_growth_since_the_last_one():
    t = th.thresholds_for(16_000, "scripted:x", ContextSettings())
    assert t.clear_min_freed == 1_600
    assert th.summary_grown(10_000, None, t)  # no summary yet
    assert th.summary_grown(10_000, {"cutoff": 4}, t)  # a checkpoint/emergency boundary
    last = {"cutoff": 9, "tokens_after": 9_000}
    assert not th.summary_grown(10_000, last, t)
    assert th.summary_grown(10_600, last, t)
