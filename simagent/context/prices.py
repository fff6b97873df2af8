"""The one price table: USD per million tokens, by model name.

One home, so the figures the user sees (``/context``, ``simagent run --json``, the bench)
and the cost ceiling that stops a turn are computed from the same numbers and cannot
disagree. Prices are list prices for standard (non-batch, short-context) requests;
long-context tiers and cache *writes* are not modelled: cache writes count at the input
rate (Anthropic bills them at 1.25x, so Anthropic figures are slightly low). Update the
table when providers change their prices; a model not found here has an unknown cost
(``None``), which the callers report instead of pretending it is free.

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
FREE_PROVIDERS = frozenset({"scripted", "replay", "ollama", "openai-compatible"})

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


def _field(usage: Any, name: str) -> int:
    value = usage.get(name) if isinstance(usage, Mapping) else getattr(usage, name, 0)
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def cost_usd(model_id: str | None, usage: Any) -> float | None:
    """USD for ``usage`` (anything with input_tokens, output_tokens, cache_read).

    ``input_tokens`` includes the cache reads (as in langchain ``usage_metadata``), so
    those are billed once, at the cache rate. None when the model's price is unknown.
    """
    price = price_for(model_id)
    if price is None:
        return None
    cached = max(0, _field(usage, "cache_read"))
    fresh = max(0, _field(usage, "input_tokens") - cached)
    output = max(0, _field(usage, "output_tokens"))
    return (fresh * price.input_per_mtok + cached * price.cache_read_per_mtok
            + output * price.output_per_mtok) / 1_000_000


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


def ledger_cost(ledger: Any) -> tuple[float, list[str]]:
    """(USD total, unknown models) over a ``UsageLedger``'s ``by_model``."""
    return usage_cost(dict(ledger.by_model))
