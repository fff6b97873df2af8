"""What a session's notebook holds, from its trace and execution records (pure).

The notebook is a reproducibility claim, so its code cells are chosen by the same rules
that rebuild a restarted kernel's state (:func:`simagent.kernel.replay.select`, one home):
the current lineage's cells that define state, in order. The replay leaves out more than
a notebook may: its time budget and its refusal to repeat effects outside the kernel are
about a restart *during* a session; a notebook re-run from the top repeats what the user
did, so those cells are kept (their effects named in the cell's metadata). Failed and
display-only cells go in only with ``all_cells``, tagged so ``nbclient`` skips them;
cells of an earlier lineage (before a ``/reset``) go under a heading of their own, also
skipped, or are left out.

Where a kept cell cannot re-run by itself the plan says which and why
(:attr:`Plan.concerns`), from what the trace honestly shows: a name defined only by a
cell left out (failed, redacted, before a reset), ``input()`` (the session's kernel had
no stdin), ``_out`` (simagent's handle to earlier outputs, absent from a plain kernel),
a file a cell deleted that no exported cell creates.
"""

from __future__ import annotations

import ast
import builtins
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from simagent.kernel import replay
from simagent.kernel_api import effects as fx
from simagent.kernel_api.outputs import HANDLE, number_of

#: Tags of cells a re-run skips; ``skip-execution`` is nbclient's default skip tag, so
#: every skipped cell carries it beside the tag that says why.
SKIP_TAG = "skip-execution"
TAGS = {"failed": "simagent-failed", "display": "simagent-display",
        "secret": "simagent-secret", "earlier": "simagent-before-reset"}
#: Replay skip kinds that still define state: a notebook keeps those cells.
_KEEP = frozenset({"effects", "too-slow", "over-budget", "off"})
#: Event kinds the plan reads.
KINDS = ("session_start", "message_user", "message_assistant", "kernel_exec", "tool_call",
         "tool_result", "subagent_end", "context_checkpoint")
_BUILTINS = frozenset(dir(builtins)) | {"get_ipython", "display", "In", "Out", "exit",
                                        "quit", "__file__"}


@dataclass(frozen=True)
class Code:
    """One execution as a notebook cell; ``kind``: ``kept`` (re-runs), ``needed`` (a
    failed cell later cells depend on: re-run, its error expected), ``failed``,
    ``display``, ``secret`` or ``earlier`` (these four skipped by a re-run)."""

    n: int
    code: str
    kind: str
    status: str
    text: str  # what the model saw of it (or the raw output, for cells no model ran)
    elapsed_s: float = 0.0
    raw_path: str | None = None
    error: str | None = None
    figures: tuple[str, ...] = ()
    lineage: int | None = None
    agent: str = "main"
    warmup: bool = False
    why: str = ""  # why a skipped cell is skipped
    effects: tuple[str, ...] = ()  # worded effects outside the kernel

    @property
    def tags(self) -> list[str]:
        if self.kind == "needed":  # nbclient's tag for a cell whose error is expected
            return [TAGS["failed"], "raises-exception"]
        return [] if self.kind == "kept" else [TAGS[self.kind], SKIP_TAG]


@dataclass(frozen=True)
class Text:
    """A markdown cell: ``kind`` ``user``, ``answer``, ``report`` (a subagent's) or
    ``record`` (a task record); ``key_values`` as the records hold them."""

    kind: str
    title: str
    body: str
    key_values: tuple[Mapping[str, Any], ...] = ()
    event_id: int | None = None  # an answer's trace event (its numbers' footnotes)


@dataclass
class Plan:
    session_id: str
    items: list[Code | Text | str] = field(default_factory=list)  # str: a heading
    concerns: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    #: Each answer's numbers by its event id (``presentation.footnotes.turn_answers``).
    numbers: dict[int, Any] = field(default_factory=dict)

    @property
    def code(self) -> list[Code]:
        return [i for i in self.items if isinstance(i, Code)]

    @property
    def kept(self) -> list[Code]:
        """The cells a re-run runs."""
        return [c for c in self.code if c.kind in ("kept", "needed")]


def _payload(ev: Any) -> dict[str, Any]:
    return ev.payload if isinstance(ev.payload, dict) else {}


def plan(events: Sequence[Any], records: Iterable[Mapping[str, Any]], session_id: str, *,
         all_cells: bool = False, earlier: bool = True, raw: Mapping[int, str] | None = None,
         base: str | None = None, cited: Iterable[int] = ()) -> Plan:
    """The notebook of a session: ``events`` from its trace (``.kind``, ``.payload``),
    ``records`` its execution records (``outputs/NNNN.json``); ``raw``: raw output text by
    execution number, for cells no tool result shows (the warm-up); ``earlier``: keep
    cells before the last ``/reset`` under a heading (False: leave them out); ``cited``:
    cells an answer's numbers come from, shown even when failed or display-only (tagged
    as ``all_cells`` tags them), so the answer's footnotes have a cell to link to."""
    recs = {int(r["n"]): r for r in records if isinstance(r.get("n"), int)}
    lineage = next((recs[n].get("lineage") for n in sorted(recs, reverse=True)), None)
    chosen = _classify(recs.values(), lineage)
    agents = {p.get("id"): p.get("agent") or "main"
              for p in (_payload(e) for e in events if e.kind == "tool_call")}
    results = {p.get("tool_call_id"): str(p.get("content") or "")
               for p in (_payload(e) for e in events if e.kind == "tool_result")}
    out = Plan(session_id)
    answer: str | None = None
    answer_id: int | None = None
    last = 0  # the execution number of the last cell placed
    for ev in events:
        p = _payload(ev)
        if ev.kind == "session_start":
            out.meta.update({k: p.get(k) for k in ("workspace", "simulator", "model")})
            out.meta.setdefault("started", getattr(ev, "ts", None))
        elif ev.kind == "message_user":
            if answer:
                out.items.append(Text("answer", "Answer", answer, event_id=answer_id))
            answer = None
            out.items.append(Text("user", "Request", str(p.get("content") or "")))
        elif ev.kind == "message_assistant" and (p.get("agent") or "main") == "main" \
                and str(p.get("content") or ""):
            answer, answer_id = str(p.get("content")), getattr(ev, "id", None)
        elif ev.kind == "subagent_end" and isinstance(p.get("report"), dict):
            rep = p["report"]
            out.items.append(Text("report", f"Report of the {p.get('name')} subagent",
                                  str(rep.get("answer") or ""),
                                  tuple(_kvs(rep.get("key_values")))))
        elif ev.kind == "context_checkpoint" and isinstance(p.get("record"), dict):
            rec = p["record"]
            out.items.append(Text("record", f"Task record ({rec.get('source') or 'done'})",
                                  str(rec.get("answer") or ""),
                                  tuple(_kvs(rec.get("key_values")))))
        elif ev.kind == "kernel_exec":
            n = number_of(p.get("raw_path")) or _record_of(p, recs, last)
            rec = recs.get(n) if n is not None else None
            if rec is None:
                continue
            last = n
            kind, why, words = chosen.get(n, ("earlier", "it ran before a /reset", ()))
            tid = p.get("tool_call_id")
            text = results.get(tid) if tid else None
            out.items.append(Code(
                n=n, code=str(rec.get("code") or p.get("code") or ""), kind=kind,
                status=str(rec.get("status") or p.get("status") or "?"),
                text=text if text is not None else (raw or {}).get(n, ""),
                elapsed_s=float(rec.get("elapsed_s") or 0.0), raw_path=p.get("raw_path"),
                error=rec.get("error"), figures=tuple(str(f) for f in rec.get("figures") or ()),
                lineage=rec.get("lineage"), agent=str(agents.get(tid) or "main"),
                warmup=bool(p.get("warmup")), why=why, effects=words))
    if answer:
        out.items.append(Text("answer", "Answer", answer, event_id=answer_id))
    needed, lines = _needed([i for i in out.items if isinstance(i, Code)])
    out.items = [replace(i, kind="needed") if isinstance(i, Code) and i.n in needed else i
                 for i in out.items]
    out.concerns = lines + concerns(out.code, recs, base)
    if any(HANDLE in names(c.code)[1] for c in out.kept) and \
            (raw_dir := next((os.path.dirname(c.raw_path) for c in out.code if c.raw_path),
                             None)):
        out.meta["outputs"] = raw_dir  # where `_out` reads (the setup cell)
    out.items = _shown(out.items, all_cells, earlier, frozenset(cited))
    return out


def _shown(items: list[Code | Text | str], all_cells: bool, earlier: bool,
           cited: frozenset[int] = frozenset()) -> list[Code | Text | str]:
    """The items a notebook shows, with a heading where cells before a reset begin and
    where the cells after it begin."""
    out: list[Code | Text | str] = []
    current, shown = True, False  # was the cell shown last of the current lineage; any yet
    for item in items:
        if isinstance(item, Code):
            if (item.kind in ("failed", "display") and not all_cells
                    and item.n not in cited) or \
                    (item.kind == "earlier" and not earlier):
                continue
            now = item.kind != "earlier"
            if now != current and (shown or not now):
                out.append("After the /reset" if now
                           else "Before a /reset (these cells are not re-run)")
            current, shown = now, True
        out.append(item)
    return out


def _needed(cells: Sequence[Code]) -> tuple[set[int], list[str]]:
    """Failed cells whose effects later kept cells read: an error part-way through a cell
    leaves what it did before the error, so the notebook runs such a cell too, expecting
    its error, and says so. A failed cell counts when it defines or changes
    (:func:`changes`) a name the later cell reads and does not define itself, or calls a
    function an earlier cell defined (which may change any name); one that only read
    names changed nothing."""
    failed: list[tuple[Code, set[str], list[str]]] = []
    functions: set[str] = set()
    needed: set[int] = set()
    lines: list[str] = []
    for c in cells:
        if c.kind == "earlier":
            continue
        defined, used, _ = names(c.code)
        if c.kind == "failed" and c.status == "error":
            failed.append((c, defined | changes(c.code), sorted(calls(c.code) & functions)))
        elif c.kind == "kept":
            wanted = used - defined
            for src, touched, called in failed:
                hit = sorted(wanted & touched) or (sorted(wanted) if called else [])
                if src.n in needed or not hit:
                    continue
                needed.add(src.n)
                how = (f"may have changed before it failed in the session (it calls "
                       f"{called[0]}, defined in an earlier cell)" if called and not
                       wanted & touched else "defined or changed before it failed in the "
                       "session")
                lines.append(f"{_label(c)} uses `{hit[0]}`, which cell [{src.n}] {how}: the "
                             f"notebook runs that cell too (tagged raises-exception) and "
                             f"expects its error")
        functions |= functions_of(c.code)
    return needed, lines


def calls(code: str) -> set[str]:
    """Names a cell calls as functions (``f(x)``)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    return {n.func.id for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def functions_of(code: str) -> set[str]:
    """Functions a cell defines at its top level."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _record_of(p: Mapping[str, Any], recs: Mapping[int, Mapping[str, Any]], after: int
               ) -> int | None:
    """The record of an execution that left no raw output file (it printed nothing): the
    next one after ``after`` with its code and kernel execution count."""
    return next((n for n in sorted(recs) if n > after and recs[n].get("code") == p.get("code")
                 and recs[n].get("execution_count") in (None, p.get("execution_count"))), None)


def _kvs(values: Any) -> Iterable[Mapping[str, Any]]:
    return [v for v in values or () if isinstance(v, Mapping) and "name" in v]


def _classify(records: Iterable[Mapping[str, Any]], lineage: Any
              ) -> dict[int, tuple[str, str, tuple[str, ...]]]:
    """``n -> (kind, why, worded effects)`` for the cells of ``lineage``, by the replay's
    rules with no time budget and no backup limit (see the module doc)."""
    records = list(records)
    sizes = {str(e["path"]): 0 for r in records for e in fx.of(r) if "path" in e}
    budget = replay.ReplayBudget(cell_s=math.inf, total_s=math.inf)
    sel = replay.select(records, budget, lineage=lineage, sizes=sizes)
    out: dict[int, tuple[str, str, tuple[str, ...]]] = {}
    for c in sel.run:
        rec = next(r for r in records if r.get("n") == c.n)
        out[c.n] = ("kept", "", tuple(fx.describe(e) for e in fx.of(rec)))
    for s in sel.skipped:
        kind = "kept" if s.kind in _KEEP else s.kind
        out[s.n] = (kind, s.why, tuple(fx.describe(e) for e in s.effects))
    return out


# ------------------------------------------------------------ what may not re-run
def names(code: str) -> tuple[set[str], set[str], bool]:
    """(names a cell defines, global names it reads, whether it calls ``input``)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set(), set(), False
    defined: set[str] = set()
    used: set[str] = set()
    asks = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (defined if isinstance(node.ctx, (ast.Store, ast.Del)) else used).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "input":
            asks = True
    return defined, used - _BUILTINS, asks


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def changes(code: str) -> set[str]:
    """Names whose objects a cell changes in place: ``p["Ni"] = 1``, ``obj.x += 1``,
    ``results.append(r)`` as a statement (the object it starts from)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    out: set[str] = set()
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, ast.Delete) else [node.target]
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and \
                isinstance(node.value.func, ast.Attribute):
            targets = [node.value.func]
        out |= {r for t in targets if isinstance(t, (ast.Attribute, ast.Subscript))
                and (r := _root(t)) is not None}
    return out


def _label(c: Code) -> str:
    return f"cell [{c.n}] (`{replay.first_line(c.code, 40)}`)"


def concerns(cells: Sequence[Code], records: Mapping[int, Mapping[str, Any]],
             base: str | None = None) -> list[str]:
    """One line per kept cell that cannot re-run by itself, saying why."""
    out: list[str] = []
    defined_by_kept: set[str] = set()
    left_out: dict[str, Code] = {}
    written: set[str] = set()
    deleted = {str(e["path"]): n for n, r in records.items() for e in fx.of(r)
               if e.get("kind") == "delete" and "path" in e}
    kept_all = [c for c in cells if c.kind in ("kept", "needed")]
    every_kept_def = set().union(*(names(c.code)[0] for c in kept_all)) if kept_all else set()
    for c in cells:
        defined, used, asks = names(c.code)
        if c.kind not in ("kept", "needed"):
            for name in defined:
                left_out.setdefault(name, c)
            continue
        missing = sorted(u for u in used if u in left_out and u not in defined_by_kept
                         and u not in every_kept_def)
        for name in missing[:3]:
            src = left_out[name]
            out.append(f"{_label(c)} uses `{name}`, defined only by cell [{src.n}], which "
                       f"is not re-run ({src.why or src.kind})")
        if asks:
            out.append(f"{_label(c)} calls input(): it waits for a person, and the "
                       f"session's kernel had no input")
        if HANDLE in used:
            out.append(f"{_label(c)} reads `{HANDLE}`, simagent's handle to what earlier "
                       f"cells printed: the notebook's first code cell points it at the "
                       f"session's saved outputs (simagent and that folder are needed)"
                       + (f"; `{HANDLE}[-k]` counts back from the session's last cell, "
                          f"not this one" if re.search(rf"{HANDLE}\[\s*-", c.code) else ""))
        effects = fx.of(records.get(c.n, {}))
        for path, n in deleted.items():
            shown = fx.shown_path(path, base)
            if n > c.n and path not in written and _mentions(c.code, path):
                out.append(f"{_label(c)} reads {shown}, which cell [{n}] deleted later: "
                           f"a re-run needs the file as it was before the session")
        for e in effects:  # a delete its own code names (not a library's temp files)
            if e.get("kind") == "delete" and str(e.get("path")) not in written and \
                    _mentions(c.code, str(e.get("path"))):
                out.append(f"{_label(c)} deletes {fx.shown_path(str(e.get('path')), base)}, "
                           f"which no exported cell creates: a re-run needs it as it was")
        written.update(str(e.get("path")) for e in effects if e.get("kind") == "write")
        defined_by_kept |= defined
    return out


def _mentions(code: str, path: str) -> bool:
    """Whether ``code`` names ``path`` (its file name, quoted or in a longer path)."""
    name = os.path.basename(path.rstrip("/"))
    return bool(name) and re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", code) is not None
