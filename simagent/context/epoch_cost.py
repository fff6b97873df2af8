"""When a clearing epoch pays for itself, by the prompt cache's prices (issue 31 §2).

A token threshold alone clears when the request is big, whatever that costs. With a
prompt cache the bill has two parts that pull apart: an old result left in view is read
from the cache on every request (``read`` x its tokens, each time), and an epoch that
clears it changes the prefix where it sits, so the provider writes everything after
that point again (``write`` x the rewritten tokens, once, instead of reading them). So
an epoch is worth it once the results it would clear have cost, while stale, as much as
its rewrite costs: the rent-or-buy rule, which never pays more than twice what the best
schedule with hindsight pays for the same epochs. Ages and sizes come from the messages
alone, so a resumed or rebuilt agent decides the same way, and the window stays the
hard limit (``thresholds.clear_trigger`` forces an epoch whatever the prices say).

Figures are in input-token units: one uncached input token of the model in use costs 1.
The prices are :mod:`simagent.context.prices`' (one home). A model simagent does not
price (scripted, local, unknown) gets :data:`UNPRICED`: a local server's KV cache keeps a
prefix as a provider's cache does, and re-reading it is the cost an epoch adds there.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from simagent.context.prices import FREE, cache_rules, price_for


@dataclass(frozen=True)
class InputPrices:
    """What one input token costs, relative to an uncached one, by how it is billed."""

    read: float  # read from the prompt cache
    write: float  # written to it (Anthropic 1.25; an automatic cache charges input)
    family: str | None = None  # "anthropic" (explicit breakpoints) | "openai" | None

    def epoch_price(self, rewrite: int) -> float:
        """What an epoch that makes the provider write ``rewrite`` tokens again costs over
        reading them from the cache."""
        return max(0.0, self.write - self.read) * max(0, rewrite)


#: A model without a modelled cache: reads at a tenth (the common provider discount, and
#: what skipping a KV-cached prefill saves a local server, roughly), writes at input.
UNPRICED = InputPrices(read=0.1, write=1.0)


def input_prices(model_id: str | None) -> InputPrices:
    """The relative input prices of ``model_id``'s family, from the one price table."""
    price, rules = price_for(model_id), cache_rules(model_id)
    if price is None or price == FREE or rules is None or not price.input_per_mtok:
        return UNPRICED
    return InputPrices(read=price.cache_read_per_mtok / price.input_per_mtok,
                       write=rules.write_multiplier, family=rules.family)


@dataclass(frozen=True)
class EpochCost:
    """One call's clearing decision, as ``/context`` shows it."""

    freed: int  # tokens the epoch would take from view
    rewrite: int  # tokens the provider would write again because of it
    #: input-token units keeping the candidates costs in cache reads: paid so far while
    #: stale, or (with a horizon) expected over the requests to come, whichever is more
    rent: float
    price: float  # input-token units the epoch costs over reading the same prefix
    candidates: int = 0

    @property
    def pays(self) -> bool:
        """Whether the epoch is due by cost: something to free, rent at least the price."""
        return self.freed > 0 and self.rent >= self.price

    def as_dict(self) -> dict[str, Any]:
        return {"freed": self.freed, "rewrite": self.rewrite, "rent": round(self.rent),
                "price": round(self.price), "candidates": self.candidates}


def requests_since(messages: Sequence[BaseMessage], index: int) -> int:
    """Model requests that have carried ``messages[index]`` after the one that added it:
    one per model reply after it, plus the request being made now."""
    return 1 + sum(1 for m in messages[index + 1:] if isinstance(m, AIMessage))


def stale_ages(messages: Sequence[BaseMessage], candidate_ids: Collection[str],
               kept: int) -> dict[str, int]:
    """tool_call_id -> requests each candidate has been clearable for: since the result
    ``kept`` places newer arrived and pushed it out of the newest results kept."""
    wanted = set(candidate_ids)
    results = [(i, m) for i, m in enumerate(messages) if isinstance(m, ToolMessage)]
    ages = {}
    for j, (_i, msg) in enumerate(results):
        if msg.tool_call_id in wanted:
            k = min(j + max(kept, 1), len(results) - 1)
            ages[msg.tool_call_id] = requests_since(messages, results[k][0])
    return ages


def horizon(messages: Sequence[BaseMessage]) -> int:
    """The requests still to come, estimated as those made so far (the model replies in
    ``messages``): with nothing else known, a session is as likely to be in the first
    half of its life as in the second (Gott's estimate), so the median of what is left
    equals what has passed. A long session keeps its stale results for long if kept, so
    its epochs come sooner, when each frees less and rewrites less."""
    return sum(1 for m in messages if isinstance(m, AIMessage))


def newest_reply(messages: Sequence[BaseMessage]) -> int | None:
    """Index of the last model reply: it and what follows are new in this request."""
    return next((i for i in range(len(messages) - 1, -1, -1)
                 if isinstance(messages[i], AIMessage)), None)


def first_change(messages: Sequence[BaseMessage], ids: Collection[str],
                 inputs: Collection[str] = ()) -> int | None:
    """Index of the first message an epoch clearing ``ids`` (results) and ``inputs``
    (their calls' code) changes; None when it changes none."""
    wanted, calls = set(ids), set(inputs)
    for i, m in enumerate(messages):
        if isinstance(m, ToolMessage) and m.tool_call_id in wanted:
            return i
        if isinstance(m, AIMessage) and any(c.get("id") in calls for c in m.tool_calls):
            return i
    return None


def epoch_cost(sizes: Sequence[int], first: int | None, savings: dict[str, int],
               ages: dict[str, int], prices: InputPrices, *, pinned: bool = True,
               new_from: int | None = None, also_written: int = 0,
               horizon: int = 0) -> EpochCost:
    """The decision for an epoch over a view of ``sizes`` (tokens per message) that
    changes it from message ``first`` on and frees ``savings`` (id -> tokens), whose
    candidates have been stale for ``ages`` (id -> requests).

    The rewrite is what lies between the first change and ``new_from`` (the messages
    this request adds, which it writes with or without an epoch) once cleared: an
    automatic cache (or Anthropic with a breakpoint pinned before the change,
    ``pinned``) reads what comes before; Anthropic without a pin reads only the tools and
    system prompt, so it writes every message again. ``also_written``: what the epoch
    brings in besides (the kernel state card that follows one).

    Why rent = price is the moment: if stale tokens pile up at a steady rate, waiting
    ``T`` requests between epochs costs ``read x rate x T / 2`` a request in reads and
    ``price / T`` in rewrites; the sum is least where the two are equal, which is where
    the rent paid since the last epoch equals one epoch's price.

    ``horizon``: the requests the candidates are expected to stay in view if kept (see
    :func:`horizon`); the rent is then at least ``read x freed x horizon``, what keeping
    them would cost from here on. Rent paid so far is sunk: it only bounds, in the worst
    case, what keeping will cost, and a stale result stays stale, so the reads to come
    are the better guide once the session's length says how many there will be."""
    freed = sum(savings.values())
    if first is None or not savings:
        return EpochCost(0, 0, 0.0, 0.0)
    start = first if pinned or prices.family != "anthropic" else 0
    end = len(sizes) if new_from is None else max(start, new_from)
    rewrite = max(0, sum(sizes[start:end]) - freed) + max(0, also_written)
    rent = prices.read * sum(tokens * ages.get(cid, 0) for cid, tokens in savings.items())
    rent = max(rent, prices.read * freed * max(0, horizon))
    return EpochCost(freed, rewrite, rent, prices.epoch_price(rewrite), len(savings))
