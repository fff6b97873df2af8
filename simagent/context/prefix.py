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
from collections.abc import Sequence
from typing import Any


def message_key(msg: Any) -> str:
    """A hash of what the provider receives for ``msg`` (role, texts, media, calls)."""
    from simagent.context.counting import message_parts

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
    from langchain_core.messages import SystemMessage

    from simagent.context.counting import count_message

    start = first_change(old_view, new_view)
    if start >= len(old_view):
        return 0
    if family == "anthropic":
        start = 1 if new_view and isinstance(new_view[0], SystemMessage) else 0
    return sum(count_message(m, ruler) for m in new_view[start:])
