"""Clearing old tool results from the model's view, in epochs (design.md §7, layer 3).

langchain's ``ClearToolUsesEdit`` re-decides on every call, so once over its trigger it
clears one more result per call and the request prefix changes every time, which throws
away provider prompt caches and local KV caches on every step. Here clearing happens in
*epochs*: the set of cleared results only grows when an epoch frees at least a set share
of the window, and between epochs the same results stay cleared, so the prefix is byte
for byte stable. The set lives in graph state (checkpointed), not in the messages: the
raw results stay in state and on disk, and each placeholder tells the model how to get
the content back.

Inputs go with their results (``clear_inputs``): once a ``run_python`` result is cleared,
the code that produced it is often the larger half of the pair, and it is on disk with
the output (``_out[n].code``). The view then swaps the call's ``code`` argument for a
one-line pointer; the call keeps its id, name and argument keys, so every provider still
pairs it with its result. Which calls lose their code is decided at the same epoch as
the results (and kept in state beside them), so the prefix changes no more often than
clearing alone changes it.

The model's words go the same way (``clear_words``): once every call an AI message made
has its result cleared (or kept for good, as the attempt log's, once an epoch has passed
it), what the model wrote beside those calls (its reading of results the view no longer
shows) is cut to its first sentence, the headline it led with. Its conclusions live on
in the attempt log, the state card and its later words; a summary drops the same text.
The cut is keyed in the cleared inputs (``words:<first call id>``), so it is decided,
kept and applied with them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from simagent.context.counting import count_message, count_messages
from simagent.context.epoch_cost import (
    EpochCost,
    InputPrices,
    epoch_cost,
    first_change,
    horizon,
    newest_reply,
    stale_ages,
)
from simagent.context.placeholders import execution_of, placeholder
from simagent.kernel_api.outputs import handle

#: Results never cleared: the attempt log is referred to by value, subagent results are
#: already digests, and the task record is tiny.
EXCLUDED_TOOLS = frozenset({"record_attempt", "task", "mark_task_done", "remember"})

#: Tools whose bulky input is swapped for a pointer once their result is cleared, and
#: the argument that holds it. Only the kernel's code: it is saved with each execution's
#: record, so ``_out[n].code`` returns it in one line.
INPUT_ARGS = {"run_python": "code"}
#: How a cleared-inputs entry names an AI message whose words are cut (by its first call).
WORDS = "words:"
#: The most of a cut message's words that stay: its first sentence, up to this many chars.
WORDS_KEEP_CHARS = 160
_SENTENCE_END = re.compile(r"(?<=[.!?])\s|\n")


def tool_names(messages: Sequence[BaseMessage]) -> dict[str, str]:
    """tool_call_id -> tool name, from the AI messages that made the calls."""
    names = {}
    for msg in messages:
        if isinstance(msg, AIMessage):
            for call in msg.tool_calls:
                names[call.get("id") or ""] = call.get("name") or ""
    return names


def is_cleared(msg: BaseMessage) -> bool:
    return isinstance(msg, ToolMessage) and bool(
        (msg.response_metadata or {}).get("context_editing", {}).get("cleared"))


def candidates(messages: Sequence[BaseMessage], cleared: Collection[str], keep: int,
               excluded: Collection[str] = EXCLUDED_TOOLS,
               keep_tokens: int | None = None) -> list[ToolMessage]:
    """Results an epoch may clear: not among the newest kept, not excluded, no errors.

    The newest ``keep`` results stay, but only while they fit in ``keep_tokens``: six
    capped multi-megabyte logs would otherwise pin a third of the window.
    """
    names = tool_names(messages)
    results = [m for m in messages if isinstance(m, ToolMessage)]
    older = results[: len(results) - kept_count(results, keep, keep_tokens)]
    return [m for m in older
            if m.tool_call_id not in cleared and names.get(m.tool_call_id) not in excluded
            and not is_error(m) and not is_cleared(m)]


def kept_count(results: Sequence[ToolMessage], keep: int, keep_tokens: int | None) -> int:
    """How many of the newest ``results`` stay verbatim (see :func:`candidates`)."""
    kept, used = 0, 0
    for msg in reversed(results):
        size = count_messages([msg])
        if kept >= keep or (keep_tokens is not None and kept and used + size > keep_tokens):
            break
        kept, used = kept + 1, used + size
    return kept


def is_error(msg: ToolMessage) -> bool:
    """A failed call, or a kernel run that raised, died or timed out (kept: errors teach)."""
    artifact = msg.artifact if isinstance(msg.artifact, dict) else {}
    return msg.status == "error" or artifact.get("status") in ("error", "died", "timeout")


def savings(messages: Sequence[BaseMessage], todo: Sequence[ToolMessage],
            clear_inputs: bool = False, cleared: Collection[str] = (),
            words: bool = False) -> tuple[dict[str, int], frozenset[str]]:
    """(call id -> tokens clearing it frees, the inputs that go with it): each result's
    placeholder saving, plus with ``clear_inputs`` its call's code swapped for a pointer,
    and with ``words`` the :func:`clearable_words` once ``todo`` is cleared too, each
    counted on its first call in ``todo`` (else on the first candidate)."""
    names = tool_names(messages)
    out = {m.tool_call_id: count_messages([m]) - count_messages([_cleared_copy(m, names)])
           for m in todo}
    inputs = clearable_inputs(messages, list(out)) if clear_inputs and todo else frozenset()
    pointers = input_pointers(messages, inputs)
    for m in messages:
        if _holds_any(m, pointers):
            for call in m.tool_calls:
                cid = call.get("id")
                if cid in pointers:
                    one = {cid: pointers[cid]}
                    out[cid] += count_messages([m]) - count_messages([without_inputs(m, one)])
    if words and clear_inputs and todo:
        cut = clearable_words(messages, set(cleared) | set(out))
        for m in messages:
            if isinstance(m, AIMessage) and words_key(m) in cut:
                gain = count_message(m) - count_message(without_words(m))
                mine = next((c.get("id") for c in m.tool_calls if c.get("id") in out),
                            next(iter(out)))  # beside a kept call: on the first candidate
                if gain > 0:
                    out[mine] += gain
                    inputs |= {words_key(m) or ""}
    return out, inputs


def decide_epoch(messages: Sequence[BaseMessage], cleared: Collection[str], *,
                 total_tokens: int, trigger: int | None, keep: int, min_freed: int,
                 prices: InputPrices, excluded: Collection[str] = EXCLUDED_TOOLS,
                 keep_tokens: int | None = None, clear_inputs: bool = False,
                 pinned: bool = True, card_tokens: int = 0, words: bool = False,
                 expect: bool = False
                 ) -> tuple[frozenset[str] | None, str | None, EpochCost]:
    """(the new cleared set or None, why: "window" | "cost", the cost figures).

    The window decides first: due when the request is over ``trigger`` and clearing every
    candidate frees at least ``min_freed`` tokens (a smaller gain would bust caches for
    little), the inputs that go with the results counted with ``clear_inputs``. Below it
    the epoch is due when the candidates have cost in cache reads, while stale, at least
    what its rewrite costs (``epoch_cost``), counting the ``card_tokens`` of the state
    card that follows an epoch clearing kernel output;
    ``words``: the model's words beside calls whose results all go count as freed;
    ``expect``: the rent counts the reads expected over the session's :func:`horizon`."""
    todo = candidates(messages, cleared, keep, excluded, keep_tokens)
    saved, inputs = savings(messages, todo, clear_inputs, cleared, words)
    results = [m for m in messages if isinstance(m, ToolMessage)]
    ages = stale_ages(messages, saved, kept_count(results, keep, keep_tokens))
    sizes = [count_message(m) for m in messages]
    calls = {i.removeprefix(WORDS) for i in inputs}  # a cut message changes where it is
    cost = epoch_cost(sizes, first_change(messages, saved, calls), saved, ages, prices,
                      pinned=pinned, new_from=newest_reply(messages),
                      also_written=card_tokens if any(execution_of(m) is not None
                                                      for m in todo) else 0,
                      horizon=horizon(messages) if expect else 0)
    if not todo:
        return None, None, cost
    new = frozenset(cleared) | set(saved)
    if trigger is not None and total_tokens > trigger and cost.freed >= max(1, min_freed):
        return new, "window", cost
    if cost.pays:
        return new, "cost", cost
    return None, None, cost


def _cleared_copy(msg: ToolMessage, names: dict[str, str]) -> ToolMessage:
    meta = dict(msg.response_metadata or {})
    meta["context_editing"] = {"cleared": True, "strategy": "simagent_epoch"}
    return msg.model_copy(update={"content": placeholder(msg, names.get(msg.tool_call_id)),
                                  "response_metadata": meta, "artifact": None})


def apply_cleared(messages: Sequence[BaseMessage], cleared: Collection[str],
                  inputs: Collection[str] = ()) -> list[BaseMessage]:
    """The model's view: cleared results replaced by their placeholders and the inputs of
    the calls in ``inputs`` by pointers, the words of the messages keyed there
    (:data:`WORDS`) cut (copies only; ``messages`` stay as they are)."""
    if not cleared and not inputs:
        return list(messages)
    inputs = frozenset(inputs)
    names = tool_names(messages)
    pointers = input_pointers(messages, inputs)
    out: list[BaseMessage] = []
    for m in messages:
        if isinstance(m, ToolMessage) and m.tool_call_id in cleared and not is_cleared(m):
            m = _cleared_copy(m, names)
        elif isinstance(m, AIMessage):
            if pointers and _holds_any(m, pointers):
                m = without_inputs(m, pointers)
            if words_key(m) in inputs:
                m = without_words(m)
        out.append(m)
    return out


# ------------------------------------------------------------------- inputs
def input_pointer(n: int) -> str:
    """What a cleared cell's ``code`` becomes: still Python, and one kernel line away."""
    return f"# code cleared from view: {handle(n)}.code"


def clearable_inputs(messages: Sequence[BaseMessage], cleared: Collection[str],
                     words: bool = False) -> frozenset[str]:
    """Calls whose input may leave the view: a tool in :data:`INPUT_ARGS` whose result is
    in ``cleared`` and names its kernel execution (so the code can be had back); with
    ``words``, the :func:`clearable_words` of ``cleared`` too.
    ``messages`` are the raw ones: a placeholder no longer carries the result's path."""
    names = tool_names(messages)
    wanted = set(cleared)
    code = frozenset(m.tool_call_id for m in messages
                     if isinstance(m, ToolMessage) and m.tool_call_id in wanted
                     and names.get(m.tool_call_id) in INPUT_ARGS
                     and execution_of(m) is not None)
    return code | clearable_words(messages, wanted) if words else code


def input_pointers(messages: Sequence[BaseMessage], inputs: Collection[str]) -> dict[str, str]:
    """tool_call_id -> the pointer its input becomes, for the calls in ``inputs`` whose
    result (in ``messages``, uncleared) names its execution."""
    if not inputs:
        return {}
    wanted = set(inputs)
    out = {}
    for m in messages:
        if isinstance(m, ToolMessage) and m.tool_call_id in wanted and not is_cleared(m):
            n = execution_of(m)
            if n is not None:
                out[m.tool_call_id] = input_pointer(n)
    return out


def _holds_any(msg: BaseMessage, pointers: Mapping[str, str]) -> bool:
    return isinstance(msg, AIMessage) and any(c.get("id") in pointers for c in msg.tool_calls)


def _swapped(name: str | None, args: Any, pointer: str) -> Any:
    arg = INPUT_ARGS.get(name or "")
    if arg and isinstance(args, dict) and arg in args:
        return {**args, arg: pointer}
    return args


def _swapped_json(name: str | None, arguments: Any, pointer: str) -> Any:
    """The same swap inside a JSON-encoded arguments string (OpenAI's wire format)."""
    try:
        args = json.loads(arguments)
    except (TypeError, ValueError):
        return arguments
    new = _swapped(name, args, pointer)
    return arguments if new is args else json.dumps(new, ensure_ascii=False)


def _swapped_block(block: Any, pointers: Mapping[str, str]) -> Any:
    """A content block carrying a call (Anthropic ``tool_use``, standard ``tool_call``,
    Responses ``function_call``) with the same swap, so no converter resends the code."""
    if not isinstance(block, dict):
        return block
    kind = block.get("type")
    if kind == "tool_use" and block.get("id") in pointers:
        return {**block, "input": _swapped(block.get("name"), block.get("input"),
                                           pointers[block["id"]])}
    if kind == "tool_call" and block.get("id") in pointers:
        return {**block, "args": _swapped(block.get("name"), block.get("args"),
                                          pointers[block["id"]])}
    if kind == "function_call" and block.get("call_id") in pointers:
        return {**block, "arguments": _swapped_json(block.get("name"), block.get("arguments"),
                                                    pointers[block["call_id"]])}
    return block


def without_inputs(msg: AIMessage, pointers: Mapping[str, str]) -> AIMessage:
    """A copy of ``msg`` whose calls in ``pointers`` carry the pointer as their input;
    ids, names, order and every other argument stay, so results still pair."""
    calls = [{**c, "args": _swapped(c.get("name"), c.get("args"), pointers[c["id"]])}
             if c.get("id") in pointers else c for c in msg.tool_calls]
    update: dict[str, Any] = {"tool_calls": calls}
    if isinstance(msg.content, list):
        update["content"] = [_swapped_block(b, pointers) for b in msg.content]
    raw = msg.additional_kwargs.get("tool_calls")
    if isinstance(raw, list):
        fixed = []
        for tc in raw:
            fn = tc.get("function") if isinstance(tc, dict) else None
            if isinstance(fn, dict) and tc.get("id") in pointers:
                tc = {**tc, "function": {**fn, "arguments": _swapped_json(
                    fn.get("name"), fn.get("arguments"), pointers[tc["id"]])}}
            fixed.append(tc)
        update["additional_kwargs"] = {**msg.additional_kwargs, "tool_calls": fixed}
    return msg.model_copy(update=update)


# ------------------------------------------------------------------- words
def words_key(msg: BaseMessage) -> str | None:
    """The cleared-inputs entry that cuts ``msg``'s words: an AI message with calls."""
    if isinstance(msg, AIMessage) and msg.tool_calls and msg.tool_calls[0].get("id"):
        return WORDS + str(msg.tool_calls[0]["id"])
    return None


def clearable_words(messages: Sequence[BaseMessage], cleared: Collection[str],
                    excluded: Collection[str] = EXCLUDED_TOOLS) -> frozenset[str]:
    """The :func:`words_key` of each AI message with words whose every call has its
    result in ``cleared`` or is one whose result is never cleared (the attempt log, a
    subagent's digest: they keep what was done, by value), when it comes before the
    newest cleared result. The newest reply, and one beside an error, keep their words."""
    wanted = set(cleared)
    names = tool_names(messages)
    last = max((i for i, m in enumerate(messages)
                if isinstance(m, ToolMessage) and m.tool_call_id in wanted), default=-1)
    return frozenset(key for m in messages[:last]
                     if (key := words_key(m)) and _text_of(m).strip()
                     and all(c.get("id") in wanted or names.get(c.get("id")) in excluded
                             for c in m.tool_calls))


def headline(text: str, limit: int = WORDS_KEEP_CHARS) -> str:
    """The first sentence (or line) of ``text``, at most ``limit`` characters, marked
    ``…`` when anything was cut; what stays of the words of a cleared exchange."""
    text = text.strip()
    if text.endswith(" …") and len(text) <= limit + 2:  # already a headline
        return text
    end = _SENTENCE_END.search(text)
    first = text[: end.start()].rstrip() if end else text
    if len(first) > limit:
        first = first[:limit].rsplit(" ", 1)[0].rstrip()
    return first if first == text else f"{first} …"


def _text_of(msg: AIMessage) -> str:
    if isinstance(msg.content, str):
        return msg.content
    return "".join(b.get("text", "") for b in msg.content
                   if isinstance(b, dict) and b.get("type") == "text")


def without_words(msg: AIMessage) -> AIMessage:
    """A copy of ``msg`` whose text is its :func:`headline` (in a list of blocks, the
    first text block carries it and later ones go; calls and other blocks stay)."""
    if isinstance(msg.content, str):
        return msg.model_copy(update={"content": headline(msg.content)})
    short, blocks = headline(_text_of(msg)), []
    for b in msg.content:
        if isinstance(b, dict) and b.get("type") == "text":
            if short:
                blocks.append({**b, "text": short})
            short = ""
            continue
        blocks.append(b)
    return msg.model_copy(update={"content": blocks})
