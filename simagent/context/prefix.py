"""The prompt prefix a provider caches, and what a compaction costs it.

Providers cache a request's prefix (Anthropic at explicit breakpoints, OpenAI
automatically) and bill a later request that starts the same way at a fraction of the
input price. A compaction (a clearing epoch, a summary, a checkpoint) changes an early
message of the model's view, so everything after that message must be written to the
cache again. This module is the one home for "which messages does the provider see as
the same" (:func:`message_key`) and "how many tokens does this change make it write"
(:func:`rewrite_tokens`): the middleware traces the figure with each compaction, so
``/context`` shows it, and the bench's cache simulation (``simagent.bench.caching``)
keys its blocks the same way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from typing import Any

from langchain_core.messages import SystemMessage, ToolMessage

from simagent.context.clearing import is_cleared
from simagent.context.counting import count_message, is_state_card, message_parts


def message_key(msg: Any) -> str:
    """A hash of what the provider receives for ``msg`` (role, texts, media, calls)."""
    texts, extra = message_parts(msg)
    data = "\x1f".join([msg.type, str(extra), *texts])
    return hashlib.blake2b(data.encode("utf-8", "replace"), digest_size=16).hexdigest()


def first_change(old_view: Sequence[Any], new_view: Sequence[Any]) -> int:
    """Index of the first message of ``new_view`` that ``old_view`` did not send there
    (``len(old_view)`` when the new view only appends)."""
    for i, (a, b) in enumerate(zip(old_view, new_view, strict=False)):
        if message_key(a) != message_key(b):
            return i
    return min(len(old_view), len(new_view))


def rewrite_tokens(old_view: Sequence[Any], new_view: Sequence[Any], ruler: Any = None,
                   family: str | None = None) -> int:
    """Tokens the next request writes to the provider's cache because the view changed;
    0 when the new view only appends. It includes the few messages the turn appended
    since the last call, which a request writes anyway.

    An automatic prefix cache (OpenAI, local KV caches) keeps everything before the first
    changed message, so the write is ``new_view`` from there to its end. Anthropic caches
    only at breakpoints (tools, system prompt, the previous requests' ends: see
    ``simagent.bench.caching``), all of which but the first two lie after the change, so
    for ``family="anthropic"`` the write is everything after the system prompt.
    """
    start = first_change(old_view, new_view)
    if start >= len(old_view):
        return 0
    if family == "anthropic":
        start = 1 if new_view and isinstance(new_view[0], SystemMessage) else 0
    return sum(count_message(m, ruler) for m in new_view[start:])


#: What a pinned breakpoint asks the provider for (Anthropic's 5-minute cache).
EPHEMERAL = {"type": "ephemeral"}


def pin_index(view: Sequence[Any], cleared_before: Collection[str]) -> int | None:
    """Where a fourth cache breakpoint keeps the prefix that the next clearing epoch will
    not change: the newest tool result in ``view`` that was already a placeholder before
    this request (``cleared_before``: the cleared call ids the previous request had).

    Anthropic reads a cached prefix only at a breakpoint (tools, system prompt, the end of
    an earlier request), so an epoch, which changes the oldest results still in view,
    made the next request write the whole conversation again. Everything up to the
    newest *older* placeholder is byte-stable until the next epoch clears results after
    it, so a breakpoint there is read back exactly when that epoch comes; using the
    placeholders of the previous request (not of an epoch made for this one) means the
    entry already exists when it is needed. None when nothing was cleared before.

    A state card or card update right after that placeholder was made by the epoch that
    cleared it and stays until a full card replaces it (``context.card_updates``), so the
    breakpoint goes on the last of them: the card is read back, not written again."""
    for i in range(len(view) - 1, -1, -1):
        msg = view[i]
        if isinstance(msg, ToolMessage) and msg.tool_call_id in cleared_before \
                and is_cleared(msg):
            while i + 1 < len(view) and is_state_card(view[i + 1]):
                i += 1
            return i
    return None


def with_cache_pin(view: Sequence[Any], index: int | None) -> list[Any]:
    """``view`` with a ``cache_control`` breakpoint on message ``index`` (a copy; the
    Anthropic converter moves a tool result's block marker to the ``tool_result``)."""
    out = list(view)
    if index is None or not 0 <= index < len(out):
        return out
    msg = out[index]
    blocks = msg.content if isinstance(msg.content, list) else [
        {"type": "text", "text": msg.content}]
    if not blocks:
        return out
    last = blocks[-1] if isinstance(blocks[-1], dict) else {"type": "text",
                                                            "text": str(blocks[-1])}
    out[index] = msg.model_copy(update={"content": [*blocks[:-1],
                                                    {**last, "cache_control": EPHEMERAL}]})
    return out
