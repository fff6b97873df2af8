"""The ``[context]`` table of ``.simagent/config.toml``: what a person may set, read and
checked once (design.md §7).

:class:`ContextSettings` is every setting with its default, the numbers of
``context/thresholds.py`` (where each says why it is that number); what a threshold makes
of a setting for a given window is a function there too. Here is only the reading: an
unknown key or a value that cannot be used is refused before anything runs, with one
line naming the key and, read from a config (:meth:`ContextSettings.from_config`), the
file that set it (``Config.source``), so the line says which file to fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from simagent.config import ConfigError
from simagent.context.thresholds import (
    CLEAR_FRACTION,
    CLEAR_KEEP_FRACTION,
    CLEAR_MIN_FREED_FRACTION,
    DEFAULT_TOOL_CAPS,
    DEFER_TOOLS_FRACTION,
    EVICT_TOKENS,
    REPL_FAILED_RUN,
    REPL_SAME_ERROR,
    STATE_CARD_TOKENS,
    SUMMARY_KEEP_FRACTION,
    SUMMARY_MODEL,
    SUMMARY_TIERS,
    TOKENIZER,
    TOOL_CAP_CHARS,
    WATCHDOG_MODES,
    WATCHDOG_REPEATS,
)
from simagent.context.tokens import RULERS

#: The settings that are shares of the window: each in (0, 1].
FRACTIONS = ("clear_fraction", "summary_fraction", "clear_min_freed_fraction",
             "summary_keep_fraction", "clear_keep_fraction", "defer_tools_fraction")


class ContextConfigError(ConfigError):
    """A ``[context]`` setting that cannot be used; the message names the key, and
    ``key`` is its path in the table (the file that set it is found by it)."""

    def __init__(self, message: str, key: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class ContextSettings:
    """The configurable numbers; ``enabled`` switches whole layers (the bench's policies)."""

    evict_tokens: int | None = EVICT_TOKENS
    clear_fraction: float | None = CLEAR_FRACTION
    clear_keep: int | None = None  # None: CLEAR_KEEP
    clear_keep_fraction: float | None = CLEAR_KEEP_FRACTION  # None: count only
    clear_min_freed_fraction: float = CLEAR_MIN_FREED_FRACTION
    #: clear a run_python call's code with its result (a pointer to ``_out[n].code``)
    clear_inputs: bool = True
    #: with it, cut the model's words beside calls whose results are all cleared to their
    #: first sentence (``clearing.without_words``)
    clear_words: bool = True
    #: below the clearing trigger, an epoch also runs once the stale results have cost
    #: in cache reads what its cache rewrite costs (``context.epoch_cost``)
    clear_by_cost: bool = True
    #: ... counting as the rent what keeping them is expected to cost over as many
    #: requests again as the session has made (``epoch_cost.horizon``), when that is more
    clear_by_expected: bool = True
    #: the model whose cache prices decide that (None: the model in use); the bench's
    #: replay names the model it prices at, so it decides as that model would live
    cost_model: str | None = None
    #: send deepagents' tools with simagent's slim descriptions (``agent/tool_text.py``)
    slim_tools: bool = True
    #: a small open-weight model gets a short prompt, skills by name, one or two tools and
    #: a forced first tool call (``thresholds.small_agent``, ``agent/small_tier.py``)
    small_agent: bool = True
    #: force a small model's calls to ``run_python`` until one ran without an error,
    #: decoded by llama.cpp under the tool's JSON-schema grammar (live bench, 0.5B: a
    #: valid call in ~6 s where unforced it guessed an answer or wrote prose)
    small_agent_force_call: bool = True
    summary_fraction: float | None = None  # None: by tier
    summary_tiers: Mapping[str, float] = field(default_factory=lambda: dict(SUMMARY_TIERS))
    summary_keep_fraction: float = SUMMARY_KEEP_FRACTION
    summary_model: str = SUMMARY_MODEL
    tokenizer: str = TOKENIZER
    tool_cap_chars: int = TOOL_CAP_CHARS
    tool_caps: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_TOOL_CAPS))
    window: int | None = None  # overrides the model's reported window
    max_output_tokens: int | None = None
    watchdog: str = "warn"
    watchdog_repeats: int = WATCHDOG_REPEATS
    #: off | warn | enforce; None: by front end (``thresholds.REPL_WATCHDOG_BY_FRONT_END``)
    repl_watchdog: str | None = None
    repl_same_error: int = REPL_SAME_ERROR
    repl_failed_run: int = REPL_FAILED_RUN
    #: a failed cell re-run with only whitespace changes (caught before it runs)
    repl_whitespace_rerun: bool = True
    max_turn_usd: float | None = None
    max_session_usd: float | None = None
    max_turn_tokens: int | None = None
    max_session_tokens: int | None = None
    summarize: bool = True
    checkpoints: bool = True
    budget_check: bool = True
    emergency: bool = True
    state_card_tokens: int = STATE_CARD_TOKENS
    #: a clearing epoch sends what changed on the card, not the card again in full, and
    #: the card stays where it was (``context.card_updates``)
    state_card_updates: bool = True
    #: a fourth prompt-cache breakpoint before the results the next epoch clears
    #: (Anthropic; ``simagent.context.prefix.pin_index``)
    cache_pin: bool = True
    ledger: bool = True  # the dropped-items ledger and the recall tool (context/ledger.py)
    #: defer MCP tool schemas behind ``find_tools``: None = when they exceed
    #: ``defer_tools_fraction`` of the window (``thresholds.defer_tools``)
    defer_tools: bool | None = None
    defer_tools_fraction: float = DEFER_TOOLS_FRACTION

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> ContextSettings:
        """Settings from a ``[context]`` table; unknown keys and bad values are errors."""
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ContextConfigError(f"[context]: unknown setting(s) {', '.join(unknown)}; "
                                     f"known: {', '.join(sorted(known))}", (unknown[0],))
        base = cls()
        tiers = dict(SUMMARY_TIERS)
        tiers.update(_fractions("summary_tiers", data.pop("summary_tiers", {}) or {}))
        for key in FRACTIONS:
            if data.get(key) is not None:
                _fractions(key, {key: data[key]})
        if data.get("watchdog", "warn") not in WATCHDOG_MODES:
            raise ContextConfigError(f"[context] watchdog must be one of "
                                     f"{', '.join(WATCHDOG_MODES)}", ("watchdog",))
        if data.get("repl_watchdog") not in (None, *WATCHDOG_MODES):
            raise ContextConfigError(f"[context] repl_watchdog must be one of "
                                     f"{', '.join(WATCHDOG_MODES)} (unset: by front end)",
                                     ("repl_watchdog",))
        for key in ("repl_same_error", "repl_failed_run"):
            n = data.get(key, 0)
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ContextConfigError(f"[context] {key} must be a whole number of cells "
                                         "(0 switches that signal off)", (key,))

        if data.get("tokenizer", "auto") not in ("auto", *RULERS):
            raise ContextConfigError(f"[context] tokenizer must be one of auto, "
                                     f"{', '.join(RULERS)}", ("tokenizer",))
        card = data.get("state_card_tokens", STATE_CARD_TOKENS)
        if not isinstance(card, int) or isinstance(card, bool) or card < 0:
            raise ContextConfigError("[context] state_card_tokens must be a whole number of "
                                     "tokens (0 turns the kernel state card off)",
                                     ("state_card_tokens",))
        caps = data.pop("tool_caps", {}) or {}
        if not isinstance(caps, Mapping) or not all(
                isinstance(v, int) and v >= 0 for v in caps.values()):
            raise ContextConfigError("[context.tool_caps] values must be whole numbers of "
                                     "characters (0 disables a tool's cap)", ("tool_caps",))
        try:
            return replace(base, summary_tiers=tiers, tool_caps={**DEFAULT_TOOL_CAPS, **caps},
                           **data)
        except TypeError as exc:
            raise ContextConfigError(f"[context]: {exc}") from exc

    @classmethod
    def from_config(cls, config: Any) -> ContextSettings:
        """Settings from ``config``'s ``[context]`` table; an error line starts with the
        file that set the key (the workspace's or the user's ``config.toml``)."""
        if config is None:
            return cls.from_mapping({})
        try:
            return cls.from_mapping(config.section("context"))
        except ContextConfigError as exc:
            raise ContextConfigError(f"{config.source('context', *exc.key)}: {exc}",
                                     exc.key) from exc


def _fractions(where: str, values: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in values.items():
        if not isinstance(value, int | float) or not 0 < float(value) <= 1:
            key_path = (where,) if where == key else (where, key)
            raise ContextConfigError(f"[context] {where}: {key} must be a fraction in (0, 1]",
                                     key_path)
        out[key] = float(value)
    return out
