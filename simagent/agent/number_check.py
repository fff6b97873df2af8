"""The check before final: an answer's numbers that no source shows are asked about once.

A model may state a plausible number no cell ever printed. When the main agent's reply
is final (no tool call) this middleware traces its numbers (``context/provenance``)
against the session's sources so far (every cell's raw output and code, other tools'
results, the person's messages). With ``[answers] check_numbers``:

- ``nudge`` (the default): the first final of a turn with unsourced numbers gets one
  message naming them and asking the model to compute them or drop them, and the model
  answers again (that message and its reply are counted in usage like any other call).
  Once per turn: what the next final still leaves unsourced is marked, as in ``mark``.
- ``mark``: no extra call; the final answer ends with one line naming its unsourced
  numbers, so the person reads them as such.
- ``off``: nothing.

The nudge is marked in the checkpointed messages (``additional_kwargs``), so "once per
turn" holds across a resume, as ``recovery``'s nudges do.
"""

from __future__ import annotations

from typing import Any

from langchain.agents.middleware import AgentMiddleware, hook_config
from langchain_core.messages import AIMessage, HumanMessage

from simagent.context.provenance.engine import Provenance, SourceIndex, trace_answer
from simagent.context.provenance.sources import sources_from_events
from simagent.context.reporting import write_stream
from simagent.trace.log import TraceLog

#: ``additional_kwargs`` ``lc_source`` of the nudge, and key of a marked answer.
NUDGE_SOURCE = "simagent_number_check"
MARKED = "simagent_numbers_marked"
#: At most this many numbers are named in a nudge or a mark.
NAMED = 12


def is_nudge(msg: Any) -> bool:
    return isinstance(msg, HumanMessage) and \
        msg.additional_kwargs.get("lc_source") == NUDGE_SOURCE


def nudged_this_turn(messages: list[Any]) -> bool:
    """A nudge since the person's last message (the turn's start)."""
    for msg in reversed(messages):
        if is_nudge(msg):
            return True
        if isinstance(msg, HumanMessage):
            return False
    return False


def _named(prov: Provenance) -> str:
    texts = list(dict.fromkeys(t.text for t in prov.unsourced))
    more = len(texts) - NAMED
    return ", ".join(texts[:NAMED]) + (f" and {more} more" if more > 0 else "")


def nudge_text(prov: Provenance) -> str:
    return (f"[harness] Your answer states numbers that no cell output, tool result or "
            f"message of the person shows: {_named(prov)}. Compute each one in a cell (print "
            "it) and report the printed value, or drop it; then give your final answer "
            "again.")


def mark_line(prov: Provenance) -> str:
    """The line a marked answer ends with."""
    n = len(prov.unsourced)
    return (f"[unsourced: {_named(prov)}: no cell output, tool result or message of yours "
            f"shows {'this number' if n == 1 else 'these numbers'}]")


class NumberCheckMiddleware(AgentMiddleware):
    """Checks the main agent's final answers' numbers (module docstring)."""

    def __init__(self, trace: TraceLog, mode: str = "nudge") -> None:
        super().__init__()
        self.trace = trace
        self.mode = mode

    @property
    def name(self) -> str:
        return "NumberCheckMiddleware"

    def provenance(self, answer: str) -> Provenance:
        """``answer``'s numbers against everything the session's trace holds so far."""
        return trace_answer(answer, SourceIndex(sources_from_events(self.trace.events())))

    @hook_config(can_jump_to=["model"])
    def after_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        messages = state.get("messages") or []
        if self.mode == "off" or not messages or not isinstance(messages[-1], AIMessage):
            return None
        msg = messages[-1]
        if msg.tool_calls or msg.invalid_tool_calls or not msg.text.strip() \
                or MARKED in msg.additional_kwargs:
            return None
        prov = self.provenance(msg.text)
        if not prov.unsourced:
            return None
        if self.mode == "nudge" and not nudged_this_turn(messages[:-1]):
            write_stream({"type": "notice", "level": "info",
                          "text": f"numbers: asked the model about {_named(prov)} (no source "
                                  "shows them)"})
            nudge = HumanMessage(content=nudge_text(prov),
                                 additional_kwargs={"lc_source": NUDGE_SOURCE,
                                                    "unsourced": [t.text for t in prov.unsourced]})
            return {"messages": [nudge], "jump_to": "model"}
        write_stream({"type": "notice", "level": "warning", "text": mark_line(prov)})
        marked = AIMessage(
            content=f"{msg.text.rstrip()}\n\n{mark_line(prov)}", id=msg.id,
            usage_metadata=msg.usage_metadata, response_metadata=dict(msg.response_metadata),
            additional_kwargs={**msg.additional_kwargs,
                               MARKED: [t.text for t in prov.unsourced]})
        return {"messages": [marked]}

    @hook_config(can_jump_to=["model"])
    async def aafter_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        return self.after_model(state, runtime)
