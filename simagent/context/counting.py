"""Token counts of exactly what is sent, split by what spent them.

Every layer measures the same thing: system prompt (with the skills and memory indexes
the middleware appends) + tool schemas + messages, with langchain's approximate counter,
which is also what the scripted model reports. The counter rounds up per message, so the
categories add up to the total exactly. When the provider reported usage for the previous
call, :func:`calibrate` scales the estimate by how far the counter was off on that call,
so thresholds follow real tokens without a tokenizer (chars/4 under-counts code).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages.utils import count_tokens_approximately

from simagent.agent.prompts import MEMORY_MARKER, SKILLS_MARKER

#: ``additional_kwargs["lc_source"]`` of messages the context layers write.
SUMMARY_SOURCES = frozenset({"summarization", "simagent_summary", "simagent_checkpoint",
                             "simagent_emergency"})
CATEGORIES = ("system_prompt", "tool_schemas", "skills_index", "memory_index",
              "conversation", "tool_results", "summaries")


def count_messages(messages: Sequence[BaseMessage]) -> int:
    return count_tokens_approximately(list(messages)) if messages else 0


_SCHEMAS: dict[tuple[str, str, str], dict[str, Any]] = {}
_SCHEMAS_MAX = 512


def tool_schema(tool: Any) -> dict[str, Any]:
    """The tool as a provider receives it (OpenAI function format), memoized by content
    (never by object: tools close over their session, which must be free to go)."""
    if isinstance(tool, dict):
        return tool
    key = (str(getattr(tool, "name", "")), str(getattr(tool, "description", "")),
           repr(getattr(tool, "args", "")))
    schema = _SCHEMAS.get(key)
    if schema is None:
        from langchain_core.utils.function_calling import convert_to_openai_tool

        if len(_SCHEMAS) >= _SCHEMAS_MAX:
            _SCHEMAS.clear()
        schema = _SCHEMAS[key] = convert_to_openai_tool(tool)
    return schema


def count_tools(tools: Sequence[Any] | None) -> int:
    """Tokens of the tool schemas in the format they are sent in."""
    if not tools:
        return 0
    try:
        return count_tokens_approximately([], tools=[tool_schema(t) for t in tools])
    except Exception:  # an odd tool object must not break a model call
        return 0


def count_text(text: str) -> int:
    return count_tokens_approximately([SystemMessage(text)]) if text else 0


def is_summary(msg: BaseMessage) -> bool:
    source = msg.additional_kwargs.get("lc_source") if isinstance(msg, HumanMessage) else None
    return source in SUMMARY_SOURCES


def split_system(text: str) -> tuple[str, str, str]:
    """(base prompt, skills index, memory index) of a system prompt simagent assembled."""
    cuts = sorted((text.find(m), m) for m in (SKILLS_MARKER, MEMORY_MARKER) if m in text)
    parts = {"base": text, SKILLS_MARKER: "", MEMORY_MARKER: ""}
    if cuts:
        parts["base"] = text[: cuts[0][0]]
        for k, (pos, marker) in enumerate(cuts):
            end = cuts[k + 1][0] if k + 1 < len(cuts) else len(text)
            parts[marker] = text[pos:end]
    return parts["base"], parts[SKILLS_MARKER], parts[MEMORY_MARKER]


@dataclass(frozen=True)
class RequestSize:
    """Tokens of one request by category; ``total`` is what the counter gives the whole."""

    system_prompt: int = 0
    tool_schemas: int = 0
    skills_index: int = 0
    memory_index: int = 0
    conversation: int = 0
    tool_results: int = 0
    summaries: int = 0

    @property
    def total(self) -> int:
        return sum(getattr(self, c) for c in CATEGORIES)

    @property
    def fixed(self) -> int:
        """What no history layer can shrink: prompt, indexes and tool schemas."""
        return self.system_prompt + self.tool_schemas + self.skills_index + self.memory_index

    @property
    def history(self) -> int:
        return self.conversation + self.tool_results + self.summaries

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> RequestSize:
        data = data or {}
        return cls(**{c: int(data.get(c) or 0) for c in CATEGORIES})


def measure(system_message: BaseMessage | None, messages: Sequence[BaseMessage],
            tools: Sequence[Any] | None) -> RequestSize:
    """Split one request into categories; the parts sum to the approximate total."""
    base = skills = memory = 0
    if system_message is not None:
        total_sys = count_messages([system_message])
        _base, skills_text, memory_text = split_system(system_message.text)
        skills = count_text(skills_text) - 3 if skills_text else 0
        memory = count_text(memory_text) - 3 if memory_text else 0
        base = total_sys - max(0, skills) - max(0, memory)
    conv = results = summaries = 0
    for msg in messages:
        n = count_messages([msg])
        if isinstance(msg, ToolMessage):
            results += n
        elif is_summary(msg):
            summaries += n
        else:
            conv += n
    return RequestSize(system_prompt=base, tool_schemas=count_tools(tools),
                       skills_index=max(0, skills), memory_index=max(0, memory),
                       conversation=conv, tool_results=results, summaries=summaries)


def calibrate(estimate: int, previous_estimate: int | None, previous_reported: int | None) -> int:
    """Scale ``estimate`` by the provider/estimate ratio of the previous call (0.5x-3x)."""
    if not previous_estimate or not previous_reported:
        return estimate
    ratio = min(3.0, max(0.5, previous_reported / previous_estimate))
    return int(estimate * ratio)
