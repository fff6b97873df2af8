"""Bounded self-healing for replies a turn cannot use.

Two failure shapes end a turn silently if nothing intervenes: a tool call whose
arguments are not valid JSON (common with local models and merged parallel calls), and
an empty or reasoning-only reply. After such a reply this middleware replaces the bad
message with a cleaned copy (so no provider ever sees a dangling malformed call), adds a
short marked nudge, and sends the model back once more. At most
:data:`MAX_CONSECUTIVE` nudges in a row; the marks live in the checkpointed messages, so
the bound and the transcript survive a resume.
"""

from __future__ import annotations

from typing import Any

from langchain.agents.middleware import AgentMiddleware, hook_config
from langchain_core.messages import AIMessage, HumanMessage

from simagent.agent.recorder import reasoning_text
from simagent.context.reporting import write_stream
from simagent.provider_errors import INCOMPLETE_CALLS_KEY
from simagent.trace.log import TraceLog

MAX_CONSECUTIVE = 2
#: ``additional_kwargs`` key on nudges and on cleaned replies.
MARK = "simagent_recovery"
NUDGE_SOURCE = "simagent_recovery"


def is_nudge(msg: Any) -> bool:
    return isinstance(msg, HumanMessage) and msg.additional_kwargs.get("lc_source") == NUDGE_SOURCE


def cut_off(msg: AIMessage) -> bool:
    """The reply's tool-call arguments did not end as complete JSON: it stopped at the
    output token limit (``finish_reason`` "length", Anthropic's ``stop_reason``
    "max_tokens"), or the stream said so (``INCOMPLETE_CALLS_KEY``, set by
    ``simagent.compatible_chat``: llama.cpp reports "tool_calls" even then)."""
    meta = msg.response_metadata or {}
    return bool(meta.get("finish_reason") == "length" or meta.get("stop_reason") ==
                "max_tokens" or meta.get(INCOMPLETE_CALLS_KEY))


def diagnose(msg: AIMessage) -> str | None:
    """Why this reply cannot be used, or None when it is fine.

    A tool call in a reply cut off at the output limit has arguments that stop midway;
    langchain's lenient parse of streamed JSON still makes it a "valid" call (``{"unit":
    "kel`` becomes ``{"unit": "kel"}``), so it would run with wrong arguments (seen with
    llama.cpp's server): it is not run, and the model is told."""
    if msg.tool_calls and cut_off(msg):
        return "cut_tool_call"
    if msg.invalid_tool_calls and not msg.tool_calls:
        return "invalid_tool_call"
    if not msg.tool_calls and not msg.invalid_tool_calls and not msg.text.strip():
        return "reasoning_only" if reasoning_text(msg) else "empty"
    return None


#: What a give-up notice says the model's replies were, per reason.
_WHY = {"invalid_tool_call": "tool calls that were not valid JSON",
        "cut_tool_call": "tool calls cut off before their arguments ended",
        "reasoning_only": "only reasoning, no answer or tool call",
        "empty": "empty replies"}


def cut_notice(agent: str, output_tokens: int | None) -> str:
    """What a person is told of an answer cut at the output token limit: otherwise it
    just ends mid-sentence, as if the model had finished."""
    who = "the model's" if agent == "main" else f"the {agent} subagent's"
    size = f" ({output_tokens:,} tokens)" if output_tokens else ""
    return (f"{who} reply stopped at the output token limit{size}, so it is cut off; "
            "raise max_output in the [model] config to let it write more")


def give_up_notice(reason: str, attempts: int) -> str:
    """The line a person sees when the bound is reached: otherwise the turn just ends,
    with no answer and no word of why."""
    return (f"the model's last {attempts} replies could not be used "
            f"({_WHY.get(reason, reason)}); the turn stopped. Send a message to go on, "
            "or use a larger model.")


def recent_nudges(messages: list[Any]) -> int:
    """Nudges since the last usable step (a good reply, a tool result, the user)."""
    count = 0
    for msg in reversed(messages):
        if is_nudge(msg):
            count += 1
        elif isinstance(msg, AIMessage) and MARK in msg.additional_kwargs:
            continue
        else:
            break
    return count


def nudge_text(reason: str, msg: AIMessage) -> str:
    if reason == "invalid_tool_call":
        bad = msg.invalid_tool_calls[0]
        return (f"[harness] Your call to `{bad.get('name')}` could not be run: its arguments "
                f"were not a valid JSON object ({bad.get('error') or 'parse error'}). Call the "
                "tool again with valid JSON arguments, one call at a time if needed.")
    if reason == "cut_tool_call":
        return (f"[harness] Your call to `{msg.tool_calls[-1].get('name')}` was not run: its "
                "arguments were not complete JSON (cut off at the output token limit, or "
                "malformed). Call the tool again with complete, shorter arguments (split "
                "long code into steps).")
    if reason == "reasoning_only":
        return ("[harness] Your last reply contained only reasoning, with no answer and no "
                "tool call. Continue: call a tool, or write your answer to the user.")
    return ("[harness] Your last reply was empty. Continue the task: call a tool, or write "
            "your answer to the user.")


class RecoveryMiddleware(AgentMiddleware):
    """Nudges after unusable replies, at most ``max_consecutive`` times in a row."""

    def __init__(self, trace: TraceLog | None = None, *, agent: str = "main",
                 max_consecutive: int = MAX_CONSECUTIVE) -> None:
        super().__init__()
        self.trace = trace
        self.agent = agent
        self.max_consecutive = max_consecutive

    @property
    def name(self) -> str:
        return f"RecoveryMiddleware[{self.agent}]"

    @hook_config(can_jump_to=["model"])
    def after_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        messages = state.get("messages") or []
        if not messages or not isinstance(messages[-1], AIMessage):
            return None
        msg = messages[-1]
        reason = diagnose(msg)
        if reason is None:
            if cut_off(msg):  # usable, but it ends mid-way: say so
                self._say_cut(msg)
            return None
        attempt = recent_nudges(messages[:-1]) + 1
        cut = reason == "cut_tool_call"  # its calls are dropped, kept in the mark
        bad = [dict(c) for c in (msg.tool_calls if cut else msg.invalid_tool_calls)]
        extra = {k: v for k, v in msg.additional_kwargs.items()
                 if not (cut and k in ("tool_calls", "function_call"))}
        cleaned = AIMessage(
            content=msg.content, id=msg.id, tool_calls=[] if cut else list(msg.tool_calls),
            invalid_tool_calls=[], usage_metadata=msg.usage_metadata,
            response_metadata=dict(msg.response_metadata),
            additional_kwargs={**extra,
                               MARK: {"reason": reason, "attempt": attempt,
                                      "invalid_tool_calls": bad}})
        if attempt > self.max_consecutive:
            self._trace(reason, attempt, gave_up=True)
            write_stream({"type": "notice", "level": "warning",
                          "text": give_up_notice(reason, attempt)})
            return {"messages": [cleaned]}
        self._trace(reason, attempt, gave_up=False)
        nudge = HumanMessage(content=nudge_text(reason, msg),
                             additional_kwargs={"lc_source": NUDGE_SOURCE, "reason": reason})
        return {"messages": [cleaned, nudge], "jump_to": "model"}

    @hook_config(can_jump_to=["model"])
    async def aafter_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        return self.after_model(state, runtime)

    def _say_cut(self, msg: AIMessage) -> None:
        tokens = (msg.usage_metadata or {}).get("output_tokens")
        if self.trace is not None:
            self.trace.append("reply_cut", {"agent": self.agent, "output_tokens": tokens})
        write_stream({"type": "notice", "level": "warning",
                      "text": cut_notice(self.agent, tokens)})

    def _trace(self, reason: str, attempt: int, *, gave_up: bool) -> None:
        if self.trace is not None:
            self.trace.append("recovery", {"reason": reason, "attempt": attempt,
                                           "gave_up": gave_up, "agent": self.agent})
