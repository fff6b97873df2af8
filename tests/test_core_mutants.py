"""Edge cases of the pure cores that mutation testing (``make mutate``) showed no other
test pinned down: each assertion here kills mutants that the behavioural tests let live.
Expected values are worked out by hand from the rules the docstrings state."""

from __future__ import annotations

import dataclasses

import pytest

from simagent.context import thresholds as th
from simagent.context.settings import ContextConfigError, ContextSettings

FRACTION_KEYS = ("clear_fraction", "summary_fraction", "clear_min_freed_fraction",
                 "summary_keep_fraction", "clear_keep_fraction")


# ------------------------------------------------------------------ thresholds: config
def _error(data: dict) -> str:
    with pytest.raises(ContextConfigError) as err:
        ContextSettings.from_mapping(data)
    return str(err.value)


def test_unknown_keys_are_listed_sorted_with_every_known_key():
    message = _error({"zeta": 1, "bogus": 2})
    known = sorted(f.name for f in dataclasses.fields(ContextSettings))
    assert message == (f"[context]: unknown setting(s) bogus, zeta; known: "
                       f"{', '.join(known)}")


@pytest.mark.parametrize("key", FRACTION_KEYS)
def test_each_fraction_key_accepts_zero_to_one_exclusive_of_zero(key):
    assert _error({key: 0}) == f"[context] {key}: {key} must be a fraction in (0, 1]"
    assert _error({key: 1.01}) == f"[context] {key}: {key} must be a fraction in (0, 1]"
    assert _error({key: "half"}).endswith("must be a fraction in (0, 1]")
    assert getattr(ContextSettings.from_mapping({key: 1}), key) == 1
    assert getattr(ContextSettings.from_mapping({key: 0.25}), key) == 0.25
    assert getattr(ContextSettings.from_mapping({key: None}), key) is None


def test_summary_tiers_override_one_tier_and_are_validated():
    s = ContextSettings.from_mapping({"summary_tiers": {"small": 0.3}})
    assert dict(s.summary_tiers) == {"frontier": 0.85, "mid": 0.65, "small": 0.3}
    assert dict(ContextSettings.from_mapping({"summary_tiers": None}).summary_tiers) == \
        th.SUMMARY_TIERS
    assert _error({"summary_tiers": {"small": 0}}) == \
        "[context] summary_tiers: small must be a fraction in (0, 1]"
    assert isinstance(ContextSettings.from_mapping({"summary_tiers": {"mid": 1}})
                      .summary_tiers["mid"], float)


def test_watchdog_modes_and_their_messages():
    assert _error({"watchdog": "loud"}) == \
        "[context] watchdog must be one of off, warn, enforce"
    assert _error({"repl_watchdog": "loud"}) == \
        "[context] repl_watchdog must be one of off, warn, enforce (unset: by front end)"
    for mode in th.WATCHDOG_MODES:
        s = ContextSettings.from_mapping({"watchdog": mode, "repl_watchdog": mode})
        assert (s.watchdog, th.repl_watchdog_mode(s, "tui")) == (mode, mode)
    s = ContextSettings()
    assert th.repl_watchdog_mode(s, "tui") == "warn"
    assert th.repl_watchdog_mode(s, "headless") == "enforce"
    assert th.repl_watchdog_mode(s, "other") == "warn"


@pytest.mark.parametrize("key", ["repl_same_error", "repl_failed_run"])
@pytest.mark.parametrize("bad", [-1, True, 1.5, "3"])
def test_repl_counts_are_whole_numbers(key, bad):
    assert _error({key: bad}) == (f"[context] {key} must be a whole number of cells "
                                  "(0 switches that signal off)")


@pytest.mark.parametrize("key", ["repl_same_error", "repl_failed_run"])
def test_repl_counts_accept_zero(key):
    assert getattr(ContextSettings.from_mapping({key: 0}), key) == 0


def test_tokenizer_names():
    from simagent.context.tokens import RULERS

    assert _error({"tokenizer": "bpe"}) == \
        f"[context] tokenizer must be one of auto, {', '.join(RULERS)}"
    for name in ("auto", *RULERS):
        assert ContextSettings.from_mapping({"tokenizer": name}).tokenizer == name


@pytest.mark.parametrize("bad", [-1, True, 2.5])
def test_state_card_tokens_are_whole(bad):
    assert _error({"state_card_tokens": bad}) == (
        "[context] state_card_tokens must be a whole number of tokens (0 turns the kernel "
        "state card off)")


def test_state_card_zero_turns_it_off_and_the_size_follows_the_window():
    off = ContextSettings.from_mapping({"state_card_tokens": 0})
    assert th.state_card_tokens(100_000, off) == 0
    s = ContextSettings()
    assert th.state_card_tokens(100_000, s) == 1_500  # 5 % is 5,000: the setting caps
    assert th.state_card_tokens(20_000, s) == 1_000  # 5 % of the window
    assert th.state_card_tokens(2_000, s) == 200  # never below 200
    assert th.state_card_tokens(4_000, s) == 200 and th.state_card_tokens(4_020, s) == 201


@pytest.mark.parametrize("bad", [{"x": -1}, {"x": 1.5}, [1], {"x": "9"}])
def test_tool_caps_are_whole_numbers(bad):
    assert _error({"tool_caps": bad}) == ("[context.tool_caps] values must be whole numbers "
                                          "of characters (0 disables a tool's cap)")


def test_tool_caps_merge_with_the_defaults_and_zero_uncaps():
    s = ContextSettings.from_mapping({"tool_caps": {"grep": 0, "run_python": 9}})
    assert dict(s.tool_caps) == {"read_file": 0, "grep": 0, "run_python": 9}
    assert th.tool_cap("grep", s) is None and th.tool_cap("read_file", s) is None
    assert th.tool_cap("run_python", s) == 9 and th.tool_cap("ls", s) == th.TOOL_CAP_CHARS
    assert dict(ContextSettings.from_mapping({"tool_caps": None}).tool_caps) == \
        th.DEFAULT_TOOL_CAPS


def test_from_config_without_a_config_is_the_defaults():
    assert ContextSettings.from_config(None) == ContextSettings()
    assert ContextSettings.from_mapping(None) == ContextSettings()


# ---------------------------------------------------------------- thresholds: numbers
def test_window_and_output_fall_back_in_order():
    s, w = ContextSettings(), ContextSettings(window=5_000, max_output_tokens=77)
    assert th.effective_window(9_000, s) == 9_000 and th.effective_window(9_000, w) == 5_000
    assert th.max_output(300, s) == 300 and th.max_output(300, w) == 77
    assert th.max_output(None, s) == th.MAX_OUTPUT_FALLBACK == 4_096


def test_eviction_is_capped_by_the_window_but_never_below_500():
    s = ContextSettings()
    assert th.evict_tokens(s) == 10_000 and th.evict_tokens(s, None) == 10_000
    assert th.evict_tokens(s, 200_000) == 10_000  # 8 % is 16,000: the setting wins
    assert th.evict_tokens(s, 50_000) == 4_000  # 8 % of the window
    assert th.evict_tokens(s, 5_000) == 500 and th.evict_tokens(s, 6_300) == 504
    assert th.evict_tokens(ContextSettings(evict_tokens=None), 50_000) is None
    assert th.evict_tokens(ContextSettings(evict_tokens=0), 50_000) is None


def test_clear_trigger_stays_below_the_summary_trigger():
    s = ContextSettings(clear_fraction=0.9)
    # haiku summarizes at 0.35: clearing moves to 0.8 of that
    assert th.clear_trigger_tokens(100_000, s, "claude-haiku-4-5") == int(100_000 * (0.8 * 0.35))
    assert th.clear_trigger_tokens(100_000, s, "claude-opus-4-7") == int(100_000 * (0.8 * 0.85))
    no_summary = ContextSettings(clear_fraction=0.9, summarize=False)
    assert th.clear_trigger_tokens(100_000, no_summary, "claude-haiku-4-5") == 90_000
    assert th.clear_trigger_tokens(100_000, ContextSettings(clear_fraction=None)) is None
    assert th.clear_trigger_tokens(100_000, ContextSettings()) == 30_000


def test_clear_keep_and_freed_shares():
    s = ContextSettings()
    assert th.clear_keep(50_000, ContextSettings(clear_keep=0)) == 0
    assert th.clear_keep(50_000, ContextSettings(clear_keep=9)) == 9
    assert th.clear_keep_tokens(50_000, s) == 5_000
    assert th.clear_keep_tokens(50_000, ContextSettings(clear_keep_fraction=None)) is None
    assert th.clear_min_freed_tokens(50_000, s) == 5_000
    assert th.clear_min_freed_tokens(50_005, ContextSettings(clear_min_freed_fraction=0.5)) \
        == 25_002


@pytest.mark.parametrize("model, tier", [
    ("claude-3-5-haiku", "small"), ("gemini-2.0-flash-lite", "small"), ("gpt-5-nano", "small"),
    ("gpt-4.1-mini", "small"), ("mistral-small", "small"), ("llama3.2:3b", "small"),
    ("qwen:1.5b", "small"), ("gpt-4.1", "mid"), ("mistral-medium", "mid"),
    ("qwen3:32b", "mid"), ("llama:14.5b", "mid"), ("claude-opus-4", "frontier"),
    ("o1", "frontier"), ("openai:o3", "frontier"), ("o4", "frontier"),
    ("gemini-3-ultra", "frontier"), ("vendor-pro", "frontier"), ("deepseek-r1", "frontier"),
    ("llama3.1:70b", "frontier"), ("llama:405b", "frontier"), ("qwen:72.5b", "frontier"),
    ("MODEL-OPUS", "frontier"), ("geminimini", None), ("o10", None), ("proto", None),
    ("x12b", "mid"), ("x.12b", None), ("", None), (None, None),
])
def test_model_tiers(model, tier):
    assert th.model_tier(model) == tier


def test_an_unknown_model_is_small_only_in_a_small_window():
    assert th.model_tier("local", 32_000) == "small"
    assert th.model_tier("local", 32_001) is None and th.model_tier("local", None) is None
    assert th.model_tier("claude-opus-4", 8_000) == "frontier"


def test_summary_fraction_and_trigger():
    s = ContextSettings()
    assert th.summary_fraction("local", s) == 0.85
    assert th.summary_fraction("local", s, 16_000) == 0.35
    assert th.summary_fraction("sonnet", ContextSettings(summary_fraction=0.5)) == 0.5
    missing = ContextSettings(summary_tiers={"frontier": 0.9})
    assert th.summary_fraction("haiku", missing) == 0.85  # a tier with no share: default
    assert th.summary_trigger_tokens(100_000, "sonnet", s, fixed=20_000) == 72_000
    assert th.summary_trigger_tokens(100_000, "sonnet", ContextSettings(summarize=False)) \
        is None


def test_room_share_clamps_the_fixed_prompt():
    assert th.room_share(1_000, -50, 0.5) == 500
    assert th.room_share(1_000, 2_000, 0.5) == 1_000
    assert th.room_share(1_000, 200, 0.5) == 600
    assert th.room_share(1_000, 1_000, 0.5) == 1_000


def test_summary_keep_and_growth():
    s = ContextSettings()
    assert th.summary_keep_tokens(50_005, s) == 5_000
    t = th.thresholds_for(100_000, "sonnet", s)  # clear_min_freed 10,000
    assert th.summary_grown(5, None, t) and th.summary_grown(5, {}, t)
    assert th.summary_grown(30_000, {"tokens_after": 20_000}, t)
    assert not th.summary_grown(29_999, {"tokens_after": 20_000}, t)
    assert th.summary_grown(30_000, {"tokens_after": "20000"}, t)


def test_thresholds_for_and_for_prompt():
    t = th.thresholds_for(None, "claude-sonnet-4-5", ContextSettings(), 1_234)
    assert t == th.Thresholds(
        window=128_000, tier="mid", evict_tokens=10_000, clear_trigger=38_400, clear_keep=1,
        clear_keep_tokens=12_800, clear_min_freed=12_800, summary_trigger=83_200,
        summary_keep=12_800, max_output=1_234, state_card=1_500, summary_fraction=0.65)
    assert t.for_prompt(28_000).summary_trigger == 28_000 + int(100_000 * 0.65)
    assert t.for_prompt(28_000).clear_trigger == t.clear_trigger
    off = th.thresholds_for(None, "sonnet", ContextSettings(summarize=False))
    assert off.summary_fraction is None and off.summary_trigger is None
    assert off.for_prompt(28_000) is off
    assert th.history_budget(10, system=1, summary=2, tool_defs=3, max_output_tokens=4) == 0


def test_shares_at_small_windows_and_odd_sizes():
    # an unplaced model in a small window is small-tier: clearing moves below 0.35
    s = ContextSettings(clear_fraction=0.9)
    assert th.clear_trigger_tokens(16_000, s, "local") == int(16_000 * (0.8 * 0.35))
    half = ContextSettings(summary_fraction=0.5)
    assert th.summary_trigger_tokens(101, None, half) == 50  # no fixed prompt by default
    assert th.room_share(101, 0, 0.5) == 50
    assert th.thresholds_for(50_000, "sonnet", ContextSettings()).evict_tokens == 4_000
    odd = th.Thresholds(window=100, tier=None, evict_tokens=None, clear_trigger=None,
                        clear_keep=1, clear_keep_tokens=None, clear_min_freed=1,
                        summary_trigger=5, summary_keep=1, max_output=1,
                        summary_fraction=None)
    assert odd.for_prompt(10) is odd
