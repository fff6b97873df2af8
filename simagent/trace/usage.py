"""Token usage per model call, rolled up by agent and by model.

One tally per session, fed by the trace recorder for every call (main agent and
subagents alike) and rebuilt from ``model_usage`` trace events on resume, so totals in
``simagent run --json``, ``/context`` and the bench agree with the trace.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

_FIELDS = ("input_tokens", "output_tokens", "cache_read", "cache_creation", "reasoning_tokens")


def token_count(value: Any) -> int:
    """A token count from a payload; odd values (a hand-edited or foreign trace) count 0."""
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


@dataclass
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read: int = 0
    cache_creation: int = 0
    reasoning_tokens: int = 0
    calls: int = 0

    def add(self, other: Mapping[str, Any]) -> None:
        for name in _FIELDS:
            setattr(self, name, getattr(self, name) + token_count(other.get(name)))
        self.calls += token_count(other.get("calls", 1))

    def minus(self, other: Usage) -> Usage:
        return Usage(*(getattr(self, f) - getattr(other, f) for f in (*_FIELDS, "calls")))

    def as_dict(self) -> dict[str, int]:
        return {f: getattr(self, f) for f in (*_FIELDS, "calls")}


#: Where langchain-anthropic puts cache writes split by TTL; it then zeroes the generic
#: ``cache_creation`` key (to avoid double counting), so the writes must be summed here.
_TTL_WRITES = ("ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens")


def cache_write_tokens(details_in: Mapping[str, Any]) -> int:
    """Tokens written to the provider's prompt cache (Anthropic ``cache_creation``), from
    ``usage_metadata["input_token_details"]``; 0 where the provider reports none."""
    by_ttl = sum(token_count(details_in.get(k)) for k in _TTL_WRITES)
    return by_ttl or token_count(details_in.get("cache_creation"))


def usage_record(usage_metadata: Mapping[str, Any] | None) -> dict[str, int]:
    """Flatten langchain ``usage_metadata`` (with its detail dicts) into usage fields."""
    um = dict(usage_metadata or {})
    details_in = um.get("input_token_details") or {}
    details_out = um.get("output_token_details") or {}
    return {
        "input_tokens": int(um.get("input_tokens") or 0),
        "output_tokens": int(um.get("output_tokens") or 0),
        "total_tokens": int(um.get("total_tokens") or 0),
        "cache_read": int(details_in.get("cache_read") or 0),
        "cache_creation": cache_write_tokens(details_in),
        "reasoning_tokens": int(details_out.get("reasoning") or 0),
    }


@dataclass
class UsageTotals:
    total: Usage = field(default_factory=Usage)
    by_agent: dict[str, Usage] = field(default_factory=dict)
    by_model: dict[str, Usage] = field(default_factory=dict)
    last_input_tokens: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, agent: str, model: str, record: Mapping[str, Any]) -> None:
        with self._lock:
            self.total.add(record)
            self.by_agent.setdefault(agent, Usage()).add(record)
            self.by_model.setdefault(model, Usage()).add(record)
            if agent == "main" and not record.get("dropped"):  # a late, abandoned reply
                self.last_input_tokens = token_count(record.get("input_tokens"))

    def snapshot(self) -> Usage:
        with self._lock:
            return Usage(**self.total.as_dict())

    @classmethod
    def from_trace(cls, events: Iterable[Any]) -> UsageTotals:
        totals = cls()
        for event in events:
            p = event.payload if isinstance(event.payload, dict) else {}
            totals.record(str(p.get("agent") or "main"), str(p.get("model") or "?"), p)
        return totals
