"""What every front end does before its first turn, in one place.

The TUI, ``simagent run`` and the bench's kill child each hold a session and a model and
need a turn runner. The steps and their order are the same for all of them: a resumed
session that goes on with another model traces the switch (before anything else writes
to the trace), the graph is built for that front end (a bad subagent file or model fails
here, before the kernel starts), and a resumed thread's open tool calls are answered (a
killed run may have left some) before a ``TurnRunner`` drives it. Three copies of this
drifted apart once; a front end now calls :func:`turn_runner_for` (or :func:`agent_for`
to swap the graph of a runner it already has, as ``/model`` does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from simagent.agent.builder import BuiltAgent, build_agent
from simagent.agent.resume_repair import repair as answer_open_calls
from simagent.agent.runner import TurnRunner

if TYPE_CHECKING:
    from simagent.session import Session

#: ``repair(session, graph) -> ids answered``: how a resumed thread's open calls are answered.
Repair = Callable[[Any, Any], list[str]]


def agent_for(session: Session, model: Any, *, front_end: str = "tui",
              **build: Any) -> BuiltAgent:
    """The session's graph for ``model`` (a ``ResolvedModel`` or a chat model), after
    tracing a model switch; ``build``: more ``build_agent`` keywords."""
    if (model_id := getattr(model, "id", None)) is not None:  # a ResolvedModel
        session.note_model_switch(model_id)
        model.keep_logs_in(session.paths.root)  # a local server's log, with the session's
    return build_agent(session, model, front_end=front_end, **build)


def turn_runner_for(session: Session, model: Any, *, front_end: str = "tui",
                    repair: Repair = answer_open_calls, **build: Any) -> TurnRunner:
    """A ``TurnRunner`` for ``session`` on ``model``: :func:`agent_for`, then (a resumed
    session only) ``repair`` of the thread's open tool calls."""
    agent = agent_for(session, model, front_end=front_end, **build)
    if session.resume_info is not None:
        repair(session, agent.graph)
    return TurnRunner(session, agent)
