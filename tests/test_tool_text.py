"""Slim tool descriptions: fewer tokens, the same tools, the same instructions.

The tools are captured as the model receives them on the real graph (scripted model),
once with the slim texts and once with deepagents' stock ones, and measured with the
real ruler.
"""

from __future__ import annotations

import pytest

from simagent.agent.builder import build_agent
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.agent.tool_text import DESCRIPTIONS, task_description
from simagent.context.counting import count_tools, tool_schema
from simagent.context.settings import ContextSettings
from simagent.context.tokens import Ruler
from simagent.session import Session


def sent_tools(workspace, monkeypatch, *, slim: bool, steps=None):
    """(schemas by name, tool objects, the model) of the main agent's first request."""
    seen: list[list] = []
    original = ScriptedChatModel._reply

    def spy(self, messages):
        seen.append(list(self.bound_tools))
        return original(self, messages)

    monkeypatch.setattr(ScriptedChatModel, "_reply", spy)
    session = Session.create(workspace, approval="auto", simulator="scipy")
    try:
        model = ScriptedChatModel.from_steps(steps or [{"final": "ok"}], window=128_000)
        agent = build_agent(session, model,
                            context_settings=ContextSettings(slim_tools=slim))
        result = TurnRunner(session, agent).run("hi")
    finally:
        session.close()
    tools = seen[0]
    return {tool_schema(t)["function"]["name"]: tool_schema(t)["function"] for t in tools}, \
        tools, result


@pytest.fixture
def both(workspace, monkeypatch, tmp_path):
    slim = sent_tools(workspace, monkeypatch, slim=True)
    other = tmp_path / "ws2"
    other.mkdir()
    stock = sent_tools(other, monkeypatch, slim=False)
    return slim, stock


def shape(params: dict) -> dict:
    """A JSON schema without its descriptions: what the arguments may be."""
    if isinstance(params, dict):
        return {k: shape(v) for k, v in params.items() if k != "description"}
    if isinstance(params, list):
        return [shape(v) for v in params]
    return params


def test_slim_schemas_are_the_same_tools_for_far_fewer_tokens(both):
    (slim, slim_tools, _), (stock, stock_tools, _) = both
    assert set(slim) == set(stock) and {"read_file", "grep", "task", "run_python"} <= set(slim)
    for name in slim:  # same arguments, same types, same required ones
        assert shape(slim[name]["parameters"]) == shape(stock[name]["parameters"]), name
    ruler = Ruler("o200k_base")
    before, after = count_tools(stock_tools, ruler), count_tools(slim_tools, ruler)
    assert after < 0.75 * before, (before, after)
    for name in DESCRIPTIONS:  # each slim text is shorter than the stock one it replaces
        if name in slim:
            assert len(slim[name]["description"]) < len(stock[name]["description"]), name
    # no docstring indentation reaches the model
    assert all("\n    " not in s["description"] for s in slim.values())


@pytest.mark.slow
def test_slim_texts_keep_the_instructions_the_workflows_rely_on(both):
    (slim, _, _), (stock, _, _) = both
    text = {name: s["description"] for name, s in slim.items()}
    read = text["read_file"]
    for needle in ("absolute path", "100 lines", "`offset`", "`limit`", "Page through",
                   "saved to a file", "@@"):
        assert needle in read, needle
    for needle in ("LITERAL", "not a regex", "files_with_matches", "'content'", "'count'",
                   "`glob`", "`path`"):
        assert needle in text["grep"], needle
    assert "unique" in text["edit_file"] and "`replace_all`" in text["edit_file"]
    assert "`edit_file`" in text["write_file"] and "**" in text["glob"]
    assert "grep" in text["execute"] and "read_file" in text["execute"]
    task = text["task"]
    for needle in ("`description`", "every detail", "what to return", "parallel",
                   "not shown to the user"):
        assert needle in task, needle
    # every agent deepagents lists, with its own description, verbatim
    stock_task = stock["task"]["description"]
    agents = [line for line in stock_task.splitlines() if line.startswith("- ")
              and ":" in line and not line.startswith("- Launch")][:3]
    assert {a.split(":")[0] for a in agents} == {"- general-purpose", "- run-analyst",
                                                 "- source-explorer"}
    assert all(a in task for a in agents)
    assert "`read_file`" in text["run_python"] and "`view_figure`" in text["run_python"]
    assert "never cleared" in text["record_attempt"]


def test_the_tools_still_run_as_before(workspace, monkeypatch):
    """The model gets copies; the tool node runs the originals (paging and literal grep)."""
    lines = "".join(f"line {i} a|b\n" for i in range(10))
    (workspace / "data.txt").write_text(lines)
    path = str((workspace / "data.txt").resolve())
    steps = [{"tool": "read_file", "args": {"file_path": path, "offset": 3, "limit": 2}},
             {"tool": "grep", "args": {"pattern": "7 a|b", "path": str(workspace.resolve()),
                                       "output_mode": "content"}},
             {"final": "{out[-2]|line \\d} / {out[-1]|line 7}"}]
    _slim, _tools, result = sent_tools(workspace, monkeypatch, slim=True, steps=steps)
    assert result.status == "done" and result.final == "line 3 / line 7"


def test_task_text_falls_back_to_stock_when_the_list_moves():
    stock = "Launch a subagent.\n\nSome other layout."
    assert task_description(stock) == stock
