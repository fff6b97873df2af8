"""The ``scripted:`` model: a chat model that plays a fixed list of steps (design.md §9.2).

No machine here reaches a model provider, so tests, ``make run`` and the replay bench
drive the *real* deepagents graph with this model. Two properties make it honest:

* its ``usage_metadata`` counts the request it actually received (messages + bound tool
  schemas, with the real tokenizer every layer counts with: ``counting.count_request``),
  so token figures measure what the harness sends, not what a script claims;
* the final text can quote earlier tool results (``{out[-1]}``, ``{out[-2]|regex}``), read
  from the tool messages *in the request*, so an answer is only right if the harness kept
  the needed result visible.

Step forms (JSON list, ``{"steps": [...]}``, or TOML ``[[steps]]``)::

    {"tool": "run_python", "args": {"code": "..."}}          one tool call
    {"tools": [{"tool": ..., "args": ...}, ...]}              parallel tool calls
    {"say": "text"}                                           text sent with the next step
    {"final": "The value is {out[-1]|value (\\d+)}"}           the answer; ends the turn
    {"tool": "task", "args": {...}, "steps": [...]}           a subagent call and its steps
    {"invalid_tool_call": {"name": ..., "args": "not json"}}  malformed call (recovery tests)
    {"empty": true}                                           an empty reply (recovery tests)
    {"reasoning": "text", ...}                                reasoning attached to a step
    {"tool": ..., "args": {...}, "fill": true}                expand {out[..]} in string args
    {"final": ..., "wait": 30}                                answer after 30 s of silence
                                                              (a provider thinking or stalled;
                                                              nothing interrupts the wait)
    {"final": "The fit con", "cut": true}                     a reply cut at the output limit
                                                              (finish_reason "length")

A script that runs out answers with a clear notice instead of raising.
"""

from __future__ import annotations

import json
import re
import threading
import time
import tomllib
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.exceptions import ContextOverflowError
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import ConfigDict, Field

from simagent.context.counting import count_request, count_text
from simagent.context.tokens import DEFAULT_ENCODING, Ruler

PROVIDER = "scripted"
DEFAULT_WINDOW = 128_000
EXHAUSTED = "(scripted model: the script has no more steps)"

_STEP_KEYS = {"tool", "tools", "args", "say", "final", "steps", "invalid_tool_call", "empty",
              "reasoning", "id", "fill", "wait", "cut"}
#: A quote of an earlier tool result in a final answer or a ``fill`` argument:
#: ``{out[i]}`` or ``{out[i]|regex}``, ``i`` indexing the request's tool results.
OUT_REF = re.compile(r"\{out\[(-?\d+)\](?:\|((?:[^{}\\]|\\.|\{\d*,?\d*\})+))?\}")


class ScriptError(ValueError):
    """A script file that cannot be played; the message names the file and the step."""


def load_steps(path: str | Path) -> list[dict[str, Any]]:
    """Read a script file (JSON or TOML) and flatten subagent steps into play order."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScriptError(f"cannot read script {path}: {exc.strerror or exc}") from exc
    try:
        data: Any = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ScriptError(f"{path}: not valid {'TOML' if path.suffix == '.toml' else 'JSON'}: "
                          f"{exc}") from exc
    steps = data.get("steps") if isinstance(data, dict) else data
    if not isinstance(steps, list):
        raise ScriptError(f"{path}: expected a list of steps or {{\"steps\": [...]}}")
    return flatten_steps(steps, where=str(path))


def flatten_steps(steps: Sequence[Any], *, where: str = "script") -> list[dict[str, Any]]:
    """Validate steps; a subagent call's own ``steps`` play right after the call."""
    out: list[dict[str, Any]] = []
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            raise ScriptError(f"{where}: step {i} must be a table/object, "
                              f"got {type(step).__name__}")
        unknown = set(step) - _STEP_KEYS
        if unknown:
            raise ScriptError(f"{where}: step {i} has unknown field(s) {sorted(unknown)}")
        if not ({"tool", "tools", "say", "final", "invalid_tool_call", "empty"} & set(step)):
            raise ScriptError(f"{where}: step {i} needs one of tool, tools, say, final, "
                              "invalid_tool_call, empty")
        wait = step.get("wait", 0)
        if isinstance(wait, bool) or not isinstance(wait, int | float) or wait < 0:
            raise ScriptError(f"{where}: step {i} wait must be a number of seconds >= 0")
        if "tool" in step and not isinstance(step.get("args", {}), dict):
            raise ScriptError(f"{where}: step {i} args must be a table/object")
        out.append({k: v for k, v in step.items() if k != "steps"})
        if "steps" in step:
            out.extend(flatten_steps(step["steps"], where=f"{where} step {i}"))
    return out


def tool_outputs(messages: Sequence[BaseMessage]) -> list[str]:
    """Text of every tool result in a request, oldest first (what ``out[i]`` indexes)."""
    return [m.text for m in messages if isinstance(m, ToolMessage)]


def _fill_args(value: Any, outputs: Sequence[str]) -> Any:
    """``fill_template`` applied to every string inside tool arguments."""
    if isinstance(value, str):
        return fill_template(value, outputs)
    if isinstance(value, dict):
        return {k: _fill_args(v, outputs) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill_args(v, outputs) for v in value]
    return value


def out_indices(template: str) -> list[int]:
    """The ``i`` of every ``{out[i]}`` a template quotes, in order (what a harness must keep
    in view, and where, for the template to resolve)."""
    return [int(m.group(1)) for m in OUT_REF.finditer(template)]


def fill_template(template: str, outputs: Sequence[str]) -> str:
    """Expand ``{out[i]}`` and ``{out[i]|regex}`` (first group, else whole match)."""

    def sub(match: re.Match[str]) -> str:
        idx, pattern = int(match.group(1)), match.group(2)
        try:
            text = outputs[idx]
        except IndexError:
            return f"<no tool result out[{idx}]>"
        if not pattern:
            return text
        found = re.search(pattern, text)
        if not found:
            return f"<no match for {pattern!r}>"
        return found.group(1) if found.groups() else found.group(0)

    return OUT_REF.sub(sub, template)


def call_id(tag: str, step: int, j: int | str) -> str:
    """``call_<tag>_<step>_<j>``: the step's position plus the script's play tag."""
    return f"call_{tag}_{step}_{j}"


_CALL_ID = re.compile(r"^call_[0-9a-f]+_(\d+)_(?:\d+|bad)$")


def call_step(call_id_: str) -> int | None:
    """The flattened step index a scripted call id (:func:`call_id`) carries; None for
    any other id (a live model's). The bench grades step results by it."""
    m = _CALL_ID.match(call_id_)
    return int(m.group(1)) if m else None


def _tool_name(t: Any) -> str:
    if isinstance(t, dict):
        return str(t.get("name") or t.get("function", {}).get("name", "?"))
    return str(getattr(t, "name", "?"))


class ScriptedContextOverflow(ContextOverflowError, ValueError):
    """What a provider answers when a request exceeds the window (``enforce_window``):
    langchain's own overflow error, so the harness treats it as any provider's refusal."""

    status_code = 400


class _Cursor:
    """Play position, shared by every ``bind_tools`` copy (main agent and subagents)."""

    def __init__(self, steps: list[dict[str, Any]]) -> None:
        self.steps = steps
        self.pos = 0
        #: in every call id this script makes: one conversation may play several scripts
        #: (``/model``, a resume) and ids must stay unique in it, as a provider's are
        self.tag = uuid.uuid4().hex[:6]
        self.lock = threading.Lock()
        self.requests: list[list[BaseMessage]] = []
        self.request_tools: list[list[str]] = []
        self.request_tokens: list[int] = []
        self.rejected: list[int] = []  # token counts of requests refused as too long

    def take(self) -> list[dict[str, Any]]:
        """The next reply: leading ``say`` steps plus the step they introduce."""
        with self.lock:
            taken: list[dict[str, Any]] = []
            while self.pos < len(self.steps):
                step = self.steps[self.pos]
                self.pos += 1
                taken.append(step)
                if set(step) - {"say", "reasoning", "id"}:
                    break
            return taken


class ScriptedChatModel(BaseChatModel):
    """Plays a script; see the module docstring. Works with invoke, stream, sync and async."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    cursor: _Cursor
    bound_tools: list[Any] = Field(default_factory=list)
    model_name: str = "scripted"
    #: Refuse requests over the window like a provider does (no step is consumed).
    enforce_window: bool = False

    @classmethod
    def from_steps(cls, steps: Sequence[dict[str, Any]], *, window: int | None = None,
                   name: str = "scripted", enforce_window: bool = False) -> ScriptedChatModel:
        return cls(cursor=_Cursor(flatten_steps(steps)), model_name=name,
                   enforce_window=enforce_window,
                   profile={"max_input_tokens": window or DEFAULT_WINDOW,
                            "tool_calling": True})

    @classmethod
    def from_file(cls, path: str | Path, *, window: int | None = None) -> ScriptedChatModel:
        return cls(cursor=_Cursor(load_steps(path)), model_name=f"scripted:{Path(path).name}",
                   profile={"max_input_tokens": window or DEFAULT_WINDOW,
                            "tool_calling": True})

    @property
    def _llm_type(self) -> str:
        return PROVIDER

    @property
    def requests(self) -> list[list[BaseMessage]]:
        """Every request received so far (all copies), for tests and the bench."""
        return self.cursor.requests

    @property
    def remaining(self) -> int:
        return len(self.cursor.steps) - self.cursor.pos

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> Any:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = PROVIDER  # matches response_metadata["model_provider"]
        params["ls_model_name"] = self.model_name
        return params

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: Any = None,
                   **kwargs: Any) -> ScriptedChatModel:
        return self.model_copy(update={"bound_tools": list(tools)})

    def count_request(self, messages: Sequence[BaseMessage]) -> int:
        """Tokens of the exact request (messages plus bound tool schemas), counted with
        the default ruler (o200k), as a provider counts what it receives."""
        return count_request(list(messages), self.bound_tools, Ruler(DEFAULT_ENCODING))

    @staticmethod
    def count_reply(content: str, tool_calls: Sequence[dict[str, Any]]) -> int:
        """Output tokens of a reply: its text and each call's name and JSON arguments."""
        return count_text(content) + sum(
            count_text(str(c["name"])) + count_text(json.dumps(c["args"], ensure_ascii=False))
            for c in tool_calls)

    def _reply(self, messages: list[BaseMessage]) -> AIMessage:
        window = (self.profile or {}).get("max_input_tokens")
        if self.enforce_window and window:
            size = self.count_request(messages)
            if size > window:
                self.cursor.rejected.append(size)
                raise ScriptedContextOverflow(
                    f"This model's maximum context length is {window} tokens. However, your "
                    f"messages resulted in {size} tokens (context_length_exceeded).")
        self.cursor.requests.append(list(messages))
        self.cursor.request_tools.append([_tool_name(t) for t in self.bound_tools])
        index = self.cursor.pos
        steps = self.cursor.take()
        text_parts = [s["say"] for s in steps if "say" in s]
        reasoning = "\n".join(s["reasoning"] for s in steps if "reasoning" in s)
        if wait := max((float(s.get("wait", 0)) for s in steps), default=0.0):
            time.sleep(wait)  # after taking the steps: a turn meanwhile gets the next ones
        tool_calls: list[dict[str, Any]] = []
        invalid: list[dict[str, Any]] = []
        outputs = tool_outputs(messages)
        for k, step in enumerate(steps):
            calls = step.get("tools") or ([step] if "tool" in step else [])
            for j, call in enumerate(calls):
                args = dict(call.get("args", {}))
                if step.get("fill") or call.get("fill"):
                    args = _fill_args(args, outputs)
                tool_calls.append({"name": call["tool"], "args": args,
                                   "id": call.get("id") or call_id(self.cursor.tag, index + k, j),
                                   "type": "tool_call"})
            if "invalid_tool_call" in step:
                bad = step["invalid_tool_call"]
                invalid.append({"name": bad.get("name"), "args": bad.get("args", "{"),
                                "id": bad.get("id") or call_id(self.cursor.tag, index + k, "bad"),
                                "error": "invalid JSON in tool arguments",
                                "type": "invalid_tool_call"})
            if "final" in step:
                text_parts.append(str(step["final"]))
        if not steps:
            text_parts.append(EXHAUSTED)
        content = "\n\n".join(fill_template(t, outputs) for t in text_parts)
        usage_in = self.count_request(messages)
        self.cursor.request_tokens.append(usage_in)
        usage_out = max(1, self.count_reply(content, tool_calls))
        kwargs: dict[str, Any] = {}
        if reasoning:
            kwargs["additional_kwargs"] = {"reasoning_content": reasoning}
        return AIMessage(
            content=content, tool_calls=tool_calls, invalid_tool_calls=invalid,
            usage_metadata={"input_tokens": usage_in, "output_tokens": usage_out,
                            "total_tokens": usage_in + usage_out},
            response_metadata={"model_name": self.model_name, "model_provider": PROVIDER,
                               "finish_reason": "length" if any(s.get("cut") for s in steps)
                               else "tool_calls" if tool_calls else "stop"},
            **kwargs)

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._reply(messages))])

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None,
                **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        msg = self._reply(messages)
        text = msg.text
        parts = [p for p in re.split(r"(\s+)", text) if p] or [""]
        reasoning = msg.additional_kwargs.get("reasoning_content")
        if reasoning:
            chunk = AIMessageChunk(content="", id=msg.id,
                                   additional_kwargs={"reasoning_content": reasoning})
            yield ChatGenerationChunk(message=chunk)
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            chunk = AIMessageChunk(
                content=part, id=msg.id,
                tool_call_chunks=[
                    {"name": tc["name"], "args": json.dumps(tc["args"]), "id": tc["id"],
                     "index": j, "type": "tool_call_chunk"}
                    for j, tc in enumerate(msg.tool_calls)] + [
                    {"name": bad["name"], "args": bad["args"], "id": bad["id"],
                     "index": len(msg.tool_calls) + j, "type": "tool_call_chunk"}
                    for j, bad in enumerate(msg.invalid_tool_calls)] if last else [],
                usage_metadata=msg.usage_metadata if last else None,
                response_metadata=dict(msg.response_metadata) if last else {},
                chunk_position="last" if last else None)
            gen = ChatGenerationChunk(message=chunk)
            if run_manager:
                run_manager.on_llm_new_token(part, chunk=gen)
            yield gen
