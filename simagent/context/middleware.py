"""``ContextMiddleware``: the history layers around each model call (design.md §7).

It sits inside the skills and memory middleware, so the request it measures is the one
the model gets (system prompt with both indexes, tool schemas, messages). Per call, in
order, cheapest first:

1. a task checkpoint left pending by ``mark_task_done`` is written at the new turn,
   with the typed record the model filed (``task_records.close_task``);
2. the latest boundary (summary / checkpoint / emergency) rebuilds the view from the raw
   messages; cleared results are swapped for placeholders (``state.model_view``);
3. a clearing epoch runs when the window forces it (over the clearing trigger, freeing
   enough) or when the prompt cache's prices pay for it (``clearing.decide_epoch``);
4. summarization runs if the request is still over the tier's trigger, or over the
   history budget (``window - system - summary - tool_defs - max_output``);
5. after any of these that took kernel output from view, a kernel state card read from
   the live kernel follows the newest message (``state_card.py``, ``card_updates.py``);
6. the call; on a context-overflow error, one emergency truncation (with a card) and one
   retry; the provider's count of the request calibrates the next one
   (``counting.Calibration``).

Why one middleware and not one per layer (deepagents splits summarization from
eviction; langchain keeps context editing apart from both): the layers are steps of one
pass over one request. Each decides on the view and the calibrated size the steps before
it left (clearing on the rebuilt view, summarization on what clearing left); the card
goes in once, after whichever steps took kernel output, with one reason (a summary's
over a checkpoint's over a clear's); what the call's changes cost the prompt cache is
priced once, against the previous request's view; the emergency retry rebuilds from this
call's layers (its boundary, clears and card). Only ``wrap_model_call`` sees the exact
request (``before_model`` gets the state, not the system prompt with its indexes or the
tool schemas), so each layer split off would be a ``wrap_model_call`` of its own that
measures and renders the view again, and the card's reason, the cache price and the
retry would need this call's state handed between middlewares. So the steps stay
methods on one per-call :class:`_Pass`; their rules live in their own modules
(``clearing``, ``compaction``, ``task_records``, ``state_card``, ``card_updates``,
``thresholds``). Capping each tool result acts on tool calls only and shares nothing
with them, so it is its own middleware (``capping.ToolCapMiddleware``); the state every
layer keeps has one home, ``state.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from langchain.agents.middleware.types import AgentMiddleware, ExtendedModelResponse
from langchain_core.messages import BaseMessage, ToolMessage
from langgraph.types import Command

from simagent.context import card_updates as cards
from simagent.context import thresholds as th
from simagent.context.boundaries import turn_starts
from simagent.context.clearing import WORDS, clearable_inputs, decide_epoch
from simagent.context.compaction import Compaction, Compactor
from simagent.context.counting import Calibration, RequestSize, measure
from simagent.context.epoch_cost import EpochCost, input_prices
from simagent.context.ledger import calls_by_id, trace_fields
from simagent.context.overflow import is_context_overflow
from simagent.context.prefix import pin_index, rewrite_tokens, with_cache_pin
from simagent.context.prices import cache_rules
from simagent.context.reporting import emit
from simagent.context.settings import ContextSettings
from simagent.context.state import (
    BOUNDARY_KEY,
    CLEARED_INPUTS_KEY,
    CLEARED_KEY,
    PENDING_CHECKPOINT_KEY,
    STATE_CARD_KEY,
    ContextState,
    model_view,
)
from simagent.context.state_card import card_event, render_card
from simagent.context.task_records import FROM_TOOL, close_task, pending_record
from simagent.context.tokens import resolve_ruler, using
from simagent.trace.log import TraceLog


@dataclass
class Prepared:
    view: list[BaseMessage]
    size: RequestSize
    tokens: int  # calibrated total of the view
    update: dict[str, Any] = field(default_factory=dict)
    boundary: dict[str, Any] | None = None
    cleared: frozenset[str] = frozenset()
    card: dict[str, Any] | None = None
    inputs: frozenset[str] = frozenset()  # calls whose code is cleared
    pin: int | None = None  # the view message carrying a pinned cache breakpoint


@dataclass
class _Pass:
    """One call's layers while ``prepare`` runs them, and what they have changed."""

    request: Any
    state: dict[str, Any]
    messages: list[BaseMessage]
    boundary: dict[str, Any] | None
    cleared: frozenset[str]
    inputs: frozenset[str]
    card: dict[str, Any] | None
    update: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    card_reason: str | None = None
    view: list[BaseMessage] = field(default_factory=list)
    size: RequestSize = field(default_factory=RequestSize)
    tokens: int = 0

    @classmethod
    def of(cls, request: Any) -> _Pass:
        state = request.state or {}
        return cls(request, state, list(request.messages), state.get(BOUNDARY_KEY),
                   frozenset(state.get(CLEARED_KEY) or ()),
                   frozenset(state.get(CLEARED_INPUTS_KEY) or ()), state.get(STATE_CARD_KEY))


class ContextMiddleware(AgentMiddleware):
    """Checkpoints, clearing epochs, summarization, budget check, state card, emergency."""

    state_schema = ContextState

    def __init__(self, *, trace: TraceLog, compactor: Compactor, settings: ContextSettings,
                 model_id: str, window: int | None, max_output: int | None,
                 agent: str = "main", tools: list[Any] | None = None,
                 state_source: Callable[[], dict[str, Any]] | None = None,
                 task_records: Any = None) -> None:
        super().__init__()
        self.trace = trace
        self.compactor = compactor
        self.settings = settings
        self.model_id = model_id
        self.agent = agent
        self.thresholds = th.thresholds_for(window, model_id, settings, max_output)
        #: the ruler every decision here is measured with (the model family's tokenizer)
        self.ruler = resolve_ruler(model_id, settings.tokenizer)
        self.tools = list(tools or [])
        #: the runtime snapshot a state card is made from (``Session.state_snapshot``)
        self.state_source = state_source
        #: whose prompt cache a compaction's rewrite is counted for (None: automatic)
        rules = cache_rules(model_id)
        self.cache_family = rules.family if rules else None
        #: the session's ``tasks.jsonl`` (None: task records live in state and trace only)
        self.task_records = task_records
        #: our count of the previous request and the provider's figure for it
        self.calibration = Calibration.resumed(trace, agent, model_id, self.ruler.name)

    @property
    def name(self) -> str:
        return f"ContextMiddleware[{self.agent}]"

    # ------------------------------------------------------------------ helpers
    def _emit(self, kind: str, payload: dict[str, Any]) -> None:
        emit(self.trace, kind, {**payload, "agent": self.agent})

    def _measure(self, request: Any, view: list[BaseMessage]) -> tuple[RequestSize, int]:
        size = measure(request.system_message, view, request.tools, self.ruler)
        return size, self.calibration.scale(size.total)

    def over_budget(self, size: RequestSize, tokens: int) -> bool:
        if not self.settings.budget_check:
            return False
        scale = tokens / size.total if size.total else 1.0
        budget = th.history_budget(
            self.thresholds.window, system=int((size.fixed - size.tool_schemas) * scale),
            summary=int(size.summaries * scale), tool_defs=int(size.tool_schemas * scale),
            max_output_tokens=self.thresholds.max_output)
        return (size.history - size.summaries) * scale > budget

    # ------------------------------------------------------------------ layers
    def view(self, messages: list[BaseMessage], boundary: dict[str, Any] | None,
             cleared: Any, card: dict[str, Any] | None, inputs: Any = ()) -> list[BaseMessage]:
        return model_view(messages, boundary, cleared, card, inputs)

    def prepare(self, request: Any) -> Prepared:
        """The view for this call: each layer in turn on one :class:`_Pass`, then what
        changed is traced with what it costs the provider's cache."""
        p = _Pass.of(request)
        before_layers = (p.boundary, p.cleared, p.card, p.inputs)  # the previous request's
        self.close_pending_task(p)
        self.remeasure(p)
        self.clear(p)
        self.summarize(p)
        self.add_card(p)
        if p.events:  # what the change costs the provider's prompt cache
            unchanged = self.view(p.messages, *before_layers)
            p.events[-1][1]["cache_write_tokens"] = rewrite_tokens(
                unchanged, p.view, self.ruler, self.cache_family)
        for kind, payload in p.events:
            self._emit(kind, payload)
        if p.card_reason is not None and p.update.get(STATE_CARD_KEY):
            self._emit("context_state_card", card_event(p.card, self.agent))
        pin = pin_index(p.view, before_layers[1]) if self.pins_cache else None
        return Prepared(p.view, p.size, p.tokens, p.update, p.boundary, p.cleared, p.card,
                        p.inputs, pin)

    def remeasure(self, p: _Pass) -> None:
        """Rebuild the view from the layers as they stand now and measure it."""
        p.view = self.view(p.messages, p.boundary, p.cleared, p.card, p.inputs)
        p.size, p.tokens = self._measure(p.request, p.view)

    def close_pending_task(self, p: _Pass) -> None:
        """Write the checkpoint ``mark_task_done`` left pending, at the new turn."""
        pending = p.state.get(PENDING_CHECKPOINT_KEY)
        if not (pending and self.settings.checkpoints):
            return
        starts = [i for i in turn_starts(p.messages) if i >= int(pending.get("at", 0))]
        if not starts:
            return
        self.remeasure(p)
        before = p.tokens
        done = close_task(self.compactor, p.messages, p.boundary, starts[0], source=FROM_TOOL,
                          filed=pending_record(pending), store=self.task_records)
        p.update[PENDING_CHECKPOINT_KEY] = None
        if done is None:
            return
        p.boundary = p.update[BOUNDARY_KEY] = done.boundary
        self.remeasure(p)
        p.events.append(("context_checkpoint", self.compaction_payload(
            done, before, p.tokens, note=None, source="tool", record=done.boundary["record"])))
        p.card_reason = "checkpoint"

    def clear_decision(self, p: _Pass) -> tuple[frozenset[str] | None, str | None, EpochCost]:
        """This call's clearing decision on the current view, priced at ``cost_model``'s
        cache prices, else the model's (traced as ``context_clear_cost``)."""
        thr, prices = self.thresholds, input_prices(self.settings.cost_model or self.model_id)
        return decide_epoch(p.view, p.cleared, total_tokens=p.tokens,
                            trigger=thr.clear_trigger, keep=thr.clear_keep,
                            min_freed=thr.clear_min_freed, keep_tokens=thr.clear_keep_tokens,
                            clear_inputs=self.settings.clear_inputs, prices=prices,
                            words=self.settings.clear_words, pinned=self.settings.cache_pin,
                            expect=self.settings.clear_by_expected,
                            card_tokens=thr.state_card if self.state_source else 0)

    def clear(self, p: _Pass) -> None:
        """A clearing epoch, when the window forces one or the cache prices pay for it."""
        if self.thresholds.clear_trigger is None:
            return
        new_cleared, reason, cost = self.clear_decision(p)
        if reason == "cost" and not self.settings.clear_by_cost:
            new_cleared = reason = None
        if cost.candidates:  # the figures /context shows (a record, not a notice)
            self.trace.append("context_clear_cost", {**cost.as_dict(), "due": reason,
                                                     "agent": self.agent})
        if new_cleared is None:
            return
        newly = new_cleared - p.cleared
        p.cleared = new_cleared
        p.update[CLEARED_KEY] = sorted(p.cleared)
        if self.settings.clear_inputs:  # decided with the results: one prefix change
            p.inputs = p.inputs | clearable_inputs(p.messages, p.cleared,
                                                   self.settings.clear_words)
            p.update[CLEARED_INPUTS_KEY] = sorted(p.inputs)
        before = p.tokens
        self.remeasure(p)
        p.events.append(("context_clear", {
            "cleared": len(newly), "total_cleared": len(p.cleared),
            "inputs_cleared": sum(not i.startswith(WORDS) for i in p.inputs),
            "words_cut": sum(i.startswith(WORDS) for i in p.inputs), "tokens_before": before,
            "tokens_after": p.tokens, "reason": reason, "rent": round(cost.rent),
            "price": round(cost.price), **self.clear_ledger(p.messages, newly)}))
        if p.card_reason is None and _has_kernel_results(p.messages, newly):
            p.card_reason = "clear"

    def summarize(self, p: _Pass) -> None:
        """A summary over the tier's trigger (once the conversation has grown enough
        since the last one), or over the history budget."""
        thr = self.thresholds.for_prompt(p.size.fixed)  # a share of the room
        due = thr.summary_trigger is not None and p.tokens >= thr.summary_trigger and \
            th.summary_grown(p.tokens, p.boundary, thr)
        if not (due or self.over_budget(p.size, p.tokens)):
            return
        done = self.compactor.summarize(p.messages, p.boundary, thr.summary_keep)
        if done is None:
            return
        p.boundary = p.update[BOUNDARY_KEY] = done.boundary
        before = p.tokens
        self.remeasure(p)
        p.events.append(("context_summary", self.compaction_payload(
            done, before, p.tokens, reason="threshold" if due else "budget", focus=None,
            summarizer=self.compactor.summarizer.name)))
        p.card_reason = "summary"

    def add_card(self, p: _Pass) -> None:
        """A kernel state card after a layer took kernel output from view."""
        if p.card_reason is not None:
            new_card = self.make_card(p.messages, p.card, p.card_reason, p.cleared)
            if new_card is not None:
                p.card = p.update[STATE_CARD_KEY] = new_card
                self.remeasure(p)
                p.events[-1][1].update(tokens_after=p.tokens,
                                       state_card_tokens=new_card["tokens"])
        if p.card_reason == "summary":  # where the next one may start from, card included
            p.boundary["tokens_after"] = p.tokens

    @property
    def pins_cache(self) -> bool:
        """Whether requests carry a pinned breakpoint: only for a provider that caches at
        explicit breakpoints (Anthropic), and when ``cache_pin`` is on."""
        return self.cache_family == "anthropic" and self.settings.cache_pin

    def make_card(self, messages: list[BaseMessage], previous: dict[str, Any] | None,
                  reason: str, cleared: frozenset[str] = frozenset()) -> dict[str, Any] | None:
        """A kernel state card, or an update to ``previous`` (``context.card_updates``),
        or None when off or unreadable."""
        if not self.thresholds.state_card or self.state_source is None or not messages:
            return None
        try:
            snapshot = self.state_source()
        except Exception as exc:  # a card that cannot be made costs the card, not the call
            self.trace.append("error", {"message": f"{type(exc).__name__}: {exc}"[:500],
                                        "where": f"state card ({self.agent})"})
            return None
        card = render_card(snapshot, reason=reason, budget=self.thresholds.state_card,
                           previous=previous, ruler=self.ruler)
        anchor = (cards.anchor_after_cleared(messages, cleared) if reason == "clear"
                  else None) or cards.anchor_newest(messages)
        return cards.next_card(card, previous, reason=reason, anchor=anchor,
                               updates=self.settings.state_card_updates, ruler=self.ruler)

    def compaction_payload(self, done: Compaction, before: int, after: int,
                           **extra: Any) -> dict[str, Any]:
        return {"cutoff_index": done.boundary["cutoff"], "messages": done.dropped,
                "path": str(done.path), "tokens_before": before, "tokens_after": after,
                **extra, **trace_fields(done.ledger)}

    def clear_ledger(self, messages: list[BaseMessage], newly: Any) -> dict[str, Any]:
        """The ledger entry of a clearing epoch (the results stay in state and on disk:
        its pointers are raw outputs, evicted files and the files read), as trace fields."""
        ledger = self.compactor.ledger
        if ledger is None or not newly:
            return {}

        results = [m for m in messages if isinstance(m, ToolMessage) and m.tool_call_id in newly]
        return trace_fields(ledger.record("clear", results, calls=calls_by_id(messages)))

    def record(self, kind: str, done: Compaction, before: int, after: int, **extra: Any) -> None:
        """Trace and stream one compaction (the manual ones in ``manual.py``)."""
        self._emit(kind, self.compaction_payload(done, before, after, **extra))

    def emergency(self, request: Any, prep: Prepared, error: Exception) -> Prepared:
        """Truncate to a safe boundary keeping half; raise ``error`` if nothing can go."""
        messages = list(request.messages)
        done = self.compactor.emergency(messages, prep.boundary, th.EMERGENCY_MIN_MESSAGES)
        if done is None:
            raise error
        card = self.make_card(messages, prep.card, "emergency") or prep.card
        update = {**prep.update, BOUNDARY_KEY: done.boundary}
        if card is not prep.card:
            update[STATE_CARD_KEY] = card
        view = self.view(messages, done.boundary, prep.cleared, card, prep.inputs)
        size, tokens = self._measure(request, view)
        self._emit("context_emergency", {
            "error": str(error).splitlines()[0][:300] if str(error) else type(error).__name__,
            "kept": done.kept, "dropped": done.dropped, "path": str(done.path),
            "tokens_before": prep.tokens, "tokens_after": tokens, **trace_fields(done.ledger),
            "cache_write_tokens": rewrite_tokens(prep.view, view, self.ruler, self.cache_family),
            **({"state_card_tokens": card["tokens"]} if card is not prep.card else {})})
        if card is not prep.card:
            self._emit("context_state_card", card_event(card, self.agent))
        return Prepared(view, size, tokens, update, done.boundary, prep.cleared, card,
                        prep.inputs)

    # --------------------------------------------------------------- model call
    def _finish(self, prep: Prepared, response: Any) -> Any:
        self.calibration.learn(prep.size.total, response)
        if not prep.update:
            return response
        if isinstance(response, ExtendedModelResponse):
            inner = response.command.update if response.command else None
            merged = {**(inner if isinstance(inner, dict) else {}), **prep.update}
            return ExtendedModelResponse(model_response=response.model_response,
                                         command=Command(update=merged))
        return ExtendedModelResponse(model_response=response, command=Command(update=prep.update))

    def safe_prepare(self, request: Any) -> Prepared:
        """``prepare``, or on any failure the last good view: a broken layer (a full disk,
        a summarizer bug) must cost a compaction, never the turn."""
        try:
            with using(self.ruler):  # clearing and compaction count with the model's ruler
                return self.prepare(request)
        except Exception as exc:
            self.trace.append("error", {"message": f"{type(exc).__name__}: {exc}"[:500],
                                        "where": f"context layer ({self.agent})"})
            state = request.state or {}
            cleared = frozenset(state.get(CLEARED_KEY) or ())
            inputs = frozenset(state.get(CLEARED_INPUTS_KEY) or ())
            boundary = state.get(BOUNDARY_KEY)
            card = state.get(STATE_CARD_KEY)
            view = self.view(list(request.messages), boundary, cleared, card, inputs)
            size, tokens = self._measure(request, view)
            return Prepared(view, size, tokens, {}, boundary, cleared, card, inputs)

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        prep = self.safe_prepare(request)
        try:
            response = handler(request.override(messages=with_cache_pin(prep.view, prep.pin)))
        except Exception as exc:
            if not (self.settings.emergency and is_context_overflow(exc)):
                raise
            with using(self.ruler):
                prep = self.emergency(request, prep, exc)
            response = handler(request.override(messages=prep.view))
        return self._finish(prep, response)

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        prep = self.safe_prepare(request)
        try:
            response = await handler(request.override(
                messages=with_cache_pin(prep.view, prep.pin)))
        except Exception as exc:
            if not (self.settings.emergency and is_context_overflow(exc)):
                raise
            with using(self.ruler):
                prep = self.emergency(request, prep, exc)
            response = await handler(request.override(messages=prep.view))
        return self._finish(prep, response)


def _has_kernel_results(messages: list[BaseMessage], ids: Any) -> bool:
    """Whether any of the results ``ids`` came from the kernel (they carry a raw output)."""
    return any(isinstance(m, ToolMessage) and m.tool_call_id in ids
               and isinstance(m.artifact, dict) and m.artifact.get("raw_path")
               for m in messages)

