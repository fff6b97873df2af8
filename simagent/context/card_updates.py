"""A state card that changed little is sent as an update, not again in full (issue 31 §2).

Every clearing epoch that takes kernel output from view makes a new card. Sent in full,
each card is written to the provider's prompt cache again (Anthropic: 1.25x input) though
between two epochs a few names change, the execution count moves and a file or a figure
is added. So an epoch of a kernel that did not restart sends an *update*: the lines that
differ from what the card and its earlier updates said. Each part goes after the newest
result its epoch cleared (:func:`anchor_after_cleared`), before the step whose result is
kept, so the next epoch, which clears that step, changes the view after the card and its
updates: they stay byte for byte where they were and are read from the cache (Anthropic's
pinned breakpoint reaches over them, ``context.prefix.pin_index``). Updates pile up until
a compaction that changes the view before them anyway (a summary, a task checkpoint,
``/compact``, an emergency) or a kernel restart sends a full card again, which replaces
the card and all its updates. Replacing them sooner would rewrite everything after the
card (most of the conversation) to save reads of a few hundred tokens at a tenth of the
input price: replay, long workflows at 128k, $ x stock (Anthropic/OpenAI), tuned group,
every card in full 0.555x/0.581x, a full card again once the updates pass twice its size
0.523x/0.560x, never 0.513x/0.553x (held-out, checked after: 0.693x/0.698x, 0.694x/0.693x,
0.687x/0.691x), recall 1.0 at each. ``[context] state_card_updates = false`` sends every
card in full. An epoch is still priced with a full card's budget (``epoch_cost``): priced
at the last update's size, epochs came more often and the held-out Anthropic bill rose
(0.687x -> 0.716x; tuned 0.513x -> 0.515x).

Pure: the full card :func:`simagent.context.state_card.render_card` made now and the
card stored in graph state in, the card to store out.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage

from simagent.context.tokens import Ruler


def anchor_after_cleared(messages: Sequence[BaseMessage], cleared: Collection[str]
                         ) -> str | None:
    """Id of the message a card made by a clearing epoch follows: the last result of the
    call group holding the newest cleared result (a card between a call and its results
    would break the pairing every provider checks). None when nothing is cleared."""
    wanted = set(cleared)
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if isinstance(msg, ToolMessage) and msg.tool_call_id in wanted:
            j = i
            while j + 1 < len(messages) and isinstance(messages[j + 1], ToolMessage):
                j += 1
            return messages[j].id
    return None


def anchor_newest(messages: Sequence[BaseMessage]) -> str | None:
    """Id of the message any other card follows: the newest one, or the one before it
    when that is the user's new turn, so the question stays the last thing read."""
    if not messages:
        return None
    newest_is_user = isinstance(messages[-1], HumanMessage) and len(messages) > 1
    return messages[-2 if newest_is_user else -1].id


def changes(told: dict[str, Any], now: dict[str, Any], names: Collection[str]
            ) -> dict[str, Any]:
    """What ``now`` (a full card's shown lines) says that ``told`` (what the card and its
    updates said) does not; ``names``: every name the kernel holds now, so a name the
    full card only left out for room is not called gone."""
    old_names = told.get("names") or {}
    old_files = told.get("files") or {}
    shown, alive = now.get("names") or {}, set(names)
    effects = now.get("effects") or ""
    return {
        "kernel": now.get("kernel") or "",
        "names": [line for name, line in shown.items() if old_names.get(name) != line],
        "gone": [name for name in old_names if name not in alive]
        + [f for f in told.get("functions", []) if f not in (now.get("functions") or [])],
        # said before, still there, but a full card now has no room for them: unchecked
        "unread": [name for name in old_names if name in alive and name not in shown],
        "imports": [x for x in now.get("imports") or [] if x not in told.get("imports", [])],
        "functions": [x for x in now.get("functions") or []
                      if x not in told.get("functions", [])],
        "figures": [x for x in now.get("figures") or [] if x not in told.get("figures", [])],
        "files": [line for key, line in (now.get("files") or {}).items()
                  if old_files.get(key) != line],
        "effects": effects if effects != (told.get("effects") or "") else "",
    }


def merged(told: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """What the card and its updates say once this update is sent. A told name the full
    card no longer shows is either gone or said to be unread (:func:`changes`): either way
    it has been said once, so it leaves what later updates compare to."""
    return {
        "kernel": now.get("kernel") or "",
        "names": dict(now.get("names") or {}),
        "imports": [*told.get("imports", []),
                    *(x for x in now.get("imports") or [] if x not in told.get("imports", []))],
        "functions": list(now.get("functions") or []),
        "figures": [*told.get("figures", []),
                    *(x for x in now.get("figures") or [] if x not in told.get("figures", []))],
        "files": {**(told.get("files") or {}), **(now.get("files") or {})},
        "effects": now.get("effects") or told.get("effects") or "",
    }


def render_update(diff: dict[str, Any], reason: str) -> str:
    """The update's text: the kernel line, then only the sections that changed."""
    body = [f'<kernel_state_update after="{reason}">',
            "Read from the live kernel just now: what changed since the kernel state "
            "above; the rest of it still holds.", diff["kernel"]]
    if diff["names"]:
        body += ["new or changed names:", *diff["names"]]
    if diff["gone"]:
        body.append("names gone: " + ", ".join(diff["gone"]))
    if diff.get("unread"):
        body.append("not re-read for room (may have changed): " + ", ".join(diff["unread"]))
    if diff["imports"]:
        body.append("imports added: " + ", ".join(diff["imports"]))
    if diff["functions"]:
        body.append("functions/classes added: " + ", ".join(diff["functions"]))
    if diff["figures"]:
        body += ["figures added:", *diff["figures"]]
    if diff["files"]:
        body += ["files written, new or changed:", *(f"- {f}" for f in diff["files"])]
    if diff["effects"]:
        body.append(diff["effects"])
    if len(body) == 3:
        body.append("nothing else changed.")
    return "\n".join([*body, "</kernel_state_update>"])


def next_card(full: dict[str, Any], previous: dict[str, Any] | None, *, reason: str,
              anchor: str | None, updates: bool, ruler: Ruler) -> dict[str, Any]:
    """The card to store: ``previous`` with an update appended when ``updates`` are on
    and a clearing epoch's kernel has not restarted; else ``full`` alone (it replaces the
    card and every update)."""
    n = int((previous or {}).get("n") or 0) + 1
    told = (previous or {}).get("told")
    if (reason == "clear" and told is not None and updates and not full["restarted"]
            and previous.get("generation") == full["generation"]):
        text = render_update(changes(told, full["state"], full["names"]), reason)
        tokens = ruler.count(text)
        part = {"text": text, "after_id": anchor, "id": f"simagent-state-card-{n}"}
        return {**full, "text": previous["text"], "after_id": previous.get("after_id"),
                "parts": [*previous["parts"], part],
                "told": merged(told, full["state"]),
                "update_tokens": int(previous.get("update_tokens") or 0) + tokens,
                "tokens": tokens, "n": n, "update": True}
    part = {"text": full["text"], "after_id": anchor, "id": f"simagent-state-card-{n}"}
    return {**full, "after_id": anchor, "parts": [part], "told": full["state"],
            "update_tokens": 0, "n": n, "update": False}

