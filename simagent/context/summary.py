"""Summaries and task records: offload first, then condense (design.md §7, layer 4 and /done).

Older messages are appended to ``conversation_history/<thread>.md`` *before* anything is
condensed, and every summary names that file, so whatever a summary leaves out is one
``read_file`` away. Two writers share one interface:

* :class:`ModelSummarizer` asks a chat model (the agent's, or a cheaper one from config)
  for a structured summary;
* :class:`ExtractiveSummarizer` needs no model: it lifts the user's requests, the
  assistant's conclusions, the files and the number-bearing lines out of the messages.
  It serves scripted and replay runs, emergencies (when the model is what just failed),
  and is the fallback when the summary model errors.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from simagent.context.counting import is_summary, is_user_message
from simagent.paths import private_dir, private_opener
from simagent.trace.redact import redact

SUMMARY_SECTIONS = ("Session intent", "Decisions and reasons", "Artifacts and files",
                    "Numbers that matter", "Next steps")
CHECKPOINT_SECTIONS = ("Task", "Files & changes", "Technical context", "Strategy & approach",
                       "Verification & next steps", "Where we are")
#: ``lc_source`` of the message each kind of boundary writes.
SOURCES = {"summary": "simagent_summary", "checkpoint": "simagent_checkpoint",
           "emergency": "simagent_emergency"}
#: Chars of one tool result shown to a summary model (head and tail).
RESULT_CHARS_FOR_SUMMARY = 2_000

_PROMPT = """You are condensing part of a working session between a scientist and an \
assistant that runs simulations in a persistent Python kernel. The messages below will be \
removed from the assistant's context and replaced by what you write, so keep everything \
the assistant needs to continue without re-doing work. Their full text stays on disk.

{purpose}
Write Markdown with exactly these sections, in this order:
{sections}
Be concrete: exact parameter values, results with units, file paths, function names, \
which approaches failed and why. No preamble.{focus}

<messages>
{messages}
</messages>"""
_SUMMARY_PURPOSE = ("Summarize the session so far as a handover to a teammate who "
                    "continues the work.")
_CHECKPOINT_PURPOSE = ("The task below is finished. Write its completion record, so the "
                       "next task starts clean while this one stays known.{note}")


class Summarizer(Protocol):
    name: str

    def __call__(self, messages: Sequence[BaseMessage], *, kind: str,
                 focus: str | None = None) -> str: ...


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit // 3
    return f"{text[:head]}\n[... {len(text) - limit:,} chars omitted ...]\n{text[-(limit - head):]}"


def render_for_summary(messages: Sequence[BaseMessage]) -> str:
    """Messages as compact tagged text; long tool results clipped (the file has them whole)."""
    out = []
    for msg in messages:
        if isinstance(msg, ToolMessage):
            out.append(f'<tool_result name="{msg.name or ""}">\n'
                        f"{_clip(msg.text, RESULT_CHARS_FOR_SUMMARY)}\n</tool_result>")
        elif isinstance(msg, AIMessage):
            calls = "".join(f'\n<tool_call name="{c["name"]}">{_clip(json.dumps(c["args"]), 1500)}'
                            "</tool_call>" for c in msg.tool_calls)
            out.append(f"<assistant>{msg.text}{calls}</assistant>")
        elif isinstance(msg, HumanMessage):
            tag = "previous_summary" if is_summary(msg) else "user"
            out.append(f"<{tag}>{msg.text}</{tag}>")
    return "\n".join(out)


def summary_prompt(messages: Sequence[BaseMessage], *, kind: str, focus: str | None = None) -> str:
    sections = CHECKPOINT_SECTIONS if kind == "checkpoint" else SUMMARY_SECTIONS
    if kind == "checkpoint":
        purpose = _CHECKPOINT_PURPOSE.format(note=f" The user's note: {focus}" if focus else "")
        focus_line = ""
    else:
        purpose = _SUMMARY_PURPOSE
        focus_line = f"\nGive most detail to: {focus}." if focus else ""
    return _PROMPT.format(purpose=purpose, focus=focus_line,
                          sections="\n".join(f"# {s}" for s in sections),
                          messages=render_for_summary(messages))


class ModelSummarizer:
    """A chat model writes the summary; on any failure the extractive one does."""

    def __init__(self, model: Any, name: str = "model", *,
                 on_usage: Callable[[str, dict[str, Any] | None], None] | None = None) -> None:
        self.model = model
        self.name = name
        self.on_usage = on_usage  # (model name, usage_metadata): the ledger and trace
        self.fallback = ExtractiveSummarizer()

    def __call__(self, messages: Sequence[BaseMessage], *, kind: str,
                 focus: str | None = None) -> str:
        prompt = [HumanMessage(summary_prompt(messages, kind=kind, focus=focus))]
        try:
            # no inherited callbacks: the summary must not stream out as the answer
            reply = self.model.invoke(prompt, config={"callbacks": [], "tags": ["nostream"]})
            text = reply.text.strip() if hasattr(reply, "text") else str(reply).strip()
            if self.on_usage is not None:
                self.on_usage(self.name, getattr(reply, "usage_metadata", None))
        except Exception:  # a failing summary model must not lose the session
            text = ""
        return text or self.fallback(messages, kind=kind, focus=focus)


_NUMBER_LINE = re.compile(r"[A-Za-z_][\w .()/\[\]-]{0,60}\s*(?:=|:)\s*[-+]?\d[\d.,eE+-]*")
_PATH = re.compile(r"(?<![\w.])(?:/|\./)?(?:[\w.-]+/)*[\w.-]+\.(?:png|svg|pdf|csv|txt|json|"
                   r"npz|npy|h5|hdf5|nc|parquet|md|py|toml|yaml|yml|dat|log|xyz|traj|cif)\b")


#: Characters each section of an extractive summary may take (newest items kept). A
#: summary is sent on every request until the next one, and at a 16k window a nested
#: 10k-character summary (what merging by nesting grew to) left room for two calls
#: between summaries; ~4.6k characters (~1.2k tokens) keeps the newest of each kind while
#: the history file and the dropped-items ledger keep the rest.
SECTION_CHARS = {"Session intent": 900, "Decisions and reasons": 1_000,
                 "Artifacts and files": 600, "Numbers that matter": 1_700, "Next steps": 400,
                 "Task": 900, "Files & changes": 600, "Technical context": 1_700,
                 "Strategy & approach": 1_000, "Verification & next steps": 400,
                 "Where we are": 200}
_SECTION = re.compile(r"^# (.+)$", re.M)


def previous_sections(text: str) -> dict[str, list[str]]:
    """The sections of an earlier boundary message (its ``<summary>`` body), as lists of
    items: bullets one each, other lines joined into one item per paragraph."""
    body = text.split("<summary>", 1)[-1].rsplit("</summary>", 1)[0]
    out: dict[str, list[str]] = {}
    parts = _SECTION.split(body)
    for title, content in zip(parts[1::2], parts[2::2], strict=False):
        items = out.setdefault(title.strip(), [])
        para: list[str] = []
        for line in content.strip().splitlines():
            if line.startswith("- "):
                items.append(line[2:].strip())
            elif line.strip():
                para.append(line.strip())
        if para:
            items.insert(0, " ".join(para))
    return out


def _fit(items: Sequence[str], limit: int) -> list[str]:
    """The newest items (the list's end) that fit in ``limit`` characters, in order."""
    kept: list[str] = []
    used = 0
    for item in reversed(list(dict.fromkeys(i for i in items if i))):
        if used + len(item) + 3 > limit and kept:
            break
        kept.append(_clip(item, limit) if not kept else item)
        used += len(item) + 3
    return kept[::-1]


class ExtractiveSummarizer:
    """No model: structured sections lifted from the messages themselves.

    A new summary *merges* with the one before (section by section, newest items kept
    within :data:`SECTION_CHARS`) rather than quoting it whole, so its size stays bounded
    however many summaries a long session at a small window goes through."""

    name = "extractive"

    def __init__(self, max_numbers: int = 40, max_items: int = 12) -> None:
        self.max_numbers = max_numbers
        self.max_items = max_items

    def __call__(self, messages: Sequence[BaseMessage], *, kind: str,
                 focus: str | None = None) -> str:
        asks, said, files, numbers, calls = [], [], [], [], {}
        earlier: dict[str, list[str]] = {}
        for msg in messages:
            if is_summary(msg):
                for title, items in previous_sections(msg.text).items():
                    earlier.setdefault(title, []).extend(items)
            elif is_user_message(msg):
                asks.append(_clip(msg.text.strip(), 600))
            elif isinstance(msg, AIMessage):
                if msg.text.strip():
                    said.append(_clip(msg.text.strip(), 400))
                for call in msg.tool_calls:
                    calls[call["name"]] = calls.get(call["name"], 0) + 1
                    files.extend(_PATH.findall(json.dumps(call["args"])))
            elif isinstance(msg, ToolMessage):
                files.extend(_PATH.findall(msg.text))
                for line in msg.text.splitlines():
                    if _NUMBER_LINE.search(line) and len(line) <= 200:
                        numbers.append(line.strip())
        numbers = _unique(numbers)[-self.max_numbers:]
        files = _unique(files)[-self.max_items * 2:]
        work = ", ".join(f"{n} × {name}" for name, n in calls.items()) or "no tool calls"
        if kind == "checkpoint":
            bodies = {
                "Task": [*asks[-self.max_items:], *([f"Note: {focus}"] if focus else [])],
                "Files & changes": files,
                "Technical context": [f"Work done: {work}.", *numbers],
                "Strategy & approach": said[-self.max_items:],
                "Verification & next steps": said[-1:],
                "Where we are": ["The task above is finished; its full history is on disk."],
            }
            empty = {"Task": "(no user request in this part)",
                     "Files & changes": "(no files named)",
                     "Strategy & approach": "(none stated)",
                     "Verification & next steps": "(none stated)"}
        else:
            bodies = {
                "Session intent": asks[-self.max_items:],
                "Decisions and reasons": [f"Work done: {work}.", *said[-self.max_items:]],
                "Artifacts and files": files,
                "Numbers that matter": numbers,
                "Next steps": [(said[-1] if said else "Continue with the latest request.")
                               + (f" Focus: {focus}" if focus else "")],
            }
            empty = {"Session intent": "(no user request in this part)",
                     "Artifacts and files": "(no files named)",
                     "Numbers that matter": "(no numeric results)"}
        out = []
        for title, items in bodies.items():
            merged = [*earlier.get(title, []), *items] if title not in (
                "Next steps", "Where we are", "Verification & next steps") else items
            merged = [i for i in merged if not (i.startswith("(") and i.endswith(")"))]
            kept = _fit(merged, SECTION_CHARS.get(title, 1_000))
            out.append(f"# {title}\n" + (_bullets(kept) if kept else empty.get(title, "")))
        return "\n\n".join(out)


def _unique(items: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _bullets(items: Sequence[str]) -> str:
    return "\n".join(f"- {i}" for i in items)


# --------------------------------------------------------------------- offload
def offload(path: Path, messages: Sequence[BaseMessage], *, kind: str,
            first_index: int) -> list[int | None]:
    """Append ``messages`` to the thread's history file (whole, nothing clipped).

    Returns, per message, the 1-based line of the file its text starts on (None for a
    previous summary, which is not written again): the ledger's pointers.
    """
    private_dir(path.parent)
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    try:
        with open(path, "rb") as fh:
            line = sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b"")) + 1
    except FileNotFoundError:
        line = 1
    blocks: list[str] = []
    starts: list[int | None] = []

    def add(block: str) -> int:
        """Append a block (blocks are joined by newlines); returns its first line."""
        nonlocal line
        first = line
        block = redact(block)  # before counting: a secret may span lines
        blocks.append(block)
        line += block.count("\n") + 1
        return first

    add(f"## {kind.capitalize()} at {stamp}: messages {first_index}–"
        f"{first_index + len(messages) - 1}\n")
    for msg in messages:
        if is_summary(msg):
            starts.append(None)
            continue
        if isinstance(msg, ToolMessage):
            head = f"### tool result ({msg.name or '?'}, {msg.tool_call_id})"
        elif isinstance(msg, AIMessage):
            head = "### assistant"
        else:
            head = f"### {'user' if isinstance(msg, HumanMessage) else msg.type}"
        starts.append(add(f"{head}\n{msg.text}\n") + 1)
        for call in msg.tool_calls if isinstance(msg, AIMessage) else ():
            add(f"tool call `{call['name']}` ({call.get('id')}):\n```json\n"
                f"{json.dumps(call['args'], indent=1)}\n```\n")
    with open(path, "a", encoding="utf-8", opener=private_opener) as fh:
        fh.write("\n".join(blocks) + "\n")
    return starts


_HEADERS = {
    "summary": "[Context summary: {n} earlier messages were condensed to save context.]",
    "checkpoint": "[Task checkpoint: the finished task below was closed ({how}); its {n} "
                  "messages were condensed into this record.]",
    "emergency": "[Emergency compaction: the provider rejected the request as too long, so "
                 "{n} earlier messages were dropped from view.]",
}


def boundary_message(kind: str, text: str, path: Path, n: int, how: str = "") -> HumanMessage:
    header = _HEADERS[kind].format(n=n, how=how)
    body = (f"{header}\nTheir full text is saved at {path}; page it with `read_file` "
            f"(offset/limit) or search it with `grep` when you need an exact value, code or "
            f"output.\n\n<summary>\n{text}\n</summary>")
    return HumanMessage(content=body, additional_kwargs={"lc_source": SOURCES[kind]})
