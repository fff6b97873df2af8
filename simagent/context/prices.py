"""The one price table: USD per million tokens, by model name.

One home, so the figures the user sees (``/context``, ``simagent run --json``, the bench)
and the cost ceiling that stops a turn are computed from the same numbers and cannot
disagree. Prices are list prices for standard (non-batch, short-context) requests;
long-context tiers are not modelled. Update the table when providers change their
prices; a model not found here has an unknown cost (``None``), which the callers report
instead of pretending it is free.

Prompt caching is priced here too (:class:`CacheRules`, :func:`cache_rules`): the read
price is the table's ``cache_read_per_mtok``; a cache *write* (Anthropic's
``cache_creation``) costs the input price times the family's write multiplier. The
bench's cache simulation (``simagent.bench.caching``) takes every rule from here.

Local and stand-in models cost nothing: ``scripted:``/``replay:`` play a script,
``ollama:`` and ``openai-compatible:`` run on the user's own hardware (or a server whose
price simagent cannot know, so it shows 0 rather than a guess).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple


class Price(NamedTuple):
    """USD per million tokens."""

    input_per_mtok: float
    output_per_mtok: float
    cache_read_per_mtok: float


FREE = Price(0.0, 0.0, 0.0)

#: Providers (the ``provider:`` prefix of a model id) whose calls cost nothing here.
FREE_PROVIDERS = frozenset({"scripted", "replay", "ollama", "openai-compatible", "local"})

#: Keys are matched as whole words inside the model name; the longest match wins, so
#: ``gpt-4o-mini`` beats ``gpt-4o`` and ``claude-sonnet-4-5-20250929`` finds sonnet-4-5.
PRICES: dict[str, Price] = {
    # Anthropic
    "claude-opus-4": Price(15.0, 75.0, 1.50),
    "claude-opus-4-1": Price(15.0, 75.0, 1.50),
    "claude-opus-4-5": Price(5.0, 25.0, 0.50),
    "claude-sonnet-4": Price(3.0, 15.0, 0.30),
    "claude-sonnet-4-5": Price(3.0, 15.0, 0.30),
    "claude-haiku-4-5": Price(1.0, 5.0, 0.10),
    "claude-3-5-haiku": Price(0.80, 4.0, 0.08),
    # OpenAI
    "gpt-4.1": Price(2.0, 8.0, 0.50),
    "gpt-4.1-mini": Price(0.40, 1.60, 0.10),
    "gpt-4.1-nano": Price(0.10, 0.40, 0.025),
    "gpt-4o": Price(2.50, 10.0, 1.25),
    "gpt-4o-mini": Price(0.15, 0.60, 0.075),
    "gpt-5": Price(1.25, 10.0, 0.125),
    "gpt-5-mini": Price(0.25, 2.0, 0.025),
    "gpt-5-nano": Price(0.05, 0.40, 0.005),
    "o3": Price(2.0, 8.0, 0.50),
    "o3-mini": Price(1.10, 4.40, 0.55),
    "o4-mini": Price(1.10, 4.40, 0.275),
    # Google
    "gemini-2.5-pro": Price(1.25, 10.0, 0.125),
    "gemini-2.5-flash": Price(0.30, 2.50, 0.03),
    "gemini-2.5-flash-lite": Price(0.10, 0.40, 0.01),
    # DeepSeek
    "deepseek-chat": Price(0.28, 0.42, 0.028),
    "deepseek-reasoner": Price(0.28, 0.42, 0.028),
}


def _norm(name: str) -> str:
    # "claude-sonnet-4.5" (OpenRouter style) and "claude-sonnet-4-5" are the same model
    return name.strip().lower().replace(".", "-")


_PATTERNS = sorted(((key, re.compile(rf"(?<![a-z0-9]){re.escape(_norm(key))}(?![a-z0-9])"))
                    for key in PRICES), key=lambda kp: -len(kp[0]))


def price_for(model_id: str | None) -> Price | None:
    """The price of ``model_id`` (``provider:name`` or a bare name); None when unknown."""
    raw = (model_id or "").strip()
    provider, sep, name = raw.partition(":")
    if not sep:
        provider, name = "", raw
    if provider.lower() in FREE_PROVIDERS or raw.lower() in FREE_PROVIDERS:
        return FREE
    name = _norm(name)
    for key, pattern in _PATTERNS:  # longest key first
        if pattern.search(name):
            return PRICES[key]
    return None


class CacheRules(NamedTuple):
    """How a model family's provider caches a request's prefix (priced with the table).

    ``breakpoints`` > 0: the prefix is cached only where the request marks it
    (``cache_control``), and a later request reads an entry that ends at most
    ``lookback`` content blocks before one of its own breakpoints; 0: every prefix is
    cached automatically. Only prefixes of at least ``min_prefix`` tokens are cached, and
    a read covers a whole number of ``increment`` tokens.
    """

    family: str  # "anthropic" | "openai"
    write_multiplier: float  # price of a token written to the cache / the input price
    min_prefix: int
    increment: int = 1
    breakpoints: int = 0
    lookback: int = 0


#: Anthropic (platform.claude.com, "Prompt caching", checked 2026-11): explicit
#: ``cache_control`` breakpoints, at most 4 a request; a 5-minute write costs 1.25x the
#: input price (a 1-hour write 2x; simagent asks for 5 minutes), a read 0.1x (the table's
#: ``cache_read_per_mtok``); the automatic prefix check looks back about 20 content blocks
#: from each breakpoint; prefixes under 1,024 tokens (Sonnet 4/4.5, Opus 4/4.1) are not
#: cached; see :data:`ANTHROPIC_MIN_PREFIX` for the models with a higher floor.
ANTHROPIC_CACHE = CacheRules("anthropic", write_multiplier=1.25, min_prefix=1024,
                             breakpoints=4, lookback=20)
ANTHROPIC_MIN_PREFIX = {"claude-opus-4-5": 4096, "claude-haiku-4-5": 4096,
                        "claude-3-5-haiku": 2048}
#: OpenAI (openai.com/index/api-prompt-caching, platform docs "Prompt caching"): automatic,
#: no write surcharge; prompts of 1,024 tokens or more read the longest previously seen
#: prefix in 128-token steps. The read discount differs per model (gpt-5 family 0.1x,
#: gpt-4.1 0.25x, gpt-4o 0.5x): it is the table's ``cache_read_per_mtok``.
OPENAI_CACHE = CacheRules("openai", write_multiplier=1.0, min_prefix=1024, increment=128)


def _price_key(model_id: str | None) -> str | None:
    raw = (model_id or "").strip()
    _provider, sep, name = raw.partition(":")
    name = _norm(name if sep else raw)
    return next((key for key, pattern in _PATTERNS if pattern.search(name)), None)


def cache_rules(model_id: str | None) -> CacheRules | None:
    """The prompt-cache rules of ``model_id``'s family; None when simagent does not model
    its cache (free, unknown, Gemini, DeepSeek), so its input is priced uncached."""
    if price_for(model_id) in (None, FREE):
        return None
    key = _price_key(model_id)
    if key is None:
        return None
    if key.startswith("claude"):
        return ANTHROPIC_CACHE._replace(min_prefix=ANTHROPIC_MIN_PREFIX.get(key, 1024))
    if key.startswith(("gpt-", "o3", "o4")):
        return OPENAI_CACHE
    return None


def cache_write_per_mtok(model_id: str | None) -> float | None:
    """USD per million tokens written to the cache (the input price where writes are not
    charged extra or the cache is not modelled); None when the model's price is unknown."""
    price = price_for(model_id)
    if price is None:
        return None
    rules = cache_rules(model_id)
    return price.input_per_mtok * (rules.write_multiplier if rules else 1.0)


def cached_cost_usd(model_id: str | None, *, uncached: int, cache_write: int,
                    cache_read: int, output: int = 0) -> float | None:
    """USD for input split into uncached, cache-write and cache-read tokens, plus output."""
    price = price_for(model_id)
    write = cache_write_per_mtok(model_id)
    if price is None or write is None:
        return None
    return (max(0, uncached) * price.input_per_mtok + max(0, cache_write) * write
            + max(0, cache_read) * price.cache_read_per_mtok
            + max(0, output) * price.output_per_mtok) / 1_000_000


def _field(usage: Any, name: str) -> int:
    value = usage.get(name) if isinstance(usage, Mapping) else getattr(usage, name, 0)
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def cost_usd(model_id: str | None, usage: Any) -> float | None:
    """USD for ``usage`` (anything with input_tokens, output_tokens, cache_read and
    optionally cache_creation).

    ``input_tokens`` includes the cache reads and writes (as in langchain
    ``usage_metadata``), so each is billed once: reads at the cache rate, writes at the
    write rate (:func:`cache_write_per_mtok`). None when the model's price is unknown.
    """
    read = max(0, _field(usage, "cache_read"))
    write = max(0, _field(usage, "cache_creation"))
    return cached_cost_usd(model_id, uncached=_field(usage, "input_tokens") - read - write,
                           cache_write=write, cache_read=read,
                           output=_field(usage, "output_tokens"))


def usage_cost(by_model: Mapping[str, Any]) -> tuple[float, list[str]]:
    """(USD over every model with a known price, models whose price is unknown)."""
    total, unknown = 0.0, []
    for model, usage in by_model.items():
        cost = cost_usd(model, usage)
        if cost is None:
            unknown.append(model)
        else:
            total += cost
    return total, sorted(unknown)


def totals_cost(totals: Any) -> tuple[float, list[str]]:
    """(USD total, unknown models) over a ``UsageTotals``'s ``by_model``."""
    return usage_cost(dict(totals.by_model))
