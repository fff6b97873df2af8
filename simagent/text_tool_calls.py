"""Tool calls that a model wrote as text instead of as a call.

Small local models behind a chat template that describes tools in the prompt often
answer with the call itself as the reply's text, e.g. Qwen2.5-Coder-0.5B through
llama.cpp's server: ```` ```json {"name": "set_unit", "arguments": {"unit": "celsius"}} ```
```` or ``<tool_call>{...}</tool_call>``; the server passes it on as content, so the turn
would end with JSON as the "answer". A reply whose whole text is one such object naming
a tool the request offered is read as that call. When a single tool is offered (the small
tier offers ``run_python`` alone), a call under a name the model made up
(``sum_of_squares``, seen with Qwen2.5-Coder-0.5B) whose arguments fit that tool's schema
(only its parameters, all the required ones) is read as that tool's call. Pure: no
langchain here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from typing import Any

_WRAPPERS = (re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL),
             re.compile(r"^<tool_call>\s*(.*?)\s*</tool_call>$", re.DOTALL))


def text_tool_call(text: str, tools: Collection[str]) -> tuple[str, dict[str, Any]] | None:
    """``(name, arguments)`` when ``text`` is exactly one call of a tool in ``tools``
    (names, or names to their parameters' JSON schema, as :func:`offered_tools` gives:
    then a lone tool also takes a made-up name whose arguments fit its schema)."""
    body = (text or "").strip()
    for wrapper in _WRAPPERS:
        if found := wrapper.match(body):
            body = found.group(1).strip()
            break
    if not body.startswith("{"):
        return None
    try:
        call = json.loads(body)
    except ValueError:
        return None
    if not isinstance(call, dict) or set(call) - {"name", "arguments", "parameters"}:
        return None
    name = call.get("name")
    args = call.get("arguments", call.get("parameters", {}))
    if isinstance(args, str):  # some templates double-encode the arguments
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    if name not in tools:
        name = _lone_tool_fitting(args, tools)
    return None if name is None else (name, args)


def _lone_tool_fitting(args: dict[str, Any], tools: Collection[str]) -> str | None:
    if not isinstance(tools, Mapping) or len(tools) != 1:
        return None
    ((name, schema),) = tools.items()
    schema = schema if isinstance(schema, dict) else {}
    known = set(schema.get("properties") or {})
    required = set(schema.get("required") or ())
    return name if args and set(args) <= known and required <= set(args) else None


def offered_tools(tools: Any) -> dict[str, dict[str, Any]]:
    """The function names in a Chat Completions ``tools`` list, each to its parameters'
    JSON schema (``{}`` where it gives none)."""
    found: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            params = function.get("parameters")
            found[function["name"]] = params if isinstance(params, dict) else {}
    return found
