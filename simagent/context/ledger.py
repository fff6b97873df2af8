"""The dropped-items ledger: what each compaction took out of the model's view, and where
it is now (issue 16, item 2).

A summary keeps what its writer judged important; the ledger is an index of what left:
numbers with their units and the line they came from, file paths, figures, the assistant's
decisions, recorded attempts and the user's requests, each with a pointer to where the
full text still is — the raw kernel output and its ``_out[n]`` handle, an evicted result,
the file that was read, or the history file and line. Every compaction writes one entry
(summary, ``/compact``, task checkpoint, emergency, clearing epoch). Entries are built from
the dropped messages by rules alone, no model call, so they are the same in replay and cost
nothing; each is capped (:data:`MAX_PER_KIND`), numbers deduplicated by line.

``recall(query)`` searches the ledger, the offloaded history and the files the ledger
points to, and answers with a bounded list of lines and pointers: one call gets a lost
value back instead of paging history files.

Pure core: :func:`extract`, :func:`match`, :func:`render_hits`, :func:`trace_fields`.
Shell: :class:`Ledger` (one JSONL file per session, ``SessionPaths.ledger``), :func:`search`
(reads the files), :func:`ledger_recall` (the bench's metric).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from simagent.context.clearing import is_cleared
from simagent.context.placeholders import _PATH_RE
from simagent.context.summary import _PATH as FILE_PATH
from simagent.context.task_records import PLUS_MINUS
from simagent.jsonl import append_jsonl, read_jsonl
from simagent.kernel_api import outputs
from simagent.paths import private_dir, private_opener
from simagent.tool_names import RECALL, RECORD_ATTEMPT
from simagent.trace.redact import redact_data

#: Items kept per entry, by kind (the ledger is an index, not a second history).
MAX_PER_KIND = {"number": 40, "file": 16, "figure": 12, "decision": 10, "attempt": 12,
                "request": 4}
KINDS = tuple(MAX_PER_KIND)
#: Chars of one item's text; longer lines are clipped (the pointer has them whole).
ITEM_CHARS = 200
#: Lines longer than this are data dumps (arrays, tables), not results: no number item.
NUMBER_LINE_MAX = 400
#: Numbers listed per number item.
VALUES_PER_LINE = 4
#: What ``recall`` returns at most: hits, chars per hit line.
RECALL_HITS = 12
RECALL_LINE_CHARS = 240
#: Bytes ``recall`` reads at most from one pointed-to file, and from all of them together
#: (raw kernel outputs can be hundreds of MB; the newest entries' files are read first).
SCAN_FILE_BYTES = 16 << 20
SCAN_TOTAL_BYTES = 64 << 20
#: Items of the latest entry shown in the trace event (and so in ``/context``).
PREVIEW_ITEMS = 6

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_BASE = (r"(?:[yzafpnµumcdkMGT]?(?:eV|Ah|Wh|Pa|Hz|mol|bar|atm|ohm|Ω|K|s|m|g|A|V|W|J|N|C|F|L"
         r"|h|min|days?|yr|rad|deg|bohr|Å)(?:\^?-?\d)?)")
_UNIT = rf"(?:%|°C|/?{_BASE}(?:[/·*.]{_BASE})*)"
#: A number with an optional unit; not inside an identifier, hash or path.
_QTY = re.compile(rf"(?<![\w.]){_NUM}(?:\s?(?P<unit>{_UNIT}))?(?![\w.])")
#: ``name = value [unit]``, ``name: value``, ``"a name [unit]": value``.
_KV = re.compile(rf"[\"']?(?P<key>[A-Za-z_][\w .()\[\]/-]{{0,60}}?)[\"']?\s*[=:]\s*(?P<num>{_NUM})"
                 rf"(?:\s*{PLUS_MINUS}\s*{_NUM})?"  # an uncertainty: the unit after it counts
                 rf"(?:\s?(?P<unit>{_UNIT}))?(?![\w.])")
#: A unit at the end of a key: ``capacity_Ah``, ``tau_ms``.
_KEY_UNIT = re.compile(rf"_(?P<unit>{_UNIT})$")
_FIGURE = re.compile(r"\bfig-[0-9a-f]{8,64}\b")
_FIGURE_LINE = re.compile(r"^\[figure (fig-[0-9a-f]{8,64})[^\]:]*:\s*(\S+?)\]")
_WS = re.compile(r"\s+")


@dataclass(frozen=True)
class Item:
    """One thing that left the view, and where it still is."""
    kind: str  # one of KINDS
    text: str  # the line, path, figure caption, decision or attempt (clipped)
    source: str = ""  # the tool, or assistant / user
    values: tuple[str, ...] = ()  # numbers with units (kind "number")
    path: str | None = None  # the full content: raw output, evicted result, file read, image
    handle: str | None = None  # ``_out[12]``: the raw output queried in the kernel
    history: str | None = None  # ``<history file>:<line>``

    def pointer(self) -> str:
        """Where to get it back: the handle (it names the raw output file: fewer tokens
        than its path), else the path, and the history line."""
        path = self.path if self.path and self.path != self.text and not self.handle else ""
        parts = [self.handle or "", path, self.history or ""]
        return " · ".join(p for p in parts if p) or "(no copy on disk; re-run the call)"

    def haystack(self) -> str:
        return " ".join((self.text, *self.values, self.source, self.path or "")).lower()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Item:
        return cls(kind=str(data.get("kind") or ""), text=str(data.get("text") or ""),
                   source=str(data.get("source") or ""),
                   values=tuple(str(v) for v in data.get("values") or ()),
                   path=data.get("path"), handle=data.get("handle"),
                   history=data.get("history"))

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, "", ())}


# ------------------------------------------------------------------- pure core
def _clip(text: str, limit: int = ITEM_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _skipped(msg: BaseMessage) -> bool:
    """Boundaries, state cards and nudges are simagent's own words, not session content;
    an already-cleared placeholder holds nothing, and a ``recall`` answer only copies."""
    return (bool(msg.additional_kwargs.get("lc_source")) or is_cleared(msg)
            or (isinstance(msg, ToolMessage) and msg.name == RECALL))


def calls_by_id(messages: Sequence[BaseMessage]) -> dict[str, dict[str, Any]]:
    """tool_call_id -> the call (name, args), from the AI messages that made them."""
    return {c.get("id") or "": c for m in messages if isinstance(m, AIMessage)
            for c in m.tool_calls}


def where_result_is(msg: ToolMessage, call: Mapping[str, Any] | None
                    ) -> tuple[str | None, str | None]:
    """(path holding the full result, ``_out[n]`` handle) of a tool result, if any."""
    artifact = msg.artifact if isinstance(msg.artifact, dict) else {}
    path = artifact.get("raw_path")
    if not path and (found := _PATH_RE.search(msg.text + " ")):
        path = found.group(1)
    if not path and call and call.get("name") == "read_file":
        path = (call.get("args") or {}).get("file_path")  # the file itself: read it again
    n = outputs.number_of(path) if path else None
    return (str(path) if path else None), (outputs.handle(n) if n is not None else None)


def result_sources(messages: Sequence[BaseMessage],
                   calls: Mapping[str, Mapping[str, Any]] | None = None) -> list[dict[str, str]]:
    """Where each dropped tool result is whole (``{tool, path[, handle]}``), so ``recall``
    can search results that yielded no item."""
    calls = dict(calls) if calls is not None else calls_by_id(messages)
    out = []
    for msg in messages:
        if isinstance(msg, ToolMessage) and not _skipped(msg):
            call = calls.get(msg.tool_call_id)
            path, handle = where_result_is(msg, call)
            if path:
                tool = (call or {}).get("name") or msg.name or "tool"
                out.append({"tool": tool, "path": path, **({"handle": handle} if handle else {})})
    return out


def numbers_in(line: str) -> tuple[tuple[str, ...], int]:
    """(values with units, score) of a line: 3 for ``name = value``, 2 for a value with a
    unit, 1 for a labelled number, 0 for none (a line with no letters says nothing)."""
    if len(line) > NUMBER_LINE_MAX or not re.search(r"[A-Za-z]", line):
        return (), 0
    pairs = []
    for m in _KV.finditer(line):
        unit = m.group("unit") or ((k := _KEY_UNIT.search(m.group("key"))) and k.group("unit"))
        pairs.append(f"{m.group('key')}={m.group('num')}" + (f" {unit}" if unit else ""))
    if pairs:
        return tuple(pairs[:VALUES_PER_LINE]), 3
    qty = [m for m in _QTY.finditer(line)]
    with_unit = [f"{m.group(0).strip()}" for m in qty if m.group("unit")]
    if with_unit:
        return tuple(with_unit[:VALUES_PER_LINE]), 2
    if qty and re.match(r"\s*[\"'A-Za-z(\[]", line):
        return tuple(m.group(0) for m in qty[:VALUES_PER_LINE]), 1
    return (), 0


def _attempt_text(args: Mapping[str, Any]) -> str:
    def kv(d: Any) -> str:
        return ", ".join(f"{k}={v}" for k, v in (d or {}).items()) if isinstance(d, dict) else ""

    parts = [str(args.get("rationale") or ""), kv(args.get("parameters")),
             kv(args.get("metrics")), str(args.get("outcome") or "")]
    return "; ".join(p for p in parts if p)


def extract(messages: Sequence[BaseMessage], *, history: str | Path | None = None,
            starts: Sequence[int | None] | None = None,
            calls: Mapping[str, Mapping[str, Any]] | None = None) -> tuple[list[Item], int]:
    """(items, how many were found before the caps) from dropped ``messages``.

    ``history``/``starts``: the file they were offloaded to and, per message, the line its
    text starts on there (``summary.offload``); ``calls``: tool calls by id when the AI
    messages that made them are not among ``messages`` (a clearing epoch).
    """
    calls = dict(calls) if calls is not None else calls_by_id(messages)
    found: list[tuple[int, int, Item]] = []  # (order, score, item)

    def add(item: Item, score: int = 0) -> None:
        found.append((len(found), score, item))

    def at(i: int, offset: int = 0) -> str | None:
        line = starts[i] if starts is not None and i < len(starts) else None
        return f"{history}:{line + offset}" if history is not None and line else None

    for i, msg in enumerate(messages):
        if _skipped(msg):
            continue
        if isinstance(msg, ToolMessage):
            call = calls.get(msg.tool_call_id)
            source = (call or {}).get("name") or msg.name or "tool"
            path, handle = where_result_is(msg, call)
        elif isinstance(msg, AIMessage):
            source, path, handle = "assistant", None, None
            if msg.text.strip():
                add(Item("decision", _clip(_WS.sub(" ", msg.text)), source, history=at(i)))
            for call in msg.tool_calls:
                args = call.get("args") or {}
                if call.get("name") == RECORD_ATTEMPT:
                    add(Item("attempt", _clip(_attempt_text(args)), RECORD_ATTEMPT,
                             history=at(i)))
                for key in ("file_path", "path"):
                    if isinstance(args.get(key), str) and FILE_PATH.search(args[key]):
                        add(Item("file", args[key], call.get("name") or "", history=at(i)))
        elif isinstance(msg, HumanMessage):
            source, path, handle = "user", None, None
            add(Item("request", _clip(_WS.sub(" ", msg.text)), source, history=at(i)))
        else:
            continue
        for k, line in enumerate(msg.text.split("\n")):  # as the history file counts lines
            where = at(i, k)
            if fig := _FIGURE_LINE.match(line.strip()):
                add(Item("figure", _clip(line), source, path=fig.group(2), history=where))
                continue
            for fid in _FIGURE.findall(line):
                add(Item("figure", fid, source, history=where))
            for name in FILE_PATH.findall(line):
                add(Item("file", name, source, history=where))
            values, score = numbers_in(line)
            if score:
                add(Item("number", _clip(line), source, values, path, handle, where), score)
    return _capped(found), len(found)


def _key(item: Item) -> str:
    if item.kind == "figure":
        return _FIGURE.search(item.text).group(0) if _FIGURE.search(item.text) else item.text
    return _WS.sub(" ", item.text).lower()


def _capped(found: list[tuple[int, int, Item]]) -> list[Item]:
    """First of each duplicate (a figure caption beats a bare id), the best-scored numbers
    and the newest of the rest within :data:`MAX_PER_KIND`, in kind then message order."""
    seen: dict[tuple[str, str], tuple[int, int, Item]] = {}
    for order, score, item in found:
        key = (item.kind, _key(item))
        old = seen.get(key)
        if old is None or (item.kind == "figure" and item.path and not old[2].path):
            seen[key] = (old[0] if old else order, score, item)
    kept: list[tuple[int, int, Item]] = []
    for kind in KINDS:
        rows = [r for r in seen.values() if r[2].kind == kind]
        rows.sort(key=lambda r: (r[1], r[0]), reverse=True)  # best score, then newest
        kept += sorted(rows[: MAX_PER_KIND[kind]], key=lambda r: r[0])
    return [item for _, _, item in kept]


def _short(item: Item) -> str:
    """A pointer for a one-line preview: the handle, else the file name (and line)."""
    where = item.handle or item.history or item.path or ""
    return Path(where).name if where and not item.handle else where or "no copy on disk"


def trace_fields(entry: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a compaction's trace event says of its ledger entry (``/context`` shows it)."""
    if not entry:
        return {}
    items = [Item.from_dict(d) for d in entry.get("items") or ()]
    kinds: dict[str, int] = {}
    for item in items:
        kinds[item.kind] = kinds.get(item.kind, 0) + 1
    # a few of each kind in turn (newest first): the preview shows the entry's range
    groups = [[it for it in reversed(items) if it.kind == k] for k in KINDS]
    mixed = [g[i] for i in range(PREVIEW_ITEMS) for g in groups if i < len(g)]
    preview = [_clip(f"{it.kind}: {it.text} — {_short(it)}", 160) for it in mixed[:PREVIEW_ITEMS]]
    return {"ledger": entry.get("id"), "ledger_items": len(items), "ledger_kinds": kinds,
            "ledger_found": entry.get("found", len(items)), "ledger_preview": preview,
            "ledger_path": entry.get("file")}


# ------------------------------------------------------------------- storage
_LOCK = threading.Lock()  # main agent and subagents share the session's file


def read_entries(path: Path) -> list[dict[str, Any]]:
    return read_jsonl(path)


@dataclass
class Ledger:
    """The session's ledger file (``SessionPaths.ledger``), one JSON object per entry."""

    path: Path
    agent: str = "main"
    errors: list[str] = field(default_factory=list)

    def entries(self) -> list[dict[str, Any]]:
        return read_entries(self.path)

    def record(self, kind: str, messages: Sequence[BaseMessage], *,
               history: Path | None = None, starts: Sequence[int | None] | None = None,
               calls: Mapping[str, Mapping[str, Any]] | None = None,
               **extra: Any) -> dict[str, Any] | None:
        """Extract and append one entry; None when the disk refused (the compaction
        itself must still happen: the history file keeps everything)."""
        items, found = extract(messages, history=history, starts=starts, calls=calls)
        with _LOCK:
            try:
                private_dir(self.path.parent)
                entry = {"id": len(self.entries()) + 1, "kind": kind, "agent": self.agent,
                         "ts": datetime.now(UTC).isoformat(timespec="seconds"),
                         "messages": len(messages), "found": found,
                         "history": str(history) if history else None, **extra,
                         "items": [it.as_dict() for it in items],
                         "sources": result_sources(messages, calls)}
                append_jsonl(self.path, json.dumps(redact_data(entry), default=str),
                             opener=private_opener)
            except OSError as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
                return None
        return {**entry, "file": str(self.path)}


# ------------------------------------------------------------------- search
@dataclass(frozen=True)
class Hit:
    kind: str  # an item kind, or "history" / "output" for a line found in a file
    text: str
    pointer: str


def terms_of(query: str) -> list[str]:
    return [t for t in query.lower().split() if t]


def match(text: str, terms: Sequence[str]) -> bool:
    """Every term of the query occurs in ``text`` (case-insensitive)."""
    low = text.lower()
    return bool(terms) and all(t in low for t in terms)


def _grep(path: Path, terms: Sequence[str], budget: int) -> Iterator[tuple[int, str]]:
    """(line number, line) of matching lines, reading at most ``budget`` chars."""
    used = 0
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                used += len(line)
                if used > budget:
                    return
                if match(line, terms):
                    yield n, line.rstrip("\n")
    except OSError:
        return


def search(query: str, *, ledger: Path, history_dir: Path | None = None,
           limit: int = RECALL_HITS) -> list[Hit]:
    """Ledger items (newest entry first), then history lines, then lines of the files the
    ledger points to, whose text holds every word of ``query``; at most ``limit``."""
    terms = terms_of(query)
    hits: list[Hit] = []
    seen: set[str] = set()

    def add(kind: str, text: str, pointer: str) -> bool:
        key = _WS.sub(" ", text.strip().lower())[:ITEM_CHARS - 1]
        if key not in seen:
            seen.add(key)
            hits.append(Hit(kind, _clip(text, RECALL_LINE_CHARS), pointer))
        return len(hits) >= limit

    if not terms:
        return hits
    entries = list(reversed(read_entries(ledger)))
    pointed: dict[str, str | None] = {}  # path -> handle, newest first
    for entry in entries:
        for src in entry.get("sources") or ():
            if isinstance(src, dict) and src.get("path"):
                pointed.setdefault(str(src["path"]), src.get("handle"))
        for item in map(Item.from_dict, entry.get("items") or ()):
            if item.path and item.kind != "figure":
                pointed.setdefault(item.path, item.handle)
            if match(item.haystack(), terms) and add(item.kind, item.text, item.pointer()):
                return hits
    histories = sorted(history_dir.glob("*.md"), key=lambda p: p.stat().st_mtime,
                       reverse=True) if history_dir and history_dir.is_dir() else []
    for path in histories:
        for n, line in _grep(path, terms, SCAN_FILE_BYTES):
            if not line.startswith("#") and add("history", line, f"{path}:{n}"):
                return hits
    left = SCAN_TOTAL_BYTES
    for name, handle in pointed.items():
        path = Path(name)
        if left <= 0 or not path.is_file() or path in histories:
            continue
        budget = min(SCAN_FILE_BYTES, left)
        for n, line in _grep(path, terms, budget):
            if add("output", line, " · ".join(x for x in (handle, f"{path}:{n}") if x)):
                return hits
        left -= min(path.stat().st_size, budget)
    return hits


def render_hits(query: str, hits: Sequence[Hit], limit: int = RECALL_HITS) -> str:
    """The tool's answer: one line per hit with its pointer."""
    if not terms_of(query):
        return "recall: give words to search for, e.g. recall('capacity Ah')."
    if not hits:
        return (f"recall: nothing that left your context matches {query!r} (every word must "
                f"occur in a line; try fewer or shorter words).")
    more = " (the first; narrow the query for others)" if len(hits) >= limit else ""
    lines = [f"recall {query!r}: {len(hits)} match{'es' if len(hits) != 1 else ''}{more}"]
    lines += [f"- [{h.kind}] {h.text}  ⟶ {h.pointer}" for h in hits]
    return "\n".join(lines)


def recall_text(paths: Any, query: str) -> str:
    """``recall(query)`` for a session's paths (``SessionPaths``)."""
    hits = search(query, ledger=paths.ledger, history_dir=paths.conversation_history)
    return render_hits(query, hits)


def ledger_recall(session: Any, facts: Iterable[str]) -> float | None:
    """Share of ``facts`` (probe facts no longer in view) that ``recall(fact)`` finds;
    None when there are none, or the session has no ledger (its policy keeps none)."""
    facts = [f for f in facts if f]
    paths = getattr(session, "paths", session)
    ledger = getattr(paths, "ledger", None)
    if not facts or ledger is None or not ledger.is_file():
        return None
    found = sum(bool(search(f, ledger=paths.ledger, history_dir=paths.conversation_history,
                            limit=1)) for f in facts)
    return round(found / len(facts), 4)


__all__ = ["KINDS", "MAX_PER_KIND", "Hit", "Item", "Ledger", "extract", "ledger_recall",
           "match", "numbers_in", "read_entries", "recall_text", "render_hits", "search",
           "trace_fields"]
