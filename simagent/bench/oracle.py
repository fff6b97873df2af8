"""The ``oracle`` policy: the lower bound on tokens (issue 31 §1, design.md §10).

A replayed workflow's future is written down: the script says what every later step
sends and the final answer quotes, so the bench can build a policy no real harness can
beat. Before each main-agent request the oracle keeps in view exactly what is needed:

* the results of the last model reply (the model has to read a result once);
* an earlier result that a later step *uses*: one its final answer or ``fill`` argument
  quotes through ``{out[i]}``, or the latest one holding a value (a number of 3+
  significant digits with a decimal point or exponent, an integer of 4+ digits, a file
  name) that a later step writes and that neither the prompt nor any earlier step wrote
  first (so the model took it from that result);
* the signatures (``def``/``class`` headers) of code defining what a later step calls;
* at the last request, whatever a probe fact would otherwise be lost without.

Everything else leaves the view at the earliest moment, where that saves tokens: a call
and result holding a probe fact become simagent's own pointers (``context.clearing``: the
placeholder naming the raw output file); a call nothing later needs leaves with its
result, as a summary drops it (its result stays as a bare mark only where a later
``{out[i]}`` counts positions across it); other code is a bare mark; the model's own
earlier words (what it said beside its calls) are left out once it has written them. The
bound must hold at every window: summaries drop whole calls at 16k, so an oracle that kept
a mark per call, or whole defining cells, sent more than simagent there. It runs
with simagent's system prompt, tools, caps and eviction; its own clearing, summaries,
checkpoints, state card and cache pin are off (the oracle needs no memory aid). Being a
view, it never changes what the graph stores. It records what it decided per request, so
``oracle_cached`` can price other clearing schedules of the same run.

Known limits (a bound by construction, not a model of a real agent): a value is matched
as a token, not by meaning; a later result that repeats a value does not release an
earlier one ahead of time; subagents run without the oracle (their requests are small).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from simagent.agent.scripted import call_step, out_indices
from simagent.context.clearing import INPUT_ARGS, apply_cleared, without_inputs
from simagent.context.counting import count_message
from simagent.context.placeholders import execution_of, raw_path_of
from simagent.context.recall import locate, request_text

#: What counts as a value a later step can only have taken from a result.
_VALUE = re.compile(r"(?<![\w.])-?(?:\d+\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\d{4,})(?![\w])"
                    r"|[\w./-]+\.(?:csv|txt|log|json|npz|npy|png|dat|h5|out|yaml|toml|md)\b")
#: How much of a raw output file the probe check reads (the kernel caps files far above).
RAW_READ_CHARS = 20_000_000
_DEFINES = re.compile(r"^\s*(?:def|class)\s+([A-Za-z_]\w*)", re.M)


def values(text: str) -> set[str]:
    """The distinctive values in ``text``: file names, and numbers of 3+ significant
    digits (``0.04`` or ``1e-6`` recur by chance; ``3.217`` rarely does)."""
    return {v for v in _VALUE.findall(text)
            if not v[-1].isdigit() or len(re.sub(r"[eE].*", "", v).strip("-0.")
                                          .replace(".", "")) >= 3}


def _calls(step: dict[str, Any]) -> list[dict[str, Any]]:
    return step.get("tools") or ([step] if "tool" in step else [])


def step_text(step: dict[str, Any]) -> str:
    """Everything a step sends: its words, its answer and its calls' arguments."""
    parts = [str(step.get("say", "")), str(step.get("final", ""))]
    parts += [json.dumps(c.get("args", {}), ensure_ascii=False) for c in _calls(step)]
    return "\n".join(p for p in parts if p)


@dataclass
class Script:
    """What the oracle knows of a workflow's main conversation, computed once."""

    main: list[int]  # flattened indices of the main agent's steps
    novel: dict[int, set[str]]  # step -> values it writes first
    refs: dict[int, list[tuple[int, int]]]  # step -> (step, call) its {out[i]} resolve to
    callers: dict[tuple[int, int], int]  # (step, call) whose code defines -> last caller
    #: step -> results that must stand in the request, in place, for its ``{out[i]}`` to
    #: name the same one (``i`` counts positions: from the end, or from the start)
    spans: dict[int, set[tuple[int, int]]] = field(default_factory=dict)

    @classmethod
    def of(cls, prompt: str, steps: Sequence[dict[str, Any]],
           inside: Iterable[int] = ()) -> Script:
        skip = set(inside)
        main = [i for i in range(len(steps)) if i not in skip]
        known = values(prompt)
        novel: dict[int, set[str]] = {}
        refs: dict[int, list[tuple[int, int]]] = {}
        outs: list[tuple[int, int]] = []  # main tool results so far, in order
        defined: dict[str, tuple[int, int]] = {}
        callers: dict[tuple[int, int], int] = {}
        spans: dict[int, set[tuple[int, int]]] = {}
        for i in main:
            step = steps[i]
            text = step_text(step)
            mine = values(text)
            novel[i] = mine - known
            known |= mine
            templated = [str(step.get("final", ""))] + [
                json.dumps(c.get("args", {})) for c in _calls(step)
                if step.get("fill") or c.get("fill")]
            got, span = [], set()
            for k in (k for t in templated for k in out_indices(t)):
                if -len(outs) <= k < len(outs):
                    got.append(outs[k])
                    span |= set(outs[k:] if k < 0 else outs[:k + 1])
            refs[i], spans[i] = got, span
            for name, where in defined.items():
                if re.search(rf"\b{re.escape(name)}\s*\(", text):
                    callers[where] = i
            for j, c in enumerate(_calls(step)):
                code = (c.get("args") or {}).get(INPUT_ARGS.get(c.get("tool", ""), ""), "")
                for name in _DEFINES.findall(code if isinstance(code, str) else ""):
                    defined[name] = (i, j)
                outs.append((i, j))
        return cls(main, novel, refs, callers, spans)


def call_key(call_id: str) -> tuple[int, int] | None:
    """(step, call) of a scripted call id ``call_<tag>_<step>_<j>``."""
    step = call_step(call_id)
    if step is None:
        return None
    tail = call_id.rsplit("_", 1)[-1]
    return (step, int(tail)) if tail.isdigit() else None


@dataclass
class Decision:
    """What the oracle cleared in one request, and what it saw."""

    messages: list[BaseMessage]
    results: frozenset[str]
    inputs: frozenset[str]
    restored: frozenset[str] = frozenset()
    #: AI messages (by their first call id) whose words are left out
    texts: frozenset[str] = frozenset()
    #: calls that left the view with their results (nothing later needs them, not even
    #: in place)
    dropped: frozenset[str] = frozenset()
    #: calls whose code shows only the definitions a later step calls
    signed: frozenset[str] = frozenset()


def words_of(msg: BaseMessage) -> str | None:
    """The first call id of an AI message that has words besides its calls."""
    if isinstance(msg, AIMessage) and msg.tool_calls and isinstance(msg.content, str) \
            and msg.content.strip():
        return msg.tool_calls[0].get("id") or None
    return None


#: What a cleared result or code becomes when nothing later needs it back: the oracle
#: knows no step reads it again, so it needs no path (one holding a probe fact keeps
#: simagent's pointer to its file).
BARE_RESULT, BARE_INPUT = "[cleared]", "# cleared"


def oracle_view(messages: Sequence[BaseMessage], results: Iterable[str],
                inputs: Iterable[str], texts: Iterable[str] = (),
                probes: Sequence[str] = (), dropped: Iterable[str] = (),
                signed: Iterable[str] = ()) -> list[BaseMessage]:
    """``messages`` with ``results`` and ``inputs`` cleared, the words of the AI
    messages in ``texts`` left out (calls keep their ids, so results still pair) and the
    calls in ``dropped`` gone with their results (an AI message left empty goes too), and
    the code of the calls in ``signed`` cut to its signatures (:func:`signatures`). A
    result holding a probe fact becomes simagent's own pointer (``context.clearing``); the
    rest become :data:`BARE_RESULT` and :data:`BARE_INPUT`."""
    results, inputs, drop = frozenset(results), frozenset(inputs), frozenset(texts)
    gone = frozenset(dropped)
    pointed = frozenset(m.tool_call_id for m in messages if isinstance(m, ToolMessage)
                        and m.tool_call_id in results and any(_holds(m, f) for f in probes))
    out = apply_cleared(messages, pointed, inputs & pointed)
    bare_inputs = {c: BARE_INPUT for c in inputs - pointed}
    bare_inputs |= {c.get("id"): signatures(_code_of(c)) for m in messages
                    if isinstance(m, AIMessage) for c in m.tool_calls
                    if c.get("id") in frozenset(signed) - inputs}
    for i, m in enumerate(out):
        if isinstance(m, ToolMessage) and m.tool_call_id in results - pointed:
            meta = {**(m.response_metadata or {}),
                    "context_editing": {"cleared": True, "strategy": "oracle"}}
            out[i] = m.model_copy(update={"content": BARE_RESULT, "artifact": None,
                                          "response_metadata": meta})
        elif isinstance(m, AIMessage):
            if bare_inputs and any(c.get("id") in bare_inputs for c in m.tool_calls):
                m = without_inputs(m, bare_inputs)
            if drop and words_of(m) in drop:
                m = m.model_copy(update={"content": ""})
            if gone and any(c.get("id") in gone for c in m.tool_calls):
                m = _without_calls(m, gone)
            out[i] = m
    return [m for m in out if not _vanished(m, gone)]


def _code_of(call: dict[str, Any]) -> str:
    code = (call.get("args") or {}).get(INPUT_ARGS.get(call.get("name", ""), ""), "")
    return code if isinstance(code, str) else ""


def signatures(code: str) -> str:
    """What a later call of a function or class defined in ``code`` needs of it: the
    ``def``/``class`` headers (a header spanning lines whole), the bodies cleared."""
    lines, out, open_header = code.splitlines(), [], False
    for line in lines:
        if _DEFINES.match(line) or open_header:
            out.append(line)
            open_header = not line.rstrip().endswith(":")
    return "# code cleared from view; its definitions:\n" + "\n".join(out)


def _vanished(m: BaseMessage, gone: frozenset[str]) -> bool:
    if isinstance(m, ToolMessage):
        return m.tool_call_id in gone
    return bool(gone) and isinstance(m, AIMessage) and not m.tool_calls and not m.text.strip()


def _without_calls(msg: AIMessage, gone: frozenset[str]) -> AIMessage:
    """``msg`` without the calls in ``gone``, in every form a converter might resend."""
    def kept(block: Any) -> bool:
        return not (isinstance(block, dict)
                    and (block.get("id") in gone or block.get("call_id") in gone)
                    and block.get("type") in ("tool_use", "tool_call", "function_call"))

    update: dict[str, Any] = {"tool_calls": [c for c in msg.tool_calls
                                             if c.get("id") not in gone]}
    if isinstance(msg.content, list):
        update["content"] = [b for b in msg.content if kept(b)]
    raw = msg.additional_kwargs.get("tool_calls")
    if isinstance(raw, list):
        update["additional_kwargs"] = {**msg.additional_kwargs, "tool_calls": [
            c for c in raw if not (isinstance(c, dict) and c.get("id") in gone)]}
    return msg.model_copy(update=update)


@dataclass
class OraclePlan:
    script: Script
    probes: tuple[str, ...]
    #: (request text) -> probe facts lost in it; given by the run (needs its folders)
    lost: Callable[[str, Sequence[str]], list[str]] | None = None
    decisions: list[Decision] = field(default_factory=list)
    _values: dict[str, set[str]] = field(default_factory=dict)
    _saving: dict[tuple[str, str], bool] = field(default_factory=dict)
    _sources: dict[str, frozenset[str]] = field(default_factory=dict)
    _paths: dict[tuple[str, str], int] = field(default_factory=dict)

    def _vals(self, msg: ToolMessage) -> set[str]:
        got = self._values.get(msg.tool_call_id)
        if got is None:
            got = self._values[msg.tool_call_id] = values(msg.text)
        return got

    def _saves(self, messages: Sequence[BaseMessage], kind: str, cid: str) -> bool:
        got = self._saving.get((kind, cid))
        if got is None:
            result = next(m for m in messages if isinstance(m, ToolMessage)
                          and m.tool_call_id == cid)
            call = next(m for m in messages if isinstance(m, AIMessage)
                        and any(c.get("id") == cid for c in m.tool_calls))
            if kind == "result":
                after = oracle_view([result], {cid}, (), probes=self.probes)[0]
                got = count_message(after) < count_message(result)
            elif kind == "signed":
                after = oracle_view([call], (), (), signed={cid})[0]
                got = count_message(after) < count_message(call)
            else:
                after = oracle_view([call, result], {cid}, {cid}, probes=self.probes)[0]
                got = count_message(after) < count_message(call)
            self._saving[(kind, cid)] = got
        return got

    def _probe_source(self, messages: Sequence[BaseMessage], cid: str) -> frozenset[str]:
        """The probe facts the call ``cid`` or its result holds (it keeps a pointer)."""
        got = self._sources.get(cid)
        if got is None:
            pair = _pair_of(messages, cid)
            got = self._sources[cid] = frozenset(f for f in self.probes
                                                 if any(_holds(m, f) for m in pair))
        return got

    def _named_sources(self, messages: Sequence[BaseMessage], ids: Sequence[str]
                       ) -> tuple[frozenset[str], frozenset[str]]:
        """For each probe fact no call or result holds verbatim, the latest call whose
        arguments (else its result) name a file holding it (recall follows paths): (calls
        that stay, code and all; results that stay too)."""
        calls: set[str] = set()
        results: set[str] = set()
        if self.lost is None or not self.probes:
            return frozenset(), frozenset()
        for fact in self.probes:
            if any(fact in self._probe_source(messages, i) for i in ids):
                continue
            for cid in reversed(ids):
                found = self._paths.get((cid, fact))
                if found is None:
                    pair = _pair_of(messages, cid)
                    where = [m for m in pair if isinstance(m, AIMessage)], pair
                    found = self._paths[(cid, fact)] = next(
                        (k for k, part in enumerate(where)
                         if not self.lost(request_text(part), [fact])), -1)
                if found >= 0:
                    calls.add(cid)
                    if found:
                        results.add(cid)
                    break
        return frozenset(calls), frozenset(results)

    def needed(self, messages: Sequence[BaseMessage]) -> tuple[set[str], set[str], set[str]]:
        """(result ids, defining calls) the requests from here on need in view (results in
        full, definitions as their signatures), and the results that must stay in place (as
        a mark at least) for a later ``{out[i]}`` to count to the right one."""
        keys = {m.tool_call_id: call_key(m.tool_call_id) for m in messages
                if isinstance(m, ToolMessage)}
        last_ai = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
        fresh = {c.get("id") for c in (last_ai.tool_calls if last_ai else [])}
        seen = [k[0] for k in keys.values() if k is not None]
        nxt = max(seen, default=-1) + 1
        future = [i for i in self.script.main if i >= nxt]
        results = {cid for cid, k in keys.items() if k is None or cid in fresh}
        by_key = {k: cid for cid, k in keys.items() if k is not None}
        for i in future:
            results |= {by_key[r] for r in self.script.refs.get(i, ()) if r in by_key}
        wanted = set().union(*(self.script.novel.get(i, set()) for i in future)) \
            if future else set()
        order = [m for m in messages if isinstance(m, ToolMessage)]
        for v in wanted:
            holder = next((m for m in reversed(order) if v in self._vals(m)), None)
            if holder is not None:
                results.add(holder.tool_call_id)
        inputs = {by_key[k] for k, last in self.script.callers.items()
                  if k in by_key and last >= nxt}
        placed = {by_key[k] for i in future for k in self.script.spans.get(i, ())
                  if k in by_key}
        return results, inputs, placed | results

    def view(self, messages: list[BaseMessage], final: bool) -> list[BaseMessage]:
        ids = [m.tool_call_id for m in messages if isinstance(m, ToolMessage)]
        keep_results, defs, placed = self.needed(messages)
        # a call nothing needs again, not even in place, leaves with its result (a summary
        # drops it too); one holding a probe fact stays as a pointer
        named, named_results = self._named_sources(messages, ids)
        dropped = frozenset(i for i in ids if i not in placed | defs | named
                            and call_key(i) is not None and not self._probe_source(messages, i))
        results = frozenset(i for i in ids if i not in keep_results | named_results
                            and i not in dropped)
        # code: the latest reply's stays; a definition a later step calls keeps its
        # signatures (what a call needs); the rest is cleared (its result says what it did)
        last_ai = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
        keep_code = {c.get("id") for c in (last_ai.tool_calls if last_ai else [])} | {
            i for i in ids if call_key(i) is None} | named
        signed = frozenset(i for i in ids if i in defs and i not in keep_code)
        inputs = frozenset(i for i in ids if i not in keep_code | defs | dropped
                           and _has_execution(messages, i))
        # a pointer longer than what it replaces (a short result, a one-line cell) stays out
        results = frozenset(i for i in results if self._saves(messages, "result", i))
        inputs = frozenset(i for i in inputs if self._saves(messages, "input", i))
        signed = frozenset(i for i in signed if self._saves(messages, "signed", i))
        # the model's own earlier words: what it wrote, it knows (a summary drops them too);
        # the latest reply's stay
        ais = [m for m in messages if isinstance(m, AIMessage)]
        texts = frozenset(t for m in ais[:-1] if (t := words_of(m)))
        out = oracle_view(messages, results, inputs, texts, self.probes, dropped, signed)
        restored: set[str] = set()
        if final and self.lost is not None and self.probes:
            out, results, inputs, texts, restored = self._keep_probes(
                messages, out, results, inputs, texts, dropped, signed)
        self.decisions.append(Decision(list(messages), results, inputs, frozenset(restored),
                                       texts, dropped, signed))
        return out

    def _keep_probes(self, messages: list[BaseMessage], out: list[BaseMessage],
                     results: frozenset[str], inputs: frozenset[str],
                     texts: frozenset[str], dropped: frozenset[str],
                     signed: frozenset[str]) -> tuple[Any, ...]:
        """Un-clear the latest result (or code, or words) holding each probe fact the
        pointers lose."""
        assert self.lost is not None
        restored: set[str] = set()
        for fact in self.lost(request_text(out), self.probes):
            holder = next((m for m in reversed(messages) if _holds(m, fact)
                           and _id_of(m) in results | inputs | texts), None)
            if holder is None:
                continue
            cid = _id_of(holder)
            restored.add(cid)
            results, inputs, texts = results - {cid}, inputs - {cid}, texts - {cid}
            out = oracle_view(messages, results, inputs, texts, self.probes, dropped, signed)
        return out, results, inputs, texts, restored


def _pair_of(messages: Sequence[BaseMessage], cid: str) -> list[BaseMessage]:
    """The AI message carrying call ``cid`` and its result."""
    return [m for m in messages if (isinstance(m, ToolMessage) and m.tool_call_id == cid)
            or (isinstance(m, AIMessage) and any(c.get("id") == cid for c in m.tool_calls))]


def _id_of(m: BaseMessage) -> str:
    if isinstance(m, ToolMessage):
        return m.tool_call_id
    return next((c.get("id") or "" for c in getattr(m, "tool_calls", [])), "")


def _holds(m: BaseMessage, fact: str) -> bool:
    if isinstance(m, ToolMessage):  # what it showed, or its full output on disk
        shown = m.content if isinstance(m.content, str) else m.text
        return _shows(shown, raw_path_of(m), fact)
    return isinstance(m, AIMessage) and (fact in m.text or any(
        fact in json.dumps(c.get("args", {}), ensure_ascii=False) for c in m.tool_calls))


@functools.lru_cache(maxsize=8192)
def _shows(text: str, path: str | None, fact: str) -> bool:
    """Memo of :func:`_holds` for results (the same texts are asked about on every view
    of every request; raw files are written once): a search of a long file each time was
    most of the oracle-cached repricing."""
    return fact in text or fact in _raw_text(path)


@functools.lru_cache(maxsize=256)
def _raw_text(path: str | None) -> str:
    """A result's full output file (capped or evicted results show only part of it)."""
    if not path:
        return ""
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")[:RAW_READ_CHARS]
    except OSError:
        return ""


def _has_execution(messages: Sequence[BaseMessage], cid: str) -> bool:
    return any(isinstance(m, ToolMessage) and m.tool_call_id == cid
               and execution_of(m) is not None for m in messages)


class OracleMiddleware(AgentMiddleware):
    """Applies :class:`OraclePlan` to every main-agent request (state untouched)."""

    def __init__(self, plan: OraclePlan, steps: Sequence[dict[str, Any]]) -> None:
        super().__init__()
        self.plan = plan
        self.tool_steps = [i for i in plan.script.main if _calls(steps[i])]

    @property
    def name(self) -> str:
        return "PolicyView[oracle]"

    def _rewrite(self, request: Any) -> Any:
        messages = list(request.messages)
        seen = [k for m in messages if isinstance(m, ToolMessage)
                and (k := call_step(m.tool_call_id)) is not None]
        nxt = max(seen, default=-1) + 1
        final = not any(i >= nxt for i in self.tool_steps)  # only words and the answer left
        return request.override(messages=self.plan.view(messages, final))

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return handler(self._rewrite(request))

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return await handler(self._rewrite(request))


def oracle_middleware(wf: Any, roots: Callable[[], list[Path]],
                      outputs: Callable[[], Path | None] = lambda: None
                      ) -> tuple[OracleMiddleware, OraclePlan]:
    """The oracle for workflow ``wf``; ``roots`` gives the folders recall follows paths in,
    ``outputs`` the folder ``_out[n]`` handles read (the same pointers simagent is scored by)."""
    def lost(text: str, facts: Sequence[str]) -> list[str]:
        where, folder = roots(), outputs()
        return [f for f in facts if locate(f, text, where, outputs=folder).status == "lost"]

    plan = OraclePlan(Script.of(wf.prompt, wf.steps, wf.subagent_steps),
                      tuple(p.fact for p in wf.probes), lost)
    return OracleMiddleware(plan, wf.steps), plan
