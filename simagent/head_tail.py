"""The one head-and-tail cut for text over a budget (kernel output and tool results alike).

A long output's head holds its setup (parameters, the first lines of a table) and its
tail the results and the error, so both are kept and the middle goes. The head gets
:data:`HEAD_SHARE` of the budget, the tail the rest; each is moved to a line boundary
when one is near, so no line is shown cut. ``ExecResult.model_text`` (``run_python``'s
text), ``context.capping.cap_text`` (every other tool's result) and ``simagent mcp``'s
``output`` replies (head only) all cut here and add their own marker saying where the
whole text is.
"""

from __future__ import annotations

#: Share of the budget given to the head; the tail (results, errors) gets the rest.
HEAD_SHARE = 0.25
#: A tail starts on a whole line when a line break falls within its first this many chars.
LINE_SEARCH = 200


def head_and_tail(text: str, budget: int, *, with_head: bool = True,
                  with_tail: bool = True) -> tuple[str, str]:
    """(head, tail) of ``text`` within about ``budget`` chars; ``("", text)`` when it fits
    and no head is asked for. ``with_head=False``: only the tail (an output whose head
    was already dropped at capture). ``with_tail=False``: only the head, given the whole
    budget (a reply read from the top, as ``simagent mcp``'s ``output`` head/slice/grep)."""
    head = ""
    if with_head:
        head = text[: int(budget * (HEAD_SHARE if with_tail else 1))]
        nl = head.rfind("\n")
        head = head[: nl + 1] if nl > len(head) // 2 else head
    if not with_tail:
        return head, ""
    rest = text[len(head):]
    room = budget - len(head)
    tail = rest[-room:] if len(rest) > room else rest
    nl = tail.find("\n")
    if 0 <= nl < LINE_SEARCH and len(tail) < len(rest):  # start on a whole line
        tail = tail[nl + 1:]
    return head, tail
