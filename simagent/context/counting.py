"""Token counts of exactly what is sent, split by what spent them.

Every layer measures the same thing: system prompt (with the skills and memory indexes
the middleware appends) + tool schemas + messages, with the real tokenizer of
:mod:`simagent.context.tokens` (o200k unless the model's family says otherwise), which is
also what the scripted model reports. A message is counted as a provider frames it: its
role, its text, each tool call's name and JSON arguments, and a few framing tokens, so
the categories add up to the total exactly; the tests hold the total against an
independent ruler (langchain-openai's own request payload counted by tiktoken). Texts are
counted once and cached by content, so a long history costs a hash lookup per message.
When the provider reported usage for the previous call, :func:`calibrate` scales the
count by how far it was off on that call (another family's tokenizer, hidden framing).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    ToolMessage,
)
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool

from simagent.context.tokens import Ruler, active_ruler

if TYPE_CHECKING:
    from simagent.trace.log import TraceLog

#: Openings of the two indexes the middleware appends to the system prompt (the prompts
#: start with them); counting splits a request's system message at these to count each.
SKILLS_MARKER = "## Skills\n"
MEMORY_MARKER = "<workspace_memory>"
#: ``additional_kwargs["lc_source"]`` of messages the context layers write.
SUMMARY_SOURCES = frozenset({"summarization", "simagent_summary", "simagent_checkpoint",
                             "simagent_emergency"})
#: Where a kernel state card says so (``simagent.context.state_card``): its own category.
STATE_CARD_SOURCE = "simagent_state_card"
CATEGORIES = ("system_prompt", "tool_schemas", "skills_index", "memory_index",
              "conversation", "tool_results", "summaries", "state_card", "images")
#: How ``/context``, ``simagent context`` and the bench name each category (one home).
CATEGORY_LABELS = {"system_prompt": "system prompt", "tool_schemas": "tool schemas",
                   "skills_index": "skills index", "memory_index": "memory index",
                   "conversation": "conversation", "tool_results": "tool results",
                   "summaries": "summaries", "state_card": "state card",
                   "images": "images"}
#: Framing of one message (start, role separator, end), as chat templates add it.
MESSAGE_FRAME = 3
#: Framing of one tool call inside an assistant message (id, type, name/arguments keys).
CALL_FRAME = 3
#: Framing of one tool schema in the tools list.
TOOL_FRAME = 3
#: An image block (OpenAI's high-detail 1024x1024 tile count; providers differ). Other
#: media blocks (file, audio, video) are priced alike, as a placeholder, never by their
#: base64 length.
IMAGE_TOKENS = 765
MEDIA_BLOCKS = frozenset({"image", "image_url", "file", "audio", "video", "input_audio"})
_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}


def _role(msg: BaseMessage) -> str:
    return _ROLES.get(msg.type, msg.type)


def message_parts(msg: BaseMessage) -> tuple[list[str], int]:
    """(texts sent, fixed extra tokens): what one message costs, before counting.

    Texts are the content, each tool call's id, name and JSON arguments, and a result's
    call id (providers send ids with every call and result: 10-20 tokens each)."""
    texts: list[str] = []
    extra = 0
    content = msg.content
    if isinstance(content, str):
        texts.append(content)
    else:
        for block in content or []:
            if isinstance(block, str):
                texts.append(block)
            elif not isinstance(block, dict):
                texts.append(str(block))
            elif block.get("type") == "text":
                texts.append(str(block.get("text") or ""))
            elif block.get("type") in MEDIA_BLOCKS:
                extra += IMAGE_TOKENS  # base64 data is not text the model reads
            elif block.get("type") in ("tool_use", "tool_call", "reasoning", "thinking"):
                continue  # tool calls are counted below; reasoning is not sent back
            else:
                texts.append(json.dumps(block, ensure_ascii=False, default=str))
    if isinstance(msg, ToolMessage) and msg.tool_call_id:
        texts.append(msg.tool_call_id)  # sent with the result (tool_call_id / tool_use_id)
    if isinstance(msg, AIMessage):
        for call in msg.tool_calls:
            texts.append(str(call.get("id") or ""))
            texts.append(str(call.get("name") or ""))
            texts.append(json.dumps(call.get("args") or {}, ensure_ascii=False, default=str))
            extra += CALL_FRAME
        for bad in msg.invalid_tool_calls:
            texts.append(str(bad.get("name") or ""))
            texts.append(str(bad.get("args") or ""))
            extra += CALL_FRAME
    return texts, extra


def count_message(msg: BaseMessage, ruler: Ruler | None = None) -> int:
    """A message's tokens: framing, role, each text, and one separator between texts (a
    provider sends a call's id, name and arguments as separate fields; over a session of
    small tool calls, ignoring the separators under-counted by 1 %)."""
    ruler = ruler or active_ruler()
    texts, extra = message_parts(msg)
    return (MESSAGE_FRAME + ruler.count(_role(msg)) + extra + max(0, len(texts) - 1)
            + sum(ruler.count(t) for t in texts))


def count_messages(messages: Sequence[BaseMessage], ruler: Ruler | None = None) -> int:
    ruler = ruler or active_ruler()
    return sum(count_message(m, ruler) for m in messages)


_SCHEMAS: dict[tuple[str, str, str], dict[str, Any]] = {}
_SCHEMAS_MAX = 512


def tool_schema(tool: Any) -> dict[str, Any]:
    """The tool as a provider receives it (OpenAI function format), memoized by content
    (never by object: tools close over their session, which must be free to go)."""
    if isinstance(tool, dict):
        return tool
    if not isinstance(tool, BaseTool):  # a function or a model class: no stable key
        return convert_to_openai_tool(tool)
    key = (type(tool).__qualname__, tool.name, tool.description, repr(tool.args))
    schema = _SCHEMAS.get(key)
    if schema is None:
        if len(_SCHEMAS) >= _SCHEMAS_MAX:
            _SCHEMAS.clear()
        schema = _SCHEMAS[key] = convert_to_openai_tool(tool)
    return schema


def schema_text(tool: Any) -> str:
    return json.dumps(tool_schema(tool), ensure_ascii=False, sort_keys=True, default=str)


def count_tools(tools: Sequence[Any] | None, ruler: Ruler | None = None) -> int:
    """Tokens of the tool schemas in the format they are sent in."""
    if not tools:
        return 0
    ruler = ruler or active_ruler()
    total = 0
    for tool in tools:
        try:
            total += TOOL_FRAME + ruler.count(schema_text(tool))
        except Exception:  # an odd tool object must not break a model call
            total += TOOL_FRAME + ruler.count(str(getattr(tool, "description", "")))
    return total


def count_text(text: str, ruler: Ruler | None = None) -> int:
    """Tokens of a bare text (a file the model would read, a section of the prompt)."""
    return (ruler or active_ruler()).count(text) if text else 0


def count_request(messages: Sequence[BaseMessage], tools: Sequence[Any] | None = None,
                  ruler: Ruler | None = None) -> int:
    """Tokens of a whole request as a model receives it (system message included)."""
    ruler = ruler or active_ruler()
    return count_messages(messages, ruler) + count_tools(tools, ruler)


def is_summary(msg: BaseMessage) -> bool:
    source = msg.additional_kwargs.get("lc_source") if isinstance(msg, HumanMessage) else None
    return source in SUMMARY_SOURCES


def is_user_message(msg: BaseMessage) -> bool:
    """Words a person typed: summaries, state cards and nudges are HumanMessages too, and
    each carries the ``lc_source`` that says who wrote it."""
    return isinstance(msg, HumanMessage) and not msg.additional_kwargs.get("lc_source")


def is_state_card(msg: BaseMessage) -> bool:
    return (isinstance(msg, HumanMessage)
            and msg.additional_kwargs.get("lc_source") == STATE_CARD_SOURCE)


def media_tokens(msg: BaseMessage) -> int:
    """The part of :func:`count_message` that media blocks (images) cost."""
    if not isinstance(msg.content, list):
        return 0
    return IMAGE_TOKENS * sum(1 for b in msg.content
                              if isinstance(b, dict) and b.get("type") in MEDIA_BLOCKS)


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
    """Tokens of one request by category; ``total`` is what the ruler gives the whole."""

    system_prompt: int = 0
    tool_schemas: int = 0
    skills_index: int = 0
    memory_index: int = 0
    conversation: int = 0
    tool_results: int = 0
    summaries: int = 0
    state_card: int = 0
    images: int = 0

    @property
    def total(self) -> int:
        return sum(getattr(self, c) for c in CATEGORIES)

    @property
    def fixed(self) -> int:
        """What no history layer can shrink: prompt, indexes and tool schemas."""
        return self.system_prompt + self.tool_schemas + self.skills_index + self.memory_index

    @property
    def history(self) -> int:
        return (self.conversation + self.tool_results + self.summaries + self.state_card
                + self.images)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> RequestSize:
        data = data or {}
        return cls(**{c: int(data.get(c) or 0) for c in CATEGORIES})


def measure(system_message: BaseMessage | None, messages: Sequence[BaseMessage],
            tools: Sequence[Any] | None, ruler: Ruler | None = None) -> RequestSize:
    """Split one request into categories; the parts sum to :func:`count_request`'s total."""
    ruler = ruler or active_ruler()
    base = skills = memory = 0
    if system_message is not None:
        total_sys = count_messages([system_message], ruler)
        _base, skills_text, memory_text = split_system(system_message.text)
        skills = count_text(skills_text, ruler)
        memory = count_text(memory_text, ruler)
        base = total_sys - max(0, skills) - max(0, memory)
    conv = results = summaries = card = images = 0
    for msg in messages:
        media = media_tokens(msg)
        n = count_message(msg, ruler) - media
        images += media
        if isinstance(msg, ToolMessage):
            results += n
        elif is_summary(msg):
            summaries += n
        elif is_state_card(msg):
            card += n
        else:
            conv += n
    return RequestSize(system_prompt=base, tool_schemas=count_tools(tools, ruler),
                       skills_index=max(0, skills), memory_index=max(0, memory),
                       conversation=conv, tool_results=results, summaries=summaries,
                       state_card=card, images=images)


#: How far the provider's count may scale ours (another family's tokenizer, hidden
#: framing); beyond this the provider's figure is taken for an anomaly.
CALIBRATION_BOUNDS = (0.5, 3.0)


def calibration_ratio(previous_estimate: int | None, previous_reported: int | None) -> float:
    """The provider/our-count ratio of the previous call, within :data:`CALIBRATION_BOUNDS`."""
    if not previous_estimate or not previous_reported:
        return 1.0
    low, high = CALIBRATION_BOUNDS
    return min(high, max(low, previous_reported / previous_estimate))


def calibrate(estimate: int, previous_estimate: int | None, previous_reported: int | None) -> int:
    """Scale ``estimate`` by the provider/estimate ratio of the previous call."""
    if not previous_estimate or not previous_reported:
        return estimate
    return int(estimate * calibration_ratio(previous_estimate, previous_reported))


@dataclass
class Calibration:
    """Our count of an agent's previous request and the provider's figure for it, which
    scale the next count (:func:`calibrate`); learnt from each reply's usage."""

    sent: int | None = None
    reported: int | None = None

    @classmethod
    def resumed(cls, trace: TraceLog | None, agent: str, model_id: str,
                ruler: str) -> Calibration:
        """A resumed session starts from the trace, so its first estimate is already
        calibrated (:func:`last_calibration`)."""
        return cls(*last_calibration(trace, agent, model_id, ruler))

    def scale(self, estimate: int) -> int:
        return calibrate(estimate, self.sent, self.reported)

    def learn(self, sent: int, response: Any) -> None:
        """After a call: our count of the request sent, and what the provider reported."""
        msg = ai_message_of(response)
        reported = (msg.usage_metadata or {}).get("input_tokens") if msg is not None else None
        self.sent, self.reported = sent, reported or None


def last_calibration(trace: TraceLog | None, agent: str, model_id: str, ruler: str
                     ) -> tuple[int | None, int | None]:
    """(our count, provider's count) of this agent's latest provider-reported call with
    this model, counted with this ruler, from the trace; (None, None) when there is none
    (a split counted with another ruler, or before rulers were traced, would mis-scale)."""
    if trace is None:
        return None, None
    try:
        events = trace.events(["model_usage"])
    except Exception:  # a trace that cannot be read costs the calibration, not the agent
        return None, None
    for event in reversed(events):
        p = event.payload
        if ((p.get("agent") or "main") != agent or p.get("model") != model_id
                or p.get("source") != "provider" or p.get("dropped")):
            continue
        if p.get("ruler") != ruler:
            return None, None
        sent = RequestSize.from_dict(p.get("request")).total
        reported = int(p.get("input_tokens") or 0)
        return (sent, reported) if sent and reported else (None, None)
    return None, None


def ai_message_of(response: Any) -> AIMessage | None:
    """The AIMessage inside whatever a model handler returned."""
    if isinstance(response, AIMessage):
        return response
    inner = getattr(response, "model_response", response)
    for msg in reversed(getattr(inner, "result", []) or []):
        if isinstance(msg, AIMessage):
            return msg
    return None
