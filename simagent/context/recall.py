"""Is a fact still reachable by the model? In the request, or one path away on disk.

Every layer that removes content from the view leaves a path behind (a raw output file,
an evicted result, the conversation history). A fact counts as kept when the request
holds it, or holds a path to a file that does — following paths a couple of hops, since
a history file may itself name a raw output. Tests and the bench's recall score use this.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from langchain_core.messages import AIMessage, BaseMessage

_PATH = re.compile(r"(/[^\s\]\)\"'`,;]+)")


def request_text(messages: Sequence[BaseMessage]) -> str:
    parts = []
    for msg in messages:
        parts.append(msg.text)
        if isinstance(msg, AIMessage):
            parts.extend(str(c.get("args")) for c in msg.tool_calls)
    return "\n".join(parts)


def paths_in(text: str, roots: Iterable[Path]) -> list[Path]:
    """Existing files under ``roots`` that ``text`` names."""
    roots = [Path(r).resolve() for r in roots]
    found = []
    for raw in dict.fromkeys(_PATH.findall(text)):
        path = Path(raw.rstrip(".:"))
        try:
            if path.is_file() and any(path.resolve().is_relative_to(r) for r in roots):
                found.append(path)
        except OSError:
            continue
    return found


def reachable(fact: str, text: str, roots: Iterable[Path], hops: int = 2) -> bool:
    """``fact`` is in ``text`` or in a file under ``roots`` that ``text`` names (≤ hops)."""
    roots = list(roots)
    seen: set[Path] = set()
    frontier = [text]
    for _ in range(hops + 1):
        nxt = []
        for chunk in frontier:
            if fact in chunk:
                return True
            for path in paths_in(chunk, roots):
                if path not in seen:
                    seen.add(path)
                    try:
                        nxt.append(path.read_text(encoding="utf-8", errors="replace"))
                    except OSError:
                        continue
        frontier = nxt
    return False


def recall(facts: Sequence[str], messages: Sequence[BaseMessage], roots: Iterable[Path]) -> float:
    """Share of ``facts`` reachable from a request (1.0 when there are none)."""
    if not facts:
        return 1.0
    text = request_text(messages)
    roots = list(roots)
    return sum(reachable(f, text, roots) for f in facts) / len(facts)
