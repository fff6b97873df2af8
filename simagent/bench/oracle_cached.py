"""``oracle-cached``: the cheapest clearing schedule under a provider's cache (issue 31 §1).

The token oracle (``bench/oracle.py``) clears each item the moment nothing later needs
it, which rewrites the cached prefix on almost every request: few tokens, many cache
writes. Here the same run's decisions are rescheduled for dollars. An *epoch* at request
``e`` applies everything the oracle had cleared by ``e``; between epochs the view stays
fixed, so each request reads the previous one from the cache and writes only what is
new. Which requests are epochs is chosen by dynamic programming over the requests where
the oracle cleared something new, per family, with this cost model:

* inside a segment, request ``r`` reads the whole previous request (its last-message
  breakpoint) and writes the rest (Anthropic), or reads it floored to the family's
  increment and pays the rest uncached (OpenAI);
* at an epoch (or where the final request restores a probe's source) the read stops at
  the first message that changed; the oracle knows the next epoch, so it pins a
  breakpoint just before that message one request ahead (Anthropic allows one more
  breakpoint beside tools, system and last), which makes the read real.

A state is (epoch, previous epoch), so the DP is exact for this model (cubic in the
number of candidate epochs). The chosen schedule is then built as real requests and
priced by the bench's cache simulator (``bench/caching.py``), whose figure is what the
record shows; subagent requests (which the oracle leaves alone) are priced as sent.
Limits: the cache never expires or evicts (the simulator's assumptions), and the
model's read is optimistic where a breakpoint's lookback would miss (the simulated
price is then the higher, true one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from simagent.bench.caching import OPENAI_REFERENCE_MODEL, priced, request_of, simulate, totals
from simagent.bench.oracle import Decision, OracleMiddleware, oracle_view, words_of
from simagent.context.counting import count_message
from simagent.context.prefix import message_key
from simagent.context.prices import cache_rules, cache_write_per_mtok, price_for
from simagent.context.tokens import DEFAULT_ENCODING, Ruler

Item = tuple[str, str]  # ("result" | "input" | "text" | "drop" | "signed", tool_call_id)


@dataclass
class Timeline:
    """The main agent's requests as one growing message list plus what each can clear."""

    messages: list[BaseMessage]  # the last request's raw messages (earlier ones: prefixes)
    lengths: list[int]  # messages in each request
    heads: list[list[BaseMessage]]  # what precedes them in the request (the system prompt)
    schemas: list[int]  # tool-schema plus head tokens of each request
    cleared: list[frozenset[Item]]  # what the oracle cleared in each request
    full: list[int]  # tokens of each message as stored
    saving: dict[Item, tuple[int, int]]  # item -> (message position, tokens it frees)
    probes: Sequence[str] = ()  # their holders keep a pointer (``oracle_view``)
    #: memo of :meth:`view` and of built requests: the schedules ``improve`` prices share
    #: most of their requests, and rebuilding them was most of a long run's repricing
    memo: dict[Any, Any] = field(default_factory=dict)

    def view(self, r: int, s: frozenset[Item]) -> list[BaseMessage]:
        """Request ``r``'s messages with ``s`` cleared (shared: callers copy, never edit)."""
        got = self.memo.get(("view", r, s))
        if got is None:
            got = self.memo[("view", r, s)] = _view(self.messages[: self.lengths[r]], s,
                                                     self.probes)
        return got

    def tokens(self, r: int, s: frozenset[Item]) -> int:
        return (self.schemas[r] + sum(self.full[: self.lengths[r]])
                - sum(v for i, (p, v) in self.saving.items() if i in s and p < self.lengths[r]))

    def prefix(self, p: int, s: frozenset[Item], r: int) -> int:
        """Tokens of request ``r``'s schemas and messages before position ``p``."""
        return (self.schemas[r] + sum(self.full[:p])
                - sum(v for i, (q, v) in self.saving.items() if i in s and q < p))

    def first_change(self, a: frozenset[Item], b: frozenset[Item]) -> int | None:
        diff = a ^ b
        return min((self.saving[i][0] for i in diff if i in self.saving), default=None)


def _items(d: Decision) -> frozenset[Item]:
    return frozenset({("result", c) for c in d.results} | {("input", c) for c in d.inputs}
                     | {("text", c) for c in d.texts} | {("drop", c) for c in d.dropped}
                     | {("signed", c) for c in d.signed})


def _view(messages: Sequence[BaseMessage], s: frozenset[Item],
          probes: Sequence[str]) -> list[BaseMessage]:
    return oracle_view(messages, {c for k, c in s if k == "result"},
                       {c for k, c in s if k == "input"}, {c for k, c in s if k == "text"},
                       probes, {c for k, c in s if k == "drop"},
                       {c for k, c in s if k == "signed"})


def timeline(decisions: Sequence[Decision], requests: Sequence[Sequence[BaseMessage]],
             request_tokens: Sequence[int], ruler: Any,
             probes: Sequence[str] = ()) -> Timeline:
    """From the oracle's decisions and the main agent's requests as the model got them
    (``ruler``: the one the model counted them with)."""
    last = decisions[-1].messages
    lengths = [len(d.messages) for d in decisions]
    heads = [list(req[: len(req) - len(d.messages)]) for req, d in zip(requests, decisions,
                                                                      strict=True)]
    schemas = [total - sum(count_message(m, ruler) for m in req[len(h):])
               for req, total, h in zip(requests, request_tokens, heads, strict=True)]
    full = [count_message(m, ruler) for m in last]
    every = frozenset().union(*(_items(d) for d in decisions))
    saving: dict[Item, tuple[int, int]] = {}
    for item in every:
        pos = next((p for p, m in enumerate(last) if _carries(m, item)), None)
        if pos is None:
            continue
        if item[0] == "drop":  # the call and its result; the words go as a "text" item
            pair = _pair(last, pos, item[1])
            words = frozenset({("text", w)} if (w := words_of(last[pos])) else ())
            saving[item] = (pos, sum(count_message(m, ruler) for m in _view(pair, words, probes))
                            - sum(count_message(m, ruler)
                                  for m in _view(pair, words | {item}, probes)))
            continue
        after = _view([last[pos]], frozenset({item}), probes)[0] if item[0] == "result" \
            else _view(_pair(last, pos, item[1]), frozenset({item}), probes)[0]
        saving[item] = (pos, full[pos] - count_message(after, ruler))
    return Timeline(list(last), lengths, heads, schemas, [_items(d) for d in decisions], full,
                    saving, tuple(probes))


def _carries(m: BaseMessage, item: Item) -> bool:
    kind, cid = item
    if kind == "result":
        return isinstance(m, ToolMessage) and m.tool_call_id == cid
    if kind == "text":
        return words_of(m) == cid
    return isinstance(m, AIMessage) and any(c.get("id") == cid for c in m.tool_calls)


def _pair(messages: Sequence[BaseMessage], pos: int, cid: str) -> list[BaseMessage]:
    """The AI message at ``pos`` followed by its result (``apply_cleared`` needs the
    result to find the pointer the code becomes)."""
    result = [m for m in messages if isinstance(m, ToolMessage) and m.tool_call_id == cid]
    return [messages[pos], *result]


@dataclass(frozen=True)
class Family:
    model: str
    read: float  # $ per token read from the cache
    write: float  # $ per token written (Anthropic) or sent uncached (OpenAI)
    uncached: float
    explicit: bool  # breakpoints (Anthropic) or automatic (OpenAI)
    increment: int
    min_prefix: int

    @classmethod
    def of(cls, model: str) -> Family:
        price, rules = price_for(model), cache_rules(model)
        assert price is not None and rules is not None
        return cls(model, price.cache_read_per_mtok / 1e6,
                   (cache_write_per_mtok(model) or price.input_per_mtok) / 1e6,
                   price.input_per_mtok / 1e6, rules.breakpoints > 0, rules.increment,
                   rules.min_prefix)

    def cost(self, total: int, read: int) -> float:
        read = read if read >= self.min_prefix else 0
        read = read // self.increment * self.increment
        rest = max(0, total - read)
        return read * self.read + rest * (self.write if self.explicit else self.uncached)


def schedule(t: Timeline, fam: Family) -> list[int]:
    """The epoch requests of the cheapest schedule under ``fam``'s cost model (request 0
    always starts one)."""
    n = len(t.lengths)
    final = n - 1
    cands = [0] + [r for r in range(1, n) if t.cleared[r] - t.cleared[r - 1]]
    sets = [t.cleared[c] for c in cands]

    def live(s: frozenset[Item], r: int) -> frozenset[Item]:
        return s & t.cleared[r] if r == final else s  # the final request may restore

    def request_cost(r: int, s_prev: frozenset[Item], s: frozenset[Item]) -> float:
        cur, prev = live(s, r), live(s_prev, r - 1) if r else frozenset()
        total = t.tokens(r, cur)
        if r == 0:
            return fam.cost(total, 0)
        p = t.first_change(cur, prev)
        read = t.tokens(r - 1, prev) if p is None or p >= t.lengths[r - 1] else \
            t.prefix(p, cur, r)
        return fam.cost(total, read)

    # inner[k][r]: cost of requests cands[k]+1 .. r-1 under sets[k] (prefix sums)
    inner: list[list[float]] = []
    for k, c in enumerate(cands):
        acc, row = 0.0, [0.0] * (n + 1)
        for r in range(c + 1, n + 1):
            row[r] = acc
            if r < n:
                acc += request_cost(r, sets[k], sets[k])
        inner.append(row)
    m = len(cands)
    best: dict[tuple[int, int], tuple[float, int]] = {}
    for k in range(m - 1, -1, -1):
        tail = [(inner[k][n], -1)] + [(inner[k][cands[f]] + 0.0, f) for f in range(k + 1, m)]
        for prev in range(-1, k):
            start = request_cost(cands[k], sets[prev] if prev >= 0 else frozenset(), sets[k])
            options = [(cost + (best[(f, k)][0] if f >= 0 else 0.0), f) for cost, f in tail]
            cost, f = min(options)
            best[(k, prev)] = (start + cost, f)
    out, k, prev = [], 0, -1
    while k >= 0:
        out.append(cands[k])
        k, prev = best[(k, prev)][1], k
    return out


def scheduled_views(t: Timeline, epochs: Sequence[int]) -> list[tuple[list[BaseMessage],
                                                                       int | None]]:
    """Each request's messages under the schedule, and the message a breakpoint is pinned
    on (just before the next change, one request ahead; else before this one's)."""
    n = len(t.lengths)
    sets, s = [], frozenset()
    for r in range(n):
        if r in epochs:
            s = t.cleared[r]
        sets.append(s & t.cleared[r] if r == n - 1 else s)
    out = []
    for r in range(n):
        msgs = t.view(r, sets[r])
        own = t.first_change(sets[r], sets[r - 1]) if r else None
        nxt = t.first_change(sets[r + 1], sets[r]) if r + 1 < n else None
        at = own if own is not None else nxt  # read this request's change, else write ahead
        out.append((msgs, at - 1 if at else None))
    return out


def scheduled_requests(t: Timeline, epochs: Sequence[int], tools: Sequence[Sequence[str]],
                       ruler: Any, explicit: bool) -> list[Any]:
    """The schedule's main requests as the cache simulator reads them."""
    out = []
    for r, (msgs, pin) in enumerate(scheduled_views(t, epochs)):
        at = pin + len(t.heads[r]) if pin is not None and explicit else None
        # a view is one object per (request, cleared set) in t.memo, which keeps it alive
        key = ("request", r, id(msgs), at, id(tools[r]), getattr(ruler, "name", ruler))
        got = t.memo.get(key)
        if got is None:
            got = t.memo[key] = request_of(
                [*t.heads[r], *msgs], t.schemas[r] + sum(count_message(m, ruler) for m in msgs),
                tools[r], ruler, at)
        out.append(got)
    return out


@dataclass
class Bill:
    """The simulator's bill for a schedule of one run's main requests (plus ``sub``, the
    subagents' use, which no schedule changes)."""

    t: Timeline
    tools: Sequence[Sequence[str]]
    ruler: Any
    rules: Any
    model: str
    output: int
    sub: Any

    def __call__(self, epochs: Sequence[int]) -> tuple[dict[str, Any], list[Any]]:
        reqs = scheduled_requests(self.t, epochs, self.tools, self.ruler,
                                  explicit=bool(self.rules.breakpoints))
        use = totals(simulate(reqs, self.rules))
        use.add(self.sub)
        return priced(use, self.model, self.output, source="scheduled",
                      epochs=len(epochs)), reqs

    def usd(self, epochs: Sequence[int]) -> float:
        return float(self(epochs)[0]["cost_usd"] or 0.0)


def improve(epochs: list[int], price: Any) -> list[int]:
    """Greedy local search on the simulator's real bill (the DP's model reads optimistically
    where a breakpoint's lookback would miss): drop one epoch at a time, or stop clearing
    altogether, while that lowers the price."""
    best, cost = epochs, price(epochs)
    none = [epochs[0]]
    if (c := price(none)) < cost:
        best, cost = none, c
    better = True
    while better and len(best) > 1:
        better = False
        for k in range(1, len(best)):
            trial = best[:k] + best[k + 1:]
            if (c := price(trial)) < cost:
                best, cost, better = trial, c, True
                break
    return best


def reprice(row: dict[str, Any], run: Any) -> dict[str, Any]:
    """``row`` (an oracle run) as ``oracle-cached``: tokens and dollars of the cheapest
    schedule per family; everything the view decides about recall stays the oracle's."""
    mw = next(m for m in run.middleware if isinstance(m, OracleMiddleware))
    cursor = run.model.cursor
    main_key = message_key(cursor.requests[0][0])
    main = [i for i, req in enumerate(cursor.requests) if message_key(req[0]) == main_key]
    decisions = mw.plan.decisions
    if len(main) != len(decisions):  # a refused request or a retry: keep the oracle's bill
        return {**row, "oracle_cached_note": "schedule skipped: requests and decisions differ"}
    ruler = Ruler(DEFAULT_ENCODING)  # what the scripted model counted with
    t = timeline(decisions, [cursor.requests[i] for i in main],
                 [cursor.request_tokens[i] for i in main], ruler, mw.plan.probes)
    others = [i for i in range(len(cursor.requests)) if i not in set(main)]
    output = int(row.get("tokens_out") or 0)
    cache: dict[str, Any] = {}
    per_call: list[int] = []
    tokens_in = 0
    for model in (row.get("cost_model") or "", OPENAI_REFERENCE_MODEL):
        rules = cache_rules(model)
        if rules is None:
            continue
        sub = totals(simulate([request_of(cursor.requests[i], cursor.request_tokens[i],
                                          cursor.request_tools[i], ruler) for i in others],
                              rules))
        bill = Bill(t, [cursor.request_tools[i] for i in main], ruler, rules, model,
                    output, sub)
        epochs = improve(schedule(t, Family.of(model)), bill.usd)
        cache[rules.family], reqs = bill(epochs)
        if not per_call:  # the row's tokens: the oracle's, with its main requests rescheduled
            per_call = [r.tokens for r in reqs]
            tokens_in = row["tokens_in"] + sum(per_call) - sum(cursor.request_tokens[i]
                                                                for i in main)
    head = cache_rules(row.get("cost_model"))
    # the unscheduled oracle's figures of this same run stay beside them (run folders'
    # names differ, so another run's oracle differs by a few tokens a request)
    return {**row, "tokens_in": tokens_in or row["tokens_in"],
            "oracle_tokens_in": row["tokens_in"], "oracle_cache": row.get("cache"),
            "per_call_tokens": per_call or row["per_call_tokens"],
            "peak_tokens": max(per_call or [row["peak_tokens"]]),
            "cache": cache or row.get("cache"),
            "cost_usd_cached": cache[head.family]["cost_usd"] if head and cache
            else row.get("cost_usd_cached")}
