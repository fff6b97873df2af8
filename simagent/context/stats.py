"""``ContextStats``: what ``/context`` and ``simagent context`` show, rebuilt from the trace.

The trace is the one record every layer writes to (``model_usage`` with the request split by
category, and one event per eviction, clear, summary, checkpoint and emergency), so the panel
is a pure function of its events: the TUI, the CLI and a resumed session all agree, and tests
need no agent. Thresholds come from :func:`thresholds_for`, the same functions the middleware
acts on, so what the panel promises is what happens.

A compaction makes no model call, so the last measured figure goes stale the moment one
happens. The rule (from the issue): right after a clear, summary, checkpoint or emergency
the stats show that event's ``tokens_after`` flagged as *estimated*, never the stale figure;
the next main-agent call replaces it with a measured one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from simagent.context import prices
from simagent.context.counting import CATEGORIES, RequestSize
from simagent.context.deferral_policy import ToolsView, tools_view_from_events
from simagent.context.settings import ContextSettings
from simagent.context.task_records import records_from_events
from simagent.context.thresholds import Thresholds, thresholds_for
from simagent.trace.log import TraceLog
from simagent.trace.usage import UsageTotals, token_count

#: Events that move the boundary of what the model sees, with their short names.
BOUNDARY_KINDS = {"context_clear": "clear", "context_summary": "summary",
                  "context_checkpoint": "checkpoint", "context_emergency": "emergency"}
#: Events counted on the panel, by the ContextStats field that tallies them.
TALLIED = {"context_eviction": "evictions", "context_clear": "clears",
           "context_summary": "summaries", "context_checkpoint": "checkpoints",
           "context_emergency": "emergencies", "watchdog_alert": "watchdog_alerts",
           "repl_watchdog": "repl_alerts", "context_state_card": "state_cards"}
_FIXED = ("system_prompt", "tool_schemas", "skills_index", "memory_index")
_LIMITS = ("max_turn_usd", "max_session_usd", "max_turn_tokens", "max_session_tokens")


@dataclass(frozen=True)
class Tally:
    count: int = 0
    last: str | None = None  # ISO time of the latest one


@dataclass(frozen=True)
class Boundary:
    """One compaction, as the history list shows it."""

    ts: str
    kind: str  # clear | summary | checkpoint | emergency
    tokens_before: int | None
    tokens_after: int | None
    detail: str  # reason/focus, note, error; and the path that holds what left the view
    agent: str
    ledger_items: int | None = None  # items its ledger entry lists (None: no entry)
    #: tokens the next request writes to the provider's prompt cache because of it
    #: (``simagent.context.prefix.rewrite_tokens``); None in traces from before
    cache_write: int | None = None


@dataclass(frozen=True)
class LedgerView:
    """The latest ledger entry, as its compaction's trace event describes it."""

    id: int | None
    after: str  # the compaction: clear | summary | checkpoint | emergency
    items: int
    found: int  # before the per-kind caps
    kinds: Mapping[str, int]
    preview: tuple[str, ...]
    path: str | None  # the ledger file


@dataclass(frozen=True)
class TaskRow:
    """One task record (``/done``, ``mark_task_done``) as the panel lists it; ``record`` is
    the :class:`~simagent.records.TaskRecord` as plain data; ``written`` False: filed by
    the model, its checkpoint not written yet."""

    ts: str
    source: str
    record: Mapping[str, Any]
    written: bool = True


@dataclass(frozen=True)
class TokenRow:
    """Usage of one agent or one model; ``usd`` is None when no price is known."""

    name: str
    calls: int
    input_tokens: int
    output_tokens: int
    cache_read: int = 0
    usd: float | None = None


@dataclass(frozen=True)
class Ceiling:
    """The latest ``cost_ceiling`` event."""

    ts: str
    action: str  # tripped | reset | refused
    scope: str | None
    limit: float | None
    spent: float | None
    unit: str | None


@dataclass(frozen=True)
class ContextStats:
    model_id: str | None
    window: int
    window_known: bool  # False: nobody reported a window; ``window`` is the fallback
    thresholds: Thresholds
    no_calls: bool  # the main agent has made no model call yet
    used: int  # tokens in the main agent's context now
    estimated: bool
    estimated_after: str | None  # the compaction that made ``used`` an estimate
    categories: RequestSize | None  # sums to ``used``; None when the trace has no split
    free_tokens: int
    percent: float  # of the window
    main_calls: int = 0
    last_input_tokens: int = 0
    last_output_tokens: int = 0
    last_cache_read: int = 0
    last_call_at: str | None = None
    evictions: Tally = field(default_factory=Tally)
    clears: Tally = field(default_factory=Tally)
    summaries: Tally = field(default_factory=Tally)
    checkpoints: Tally = field(default_factory=Tally)
    emergencies: Tally = field(default_factory=Tally)
    watchdog_alerts: Tally = field(default_factory=Tally)
    repl_alerts: Tally = field(default_factory=Tally)  # REPL watchdog (context.repl_watch)
    state_cards: Tally = field(default_factory=Tally)
    boundaries: tuple[Boundary, ...] = ()
    subagents: tuple[TokenRow, ...] = ()
    models: tuple[TokenRow, ...] = ()  # by cost, highest first
    total_input_tokens: int = 0
    total_output_tokens: int = 0
    cost_usd: float | None = None  # None when any model has no price
    priced_usd: float = 0.0  # what the priced models cost
    unpriced_models: tuple[str, ...] = ()
    ceiling: Ceiling | None = None
    limits: Mapping[str, float] = field(default_factory=dict)
    ruler: str | None = None  # the tokenizer the context layers counted with
    provider_ratio: float | None = None  # provider's input tokens / our count, last call
    ledger: LedgerView | None = None  # the latest dropped-items ledger entry
    ledger_entries: int = 0
    task_records: tuple[TaskRow, ...] = ()  # oldest first
    #: MCP tool schemas per server, loaded vs deferred (None: no MCP server)
    tools: ToolsView | None = None
    #: the main agent's latest clearing decision (``context_clear_cost``: freed, rewrite,
    #: rent, price, candidates, due), None before one
    clear_cost: Mapping[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (``simagent context --json``)."""
        data = asdict(self)
        data["limits"] = dict(self.limits)
        return data


def _payload(event: Any) -> dict[str, Any]:
    p = getattr(event, "payload", None)
    return p if isinstance(p, dict) else {}


def _is_main(p: Mapping[str, Any]) -> bool:
    return (p.get("agent") or "main") == "main"


def _opt_int(value: Any) -> int | None:
    try:
        return int(value) if value is not None and value != "" else None
    except (TypeError, ValueError):
        return None


def _opt_float(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _apportion(weights: Mapping[str, int], total: int) -> dict[str, int]:
    """Split ``total`` in proportion to ``weights`` (largest remainder: sums exactly)."""
    whole = sum(max(0, w) for w in weights.values())
    if total <= 0 or whole <= 0:
        return {k: 0 for k in weights}
    raw = {k: max(0, w) * total / whole for k, w in weights.items()}
    out = {k: int(v) for k, v in raw.items()}
    for k in sorted(raw, key=lambda k: raw[k] - out[k], reverse=True)[: total - sum(out.values())]:
        out[k] += 1
    return out


def scale_categories(request: RequestSize, total: int) -> RequestSize:
    """The counter's split of a request, scaled so its parts sum to the measured total."""
    return RequestSize(**_apportion(request.as_dict(), total))


def after_compaction(cats: RequestSize, kind: str, payload: Mapping[str, Any],
                     tokens_after: int) -> RequestSize:
    """Best guess of the split after a compaction: the fixed parts stay, history shrinks.

    A clear frees tool results first; a summary or checkpoint replaces older turns with a
    summary (``summary_tokens`` when the event says) and keeps the newest turns in their
    old proportions; an emergency truncation shrinks every part of the history alike.
    """
    fixed = {k: getattr(cats, k) for k in _FIXED}
    if cats.fixed > tokens_after:  # odd event: shrink everything to fit
        fixed = _apportion(fixed, tokens_after)
    rest = max(0, tokens_after - sum(fixed.values()))
    # a kernel state card made with the compaction replaces the previous one
    new_card = payload.get("state_card_tokens")
    card = min(rest, token_count(new_card) if new_card is not None else cats.state_card)
    rest -= card
    hist = {"conversation": cats.conversation, "tool_results": cats.tool_results,
            "summaries": cats.summaries, "images": cats.images}
    if kind == "context_clear":
        excess = sum(hist.values()) - rest
        for key in ("images", "tool_results", "conversation", "summaries"):
            take = min(max(0, excess), hist[key])
            hist[key] -= take
            excess -= take
        if excess < 0:  # the event says more is held than we knew of
            hist["conversation"] -= excess
    elif kind in ("context_summary", "context_checkpoint"):
        summary = min(rest, token_count(payload.get("summary_tokens")))
        kept = _apportion({"conversation": cats.conversation, "tool_results": cats.tool_results,
                           "images": cats.images}, rest - summary)
        if not any(kept.values()) and rest - summary > 0:
            kept["conversation"] = rest - summary
        hist = {**kept, "summaries": summary}
        if not summary and kind == "context_checkpoint":  # the task record replaces turns
            hist = {"conversation": 0, "tool_results": 0, "summaries": rest, "images": 0}
    else:
        hist = _apportion(hist, rest) if sum(hist.values()) else {**hist, "conversation": rest}
    return RequestSize(**fixed, **hist, state_card=card)


def _detail(kind: str, p: Mapping[str, Any]) -> str:
    def first_line(value: Any) -> str:
        return (str(value or "").strip().splitlines() or [""])[0]

    if kind == "context_clear":
        parts = [f"{token_count(p.get('cleared'))} results cleared",
                 f"{token_count(p.get('total_cleared'))} in all"]
    elif kind == "context_summary":
        parts = [first_line(p.get("reason")), first_line(p.get("focus")), first_line(p.get("path"))]
    elif kind == "context_checkpoint":
        parts = [first_line(p.get("note")), first_line(p.get("path"))]
    else:
        parts = [first_line(p.get("error")), first_line(p.get("path"))]
    return "; ".join(x for x in parts if x)


def _costs(totals: UsageTotals) -> tuple[dict[str, float | None], float | None, float,
                                         tuple[str, ...]]:
    """Per-model USD, total (None if any model is unpriced), priced part, unpriced models."""
    per_model = {m: prices.cost_usd(m, u) for m, u in totals.by_model.items()}
    usd, unknown = prices.totals_cost(totals)
    unknown = tuple(sorted(str(m) for m in unknown))
    return per_model, (None if unknown else float(usd)), float(usd or 0.0), unknown


def _agent_costs(usage_events: list[Any]) -> dict[str, float | None]:
    """USD per subagent (None once any of its calls used an unpriced model)."""
    out: dict[str, float | None] = {}
    for ev in usage_events:
        p = _payload(ev)
        agent = str(p.get("agent") or "main")
        usd = prices.cost_usd(str(p.get("model") or "?"), p)
        prev = out.get(agent, 0.0)
        out[agent] = None if usd is None or prev is None else prev + usd
    return out


@dataclass
class _Walk:
    """What one pass over a trace gathers for ``/context`` (fed event by event)."""

    tallies: dict[str, list[Any]] = field(
        default_factory=lambda: {name: [0, None] for name in TALLIED.values()})
    boundaries: list[Boundary] = field(default_factory=list)
    ceiling: Ceiling | None = None
    used: int = 0
    estimated: bool = False
    after: str | None = None  # the boundary since the last measured call, if any
    cats: RequestSize | None = None
    last: dict[str, Any] = field(default_factory=dict)
    last_ts: str | None = None
    main_calls: int = 0
    window: int | None = None
    model: Any = None  # the model the main agent's calls name
    session_model: Any = None  # the model the session was started or switched to
    ruler: str | None = None
    provider_ratio: float | None = None
    latest_ledger: LedgerView | None = None
    ledger_entries: int = 0
    clear_cost: dict[str, Any] | None = None

    def feed(self, ev: Any) -> None:
        p = _payload(ev)
        if ev.kind == "context_clear_cost" and _is_main(p):
            self.clear_cost = p
        if ev.kind in ("session_start", "session_resume", "model_switch"):
            key = "to_model" if ev.kind == "model_switch" else "model"
            self.session_model = p.get(key) or self.session_model
        elif ev.kind == "model_usage" and _is_main(p) and not p.get("dropped"):
            self._main_call(p, ev.ts)  # a dropped (abandoned) call says nothing of the view
        elif ev.kind == "cost_ceiling":
            self.ceiling = Ceiling(ev.ts, str(p.get("action") or "?"), p.get("scope"),
                                   _opt_float(p.get("limit")), _opt_float(p.get("spent")),
                                   p.get("unit"))
        if ev.kind in TALLIED:
            tally = self.tallies[TALLIED[ev.kind]]
            tally[0] += 1
            tally[1] = ev.ts
        if ev.kind in BOUNDARY_KINDS:
            self._boundary(ev, p)

    def _main_call(self, p: dict[str, Any], ts: str | None) -> None:
        self.main_calls += 1
        self.last, self.last_ts = p, ts
        self.used = token_count(p.get("input_tokens"))
        self.estimated, self.after = p.get("source") == "estimated", None
        request = RequestSize.from_dict(p.get("request")) if isinstance(
            p.get("request"), dict) else None
        self.cats = scale_categories(request, self.used) if request and request.total else None
        self.window = _opt_int(p.get("window")) or self.window
        self.model = p.get("model") or self.model
        self.ruler = p.get("ruler") or self.ruler
        self.provider_ratio = (round(self.used / request.total, 3) if request and request.total
                               and p.get("source") == "provider" else None)

    def _boundary(self, ev: Any, p: dict[str, Any]) -> None:
        before, tokens_after = _opt_int(p.get("tokens_before")), _opt_int(p.get("tokens_after"))
        items = _opt_int(p.get("ledger_items")) if p.get("ledger") is not None else None
        self.boundaries.append(Boundary(ev.ts, BOUNDARY_KINDS[ev.kind], before, tokens_after,
                                        _detail(ev.kind, p), str(p.get("agent") or "main"),
                                        items, _opt_int(p.get("cache_write_tokens"))))
        if items is not None:
            self.ledger_entries += 1
            self.latest_ledger = LedgerView(
                _opt_int(p.get("ledger")), BOUNDARY_KINDS[ev.kind], items,
                _opt_int(p.get("ledger_found")) or items, dict(p.get("ledger_kinds") or {}),
                tuple(str(x) for x in p.get("ledger_preview") or ()), p.get("ledger_path"))
        if _is_main(p):  # the last measured figure is stale now: estimate
            self.estimated, self.after = True, BOUNDARY_KINDS[ev.kind]
            if tokens_after is not None:
                if self.cats is not None:
                    self.cats = after_compaction(self.cats, ev.kind, p, tokens_after)
                self.used = tokens_after


def _token_rows(usage_events: list[Any]) -> tuple[UsageTotals, tuple[TokenRow, ...],
                                                  tuple[TokenRow, ...], tuple[Any, ...]]:
    """(totals, a row per model dearest first, a row per subagent, costs) of the calls."""
    totals = UsageTotals.from_trace(usage_events)
    per_model, cost, priced, unpriced = _costs(totals)
    rows = [TokenRow(m, u.calls, u.input_tokens, u.output_tokens, u.cache_read, per_model.get(m))
            for m, u in totals.by_model.items()]
    rows.sort(key=lambda r: (r.usd is None, -(r.usd or 0.0), -r.input_tokens, r.name))
    agent_usd = _agent_costs(usage_events)
    subagents = tuple(TokenRow(a, u.calls, u.input_tokens, u.output_tokens, u.cache_read,
                               agent_usd.get(a)) for a, u in sorted(totals.by_agent.items())
                      if a != "main")
    return totals, tuple(rows), subagents, (cost, priced, unpriced)


def stats_from_events(events: Iterable[Any], *, settings: ContextSettings,
                      model_id: str | None = None, window: int | None = None) -> ContextStats:
    """Everything ``/context`` shows, from trace events (``.id, .ts, .kind, .payload``)."""
    events = list(events)
    w = _Walk()
    for ev in events:
        w.feed(ev)
    model_id = model_id or (str(w.session_model) if w.session_model else None) or w.model
    model_window = window or w.window
    th = thresholds_for(model_window, model_id, settings)
    if w.cats is not None:  # the summary trigger as the middleware computed it
        th = th.for_prompt(w.cats.fixed)
    totals, rows, subagents, (cost, priced, unpriced) = _token_rows(
        [e for e in events if e.kind == "model_usage"])
    return ContextStats(
        model_id=model_id, window=th.window, window_known=bool(settings.window or model_window),
        thresholds=th, no_calls=w.main_calls == 0, used=w.used, estimated=w.estimated,
        estimated_after=w.after, categories=w.cats, free_tokens=th.window - w.used,
        percent=round(100.0 * w.used / th.window, 1) if th.window else 0.0,
        main_calls=w.main_calls, last_input_tokens=token_count(w.last.get("input_tokens")),
        last_output_tokens=token_count(w.last.get("output_tokens")),
        last_cache_read=token_count(w.last.get("cache_read")), last_call_at=w.last_ts,
        **{name: Tally(n, ts) for name, (n, ts) in w.tallies.items()},
        boundaries=tuple(w.boundaries), subagents=subagents, models=rows,
        total_input_tokens=totals.total.input_tokens,
        total_output_tokens=totals.total.output_tokens,
        cost_usd=cost, priced_usd=priced, unpriced_models=unpriced, ceiling=w.ceiling,
        limits={k: getattr(settings, k) for k in _LIMITS if getattr(settings, k) is not None},
        ruler=w.ruler, provider_ratio=w.provider_ratio, ledger=w.latest_ledger,
        ledger_entries=w.ledger_entries, task_records=_task_rows(events),
        tools=tools_view_from_events(events), clear_cost=w.clear_cost)


def _task_rows(events: list[Any]) -> tuple[TaskRow, ...]:
    return tuple(TaskRow(f.ts, f.record.source, f.record.model_dump(), f.written)
                 for f in records_from_events(events))


def stats_from_trace(trace_path: str | Path, settings: ContextSettings, *,
                     model_id: str | None = None, window: int | None = None) -> ContextStats:
    """:func:`stats_from_events` over a ``trace.sqlite`` opened read-only."""
    with TraceLog(trace_path, readonly=True) as log:
        events = log.events()
    return stats_from_events(events, settings=settings, model_id=model_id, window=window)


__all__ = ["BOUNDARY_KINDS", "CATEGORIES", "Boundary", "Ceiling", "ContextStats", "LedgerView",
           "Tally", "TaskRow",
           "TokenRow", "after_compaction", "scale_categories", "stats_from_events",
           "stats_from_trace"]
