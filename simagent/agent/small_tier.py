"""What a small open-weight model is sent: a short prompt, skills by name, one or two tools,
and a first tool call decoded under the tool's grammar.

A 0.5B-1.5B model at an 8k window drowns in simagent's full request: the ground rules,
deepagents' filesystem, todo and subagent instructions and a dozen tool schemas come to
~6k tokens before the task, and on a 2-core CPU each of them costs a second of prompt
processing at best. It also answers from its imagination more often than it computes.
So, for the models :func:`simagent.context.thresholds.small_agent` names:

- the system prompt is replaced by :data:`SMALL_RULES` plus the simulator's import line,
  the workspace, the skills by name (each a path to read when needed) and the memory
  index the middleware above added;
- the model is shown only :func:`~simagent.context.thresholds.small_agent_tools` (the
  tool node still runs any call of the others), with short descriptions;
- with ``small_agent_force_call`` (on by default), until a call of the turn ran without
  an error and printed something (:func:`showed_something`), ``tool_choice`` names
  ``run_python``: llama.cpp's server then decodes the arguments under a grammar built
  from the tool's JSON schema, so the reply is a valid call that computes instead of a
  guessed answer (on the live bench, 0.5B at 8k, about 6 s for the call; unforced it
  guessed a number or wrote prose and code until its reply limit). It was off while a
  forced call took 11+ minutes on a loaded machine; given its CPU share there, the same
  call took seconds, so the grammar was not the cost;
- once a call printed without an error, the next request is the answer step, asked as a
  plain question (:func:`answer_request`: the question and what the code printed, no
  tools), which a 0.5B model answers; shown the exchange as tool calls, it re-sent the
  same call instead;
- each reply is limited to ``thresholds.reply_limit(window, small=True)`` unless the
  request sets a limit;
- a reply that writes its code as text (calls of invented tools, broken JSON, or a
  fenced Python block before anything ran) is read as the ``run_python`` call it meant
  (:func:`code_in_text`), unless it repeats code that already ran without an error;
  an exact call of an offered tool is already read as one by ``simagent.compatible_chat``.

It sits just outside the context layers, so what they count and the recorder traces is
the request as sent. Request only: the state and the graph's tools are untouched.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import BaseTool

from simagent.context.clearing import is_error
from simagent.context.counting import MEMORY_MARKER
from simagent.kernel.result import NO_OUTPUT
from simagent.simulators import Simulator

#: The rules and one worked pattern. The pattern holds no number and no unit: a concrete
#: example ("the largest T is 312.5 K") leaked into the 0.5B model's answers ("compute
#: the mean of 3, 5 and 10" got "6.0 K"; a story request got "The largest T is 312.5 K.").
#: It holds no advice either: "..., in the units the question gave, if any" as its reply
#: came back as "The mean of 3, 5 and 10 is 6.0, in the units the question gave."
SMALL_RULES = """\
You are simagent, a scientist's assistant with a persistent Python kernel.
Answer by computing: first call `run_python` with short code that computes the result \
and prints it with a label (and units, if it has any); write strings in the code with \
single quotes. Write no explanation before the call. Every \
number you report must be one your code printed. The kernel keeps variables between \
calls. If the code fails, read the error and call `run_python` again with fixed code.
When the printed output answers the question, reply without a tool call: one sentence \
with the printed numbers (and their units, if any), and the files you saved.

How a task goes (a pattern, not a task: each <...> stands for what the real question \
and the real output say; never answer with the pattern's words):
Question: "<file> has a column <name>. What is its largest value?"
Call run_python with:
import pandas as pd
df = pd.read_csv('<file>')
print('largest <name> =', df['<name>'].max())
It prints: largest <name> = <value>
Reply: The largest <name> is <value>."""

#: Short model-facing descriptions for the tools a small model is shown.
SHORT_DESCRIPTIONS = {
    "run_python": "Run Python code in the persistent kernel (working directory: the "
                  "workspace). Returns what the code prints, or the error.",
    "read_file": "Read a text file (absolute path); `offset` and `limit` page it.",
}
FORCED_TOOL = "run_python"


def skill_names(sources: Sequence[str | Path]) -> list[tuple[str, Path]]:
    """(name, SKILL.md path) of every skill in ``sources``, later sources overriding."""
    found: dict[str, Path] = {}
    for source in sources:
        for skill in sorted(Path(source).glob("*/SKILL.md")):
            found[skill.parent.name] = skill
    return sorted(found.items())


def small_prompt(sim: Simulator | None, workspace: Path,
                 skills: Sequence[tuple[str, Path]]) -> str:
    """The small model's system prompt, memory index excluded (added per request)."""
    parts = [SMALL_RULES, f"Workspace (the kernel's working directory): {workspace}"]
    if sim is not None:
        parts.append(f"Simulator: {sim.display_name}; import "
                     + ", ".join(sim.packages or ()) + ".")
    if skills:
        parts.append("Skills (read one with print(open(path).read()) only if the task "
                     "needs it): " + "; ".join(f"{n}: {p}" for n, p in skills))
    return "\n\n".join(parts)


def memory_index(system_text: str) -> str:
    """The workspace memory block the memory middleware put in the prompt ('' if none or
    empty)."""
    start = system_text.find(MEMORY_MARKER)
    if start < 0:
        return ""
    end = system_text.find("</workspace_memory>", start)
    body = system_text[start + len(MEMORY_MARKER):end if end > 0 else None].strip()
    if not body or body.startswith("(No memory"):
        return ""
    return f"Workspace notes (read one if it matters):\n{body}"


#: ``"code": "..."`` in a call written as text; the string may lack its closing quote
_CODE_ARG = re.compile(r'"code"\s*:\s*"((?:[^"\\\n]|\\.)*)(?:"|(?=\}\s*\}))')
_PY_BLOCK = re.compile(r"```(?:python|py)\s*\n(.*?)```", re.DOTALL)
#: ``response_metadata`` key on a reply whose code was read from its text
CODE_TEXT_KEY = "simagent_code_from_text"


def code_in_text(text: str, *, blocks: bool) -> str | None:
    """The code a small model wrote as text instead of calling ``run_python``: the
    ``code`` arguments of calls it wrote out (any name, even cut-off JSON: a 0.5B model
    answered the canary with two calls of tools it invented), or, with ``blocks``, its
    fenced Python blocks. None when there is none."""
    found = []
    text = text or ""
    # arguments double-encoded as a JSON string: {"arguments": "{\\"code\\": \\"...\\"}"}
    raws, twice = _CODE_ARG.findall(text), False
    if not raws:
        raws, twice = _CODE_ARG.findall(text.replace('\\"', '"')), True
    for raw in raws:
        code = _unescape(raw)
        found.append(_unescape(code.replace("\n", "\\n")) if twice else code)
    if not found and blocks:
        found = [b.strip() for b in _PY_BLOCK.findall(text) if b.strip()]
    return "\n".join(found) if found else None


def _unescape(raw: str) -> str:
    """A JSON string body's text; as written when it is not valid JSON."""
    try:
        return json.loads(f'"{raw}"')
    except ValueError:
        return raw


def as_run_python(msg: AIMessage, code: str) -> AIMessage:
    """``msg`` as the ``run_python`` call its text meant."""
    return AIMessage(content="", id=msg.id, tool_calls=[{
        "name": FORCED_TOOL, "args": {"code": code}, "id": f"call_text_code_{msg.id or ''}",
        "type": "tool_call"}], response_metadata={**(msg.response_metadata or {}),
                                                  CODE_TEXT_KEY: True},
        usage_metadata=msg.usage_metadata)


def _compiles(code: str) -> bool:
    try:
        compile(code, "<cell>", "exec")
    except (SyntaxError, ValueError):
        return False
    return True


#: At most this many characters of JSON's ends (``"``, ``}``) after over-escaped code.
JSON_DEBRIS = 4


def repaired_code(code: str) -> str | None:
    """``code`` repaired of what a small model's JSON left in it, when only that makes it
    Python; None otherwise.

    Newlines escaped once too often (``\\n`` in its JSON, so the cell holds a backslash
    and an ``n``) are made real: live bench, 0.5B under the forced grammar, ``from
    scipy.optimize import brentq\\nx = brentq(...)`` failed three times with "unexpected
    character after line continuation character" until the REPL watchdog stopped the
    turn. Up to :data:`JSON_DEBRIS` closing quotes and braces of the JSON at the code's end
    go too: the 1.5B model's over-escaped code ended ``...s')""}``, and in a TUI session
    the 0.5B model's first call was ``print('mean =', (3 + 5 + 10) / 3)}``."""
    if _compiles(code):
        return None
    newlines = code.replace("\\\\n", "\n").replace("\\n", "\n")  # once or twice too often
    for fixed in dict.fromkeys((newlines, code)):  # the newlines, then the ends alone
        for cut in range(JSON_DEBRIS + 1):
            if cut and (len(fixed) <= cut or fixed[-cut] not in "\"}"):
                break
            candidate = fixed[:len(fixed) - cut]
            if _compiles(candidate):
                return candidate
    return None


def with_repaired_code(msg: AIMessage) -> AIMessage:
    """``msg`` with each ``run_python`` call's code repaired (:func:`repaired_code`);
    ``msg`` itself when none needs it."""
    calls, changed = [], False
    for call in msg.tool_calls:
        code = call.get("args", {}).get("code") if call.get("name") == FORCED_TOOL else None
        fixed = repaired_code(code) if isinstance(code, str) else None
        if fixed is not None:
            call, changed = {**call, "args": {**call["args"], "code": fixed}}, True
        calls.append(call)
    return msg.model_copy(update={"tool_calls": calls}) if changed else msg


def short_tool(tool: Any) -> Any:
    """A copy of ``tool`` with its short description (request only)."""
    text = SHORT_DESCRIPTIONS.get(getattr(tool, "name", ""))
    if text is None or not isinstance(tool, BaseTool):
        return tool
    return tool.model_copy(update={"description": text})


def showed_something(msg: ToolMessage) -> bool:
    """A result the answer can rest on: not an error (``clearing.is_error``) and not a
    cell that printed nothing (live-root at 16k assigned the root without printing it;
    the answer step, shown "(no output)", guessed x = -1.5)."""
    return not is_error(msg) and msg.text.strip() != NO_OUTPUT


def ran_a_tool(messages: Sequence[Any], *, ok: bool = False) -> bool:
    """Whether the current turn (since the person's last message) has a tool result;
    with ``ok``, one that showed something (:func:`showed_something`)."""
    for msg in reversed(messages):
        if isinstance(msg, ToolMessage) and (not ok or showed_something(msg)):
            return True
        if isinstance(msg, HumanMessage) and not msg.additional_kwargs.get("lc_source"):
            return False
    return False


def turn_messages(messages: Sequence[Any]) -> list[Any]:
    """The current turn's messages (after the person's last message)."""
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if isinstance(msg, HumanMessage) and not msg.additional_kwargs.get("lc_source"):
            return list(messages[i + 1:])
    return list(messages)


def answer_due(messages: Sequence[Any]) -> bool:
    """Whether the last message is a tool result that showed something."""
    return bool(messages) and isinstance(messages[-1], ToolMessage) \
        and showed_something(messages[-1])


ANSWER_ASK = ("Your code printed:\n{output}\n\nAnswer the question in one sentence, with "
              "the printed numbers (and their units, if any).")


def answer_request(messages: Sequence[Any]) -> list[Any]:
    """The answer step as a plain question: the person's question and what the code just
    printed, no tool calls, no tools. Shown the exchange as tool calls, the 0.5B model
    re-sent the call that had just printed the answer (as text, until its reply limit),
    with or without tool schemas, on every live workflow. A call it still writes as text
    is run unless it repeats code that ran (:func:`ran_ok_code`)."""
    question = next((m for m in reversed(messages) if isinstance(m, HumanMessage)
                     and not m.additional_kwargs.get("lc_source")), None)
    output = messages[-1].text if hasattr(messages[-1], "text") else str(messages[-1].content)
    ask = ANSWER_ASK.format(output=output.strip())
    return [HumanMessage(f"{question.text}\n\n{ask}" if question else ask)]


def ran_ok_code(messages: Sequence[Any]) -> set[str]:
    """The ``run_python`` code of this turn's calls whose result was not an error."""
    turn = turn_messages(messages)
    ok = {m.tool_call_id for m in turn if isinstance(m, ToolMessage) and not is_error(m)}
    return {str(c["args"].get("code", "")).strip() for m in turn if isinstance(m, AIMessage)
            for c in m.tool_calls if c["name"] == FORCED_TOOL and c.get("id") in ok}


class SmallModelMiddleware(AgentMiddleware):
    """The small model's request (see the module docstring)."""

    def __init__(self, prompt: str, tools: Sequence[str], *, reply_tokens: int,
                 force_call: bool = False) -> None:
        super().__init__()
        self.prompt, self.shown, self.force_call = prompt, tuple(tools), force_call
        self.reply_tokens = reply_tokens
        self._copies: dict[int, Any] = {}

    @property
    def name(self) -> str:
        return "SmallModelMiddleware"

    def rewrite(self, request: Any) -> Any:
        system = request.system_message.text if request.system_message else ""
        prompt = "\n\n".join(p for p in (self.prompt, memory_index(system)) if p)
        shown = []
        for tool in request.tools:
            if getattr(tool, "name", None) in self.shown:
                if id(tool) not in self._copies:
                    self._copies[id(tool)] = short_tool(tool)
                shown.append(self._copies[id(tool)])
        messages = request.messages
        if answer_due(messages):
            shown, messages = [], answer_request(messages)
        names = {getattr(t, "name", None) for t in shown}
        force = self.force_call and FORCED_TOOL in names \
            and not ran_a_tool(request.messages, ok=True)
        settings = {"max_tokens": self.reply_tokens, **request.model_settings}
        return request.override(
            system_message=SystemMessage(prompt), tools=shown, model_settings=settings,
            messages=messages,
            tool_choice={"type": "function", "function": {"name": FORCED_TOOL}}
            if force else request.tool_choice if shown else None)

    def read_code(self, request: Any, response: Any) -> Any:
        """A reply that wrote its code as text becomes the ``run_python`` call it meant
        (fenced blocks only before the turn ran anything: later, an answer may quote
        code), unless that code already ran without an error in this turn."""
        messages = getattr(response, "result", None)
        if FORCED_TOOL not in self.shown or not messages:
            return response
        last = messages[-1]
        if isinstance(last, AIMessage) and last.tool_calls:
            response.result = [*messages[:-1], with_repaired_code(last)]
            return response
        if not isinstance(last, AIMessage):
            return response
        code = code_in_text(last.text, blocks=not ran_a_tool(request.messages))
        if code is None or code.strip() in ran_ok_code(request.messages):
            return response  # a repeat of code that ran is not run again
        response.result = [*messages[:-1], as_run_python(last, code)]
        return response

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        request = self.rewrite(request)
        return self.read_code(request, handler(request))

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        request = self.rewrite(request)
        return self.read_code(request, await handler(request))
