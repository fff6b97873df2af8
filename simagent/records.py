"""Typed work records: what a finished piece of work hands back, as data, not prose.

One shape serves every hand-over: a subagent ends with a :class:`Report` (its answer to
the delegated question), and a finished task is closed with a :class:`TaskRecord` (the
same fields plus what the task wrote; ``/done`` and ``mark_task_done``). Typed records
can be validated, diffed across runs and graded by the bench, which prose cannot.

Two forms of each part live here: pydantic models (the normalized record code handles)
and TypedDicts with field descriptions (the model-facing schema, which arrives as plain
dicts, so checkpointed graph state stays plain data). :func:`files_read` is the one
reading of which files an agent really read, shared by both kinds of record.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, NotRequired

from langchain_core.messages import AIMessage, ToolMessage
from pydantic import BaseModel, Field
from typing_extensions import TypedDict  # pydantic needs this one on Python < 3.12


class KeyValue(BaseModel):
    name: str
    value: float | int | str
    unit: str = ""


class Report(BaseModel):
    """The common record: the answer, the numbers that matter, the inputs, the caveats."""

    answer: str
    key_values: list[KeyValue] = []
    files_read: list[str] = []
    assumptions: list[str] = []
    open_questions: list[str] = []


class TaskRecord(Report):
    """A closed task: the common record plus its request and what it wrote.

    ``source`` says who closed it (``/done``, ``mark_task_done``, or both when the user's
    ``/done`` merged a record the model had filed); ``note`` is the user's ``/done`` note.
    """

    task: str = ""
    files_written: list[str] = []
    note: str = ""
    source: str = ""


class KeyValueArgs(TypedDict):
    name: Annotated[str, Field(description="What the number is, e.g. 'discharge capacity'.")]
    value: Annotated[float | int | str, Field(description="The value.")]
    unit: NotRequired[Annotated[str, Field(description="Its unit, e.g. 'A.h'; '' if "
                                                       "dimensionless.")]]


#: Numbers written as text with a unit glued on ("5.02 A.h"): the unit belongs in ``unit``.
_NUMBER_WITH_UNIT = re.compile(r"^\s*[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\s*(\S.*)$")


def problems(record: Report) -> list[str]:
    """What a filed record gets wrong, each as one fixable instruction (empty: valid).

    Types are the schema's job; this checks what a schema cannot say: an answer with
    content, named and unique key values, numbers that are numbers (a unit glued to the
    value, NaN), and non-empty paths.
    """
    out: list[str] = []
    if not record.answer.strip():
        out.append("`answer` is empty: state the outcome in a few sentences")
    seen: set[str] = set()
    for i, kv in enumerate(record.key_values):
        where = f"key_values[{i}]"
        name = kv.name.strip()
        if not name:
            out.append(f"{where}.name is empty: say what the number is")
        elif name.lower() in seen:
            out.append(f"{where}.name {name!r} repeats an earlier key value: give each a "
                       "distinct name")
        seen.add(name.lower())
        if isinstance(kv.value, float) and not math.isfinite(kv.value):
            out.append(f"{where}.value is {kv.value}: report a finite number, and what "
                       "failed in `open_questions`")
        elif isinstance(kv.value, str):
            glued = _NUMBER_WITH_UNIT.match(kv.value)
            if not kv.value.strip():
                out.append(f"{where}.value is empty")
            elif glued and not kv.unit:
                out.append(f"{where}.value {kv.value!r} mixes number and unit: give the "
                           f"number as `value` and {glued.group(1)!r} as `unit`")
    for field in ("files_read", "files_written", "assumptions", "open_questions"):
        items = getattr(record, field, None) or []
        if any(not str(x).strip() for x in items):
            out.append(f"`{field}` has an empty entry")
    return out


def format_value(kv: KeyValue | Mapping[str, Any]) -> str:
    """``name = value unit``, numbers in their shortest faithful form."""
    data = kv.model_dump() if isinstance(kv, BaseModel) else dict(kv)
    value = data.get("value")
    shown = f"{value:.6g}" if isinstance(value, float) else str(value)
    unit = str(data.get("unit") or "")
    return f"{data.get('name', '?')} = {shown}{' ' + unit if unit else ''}"


def files_read(messages: Sequence[Any]) -> list[str]:
    """Paths the agent really read with ``read_file`` (failed reads excluded), in order."""
    failed = {m.tool_call_id for m in messages
              if isinstance(m, ToolMessage) and (m.status == "error" or m.text.startswith(
                  ("Error:", "Error ")))}
    seen: dict[str, None] = {}
    for msg in messages:
        if isinstance(msg, AIMessage):
            for call in msg.tool_calls:
                if call.get("name") == "read_file" and call.get("id") not in failed:
                    path = (call.get("args") or {}).get("file_path")
                    if isinstance(path, str):
                        seen.setdefault(path, None)
    return list(seen)


__all__ = ["KeyValue", "KeyValueArgs", "Report", "TaskRecord", "files_read", "format_value",
           "problems"]
