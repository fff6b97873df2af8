"""The provider's prompt cache, simulated over the requests of a run (issue 16, item 4).

Token counts say what a policy sends; the bill depends on what the provider could serve
from its prefix cache. A policy that rewrites early history (a clearing epoch, a summary)
saves tokens but makes the provider write the rest of the prompt again, so the bench
prices every run with caching, per model family, from the requests the model received:

* **Anthropic**: explicit breakpoints where simagent's stack puts them. deepagents adds
  ``AnthropicPromptCachingMiddleware``, which tags the last tool schema and the system
  message (our memory middleware tags the system message's last block too) and passes a
  top-level ``cache_control`` that marks the last message: breakpoints after the tools,
  after the system prompt and at the end. A request reads the longest prefix that an
  earlier request wrote at one of its breakpoints, found within ``lookback`` content
  blocks before one of this request's breakpoints, and writes the rest up to its last
  breakpoint (at the write price); a prefix under the family's minimum is never written.
* **OpenAI**: automatic. A request reads the longest prefix it shares with any earlier
  request, floored to 128-token steps and only from 1,024 tokens on; nothing is charged
  for writing.

A request is a sequence of blocks, each a content hash and its tokens: the tool schemas,
the system message, then each message in order. Blocks are whole messages, so a prefix
that matches partway into a message counts up to the message before (low for OpenAI by
less than a message). Assumptions, since replay has no clock and one provider: every call
falls within the cache TTL (5 minutes, refreshed on each read), nothing is evicted, and a
request may read what any earlier request wrote (parallel subagents really race). Main
agent and subagents need no separate bookkeeping: their prompts differ from the first
block, so a prefix is only shared where the provider would share it too.

Token counts come from the real ruler (:mod:`simagent.context.counting`): the blocks of a
replayed request sum to the input tokens the scripted model reported for it, so
``uncached + cache_write + cache_read`` equals a run's ``tokens_in``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from langchain_core.messages import SystemMessage, ToolMessage

from simagent.context.clearing import is_cleared
from simagent.context.counting import count_message
from simagent.context.prefix import message_key, pin_index
from simagent.context.prices import CacheRules, cache_rules, cached_cost_usd
from simagent.context.tokens import DEFAULT_ENCODING, Ruler

#: The OpenAI model the bench prices a replayed run at, beside the reference model.
OPENAI_REFERENCE_MODEL = "openai:gpt-5"


class Block(NamedTuple):
    """One piece of a request: a hash of its content, its tokens, and how many content
    blocks the provider sees in it (a tool call is a block of its own)."""

    key: str
    tokens: int
    parts: int = 1


class Request(NamedTuple):
    """A request's blocks in the order the provider reads them; the first ``fixed`` ones
    (tool schemas, system prompt) each end at a cache breakpoint."""

    blocks: tuple[Block, ...]
    fixed: int = 0
    #: a block carrying a pinned breakpoint (``context.prefix.pin_index``), if any
    pin: int | None = None

    @property
    def tokens(self) -> int:
        return sum(b.tokens for b in self.blocks)


@dataclass
class CacheUse:
    """Input tokens of one request (or a run) by how the provider bills them."""

    uncached: int = 0
    cache_write: int = 0
    cache_read: int = 0

    @property
    def total(self) -> int:
        return self.uncached + self.cache_write + self.cache_read

    def add(self, other: CacheUse) -> None:
        self.uncached += other.uncached
        self.cache_write += other.cache_write
        self.cache_read += other.cache_read

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def _chain(blocks: Sequence[Block]) -> tuple[list[str], list[int], list[int]]:
    """(prefix hash, prefix tokens, prefix parts) at the end of each block."""
    hashes, tokens, parts = [], [], []
    h, t, p = b"", 0, 0
    for b in blocks:
        h = hashlib.blake2b(h + b.key.encode(), digest_size=16).digest()
        t += b.tokens
        p += b.parts
        hashes.append(h.hex())
        tokens.append(t)
        parts.append(p)
    return hashes, tokens, parts


def _breakpoints(request: Request, rules: CacheRules) -> list[int]:
    """Block indices carrying ``cache_control``: each fixed block, the pinned one, the
    last one."""
    n = len(request.blocks)
    pin = {request.pin} if request.pin is not None and 0 <= request.pin < n else set()
    points = sorted({*range(min(request.fixed, n)), *pin, n - 1} - {-1})
    if len(points) > rules.breakpoints:  # the provider refuses more; keep the tail
        points = [*points[: rules.breakpoints - 1], points[-1]]
    return points


def simulate(requests: Sequence[Request], rules: CacheRules) -> list[CacheUse]:
    """How the provider of ``rules`` bills each request's input, in order."""
    seen: set[str] = set()  # prefixes in the cache (written entries / seen prompts)
    out = []
    for request in requests:
        hashes, tokens, parts = _chain(request.blocks)
        total = tokens[-1] if tokens else 0
        if rules.breakpoints:
            use = _explicit(request, rules, seen, hashes, tokens, parts)
        else:
            hit = next((k for k in range(len(hashes) - 1, -1, -1) if hashes[k] in seen), None)
            shared = tokens[hit] if hit is not None else 0
            read = shared // rules.increment * rules.increment if shared >= rules.min_prefix \
                else 0
            seen.update(hashes)
            use = CacheUse(uncached=total - read, cache_read=read)
        out.append(use)
    return out


def _explicit(request: Request, rules: CacheRules, seen: set[str], hashes: list[str],
              tokens: list[int], parts: list[int]) -> CacheUse:
    """Anthropic: read at the latest written entry near a breakpoint, write to the last."""
    total = tokens[-1] if tokens else 0
    points = _breakpoints(request, rules)
    hit = -1
    for bp in points:
        k = bp
        while k > hit and parts[bp] - parts[k] <= rules.lookback:
            if hashes[k] in seen:
                hit = k
                break
            k -= 1
    read = tokens[hit] if hit >= 0 else 0
    cached = [bp for bp in points if tokens[bp] >= rules.min_prefix]
    seen.update(hashes[bp] for bp in cached)
    write = max(0, tokens[cached[-1]] - read) if cached else 0
    return CacheUse(uncached=total - read - write, cache_write=write, cache_read=read)


def totals(uses: Sequence[CacheUse]) -> CacheUse:
    out = CacheUse()
    for use in uses:
        out.add(use)
    return out


# ------------------------------------------------------------------ from messages
def message_block(msg: Any, ruler: Any = None) -> Block:
    content = msg.content if isinstance(msg.content, list) else [msg.content]
    calls = len(getattr(msg, "tool_calls", None) or ())
    return Block(message_key(msg), count_message(msg, ruler),
                 max(1, sum(1 for c in content if c) + calls))


def request_of(messages: Sequence[Any], total_tokens: int, tool_names: Sequence[str] = (),
               ruler: Any = None, pin: int | None = None) -> Request:
    """A request the model received: tool schemas (the tokens ``total_tokens`` leaves over
    the messages), the system message, then the other messages; ``pin``: the index of a
    message carrying a pinned breakpoint."""
    blocks = [message_block(m, ruler) for m in messages]
    fixed = 1 if blocks and isinstance(messages[0], SystemMessage) else 0
    schemas = total_tokens - sum(b.tokens for b in blocks)
    if schemas > 0:
        key = hashlib.blake2b("\x1f".join(tool_names).encode(), digest_size=16).hexdigest()
        blocks.insert(0, Block(f"tools:{key}", schemas, max(1, len(tool_names))))
        fixed += 1
        pin = pin + 1 if pin is not None else None
    return Request(tuple(blocks), fixed, pin)


def cleared_ids(messages: Sequence[Any]) -> frozenset[str]:
    """The call ids of the cleared placeholders among ``messages``."""
    return frozenset(m.tool_call_id for m in messages
                     if isinstance(m, ToolMessage) and is_cleared(m))


def pins(requests: Sequence[Sequence[Any]]) -> list[int | None]:
    """The pinned breakpoint of each request (``context.prefix.pin_index`` with the
    placeholders of the same agent's previous request; agents told apart by their system
    prompt), as the middleware places it for a model with an explicit cache."""
    before: dict[str, frozenset[str]] = {}
    out = []
    for msgs in requests:
        agent = message_key(msgs[0]) if msgs else ""
        out.append(pin_index(msgs, before.get(agent, frozenset())))
        before[agent] = cleared_ids(msgs)
    return out


def scripted_requests(model: Any, pinned: bool = False) -> list[Request] | None:
    """Every request a scripted model received, as blocks (``pinned``: with the breakpoint
    the middleware pins for an explicit cache); None for a model without a request log
    (a live run)."""
    cursor = getattr(model, "cursor", None)
    if cursor is None or not hasattr(cursor, "request_tokens"):
        return None
    ruler = Ruler(DEFAULT_ENCODING)  # what ScriptedChatModel.count_request counts with
    names = getattr(cursor, "request_tools", [])
    where = pins(cursor.requests) if pinned else [None] * len(cursor.requests)
    return [request_of(msgs, total, names[i] if i < len(names) else (), ruler, where[i])
            for i, (msgs, total) in enumerate(zip(cursor.requests, cursor.request_tokens,
                                                   strict=False))]


# ------------------------------------------------------------------ the bench record
def priced(use: CacheUse, model_id: str, output_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": model_id, **use.as_dict(),
            "cost_usd": cached_cost_usd(model_id, uncached=use.uncached,
                                        cache_write=use.cache_write,
                                        cache_read=use.cache_read, output=output_tokens),
            **extra}


def reported_use(usage: Sequence[Mapping[str, Any]]) -> CacheUse:
    """What the provider reported over a run's ``model_usage`` payloads."""
    def total(name: str) -> int:
        return sum(int(u.get(name) or 0) for u in usage)

    read, write = total("cache_read"), total("cache_creation")
    return CacheUse(uncached=total("input_tokens") - read - write, cache_write=write,
                    cache_read=read)


def cache_fields(model: Any, usage: Sequence[Mapping[str, Any]], *, mode: str,
                 price_model: str, pinned: bool = False) -> dict[str, Any]:
    """The bench record's ``cache`` (per family: uncached, cache_write, cache_read,
    cost_usd) and headline ``cost_usd_cached`` at ``price_model``.

    Replay simulates ``price_model``'s family and OpenAI's on the requests the scripted
    model received (``pinned``: the policy pins a breakpoint for explicit caches, which the
    OpenAI simulation ignores as OpenAI does); a live run keeps the figures its provider
    reported."""
    output = sum(int(u.get("output_tokens") or 0) for u in usage)
    requests = scripted_requests(model, pinned) if mode == "replay" else None
    if requests is None:
        rules = cache_rules(price_model)
        row = priced(reported_use(usage), price_model, output, source="provider")
        return {"cache": {rules.family if rules else "provider": row},
                "cost_usd_cached": row["cost_usd"]}
    cache: dict[str, Any] = {}
    for model_id in (price_model, OPENAI_REFERENCE_MODEL):
        rules = cache_rules(model_id)
        if rules is None or rules.family in cache:
            continue
        use = totals(simulate(requests, rules))
        cache[rules.family] = priced(use, model_id, output, source="simulated")
    head = cache_rules(price_model)
    return {"cache": cache,
            "cost_usd_cached": cache[head.family]["cost_usd"] if head else None}
