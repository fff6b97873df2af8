"""Context policies the bench compares (design.md §9.3), each a small object.

Every policy runs the same real graph, tools and kernel results; only context handling
differs. A policy is context settings for simagent's own layers (all off for the
baselines) plus, optionally, middleware that rewrites the request the model gets. The
baselines' rewrites are pure functions of the message list, so tests check them on a
synthetic history without a graph. Adding a policy is a few lines in :data:`POLICIES`,
or, from outside, a plugin's ``register_bench_policies`` hook (:mod:`simagent.hookspecs`);
:func:`known_policies` is both, the built-ins registered through the same hook.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from langchain.agents.middleware import AgentMiddleware, ClearToolUsesEdit, ContextEditingMiddleware
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from simagent import plugins
from simagent.bench.oracle import oracle_middleware
from simagent.bench.oracle_cached import reprice
from simagent.context.boundaries import safe_cuts
from simagent.context.counting import count_messages
from simagent.context.settings import ContextConfigError, ContextSettings
from simagent.context.thresholds import REPL_WATCHDOG_BY_FRONT_END

#: Baseline numbers, from the peers' documented defaults (seeds 000-003, design §9.3).
STOCK_EVICT_TOKENS = 20_000
STOCK_CLEAR_FRACTION = 0.60
STOCK_CLEAR_KEEP = 6
STOCK_SUMMARY_FRACTION = 0.85
STOCK_SUMMARY_KEEP = 0.10
#: deepagents and langchain decide with chars/4 (eviction, ClearToolUsesEdit, summary);
#: the bench still measures what stock sends with the real ruler.
STOCK_TOKENIZER = "approx"
SLIDING_TURNS = 20
COMPRESS_MIN_CHARS = 500
TRUNCATE_PRESSURE = 0.75
TRUNCATE_KEEP = 10
#: Bench runs are headless (nobody reads a warning), so simagent's policy runs the REPL
#: watchdog as ``simagent run`` does; the baselines have none (``UNMANAGED``).
BENCH_REPL_WATCHDOG = REPL_WATCHDOG_BY_FRONT_END["headless"]

#: simagent's layers switched off: what a harness without context management sends.
UNMANAGED = ContextSettings(evict_tokens=None, clear_fraction=None, summarize=False,
                            checkpoints=False, budget_check=False, emergency=False,
                            tool_cap_chars=0, watchdog="off", repl_watchdog="off",
                            summary_model="extractive",
                            state_card_tokens=0, cache_pin=False, clear_inputs=False, ledger=False,
                            slim_tools=False, small_agent=False)

View = Callable[[list[BaseMessage], int], list[BaseMessage]]


@dataclass(frozen=True)
class Policy:
    name: str
    summary: str
    settings: ContextSettings
    #: Request rewrite applied before the model call: (messages, window) -> messages.
    view: View | None = None
    #: Extra stock middleware (built per run, for the window).
    extra: Callable[[int], list[Any]] | None = None
    #: Middleware that knows the run's workflow: (workflow, recall roots, the folder
    #: ``_out[n]`` reads) -> middleware (the oracle reads the script's future).
    scripted: Callable[[Any, Callable[[], list[Any]], Callable[[], Any]], list[Any]] | None \
        = None
    #: (record, finished run) -> the record: a bound priced from the run's own requests
    reprice: Callable[[dict[str, Any], Any], dict[str, Any]] | None = None

    @property
    def slug(self) -> str:
        """The name as a folder name (overrides bring ``[;=]``, which paths in requests,
        and so recall's path finder, must not hold)."""
        return re.sub(r"[^A-Za-z0-9._-]+", "_", self.name).strip("_")

    def context_settings(self, window: int) -> ContextSettings:
        return replace(self.settings, window=window)

    def middleware(self, window: int, workflow: Any = None,
                   roots: Callable[[], list[Any]] = list,
                   outputs: Callable[[], Any] = lambda: None) -> list[Any]:
        out = list(self.extra(window)) if self.extra else []
        if self.scripted is not None:
            if workflow is None:
                raise ValueError(f"policy {self.name} replays a workflow's script; it has "
                                 "no live mode")
            out += self.scripted(workflow, roots, outputs)
        if self.view is not None:
            out.append(ViewMiddleware(self.name, self.view, window))
        return out


class ViewMiddleware(AgentMiddleware):
    """Applies a policy's pure request rewrite; state is never touched."""

    def __init__(self, policy: str, view: View, window: int) -> None:
        super().__init__()
        self.policy, self.view, self.window = policy, view, window

    @property
    def name(self) -> str:
        return f"PolicyView[{self.policy}]"

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return handler(request.override(messages=self.view(list(request.messages),
                                                           self.window)))

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return await handler(request.override(messages=self.view(list(request.messages),
                                                                  self.window)))


# ---------------------------------------------------------------- pure views
def _first_task(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    first = next((m for m in messages if isinstance(m, HumanMessage)), None)
    return [first] if first is not None else []


def _safe_tail_start(messages: Sequence[BaseMessage], start: int) -> int:
    """The first safe cut at or after ``start`` (never splits a call from its result)."""
    return next((c for c in safe_cuts(messages) if c >= start), len(messages))


def sliding_window(messages: list[BaseMessage], window: int,
                   rounds: int = SLIDING_TURNS) -> list[BaseMessage]:
    """The task plus the last ``rounds`` model rounds (an AI reply and its results)."""
    starts = [i for i, m in enumerate(messages) if isinstance(m, AIMessage)]
    if len(starts) <= rounds:
        return messages
    cut = _safe_tail_start(messages, starts[-rounds])
    head = _first_task(messages[:cut])
    return head + messages[cut:]


def compress_tool_results(messages: list[BaseMessage], window: int,
                          min_chars: int = COMPRESS_MIN_CHARS) -> list[BaseMessage]:
    """Tool results the model has already answered (consumed) over ``min_chars`` -> marker."""
    last_ai = max((i for i, m in enumerate(messages) if isinstance(m, AIMessage)), default=-1)
    out = []
    for i, m in enumerate(messages):
        if isinstance(m, ToolMessage) and i < last_ai and len(m.text) > min_chars:
            m = m.model_copy(update={"content": f"[tool result compressed: {len(m.text):,} "
                                                f"chars, already used]"})
        out.append(m)
    return out


def truncate(messages: list[BaseMessage], window: int, pressure: float = TRUNCATE_PRESSURE,
             keep: int = TRUNCATE_KEEP) -> list[BaseMessage]:
    """Over ``pressure`` of the window: the task, a recap line, and the last ``keep`` messages."""
    if count_messages(messages) <= pressure * window or len(messages) <= keep + 1:
        return messages
    cut = _safe_tail_start(messages, len(messages) - keep)
    dropped = messages[:cut]
    calls = [c.get("name", "?") for m in dropped if isinstance(m, AIMessage)
             for c in m.tool_calls]
    recap = HumanMessage(f"[recap: {len(dropped)} earlier messages were truncated; they held "
                         f"{len(calls)} tool calls ({', '.join(sorted(set(calls))) or 'none'})]")
    return [*_first_task(dropped), recap, *messages[cut:]]


def _stock_clearing(window: int) -> list[Any]:
    """langchain's own ClearToolUsesEdit, as deepagents/jutul-agent configure it."""
    return [ContextEditingMiddleware(edits=[ClearToolUsesEdit(
        trigger=int(STOCK_CLEAR_FRACTION * window), keep=STOCK_CLEAR_KEEP)])]


def _oracle(workflow: Any, roots: Callable[[], list[Any]],
            outputs: Callable[[], Any]) -> list[Any]:
    return [oracle_middleware(workflow, roots, outputs)[0]]


def _reprice(row: dict[str, Any], run: Any) -> dict[str, Any]:
    return reprice(row, run)


#: simagent's prompt, tools, caps and eviction; its own clearing, summaries, checkpoints,
#: state card, cache pin and emergency off (checkpoints stay on: they add the
#: ``mark_task_done`` tool, and no script calls it): the oracle decides what is in view.
ORACLE_SETTINGS = replace(ContextSettings(repl_watchdog=BENCH_REPL_WATCHDOG),
                          clear_fraction=None, summarize=False, emergency=False,
                          budget_check=False, state_card_tokens=0, cache_pin=False)

POLICIES: dict[str, Policy] = {p.name: p for p in (
    Policy("raw", "no context management (the kernel's own 256 KB output cap only)",
           UNMANAGED),
    Policy("simagent", "simagent's layers (design §7), default settings as run headless",
           ContextSettings(repl_watchdog=BENCH_REPL_WATCHDOG)),
    Policy("stock", "deepagents eviction 20k + langchain ClearToolUsesEdit at 60 % keep 6 + "
                    "summary at 85 % keep 10 %",
           replace(UNMANAGED, evict_tokens=STOCK_EVICT_TOKENS, summarize=True,
                   summary_fraction=STOCK_SUMMARY_FRACTION,
                   summary_keep_fraction=STOCK_SUMMARY_KEEP, tokenizer=STOCK_TOKENIZER),
           extra=_stock_clearing),
    Policy("sliding-window", f"the task plus the last {SLIDING_TURNS} model rounds",
           UNMANAGED, view=sliding_window),
    Policy("compress-tool-results",
           f"consumed tool results over {COMPRESS_MIN_CHARS} chars become a marker",
           UNMANAGED, view=compress_tool_results),
    Policy("truncate", f"over {TRUNCATE_PRESSURE:.0%} of the window keep the last "
                       f"{TRUNCATE_KEEP} messages plus a recap", UNMANAGED, view=truncate),
    Policy("oracle", "knows the script's future: keeps in view exactly what later steps and "
                     "probes use, everything else a pointer at once (the lower bound on "
                     "tokens; bench/oracle.py)", ORACLE_SETTINGS, scripted=_oracle),
    Policy("oracle-cached", "the oracle's clearing, rescheduled into the epochs that cost "
                            "least under each provider family's cache (the bound on "
                            "dollars; bench/oracle_cached.py)", ORACLE_SETTINGS,
           scripted=_oracle, reprice=_reprice),
)}


def with_settings(policy: Policy, overrides: str) -> Policy:
    """``policy`` with ``[context]`` settings changed, e.g. ``clear_fraction=0.3;
    tool_cap_chars=4000`` (TOML values, ``;``-separated): how thresholds are tuned from
    the bench, side by side with the defaults in one run."""
    try:
        data = tomllib.loads("\n".join(p.strip() for p in overrides.split(";") if p.strip()))
        checked = ContextSettings.from_mapping(data)
    except (tomllib.TOMLDecodeError, ContextConfigError) as exc:
        raise ValueError(f"policy {policy.name}[{overrides}]: {exc}") from exc
    changed = {k: getattr(checked, k) for k in data}
    return replace(policy, name=f"{policy.name}[{overrides}]",
                   summary=f"{policy.summary}; with {overrides}",
                   settings=replace(policy.settings, **changed))


def _split_specs(spec: str) -> list[str]:
    """Comma-separated names; commas inside ``[...]`` belong to the overrides."""
    out, depth, cur = [], 0, ""
    for ch in spec:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [s.strip() for s in [*out, cur] if s.strip()]


def known_policies() -> dict[str, Policy]:
    """Every policy by name, from the plugins' ``register_bench_policies`` hooks: the
    built-ins (:data:`POLICIES`) first, a plugin's replacing one of the same name."""
    found: dict[str, Policy] = {}
    for entry in plugins.collect("register_bench_policies"):
        if isinstance(entry.item, Policy):
            found[entry.item.name] = entry.item
        else:
            plugins.refuse(entry, "register_bench_policies", "a simagent.bench.policies.Policy")
    return found


def resolve_policies(spec: str | None) -> list[Policy]:
    """``all`` / None -> every policy; else a comma list of names, each optionally with
    setting overrides: ``simagent[clear_fraction=0.3]``."""
    known = known_policies()
    if not spec or spec == "all":
        return list(known.values())
    out = []
    for item in _split_specs(spec):
        name, _, rest = item.partition("[")
        name = name.strip()
        if name not in known:
            raise ValueError(f"unknown policy {name!r} (known: {', '.join(known)})")
        if rest and not rest.endswith("]"):
            raise ValueError(f"policy {item!r}: overrides go in brackets, e.g. "
                             f"{name}[clear_fraction=0.3]")
        out.append(with_settings(known[name], rest[:-1]) if rest else known[name])
    return out
