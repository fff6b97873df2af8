"""Guards that stop a turn going round in circles or running up a bill.

* The **watchdog** notices the same tool call (same name, same literal JSON arguments)
  made ``watchdog_repeats`` times in a row: a model stuck re-running a failing cell.
  ``warn`` records and shows it once per stuck run; ``enforce`` also stops the turn
  before the repeated call runs.
* The **cost ceiling** stops a turn once the turn's or the session's spend (USD from
  :mod:`simagent.context.prices`, or tokens) meets a configured limit. The trip is
  written to the trace, so "refuse the next turn until the user resets it" holds across
  a restart of the process (see :func:`ceiling_tripped`).

Both read what they need from the checkpointed messages, the usage totals and the
trace rather than from instance memory, so a resumed session behaves the same. Pure
cores first (testable without a graph), then the two middlewares. When a guard stops a
turn it rewrites the reply with the same message id, so langgraph's ``add_messages``
replaces it, and removes the calls that have no result yet: no provider ever sees a tool
call without its tool result.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from langchain.agents.middleware import AgentMiddleware, hook_config
from langchain_core.messages import AIMessage, ToolMessage

from simagent.context.prices import usage_cost
from simagent.context.reporting import emit, write_stream
from simagent.context.settings import ContextSettings
from simagent.trace.log import TraceLog
from simagent.trace.usage import Usage, UsageTotals

#: ``additional_kwargs`` key on a reply a guard rewrote.
MARK = "simagent_guard"
_TOOLISH_BLOCKS = {"tool_use", "tool_call", "server_tool_use", "function_call",
                   "tool_call_chunk"}


# ------------------------------------------------------------------ shared helpers
def notice(text: str) -> None:
    """A warning line for the user, as a stream item; nothing outside a stream."""
    write_stream({"type": "notice", "level": "warning", "text": text})


def _last_ai_index(messages: Sequence[Any]) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], AIMessage):
            return i
    return None


def strip_pending_calls(messages: Sequence[Any], note: str,
                        mark: Mapping[str, Any]) -> AIMessage | None:
    """A copy of the last AIMessage without its unanswered tool calls, ``note`` appended.

    Calls that already have a ToolMessage after the reply (a rejection written by the
    approval layer) stay, so no result is orphaned either. None when nothing is pending.
    """
    i = _last_ai_index(messages)
    if i is None:
        return None
    msg = messages[i]
    answered = {m.tool_call_id for m in messages[i + 1:] if isinstance(m, ToolMessage)}
    kept = [c for c in msg.tool_calls if c.get("id") in answered]
    if len(kept) == len(msg.tool_calls):
        return None
    kept_ids = {c.get("id") for c in kept}
    if isinstance(msg.content, str):
        text = msg.content.strip()
        content: Any = f"{text}\n\n{note}" if text else note
    else:  # provider blocks: drop the tool-use blocks of the removed calls
        content = [b for b in msg.content if not (
            isinstance(b, dict) and b.get("type") in _TOOLISH_BLOCKS
            and b.get("id") not in kept_ids)]
        content.append({"type": "text", "text": note})
    extra = {k: v for k, v in msg.additional_kwargs.items()
             if k not in ("tool_calls", "function_call")}
    return AIMessage(content=content, id=msg.id, name=msg.name, tool_calls=kept,
                     invalid_tool_calls=[], usage_metadata=msg.usage_metadata,
                     response_metadata=dict(msg.response_metadata),
                     additional_kwargs={**extra, MARK: dict(mark)})


def stop_turn(messages: Sequence[Any], note: str, mark: Mapping[str, Any]) -> dict[str, Any]:
    """An ``after_model`` update that ends the turn with no pending call left behind."""
    update: dict[str, Any] = {"jump_to": "end"}
    cleaned = strip_pending_calls(messages, note, mark)
    if cleaned is not None:
        update["messages"] = [cleaned]
    return update


# ------------------------------------------------------------------------ watchdog
def call_key(name: str, args: Any) -> str:
    """Identity of a call: the name plus canonical JSON of the literal arguments."""
    return name + json.dumps(args, sort_keys=True, separators=(",", ":"), default=str,
                             ensure_ascii=False)


def repeat_alerts(calls: Sequence[tuple[str, Any]], threshold: int) -> list[int]:
    """Indexes where a run of identical consecutive calls reaches exactly ``threshold``.

    One alert per stuck run: a sixth identical call does not fire again; a different call
    in between starts a new run.
    """
    if threshold < 1:
        return []
    alerts, run, prev = [], 0, None
    for i, (name, args) in enumerate(calls):
        key = call_key(name, args)
        run = run + 1 if key == prev else 1
        prev = key
        if run == threshold:
            alerts.append(i)
    return alerts


def _calls_of(messages: Iterable[Any]) -> list[tuple[str, Any]]:
    return [(c["name"], c.get("args") or {}) for m in messages if isinstance(m, AIMessage)
            for c in m.tool_calls]


class WatchdogMiddleware(AgentMiddleware):
    """Alerts (``warn``) or stops the turn (``enforce``) on repeated identical calls."""

    def __init__(self, trace: TraceLog, settings: ContextSettings | None = None, *,
                 agent: str = "main") -> None:
        super().__init__()
        self.trace = trace
        self.settings = settings or ContextSettings()
        self.agent = agent

    @property
    def name(self) -> str:  # unique per agent so subagent stacks may hold their own
        return f"WatchdogMiddleware[{self.agent}]"

    @hook_config(can_jump_to=["end"])
    def after_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        mode = self.settings.watchdog
        messages = list(state.get("messages") or [])
        i = _last_ai_index(messages)
        if mode == "off" or i is None or not messages[i].tool_calls:
            return None
        # the run is derived from the thread's messages, so it survives a restart
        earlier = _calls_of(messages[:i])
        calls = earlier + _calls_of([messages[i]])
        repeats = self.settings.watchdog_repeats
        hits = [j for j in repeat_alerts(calls, repeats) if j >= len(earlier)]
        if not hits:
            return None
        details = []
        for j in hits:  # one per stuck run (several only with parallel calls)
            tool, args = calls[j]
            detail = {"tool": tool, "args": args, "repeats": repeats, "mode": mode,
                      "agent": self.agent}
            emit(self.trace, "watchdog_alert", detail)  # trace event + context stream item
            notice(f"watchdog: {tool} called {repeats} times in a row with the same arguments")
            details.append(detail)
        if mode != "enforce":
            return None
        note = (f"[watchdog] Turn stopped: `{details[0]['tool']}` was requested {repeats} "
                "times in a row with the same arguments, so the repeated call was not run.")
        return stop_turn(messages, note, {"guard": "watchdog", **details[0]})

    @hook_config(can_jump_to=["end"])
    async def aafter_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        return self.after_model(state, runtime)


# -------------------------------------------------------------------- cost ceiling
@dataclass(frozen=True)
class CeilingTrip:
    scope: str  # turn | session
    unit: str  # usd | tokens
    limit: float
    spent: float
    message: str


def _amount(value: float, unit: str) -> str:
    return f"${value:,.4f}" if unit == "usd" else f"{int(value):,} tokens"


def check_ceiling(settings: ContextSettings, session_usd: float, session_tokens: int,
                  turn_usd: float, turn_tokens: int) -> CeilingTrip | None:
    """The first limit met or exceeded (session before turn), or None.

    Nothing spent never trips, so a free model never meets a USD limit of 0.
    """
    checks = (("session", "usd", settings.max_session_usd, session_usd),
              ("session", "tokens", settings.max_session_tokens, session_tokens),
              ("turn", "usd", settings.max_turn_usd, turn_usd),
              ("turn", "tokens", settings.max_turn_tokens, turn_tokens))
    for scope, unit, limit, spent in checks:
        if limit is not None and spent > 0 and spent >= limit:
            what = "this turn" if scope == "turn" else "this session"
            message = (f"cost ceiling reached: {what} used {_amount(spent, unit)} "
                       f"(limit {_amount(limit, unit)}); the turn was stopped and new turns "
                       "wait until the ceiling is reset")
            return CeilingTrip(scope, unit, limit, spent, message)
    return None


def ceiling_tripped(events: Iterable[Any]) -> dict[str, Any] | None:
    """Payload of the latest ``cost_ceiling`` trip not followed by a reset, else None."""
    tripped = None
    for event in events:
        if event.kind != "cost_ceiling" or not isinstance(event.payload, dict):
            continue
        action = event.payload.get("action")
        if action == "tripped":
            tripped = event.payload
        elif action == "reset":
            tripped = None
    return tripped


def reset_ceiling(trace: TraceLog) -> None:
    """Let turns run again after a trip (the user's explicit decision)."""
    trace.append("cost_ceiling", {"action": "reset"})


def _tokens(usage: Usage) -> int:
    return usage.input_tokens + usage.output_tokens


class CostCeilingMiddleware(AgentMiddleware):
    """Stops the turn once turn or session spend meets a ``[context]`` limit."""

    def __init__(self, trace: TraceLog, usage: UsageTotals,
                 settings: ContextSettings | None = None, *, agent: str = "main") -> None:
        super().__init__()
        self.trace = trace
        self.usage = usage
        self.settings = settings or ContextSettings()
        self.agent = agent
        self._start: tuple[Usage, dict[str, Usage]] | None = None
        self._warned_unknown: set[str] = set()

    @property
    def name(self) -> str:
        return f"CostCeilingMiddleware[{self.agent}]"

    def _limited(self) -> bool:
        s = self.settings
        return any(v is not None for v in (s.max_turn_usd, s.max_session_usd,
                                           s.max_turn_tokens, s.max_session_tokens))

    def _take(self) -> tuple[Usage, dict[str, Usage]]:
        """Totals and a per-model copy of the usage, read under its lock."""
        with getattr(self.usage, "_lock", None) or nullcontext():
            total = Usage(**self.usage.total.as_dict())
            models = {m: Usage(**u.as_dict()) for m, u in self.usage.by_model.items()}
        return total, models

    def _turn_from_trace(self) -> tuple[Usage, dict[str, Usage]]:
        """This turn's usage from the trace: an approval resumed by a new process (no
        ``before_agent`` ran in this instance) still counts from the user's message."""
        users = self.trace.events(["message_user"])
        after = users[-1].id if users else 0
        turn = UsageTotals.from_trace(self.trace.events(["model_usage"], after_id=after))
        return turn.total, turn.by_model

    def before_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        self._start = self._take()  # turn start
        return None

    async def abefore_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        return self.before_agent(state, runtime)

    def spend(self) -> tuple[float, int, float, int, list[str]]:
        """(session USD, session tokens, turn USD, turn tokens, models of unknown price)."""
        total, models = self._take()
        session_usd, unknown = usage_cost(models)
        if self._start is None:
            turn_total, turn_models = self._turn_from_trace()
        else:
            start_total, start_models = self._start
            turn_total = total.minus(start_total)
            turn_models = {m: u.minus(start_models.get(m, Usage())) for m, u in models.items()}
        turn_usd, _ = usage_cost(turn_models)
        return session_usd, _tokens(total), turn_usd, _tokens(turn_total), unknown

    @hook_config(can_jump_to=["end"])
    def after_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        if not self._limited():
            return None
        # the recorder (innermost wrap_model_call) has already put this call in the usage
        session_usd, session_tokens, turn_usd, turn_tokens, unknown = self.spend()
        self._warn_unknown(unknown)
        trip = check_ceiling(self.settings, session_usd, session_tokens, turn_usd, turn_tokens)
        if trip is None:
            return None
        payload = {"action": "tripped", "scope": trip.scope, "limit": trip.limit,
                   "spent": trip.spent, "unit": trip.unit, "message": trip.message}
        emit(self.trace, "cost_ceiling", payload)
        notice(trip.message)
        messages = list(state.get("messages") or [])
        note = "[cost ceiling] Reached: " + trip.message.removeprefix("cost ceiling reached: ")
        return stop_turn(messages, note + ".", {"guard": "cost_ceiling", **payload})

    @hook_config(can_jump_to=["end"])
    async def aafter_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        return self.after_model(state, runtime)

    def _warn_unknown(self, unknown: list[str]) -> None:
        s = self.settings
        if s.max_turn_usd is None and s.max_session_usd is None:
            return
        new = [m for m in unknown if m not in self._warned_unknown]
        if new:
            self._warned_unknown.update(new)
            notice(f"cost ceiling: no price known for {', '.join(new)}; the USD limit does "
                   "not count its calls")
