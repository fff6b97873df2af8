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


def test_a_lone_tool_takes_a_made_up_name_whose_arguments_fit_it() -> None:
    run_python = offered_tools([{"type": "function", "function": {
        "name": "run_python", "parameters": {"type": "object", "properties": {
            "code": {"type": "string"}, "timeout_s": {"type": "number"}},
            "required": ["code"]}}}])
    # what Qwen2.5-Coder-0.5B wrote in the TUI, offered run_python alone
    seen = ('{\n  "name": "sum_of_squares",\n  "arguments": {\n    "code": "print(sum(i*i '
            'for i in range(1, 101)))"\n  }\n}')
    assert text_tool_call(seen, run_python) == (
        "run_python", {"code": "print(sum(i*i for i in range(1, 101)))"})
    for args in ('{"cmd": "ls"}', '{"timeout_s": 5}', '{}'):  # not its parameters, or short
        assert text_tool_call(f'{{"name": "x", "arguments": {args}}}', run_python) is None
    two = {**run_python, "read_file": {"properties": {"code": {}}}}
    assert text_tool_call(seen, two) is None  # more than one tool: whose would it be?
    assert text_tool_call(seen, {"run_python"}) is None  # names alone: no schema to fit


def test_offered_tools_reads_a_chat_completions_tools_list() -> None:
    tools = [{"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
             {"type": "function", "function": {"name": "b"}}, {"type": "x"}, "junk"]
    assert offered_tools(tools) == {"a": {"type": "object"}, "b": {}}
    assert offered_tools(None) == {}
