"""Where a conversation may be cut: the one function every layer uses (design.md §7).

A provider rejects a request in which an assistant tool call has no result, or a result
has no call, so no layer (summarization, emergency truncation, task checkpoints, the
bench's sliding window) may cut between an ``AIMessage`` with ``tool_calls`` and the
``ToolMessage`` s answering it. Cuts at the start of a user turn are preferred; inside a
very long turn (sixty kernel calls for one request) a cut between two complete
call/result groups is still safe.

A *cut* ``i`` splits ``messages`` into ``messages[:i]`` (dropped or summarized) and
``messages[i:]`` (kept).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from simagent.context.counting import is_user_message


def _call_ids(msg: Any) -> list[str]:
    if isinstance(msg, AIMessage):
        return [c.get("id") or "" for c in msg.tool_calls]
    return []


def safe_cuts(messages: Sequence[BaseMessage]) -> list[int]:
    """Every index ``i`` (0..len) at which cutting orphans no tool call or result.

    ``i`` is unsafe when an AI tool call before ``i`` has a result at or after ``i`` (or
    none yet), or when ``messages[i]`` is a ``ToolMessage`` (a kept part must not open
    with a result).
    """
    n = len(messages)
    last_result: dict[str, int] = {}
    for j, msg in enumerate(messages):
        if isinstance(msg, ToolMessage):
            last_result[msg.tool_call_id] = j
    # reach: the latest index at which a call made before i is answered; a call with no
    # result yet (waiting for approval) blocks every later cut
    reach = -1
    cuts = []
    for i in range(n + 1):
        if i > 0:
            for cid in _call_ids(messages[i - 1]):
                reach = max(reach, last_result.get(cid, n + 1))
        if reach >= i:
            continue
        if i < n and isinstance(messages[i], ToolMessage):
            continue
        cuts.append(i)
    return cuts


def turn_starts(messages: Sequence[BaseMessage]) -> list[int]:
    """Safe cuts that open a user turn (a real user message, not a summary or nudge)."""
    safe = set(safe_cuts(messages))
    return [i for i, m in enumerate(messages)
            if i in safe and is_user_message(m)]


def cut_keeping_tokens(messages: Sequence[BaseMessage], keep_tokens: int,
                       count: Callable[[Sequence[BaseMessage]], int]) -> int:
    """The earliest safe cut whose kept tail fits in ``keep_tokens`` (prefers turn starts).

    Returns 0 when everything fits. If even the shortest safe tail is over budget, the
    latest safe cut (keeping the least) is returned, never an unsafe one; the newest
    call/result group is always kept, so the model still sees what it just asked for.
    ``count`` must add up per message (the ruler counts and frames each message), so
    each message is counted once and tails are suffix sums.
    """
    n = len(messages)
    tail = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        tail[i] = tail[i + 1] + count([messages[i]])
    cuts = [i for i in safe_cuts(messages) if i < n] or [0]  # never keep nothing
    fitting = [i for i in cuts if tail[i] <= keep_tokens]
    if not fitting:
        return cuts[-1]
    best = fitting[0]
    starts = [i for i in turn_starts(messages) if i >= best]
    # a turn start that keeps at least half as much is worth the cleaner cut
    if starts and tail[starts[0]] * 2 >= tail[best]:
        return starts[0]
    return best


def cut_keeping_messages(messages: Sequence[BaseMessage], keep: int) -> int:
    """The latest safe cut that keeps at least ``keep`` messages (0 if none does)."""
    target = max(0, len(messages) - keep)
    candidates = [i for i in safe_cuts(messages) if i <= target]
    return candidates[-1] if candidates else 0


def cut_keeping_turns(messages: Sequence[BaseMessage], turns: int) -> int:
    """The cut that keeps the last ``turns`` user turns (a sliding window of turns)."""
    starts = turn_starts(messages)
    if len(starts) <= turns:
        return 0
    return starts[-turns]


def orphans(messages: Sequence[BaseMessage]) -> list[str]:
    """Problems a provider would reject: calls without results, results without calls.

    Calls are paired with results by occurrence, not by id alone: an id may recur in one
    thread (a scripted model resumed in a new process numbers its calls afresh), and
    each result answers the earliest unanswered call with its id before it."""
    problems = []
    waiting: dict[str, list[int]] = {}  # call id -> positions of its unanswered calls
    for j, msg in enumerate(messages):
        if isinstance(msg, ToolMessage):
            if waiting.get(msg.tool_call_id):
                waiting[msg.tool_call_id].pop(0)
            else:
                problems.append(f"result {msg.tool_call_id} at {j} has no earlier call")
        for cid in _call_ids(msg):
            waiting.setdefault(cid, []).append(j)
    problems += [f"call {cid} at {j} has no result" for cid, js in waiting.items() for j in js]
    return problems
