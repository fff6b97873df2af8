"""Per-tool output cap at execution time (design.md §7, layer 1).

The cheapest layer: a result longer than its tool's cap reaches the model as head + tail
around a marker, and the whole text is written to ``large_tool_results/<call_id>.full.txt`` so it
stays one ``read_file`` away. Error results are never cut: the end of an error is what
the model needs, and errors are short after the kernel's own traceback compaction.
Tools that cap themselves (``tool_names.SELF_CAPPING``: ``run_python`` knows where its raw
output already is) pass through untouched. Both cut with ``simagent.head_tail``.

:class:`ToolCapMiddleware` applies the cap to every tool call's result. It is a middleware
of its own: it acts on tool calls only and shares nothing with the model-call layers
(``context/middleware.py``), and it is listed right after them, so each tool call passes
it where it passed them when the two were one middleware.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage
from langgraph.types import Command

from simagent.context.thresholds import tool_cap
from simagent.head_tail import head_and_tail
from simagent.kernel.cut_lines import cut_note, file_slice, text_cut
from simagent.paths import private_dir, write_private
from simagent.tool_names import SELF_CAPPING
from simagent.trace.redact import redact

if TYPE_CHECKING:
    from simagent.context.settings import ContextSettings

#: Slack for markers a self-capping tool adds on top of its cap.
MARKER_SLACK = 1_000


def safe_name(call_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", call_id or "call")[:120]


def cap_text(text: str, cap: int, where: str) -> str:
    """Head + tail of ``text`` in at most about ``cap`` chars, with a marker naming ``where``
    and, when it is a saved file, the ``read_file`` page holding the omitted lines."""
    if len(text) <= cap:
        return text
    head, tail = head_and_tail(text, cap)
    omitted = len(text) - len(head) - len(tail)
    cut = text_cut(text, head, tail) if not where.startswith("(") else None
    page = cut_note(cut, file_slice(cut)) if cut else "read_file with offset/limit"
    return (f"{head}\n[... {omitted:,} of {len(text):,} chars not shown; full result: {where} "
            f"({page}) ...]\n{tail}")


def cap_tool_message(msg: ToolMessage, cap: int, folder: Path | str | None) -> ToolMessage:
    """``msg`` with its text capped (full text saved first); errors and small results as is."""
    text = msg.text
    if (msg.status == "error" or msg.name in SELF_CAPPING
            or len(text) <= cap + MARKER_SLACK or not isinstance(msg.content, str)):
        return msg
    where = "(not saved)"
    if folder is not None:
        # not ``<call_id>`` itself: eviction may write that name with the capped text
        path = Path(folder) / f"{safe_name(msg.tool_call_id)}.full.txt"
        try:
            private_dir(path.parent)
            write_private(path, redact(text))
            where = str(path)
        except OSError as exc:
            where = f"(could not be saved: {exc.strerror or exc})"
    return msg.model_copy(update={"content": cap_text(text, cap, where)})


class ToolCapMiddleware(AgentMiddleware):
    """Each result over its tool's cap (``thresholds.tool_cap``) keeps head and tail; the
    full text goes to ``folder`` (the session's ``large_tool_results/``)."""

    def __init__(self, settings: ContextSettings, folder: Path | str | None,
                 agent: str = "main") -> None:
        super().__init__()
        self.settings = settings
        self.folder = folder
        self.agent = agent

    @property
    def name(self) -> str:
        return f"ToolCapMiddleware[{self.agent}]"

    def cap(self, request: Any, result: Any) -> Any:
        """``result`` (a message, or a ``Command`` carrying messages) with each tool
        message capped."""
        cap = tool_cap(request.tool_call.get("name") or "", self.settings)
        if cap is None:
            return result
        if isinstance(result, ToolMessage):
            return cap_tool_message(result, cap, self.folder)
        if isinstance(result, Command) and isinstance(result.update, dict):
            msgs = result.update.get("messages")
            if isinstance(msgs, list):
                capped = [cap_tool_message(m, cap, self.folder)
                          if isinstance(m, ToolMessage) else m for m in msgs]
                return Command(goto=result.goto, graph=result.graph,
                               update={**result.update, "messages": capped})
        return result

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return self.cap(request, handler(request))

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return self.cap(request, await handler(request))
