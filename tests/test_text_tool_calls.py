"""Tool calls written as text (simagent.text_tool_calls); the first case is what
Qwen2.5-Coder-0.5B answered through llama.cpp's server with its own chat template."""

from __future__ import annotations

from simagent.text_tool_calls import offered_tools, text_tool_call

TOOLS = {"set_unit", "run_python"}


def test_the_small_models_fenced_json_is_read_as_the_call() -> None:
    seen = ('```json\n{\n  "name": "set_unit",\n  "arguments": {\n    "unit": "fahrenheit"\n'
            '  }\n}\n```')
    assert text_tool_call(seen, TOOLS) == ("set_unit", {"unit": "fahrenheit"})


def test_tagged_bare_and_double_encoded_calls() -> None:
    assert text_tool_call('<tool_call>\n{"name": "run_python", "arguments": {"code": "1"}}\n'
                          "</tool_call>", TOOLS) == ("run_python", {"code": "1"})
    assert text_tool_call('{"name": "set_unit", "arguments": "{\\"unit\\": \\"celsius\\"}"}',
                          TOOLS) == ("set_unit", {"unit": "celsius"})
    assert text_tool_call('  {"name": "set_unit", "parameters": {}}  ', TOOLS) == (
        "set_unit", {})


def test_anything_else_stays_text() -> None:
    for text in ('{"name": "rm_rf", "arguments": {}}',           # not an offered tool
                 'The call is {"name": "set_unit", "arguments": {}}',  # prose around it
                 '{"name": "set_unit", "arguments": {}, "why": 1}',     # other keys
                 '{"name": "set_unit", "arguments": [1]}', "{not json", "", "42"):
        assert text_tool_call(text, TOOLS) is None, text


def test_offered_tools_reads_a_chat_completions_tools_list() -> None:
    tools = [{"type": "function", "function": {"name": "a"}}, {"type": "x"}, "junk"]
    assert offered_tools(tools) == {"a"} and offered_tools(None) == set()
