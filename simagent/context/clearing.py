"""Clearing old tool results from the model's view, in epochs (design.md §7, layer 3).

langchain's ``ClearToolUsesEdit`` re-decides on every call, so once over its trigger it
clears one more result per call and the request prefix changes every time, which throws
away provider prompt caches and local KV caches on every step. Here clearing happens in
*epochs*: the set of cleared results only grows when an epoch frees at least a set share
of the window, and between epochs the same results stay cleared, so the prefix is byte
for byte stable. The set lives in graph state (checkpointed), not in the messages: the
raw results stay in state and on disk, and each placeholder tells the model how to get
the content back.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from simagent.context.counting import count_messages

#: Results never cleared: the attempt log is referred to by value, subagent results are
#: already digests, and the task record is tiny.
EXCLUDED_TOOLS = frozenset({"record_attempt", "task", "mark_task_done", "remember"})
#: Paths a result may name for its full content (run_python's raw output, an eviction
#: file, a capped result).
_PATH_RE = re.compile(r"(?:full output: |saved in the filesystem at this path: |full result: )"
                      r"(\S+?)[\]\s;,)]")
_REREAD = {"read_file": "read the file again with `read_file` (same arguments)",
           "grep": "run `grep` again", "glob": "run `glob` again", "ls": "run `ls` again"}


def recovery_hint(msg: ToolMessage, tool_name: str | None) -> str:
    """How the model gets a cleared result back: a path on disk, or re-running the call."""
    artifact = msg.artifact if isinstance(msg.artifact, dict) else {}
    path = artifact.get("raw_path")
    if not path:
        found = _PATH_RE.search(msg.text + " ")
        path = found.group(1) if found else None
    if path:
        from simagent.kernel_api.outputs import handle, number_of

        if (n := number_of(path)) is not None:
            return (f"the full output is at {path}; query it in the kernel with "
                    f"`{handle(n)}.tail(k)`, `.grep(pattern)` or `.head(k)` "
                    f"(or page it with `read_file` offset/limit)")
        return f"the full output is at {path} (page it with `read_file` offset/limit)"
    return _REREAD.get(tool_name or "", "re-run the call above if you need it")


def placeholder(msg: ToolMessage, tool_name: str | None) -> str:
    return f"[result cleared to save context; {recovery_hint(msg, tool_name)}]"


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
    kept, used = 0, 0
    for msg in reversed(results):
        size = count_messages([msg])
        if kept >= keep or (keep_tokens is not None and kept and used + size > keep_tokens):
            break
        kept, used = kept + 1, used + size
    older = results[: len(results) - kept]
    return [m for m in older
            if m.tool_call_id not in cleared and names.get(m.tool_call_id) not in excluded
            and not is_error(m) and not is_cleared(m)]


def is_error(msg: ToolMessage) -> bool:
    """A failed call, or a kernel run that raised, died or timed out (kept: errors teach)."""
    artifact = msg.artifact if isinstance(msg.artifact, dict) else {}
    return msg.status == "error" or artifact.get("status") in ("error", "died", "timeout")


def plan_epoch(messages: Sequence[BaseMessage], cleared: Collection[str], *, total_tokens: int,
               trigger: int | None, keep: int, min_freed: int,
               excluded: Collection[str] = EXCLUDED_TOOLS,
               keep_tokens: int | None = None) -> tuple[frozenset[str], int] | None:
    """The new cleared set and the tokens it frees, or None when no epoch is due.

    Due when the request is over ``trigger`` and clearing every candidate frees at least
    ``min_freed`` tokens; a smaller gain would bust caches for little.
    """
    if trigger is None or total_tokens <= trigger:
        return None
    names = tool_names(messages)
    todo = candidates(messages, cleared, keep, excluded, keep_tokens)
    freed = sum(count_messages([m]) - count_messages([_cleared_copy(m, names)]) for m in todo)
    if not todo or freed < max(1, min_freed):
        return None
    return frozenset(cleared) | {m.tool_call_id for m in todo}, freed


def _cleared_copy(msg: ToolMessage, names: dict[str, str]) -> ToolMessage:
    meta = dict(msg.response_metadata or {})
    meta["context_editing"] = {"cleared": True, "strategy": "simagent_epoch"}
    return msg.model_copy(update={"content": placeholder(msg, names.get(msg.tool_call_id)),
                                  "response_metadata": meta, "artifact": None})


def apply_cleared(messages: Sequence[BaseMessage], cleared: Collection[str]) -> list[BaseMessage]:
    """The model's view: cleared results replaced by their placeholders (copies only)."""
    if not cleared:
        return list(messages)
    names = tool_names(messages)
    return [_cleared_copy(m, names)
            if isinstance(m, ToolMessage) and m.tool_call_id in cleared and not is_cleared(m)
            else m for m in messages]
