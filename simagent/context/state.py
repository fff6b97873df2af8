"""What the context layers keep in graph state, and the model's view made from it.

One home for the state every layer shares: the latest boundary (a summary, checkpoint or
emergency cut), the cleared results and inputs, the pending task checkpoint and the
kernel state card. The raw messages stay in state untouched; these keys say what the
model sees of them, so a resumed or rebuilt agent (another model) sees the same view, and
:func:`model_view` is the one way a view is made from them (the middleware before each
call, ``/compact`` and ``/done``, the MCP tool deferral, the bench's recall).

The keys are private (``PrivateStateAttr``): never passed to subagents, never in the
graph's output.
"""

from __future__ import annotations

from typing import Annotated, Any, NotRequired

from langchain.agents.middleware.types import AgentState, PrivateStateAttr
from langchain_core.messages import BaseMessage

from simagent.context.compaction import visible
from simagent.context.state_card import with_card

BOUNDARY_KEY = "simagent_boundary"
CLEARED_KEY = "simagent_cleared"
#: Calls whose input (a cell's code) is cleared from view with their result.
CLEARED_INPUTS_KEY = "simagent_cleared_inputs"
PENDING_CHECKPOINT_KEY = "simagent_pending_checkpoint"
#: The kernel state card (``context.state_card``) and where it sits.
STATE_CARD_KEY = "simagent_state_card"


def _last(_old: Any, new: Any) -> Any:
    return new


class ContextState(AgentState):
    simagent_boundary: Annotated[NotRequired[dict[str, Any] | None], PrivateStateAttr]
    simagent_cleared: Annotated[NotRequired[list[str] | None], PrivateStateAttr]
    simagent_cleared_inputs: Annotated[NotRequired[list[str] | None], PrivateStateAttr]
    # last wins: two mark_task_done calls in one reply must not crash the step
    simagent_pending_checkpoint: Annotated[NotRequired[dict[str, Any] | None],
                                           PrivateStateAttr, _last]
    simagent_state_card: Annotated[NotRequired[dict[str, Any] | None], PrivateStateAttr]


def model_view(messages: list[BaseMessage], boundary: dict[str, Any] | None, cleared: Any,
               card: dict[str, Any] | None, inputs: Any = ()) -> list[BaseMessage]:
    """Raw messages -> what the model sees: boundary, cleared placeholders and input
    pointers, state card."""
    return with_card(visible(messages, boundary, cleared, inputs), card, boundary is not None)


def current_view(state: dict[str, Any]) -> list[BaseMessage]:
    """The model's view of a checkpointed state (for the bench's recall and for tests)."""
    return model_view(list(state.get("messages") or []), state.get(BOUNDARY_KEY),
                      state.get(CLEARED_KEY) or (), state.get(STATE_CARD_KEY),
                      state.get(CLEARED_INPUTS_KEY) or ())
