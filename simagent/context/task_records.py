"""Task records: the typed record a finished task is closed with (``/done``, ``mark_task_done``).

A task checkpoint replaces the finished task's messages with a six-section summary; the
*task record* is the same hand-over as data (:class:`~simagent.records.TaskRecord`: the
answer, key values with units, files read and written, assumptions, open questions), so
it can be validated, listed, diffed across runs and graded by the bench.

Two sources, one record:

* ``mark_task_done`` (the model) files the record as typed tool arguments, checked by
  :func:`~simagent.records.problems` (a bad record goes back to the model as a tool error);
* ``/done`` (the user) makes no model call, so :func:`derive` builds the record from the
  finished task's messages alone: the last conclusion, the numbers with units in it, the
  files its tool calls read and wrote.

:func:`close_task` writes the checkpoint and the record together: the record is rendered
into the boundary message the model sees next, kept in the boundary (graph state), and
appended to the session's ``tasks.jsonl``; the ``context_checkpoint`` trace event carries
it too, which is what ``simagent context`` lists and the bench grades
(:func:`records_from_events`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from pydantic import ValidationError

from simagent.context.counting import is_user_message
from simagent.jsonl import append_jsonl, read_jsonl
from simagent.paths import private_dir, private_opener
from simagent.records import KeyValue, TaskRecord, files_read, format_value, problems
from simagent.trace.redact import redact_data

if TYPE_CHECKING:
    from simagent.context.compaction import Compaction, Compactor

#: The tool the model files a record with (the one home of its name).
MARK_TASK_DONE = "mark_task_done"
#: ``source`` of a record by who closed the task.
FROM_COMMAND, FROM_TOOL = "/done", MARK_TASK_DONE
MAX_KEY_VALUES = 12
ANSWER_CHARS = 4_000  # stored; the boundary message shows less
_SHOWN_ANSWER_CHARS = 1_200

_NUM = r"[-+]?(?:\d+(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?"
#: Space between a number and its unit: models also write no-break and thin spaces.
_SP = r"[ \t\u00a0\u202f\u2009]"
#: How an uncertainty is written between a value and its unit (``2.6753 +/- 0.0123 ms``);
#: the ledger reads numbers with the same signs.
PLUS_MINUS = r"(?:±|\+/-|\+-|\+/\u2212)"
#: The uncertainty is skipped, so the unit after it stays the value's.
_PLUS_MINUS = rf"(?:{_SP}*{PLUS_MINUS}{_SP}*{_NUM})?"
_KV = re.compile(r"(?P<name>[A-Za-z][\w()/-]*(?:[ \t]+[A-Za-z][\w()/-]*){0,5})[ \t]*"
                 r"(?:=|:|≈|~|\bis\b|\bwas\b|\bare\b|\bof\b)[ \t]*"
                 rf"(?P<value>{_NUM})(?![\w.]*\d)(?!{_SP}*[*/+^×-]{_SP}*\d)"
                 rf"{_PLUS_MINUS}(?:{_SP}*(?P<unit>[^\s,;()]+))?")
_UNIT = re.compile(r"^(?:1/)?[A-Za-zµμΩ°%Å][\w/^*.·µμΩ°%Å·-]{0,15}$")
#: Words that end a name (articles, verbs) or cannot be units (prose after a number).
_STOP = frozenset({
    "a", "an", "the", "and", "or", "of", "in", "at", "on", "to", "for", "from", "by",
    "with", "as", "is", "was", "are", "were", "be", "this", "that", "these", "those",
    "which", "when", "while", "after", "before", "than", "then", "so", "but", "vs", "per",
    "its", "it", "we", "our", "final", "result", "results", "value", "values", "about",
    "around", "roughly", "approximately", "nearly", "times", "found", "gives", "gave",
    "got", "give", "yields", "yield", "reached", "reaches", "here", "there", "also", "both",
    "each", "all"})
_FIGURE = re.compile(r"^\[figure fig-\w+")
_WRITE_CALL = re.compile(
    r"\.(?:savefig|to_csv|to_parquet|to_json|to_excel|to_hdf|to_netcdf|to_pickle|"
    r"savez|savez_compressed|savetxt|save)\(\s*"
    r"(?:[\w.]+\s*,\s*)?[rf]?['\"](?P<path>[^'\"\n]+\.\w{1,8})['\"]")
_READ_CALL = re.compile(
    r"(?:read_csv|read_parquet|read_json|read_excel|read_hdf|loadtxt|genfromtxt|"
    r"load|read_text|read_bytes|open_dataset)\(\s*[rf]?['\"](?P<path>[^'\"\n]+\.\w{1,8})['\"]")
_OPEN = re.compile(r"\bopen\(\s*[rf]?['\"](?P<path>[^'\"\n]+)['\"]\s*(?:,\s*['\"](?P<mode>\w+)"
                   r"['\"])?")
_PATH_IO = re.compile(r"Path\(\s*[rf]?['\"](?P<path>[^'\"\n]+)['\"]\s*\)\."
                      r"(?P<op>write|read)_(?:text|bytes)\(")
_WRITE_TOOLS = ("write_file", "edit_file")


# ------------------------------------------------------------------- pure parts
def key_values_in(text: str, limit: int = MAX_KEY_VALUES) -> list[KeyValue]:
    """Named numbers in prose (``capacity is 5.02 A.h``, ``T = 298 K``), first per name."""
    found: dict[str, KeyValue] = {}
    for m in _KV.finditer(text.replace("**", "").replace("`", "")):
        words = m.group("name").split()
        while words and words[-1].lower() in _STOP:  # "... is about" names nothing
            words.pop()
        cut = max((i + 1 for i, w in enumerate(words) if w.lower() in _STOP), default=0)
        words = words[cut:][-3:]
        if not words:
            continue
        name = " ".join(words)
        unit = (m.group("unit") or "").rstrip(".)")
        if not _UNIT.match(unit) or unit.lower() in _STOP or (
                unit.isalpha() and unit.islower() and len(unit) > 8):
            unit = ""
        raw = m.group("value")
        value: float | int = float(raw) if any(c in raw for c in ".eE") else int(raw)
        found.setdefault(name.lower(), KeyValue(name=name, value=value, unit=unit))
        if len(found) >= limit:
            break
    return list(found.values())


def _failed(messages: Sequence[BaseMessage]) -> set[str]:
    return {m.tool_call_id for m in messages if isinstance(m, ToolMessage) and (
        m.status == "error" or m.text.startswith(("Error:", "Error "))
        or (isinstance(m.artifact, dict) and m.artifact.get("status") not in (None, "ok")))}


def _calls(messages: Sequence[BaseMessage], failed: set[str]) -> Iterable[dict[str, Any]]:
    for msg in messages:
        if isinstance(msg, AIMessage):
            yield from (c for c in msg.tool_calls if c.get("id") not in failed)


def files_touched(messages: Sequence[BaseMessage]) -> tuple[list[str], list[str]]:
    """(read, written) paths, in order: file tools, figures the kernel saved, and the
    literal paths that kernel code passed to common readers and writers."""
    failed = _failed(messages)
    read: dict[str, None] = dict.fromkeys(files_read(messages))
    written: dict[str, None] = {}
    for call in _calls(messages, failed):
        args = call.get("args") or {}
        if call.get("name") in _WRITE_TOOLS and isinstance(args.get("file_path"), str):
            written.setdefault(args["file_path"], None)
        code = args.get("code") if call.get("name") == "run_python" else None
        if not isinstance(code, str):
            continue
        for m in _WRITE_CALL.finditer(code):
            written.setdefault(m.group("path"), None)
        for m in _READ_CALL.finditer(code):
            read.setdefault(m.group("path"), None)
        for m in _PATH_IO.finditer(code):
            (written if m.group("op") == "write" else read).setdefault(m.group("path"), None)
        for m in _OPEN.finditer(code):
            target = written if set(m.group("mode") or "r") & set("wax") else read
            target.setdefault(m.group("path"), None)
    for msg in messages:
        if isinstance(msg, ToolMessage) and msg.name == "run_python":
            for line in msg.text.splitlines():
                if _FIGURE.match(line) and ": " in line and "]" in line:
                    written.setdefault(line[line.rindex(": ") + 2:line.rindex("]")], None)
    return list(read), list(written)


def derive(messages: Sequence[BaseMessage], *, source: str = FROM_COMMAND,
           note: str | None = None) -> TaskRecord:
    """The record of a finished task from its messages alone (no model call)."""
    asks = [m.text.strip() for m in messages if is_user_message(m) and m.text.strip()]
    answer = next((m.text.strip() for m in reversed(messages)
                   if isinstance(m, AIMessage) and m.text.strip()), "")
    read, written = files_touched(messages)
    task = asks[0][:600] if asks else ""
    if len(asks) > 1:
        task += f" (+{len(asks) - 1} later request{'s' if len(asks) > 2 else ''})"
    return TaskRecord(task=task, answer=answer[:ANSWER_CHARS] or "(no conclusion was stated)",
                      key_values=key_values_in(answer), files_read=read, files_written=written,
                      note=note or "", source=source)


def filed_record(args: Mapping[str, Any]) -> tuple[TaskRecord | None, list[str]]:
    """A record from ``mark_task_done`` arguments, or None and what to fix."""
    try:
        record = TaskRecord.model_validate({**args, "source": FROM_TOOL})
    except ValidationError as exc:
        return None, [f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors()]
    found = problems(record)
    return (None, found) if found else (record, [])


def merge(derived: TaskRecord, filed: TaskRecord | None) -> TaskRecord:
    """The model's record where it filed one; what really happened is added to it.

    As with subagent reports, files read and written always include what the tool calls
    show, whatever the record claimed; derived key values fill in only when none was filed.
    """
    if filed is None:
        return derived
    source = derived.source if derived.source == FROM_TOOL else f"{derived.source} + {FROM_TOOL}"
    return filed.model_copy(update={
        "task": filed.task or derived.task,
        "key_values": filed.key_values or derived.key_values,
        "files_read": list(dict.fromkeys([*filed.files_read, *derived.files_read])),
        "files_written": list(dict.fromkeys([*filed.files_written, *derived.files_written])),
        "note": derived.note, "source": source})


def render(record: TaskRecord) -> str:
    """The compact text the model sees after the checkpoint (empty fields left out)."""
    answer = record.answer
    if len(answer) > _SHOWN_ANSWER_CHARS:
        answer = answer[:_SHOWN_ANSWER_CHARS] + " […]"
    rows = [("task", record.task), ("note", record.note), ("answer", answer),
            ("key values", "; ".join(format_value(kv) for kv in record.key_values)),
            ("files read", ", ".join(record.files_read)),
            ("files written", ", ".join(record.files_written)),
            ("assumptions", "; ".join(record.assumptions)),
            ("open questions", "; ".join(record.open_questions))]
    body = "\n".join(f"{k}: {v}" for k, v in rows if v)
    return f'<task_record source="{record.source}">\n{body}\n</task_record>'


def with_record(message: HumanMessage, record: TaskRecord) -> HumanMessage:
    """The checkpoint's boundary message with the record appended (same kind, same id)."""
    return HumanMessage(content=f"{message.text}\n\n{render(record)}",
                        additional_kwargs=dict(message.additional_kwargs), id=message.id)


@dataclass(frozen=True)
class Filed:
    """One task record as a run left it: ``written`` False for a record the model filed
    whose checkpoint never came (the run ended first)."""

    ts: str
    record: TaskRecord
    written: bool = True


def records_from_events(events: Iterable[Any]) -> list[Filed]:
    """The main agent's task records, in order, from trace events (``.ts, .kind, .payload``).

    Written records come from ``context_checkpoint`` events (a checkpoint whose model call
    failed is written again at the next turn: the same record at the same cutoff counts
    once, with its later time); a valid ``mark_task_done`` call with no checkpoint after
    it (a run that ended on it) counts as filed, unwritten.
    """
    events = list(events)
    failed = {e.payload.get("tool_call_id") for e in events if e.kind == "tool_result"
              and e.payload.get("status") == "error"}
    out: dict[tuple[Any, str], Filed] = {}
    pending: Filed | None = None
    for ev in events:
        p = ev.payload if isinstance(ev.payload, dict) else {}
        if (p.get("agent") or "main") != "main":
            continue
        if ev.kind == "tool_call" and p.get("name") == MARK_TASK_DONE and \
                p.get("id") not in failed and isinstance(p.get("args"), dict):
            record, _ = filed_record(p["args"])
            pending = Filed(ev.ts, record, written=False) if record else pending
        elif ev.kind == "context_checkpoint" and isinstance(p.get("record"), dict):
            try:
                key = (p.get("cutoff_index"), json.dumps(p["record"], sort_keys=True))
                out[key] = Filed(ev.ts, TaskRecord.model_validate(p["record"]))
            except ValidationError:
                continue
            pending = None
    return [*out.values(), *([pending] if pending else [])]


#: Record fields a bench scorer can name (``key_values.<name>`` for one key value).
GRADED_FIELDS = ("task", "answer", "key_values", "files_read", "files_written", "assumptions",
                 "open_questions")


def check_record(record: TaskRecord, field: str, *, expected: float | None = None,
                 unit: str | None = None, contains: str | None = None,
                 rel_tol: float = 1e-6, abs_tol: float = 0.0) -> tuple[bool, str]:
    """Grade one field of a record: ``(ok, detail)``; the bench's ``task_record`` scorer.

    ``key_values.<name>`` (name case-insensitive) must exist, and match ``expected``
    within the tolerances and ``unit`` exactly when given; a text or list field must be
    non-empty, or contain ``contains`` (a list: in some item).
    """
    top, _, key = field.partition(".")
    if top == "key_values" and key:
        kv = next((k for k in record.key_values if k.name.strip().lower() == key.lower()), None)
        if kv is None:
            names = ", ".join(k.name for k in record.key_values) or "none"
            return False, f"no key value {key!r} (has: {names})"
        if unit is not None and kv.unit != unit:
            return False, f"{format_value(kv)}: unit {kv.unit!r}, expected {unit!r}"
        if expected is not None:
            try:
                got = float(kv.value)
            except (TypeError, ValueError):
                return False, f"{format_value(kv)} is not a number"
            ok = math.isclose(got, float(expected), rel_tol=rel_tol, abs_tol=abs_tol)
            return ok, f"{format_value(kv)} vs expected {float(expected):g}"
        return True, format_value(kv)
    value = getattr(record, top, None) if top in GRADED_FIELDS and not key else None
    if value is None:
        return False, f"unknown field {field!r} (fields: {', '.join(GRADED_FIELDS)})"
    items = [value] if isinstance(value, str) else [
        format_value(v) if isinstance(v, KeyValue) else str(v) for v in value]
    if contains is not None:
        ok = any(contains in item for item in items)
        return ok, f"{field} {'contains' if ok else 'lacks'} {contains!r}"
    ok = any(item.strip() for item in items)
    return ok, f"{field} {'is set' if ok else 'is empty'}"


# ------------------------------------------------------------------- the shell
def append_record(path: Path, row: Mapping[str, Any]) -> None:
    """One JSON line per closed task in the session's ``tasks.jsonl``."""
    private_dir(path.parent)
    append_jsonl(path, json.dumps(redact_data(row), ensure_ascii=False), opener=private_opener)


def read_records(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``tasks.jsonl`` (an unreadable line is skipped, never fatal)."""
    return read_jsonl(path)


def pending_record(pending: Mapping[str, Any] | None) -> TaskRecord | None:
    """The record a ``mark_task_done`` left pending in graph state (older sessions left
    a ``detail`` string, read as the answer)."""
    if not pending:
        return None
    if isinstance(pending.get("record"), dict):
        try:
            return TaskRecord.model_validate(pending["record"])
        except ValidationError:
            return None
    detail = pending.get("detail")
    return TaskRecord(answer=str(detail), source=FROM_TOOL) if detail else None


def close_task(compactor: Compactor, messages: Sequence[BaseMessage],
               boundary: dict[str, Any] | None, cut: int, *, source: str,
               note: str | None = None, filed: TaskRecord | None = None,
               store: Path | None = None) -> Compaction | None:
    """Write a task checkpoint and its record; None when there is nothing to close.

    The record is made from exactly the messages the checkpoint takes from view, rendered
    into the boundary message, kept in the boundary as data and appended to ``store``.
    """
    done = compactor.checkpoint(messages, boundary, cut, note=note, how=source)
    if done is None:
        return None
    end = int(done.boundary["cutoff"])
    record = merge(derive(messages[end - done.dropped:end], source=source, note=note), filed)
    done.boundary["message"] = with_record(done.boundary["message"], record)
    done.boundary["record"] = record.model_dump()
    if store is not None:
        append_record(store, {"ts": datetime.now(UTC).isoformat(timespec="seconds"),
                              "history": str(done.path), "cutoff": end,
                              "record": done.boundary["record"]})
    return done


__all__ = ["FROM_COMMAND", "FROM_TOOL", "GRADED_FIELDS", "MARK_TASK_DONE", "Filed",
           "append_record", "check_record", "close_task", "derive", "filed_record",
           "files_touched", "key_values_in", "merge", "pending_record", "read_records",
           "records_from_events", "render", "with_record"]
