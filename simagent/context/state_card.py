"""The kernel state card: after a compaction, re-ground the model in the live kernel.

A summary says what the session *did*; only the kernel knows what it *holds* now. After
every compaction (summary, emergency, ``/compact``, a task checkpoint, and a clearing
epoch that cleared kernel results) the next request carries one deterministic card built
from a snapshot of the runtime (:func:`simagent.session.Session.state_snapshot`): the
user's names with type and shape (largest first), imports and functions, the simulator's
registry objects with the fields its ``simulator.toml`` names, figures made (by id, which
``view_figure`` takes) and files written in the session, each with the cells that wrote it,
and what else the latest cells did outside the kernel ("_out[3] created folder logs", from
the execution records' ``effects``): every fact once, as the card is read on every
request until the next compaction. No prose, no model
call, so it costs nothing to make, works in replay, and cannot hallucinate a variable.

The card is bounded (``[context] state_card_tokens``, default
:data:`simagent.context.thresholds.STATE_CARD_TOKENS`): names are dropped smallest first,
then files, then figures. It lives in private graph state (``context.state``) with the id
of the message it follows, so the same view is rebuilt on every call (a stable
prompt prefix) and a resumed session shows it too; the next compaction replaces it. When
the kernel's generation changed since the previous card, the card says the kernel was
restarted and lists the names that were lost.

Everything here is pure: a snapshot in, text and plain data out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage

from simagent.context.counting import STATE_CARD_SOURCE, is_state_card
from simagent.context.file_groups import FileItem, cells_phrase, group_files
from simagent.context.tokens import Ruler, active_ruler
from simagent.kernel_api.effects import describe_all, shown_path

#: Compactions that make a card, as the trace's ``reason`` names them.
REASONS = ("summary", "emergency", "compact", "checkpoint", "clear")
_MAX_LOST = 40
_MAX_FIGURES = 12
_MAX_FILES = 15
_MAX_LIST_CHARS = 400
#: Effects that make or change a file, with the words a file's line says them in.
_MADE = {"write": "written", "append": "appended", "modify": "modified"}


def _size(n: int) -> str:
    n = int(n or 0)
    for unit, div in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


def _joined(items: Sequence[str], limit: int = _MAX_LIST_CHARS, sep: str = ", ") -> str:
    out, used = [], 0
    for i, item in enumerate(items):
        if used + len(item) > limit and out:
            return sep.join(out) + f"{sep}… (+{len(items) - i} more)"
        out.append(item)
        used += len(item) + 2
    return sep.join(out)


def name_line(entry: dict[str, Any]) -> str:
    """``- df: pandas.DataFrame (72, 5) columns [...] 3.1 kB`` (registry fields inline)."""
    desc = str(entry.get("desc") or "")
    size = int(entry.get("bytes") or 0)
    kind = str(entry.get("type") or "?")
    if desc.startswith("= "):
        return f"- {entry['name']} {desc} ({kind})"
    line = f"- {entry['name']}: {kind}"
    if entry.get("registry"):
        line += f" [{entry['registry']}]"
    if desc:
        line += f" {desc}"
    if size >= 1024:
        line += f", {_size(size)}"
    fields = entry.get("fields") or []
    if fields:
        line += " — " + "; ".join(f"{k}={v}" for k, v in fields)
    return line


def _kernel_line(snapshot: dict[str, Any], previous: dict[str, Any] | None
                 ) -> tuple[str, bool, list[str]]:
    """(line, restarted, lost names)."""
    kernel = snapshot.get("kernel") or {}
    status = str(kernel.get("status") or "unknown")
    gen = int(kernel.get("generation") or 0)
    execs = int(kernel.get("executions") or 0)
    line = f"kernel: {status}, {execs} executions so far"
    restarted, lost = False, []
    if previous is not None and previous.get("generation") and gen != previous["generation"]:
        restarted = True
        now = {e["name"] for e in (snapshot.get("probe") or {}).get("names") or []}
        lost = [n for n in previous.get("names") or [] if n not in now]
        shown = _joined(lost[:_MAX_LOST]) if lost else "none of the listed names"
        replayed = kernel.get("replayed") or {}
        if replayed.get("cells") and not lost:
            line += (f"\nThe kernel was restarted since the last card and its state was "
                     f"replayed ({replayed['cells']} cells): every listed name is back.")
        elif replayed.get("cells"):
            line += (f"\nTHE KERNEL WAS RESTARTED since the last card; {replayed['cells']} "
                     f"cells were replayed but these names are gone: {shown}. Re-run the "
                     f"cells that defined what you still need.")
        else:
            line += (f"\nTHE KERNEL WAS RESTARTED since the last card: state from before is "
                     f"gone; lost: {shown}. Re-run the cells that defined what you still "
                     f"need.")
    elif gen > 1 and (kernel.get("replayed") or {}).get("restored"):
        line += (f"; it was restarted {gen - 1} time(s) this session and its state was "
                 f"replayed after the last restart")
    elif gen > 1:
        line += (f"; it was restarted {gen - 1} time(s) this session, so names defined "
                 f"before the last restart are gone")
    return line, restarted, lost


def render_card(snapshot: dict[str, Any], *, reason: str, budget: int,
                previous: dict[str, Any] | None = None, ruler: Ruler | None = None
                ) -> dict[str, Any]:
    """The card for ``snapshot`` within ``budget`` tokens, as stored in graph state.

    Returns ``{"text", "tokens", "reason", "generation", "names", "restarted", "lost"}``;
    ``names`` (every probed name, not just the shown ones) lets the next card tell
    what a restart lost.
    """
    ruler = ruler or active_ruler()
    probe = snapshot.get("probe") or {}
    entries = list(probe.get("names") or [])
    # the simulator's own objects first, then the rest largest first (probe order)
    entries.sort(key=lambda e: 0 if e.get("registry") else 1)
    kernel_line, restarted, lost = _kernel_line(snapshot, previous)
    head = [f'<kernel_state after="{reason}">',
            "Read from the live kernel just now (exact, not remembered); names, types and "
            "shapes below exist in the kernel as listed.", kernel_line]
    if probe.get("error"):
        head.append(f"(the kernel could not be read: {probe['error']})")
    foot = ["Earlier outputs stay queryable in the kernel: _out[n].tail(k), "
            "_out[n].grep(pattern), _out[n].code.", "</kernel_state>"]
    names = [name_line(e) for e in entries]
    more = int(probe.get("more_names") or 0)
    imports = list(probe.get("imports") or [])
    functions = list(probe.get("functions") or [])
    figures = [_figure_line(f) for f in (snapshot.get("figures") or [])[-_MAX_FIGURES:]]
    n_figures = len(snapshot.get("figures") or [])
    cells, base = snapshot.get("effects") or [], snapshot.get("base")
    made = made_by(cells, base)
    items = group_files(snapshot.get("files") or [])[:_MAX_FILES]
    files = [_file_line(item, made) for item in items]
    n_files = len(snapshot.get("files") or []) + int(snapshot.get("files_more") or 0)

    def assemble(k_names: int, k_files: int, k_figs: int) -> str:
        body = list(head)
        if entries or not probe.get("error"):
            hidden = len(entries) - k_names + more
            body.append(f"names ({k_names} of {len(entries) + more}, largest first"
                        f"{'; the smaller ones are not shown' if hidden else ''}):"
                        if entries else "names: none defined")
            body += names[:k_names]
        if imports:
            body.append("imports: " + _joined(imports))
        if functions:
            body.append("functions/classes: " + _joined(functions))
        if n_figures:
            body.append(f"figures ({n_figures}, newest {k_figs} shown):" if k_figs < n_figures
                        else f"figures ({n_figures}):")
            body += figures[len(figures) - k_figs:] if k_figs else []
        listed = _paths_of(items[:k_files])
        if n_files:
            body.append(f"files written in the workspace this session ({n_files}"
                        f"{f', {len(listed)} shown' if len(listed) < n_files else ''}):")
            body += [f"- {f}" for f in files[:k_files]]
        if acts := effects_line(cells, base, listed):
            body.append(acts)
        return "\n".join(body + foot)

    text, tokens, (k_names, k_files, k_figs) = _fit(assemble, budget, ruler,
                                                    len(names), len(files), len(figures))
    kernel = snapshot.get("kernel") or {}
    listed = _paths_of(items[:k_files])
    shown = {"kernel": kernel_line,
             "names": {e["name"]: line for e, line in zip(entries[:k_names], names,
                                                          strict=False)},
             "imports": imports, "functions": functions,
             "figures": figures[len(figures) - k_figs:] if k_figs else [],
             "files": {item.pattern or item.paths[0]: line
                       for item, line in zip(items[:k_files], files, strict=False)},
             "effects": effects_line(cells, base, listed)}
    return {"text": text, "tokens": tokens, "reason": reason,
            "generation": int(kernel.get("generation") or 0),
            "names": [e["name"] for e in entries], "restarted": restarted, "lost": lost,
            "shown": k_names, "state": shown}


def _fit(assemble: Callable[[int, int, int], str], budget: int, ruler: Ruler,
         k_names: int, k_files: int, k_figs: int
         ) -> tuple[str, int, tuple[int, int, int]]:
    """(text, tokens, (names, files, figures shown)) of the fullest card within
    ``budget``: names go first (the most that fit beside every file and figure), then
    files, then figures."""
    text = assemble(k_names, k_files, k_figs)
    tokens = ruler.count(text)
    if tokens <= budget:
        return text, tokens, (k_names, k_files, k_figs)
    lo, hi = 0, k_names  # binary search over the names: a few counts
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ruler.count(assemble(mid, k_files, k_figs)) <= budget:
            lo = mid
        else:
            hi = mid - 1
    k_names = lo
    text = assemble(k_names, k_files, k_figs)
    tokens = ruler.count(text)
    while tokens > budget and (k_files or k_figs):
        if k_files:
            k_files -= 1
        else:
            k_figs -= 1
        text = assemble(k_names, k_files, k_figs)
        tokens = ruler.count(text)
    return text, tokens, (k_names, k_files, k_figs)


def effects_line(cells: Sequence[dict[str, Any]], base: str | None = None,
                 listed: frozenset[str] = frozenset()) -> str:
    """``cells' effects outside the kernel (newest first): _out[3] appended results.csv;
    …`` ("" when none): one line, so the model knows which files its cells changed. A
    write to a file the card lists is said on that file's line (:func:`made_by`), once."""
    items = []
    for c in reversed(cells):
        rest = [e for e in c.get("effects") or [] if not _on_listed(e, base, listed)]
        if rest:
            items.append(f"_out[{c['n']}] {describe_all(rest, base, past=True)}")
    return "cells' effects outside the kernel (newest first): " + _joined(items, sep="; ") \
        if items else ""


def made_by(cells: Sequence[dict[str, Any]], base: str | None = None
            ) -> dict[str, dict[str, list[int]]]:
    """Workspace path -> {"written": [5, 3], "appended": [...]}: the cells whose writes
    made or changed each file (newest first, by what they did), for the file lines."""
    out: dict[str, dict[str, list[int]]] = {}
    for c in reversed(cells):
        for e in c.get("effects") or []:
            if (path := _made_path(e, base)) is not None:
                seen = out.setdefault(path, {}).setdefault(_MADE[e["kind"]], [])
                if c["n"] not in seen:
                    seen.append(c["n"])
    return out


def _made_path(effect: dict[str, Any], base: str | None) -> str | None:
    """The file an effect made or changed, as the card shows it; None for other effects."""
    if effect.get("kind") in _MADE and effect.get("path"):
        return shown_path(str(effect["path"]), base)
    return None


def _on_listed(effect: dict[str, Any], base: str | None, listed: frozenset[str]) -> bool:
    return _made_path(effect, base) in listed


def _paths_of(items: Sequence[FileItem]) -> frozenset[str]:
    """Every file the card's shown file lines cover (a group covers its members)."""
    return frozenset(p for item in items for p in item.paths)


def _file_line(item: FileItem, made: dict[str, dict[str, list[int]]]) -> str:
    """``fit.json (2 B; written by _out[3])``: size, and the cells that wrote it; a group
    of numbered files as ``logs/run_*.csv (12 files, 40.1 kB: run_1.csv … run_12.csv;
    written by _out[4]…_out[9])``."""
    writes: dict[str, list[int]] = {}
    for path in item.paths:
        for word, ns in made.get(path, {}).items():
            writes.setdefault(word, []).extend(ns)
    by = "".join(f"; {word} by {cells_phrase(ns)}" for word, ns in writes.items())
    if item.pattern is None:
        return f"{item.paths[0]} ({_size(item.bytes)}{by})"
    first, last = item.ends
    return (f"{item.pattern} ({len(item.paths)} files, {_size(item.bytes)}: "
            f"{first} … {last}{by})")


def _figure_line(fig: dict[str, Any]) -> str:
    """``- fig-1a2b "V(t)"``: the id is what ``view_figure`` takes; the file is
    ``<id>.png`` in the artifacts folder the system prompt names."""
    label = fig.get("id") or ""
    title = fig.get("title") or ""
    parts = [p for p in (label, f'"{title}"' if title else "") if p]
    return "- " + " ".join(parts or [str(fig.get("path") or "")])


def card_parts(card: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages a card is sent as: its full card, then the updates made since
    (``context.card_updates``), each ``{"text", "after_id", "id"}``; a card stored
    before updates existed is one part."""
    if card.get("parts"):
        return list(card["parts"])
    return [{"text": card.get("text") or "", "after_id": card.get("after_id"),
             "id": f"simagent-state-card-{card.get('n', 0)}"}]


def card_message(part: dict[str, Any]) -> HumanMessage:
    """One part of the card as the message the model reads (same text and id on every
    call)."""
    return HumanMessage(content=part["text"], id=part.get("id") or "simagent-state-card-0",
                        additional_kwargs={"lc_source": STATE_CARD_SOURCE})


def with_card(view: list[BaseMessage], card: dict[str, Any] | None,
              boundary: bool) -> list[BaseMessage]:
    """``view`` with each part of the card after the message it was made after.

    That message may since have gone behind a boundary (then the part follows the
    boundary's message); a card whose compaction came later than the latest boundary
    always has its message in view. Parts after one message keep their order.
    """
    parts = [p for p in card_parts(card or {}) if p.get("text")] if card else []
    if not parts:
        return view
    view = [m for m in view if not is_state_card(m)]
    ids = {m.id for m in view if m.id}
    after: dict[str, list[BaseMessage]] = {}
    orphans = []
    for part in parts:
        if part.get("after_id") in ids:
            after.setdefault(part["after_id"], []).append(card_message(part))
        else:
            orphans.append(card_message(part))
    head = 1 if boundary and view else 0
    out: list[BaseMessage] = []
    for i, m in enumerate(view):
        if i == head:
            out += orphans
        out.append(m)
        out += after.get(m.id, []) if m.id else []
    return out if head < len(view) else out + orphans


def card_event(card: dict[str, Any], agent: str) -> dict[str, Any]:
    """The ``context_state_card`` trace payload (``update``: only what changed was sent,
    ``tokens`` are then the update's)."""
    return {"reason": card["reason"], "tokens": card["tokens"], "names": len(card["names"]),
            "shown": card.get("shown", 0), "generation": card["generation"],
            "restarted": card["restarted"], "lost": card["lost"][:_MAX_LOST], "agent": agent,
            "update": bool(card.get("update"))}
