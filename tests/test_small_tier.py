"""A small open-weight model's request: short prompt, skills by name, one or two tools,
a reply limit, and (``small_agent_force_call``) a first call forced to ``run_python``
(``agent/small_tier.py``).

The real graph and a real kernel play a script; the model records what each call bound
(tool names and ``tool_choice``), which is what an OpenAI-compatible server receives.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import SystemMessage
from pydantic import Field

from simagent.agent.builder import build_agent
from simagent.agent.prompts import GROUND_RULES
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.agent.small_tier import (
    SMALL_RULES,
    SmallModelMiddleware,
    answer_due,
    code_in_text,
    ran_a_tool,
)
from simagent.bench.policies import POLICIES
from simagent.context.settings import ContextSettings
from simagent.context.thresholds import SMALL_REPLY_TOKENS, model_tier, reply_limit, small_agent
from simagent.session import Session

FORCED = {"type": "function", "function": {"name": "run_python"}}
STEPS = [{"tool": "run_python", "args": {"code": "x = 6 * 7\nprint('x =', x)"}},
         {"final": "x is 42."}]


class BindingRecorder(ScriptedChatModel):
    """The scripted model, noting the tools and tool_choice each call binds."""

    bindings: list[tuple[list[str], Any]] = Field(default_factory=list)
    limits: list[Any] = Field(default_factory=list)

    def bind_tools(self, tools: Any, *, tool_choice: Any = None, **kwargs: Any) -> Any:
        names = sorted(getattr(t, "name", None) or t.get("name") or t["function"]["name"]
                       for t in tools)
        self.bindings.append((names, tool_choice))
        self.limits.append(kwargs.get("max_tokens"))
        return super().bind_tools(tools, tool_choice=tool_choice, **kwargs)

    def bind(self, **kwargs: Any) -> Any:  # a request without tools (the answer step)
        self.bindings.append(([], None))
        self.limits.append(kwargs.get("max_tokens"))
        return super().bind(**kwargs)


def play(workspace: Path, name: str, window: int,
         settings: ContextSettings | None = None, steps: list | None = None) -> BindingRecorder:
    model = BindingRecorder.from_steps(steps or STEPS, window=window, name=name)
    session = Session.create(workspace, simulator="scipy", approval="auto")
    try:
        agent = build_agent(session, model, front_end="headless",
                            context_settings=replace(settings or ContextSettings(),
                                                     window=window))
        session.start_kernel()
        result = TurnRunner(session, agent).run("What is 6 times 7? Compute it.")
        assert result.status == "done" and result.final == "x is 42."
    finally:
        session.close()
    return model


def system_text(model: ScriptedChatModel, call: int) -> str:
    first = model.requests[call][0]
    assert isinstance(first, SystemMessage)
    return first.text


def test_the_tier_places_sub_billion_models_by_name() -> None:
    assert model_tier("local:qwen2.5-coder-0.5b") == "small"  # was unplaced (None)
    assert small_agent("local:qwen2.5-coder-0.5b", ContextSettings())
    assert small_agent("ollama:qwen3:4b", ContextSettings())
    # small-tier API models keep the full tool set; replay stands for a frontier model
    assert not small_agent("anthropic:claude-haiku-4-5", ContextSettings())
    assert not small_agent("replay:canary", ContextSettings())
    assert not small_agent("local:qwen2.5-coder-0.5b", ContextSettings(small_agent=False))


def test_a_small_model_at_8k_sees_one_tool_and_a_short_prompt(workspace: Path) -> None:
    model = play(workspace, "scripted:qwen2.5-coder-0.5b", 8192)
    assert model.bindings == [(["run_python"], FORCED), ([], None)]
    assert model.limits == [SMALL_REPLY_TOKENS] * 2
    prompt = system_text(model, 0)
    assert prompt.startswith(SMALL_RULES) and GROUND_RULES not in prompt
    assert str(workspace) in prompt
    assert "scipy-overview:" in prompt and "SKILL.md" in prompt  # skills by name and path
    assert len(prompt) < 2500


def test_a_small_models_reply_limit_fits_what_the_budget_reserves(workspace: Path) -> None:
    """At a 2k window the budget reserves a quarter (512) for the reply; the small tier
    asked for its 1,024 regardless, so a full request could not fit. A configured
    ``max_output`` is what the budget reserves, and the limit too."""
    model = play(workspace, "scripted:qwen2.5-coder-0.5b", 2048)
    assert model.limits == [reply_limit(2048)] * 2 == [512] * 2
    model = play(workspace, "scripted:qwen2.5-coder-0.5b", 8192,
                 ContextSettings(max_output_tokens=300))
    assert model.limits == [300] * 2


def test_a_small_model_at_16k_also_sees_read_file(workspace: Path) -> None:
    model = play(workspace, "scripted:qwen2.5-coder-0.5b", 16384)
    assert model.bindings[0] == (["read_file", "run_python"], FORCED)


def test_the_answer_step_is_a_plain_question_with_what_the_code_printed(
        workspace: Path) -> None:
    """Shown its exchange as tool calls, the 0.5B model re-sent the call that had printed
    the answer until its reply limit (live bench, every live workflow); asked plainly, it
    answered (live-mean passed)."""
    from langchain_core.messages import HumanMessage

    for force in (True, False):
        ws = workspace / str(force)
        ws.mkdir()
        model = play(ws, "scripted:qwen2.5-coder-0.5b", 8192,
                     ContextSettings(small_agent_force_call=force))
        assert model.bindings == [(["run_python"], FORCED if force else None), ([], None)]
        system, ask = model.requests[1]
        assert isinstance(ask, HumanMessage) and system.text.startswith(SMALL_RULES)
        assert ask.text.startswith("What is 6 times 7? Compute it.")
        assert "Your code printed:\nx = 42" in ask.text


def test_the_small_prompts_pattern_holds_nothing_that_can_pass_for_an_answer() -> None:
    """Its worked example leaked into the 0.5B model's answers: "compute the mean of 3, 5
    and 10" was answered "6.0 K", a story request "The largest T is 312.5 K." (the
    example's unit and numbers). The pattern now names what varies by placeholders: no
    digit, no unit, and each name it uses is one, so a leaked word reads as one."""
    _, pattern = SMALL_RULES.split("How a task goes")
    assert re.search(r"\d", SMALL_RULES) is None  # no number anywhere in the rules
    example = pattern.split("\n", 1)[1]
    assert "not a task" in pattern.split("\n", 1)[0]  # fenced: said to be a pattern
    # the pattern's own words are placeholders: strip them and no name is left to copy
    bare = re.sub(r"<[a-z ]+>", "", example)
    assert not re.search(r"\b[A-Z]\b|\b(K|s|m|mV|Pa|kg|degC|°C)\b", bare), bare
    assert {"<file>", "<name>", "<value>"} <= set(re.findall(r"<[a-z ]+>", example))
    compile(re.sub(r"<[a-z ]+>", "x", example.split("with:\n")[1].split("It prints")[0]),
            "<pattern>", "exec")  # the code shown is Python, placeholders filled in
    # the reply it shows is placeholders and plain words only: a clause of advice there
    # ("in the units the question gave") was copied into an answer
    reply = example.split("Reply: ")[1]
    assert re.sub(r"<[a-z ]+>", "", reply) == "The largest  is ."


def test_the_stock_policy_and_a_large_model_get_the_full_request(tmp_path: Path) -> None:
    for i, (name, settings) in enumerate([
            ("scripted:qwen2.5-coder-0.5b", POLICIES["stock"].settings),
            ("scripted:claude-sonnet-4-5", None)]):
        ws = tmp_path / f"ws{i}"
        ws.mkdir()
        model = play(ws, name, 8192, settings)
        tools, choice = model.bindings[0]
        assert choice is None and {"run_python", "read_file", "task"} <= set(tools)
        assert model.limits[0] is None
        assert system_text(model, 0).startswith(GROUND_RULES)


@pytest.mark.parametrize(("kinds", "ran"), [
    (["human"], False), (["human", "ai", "tool"], True),
    (["human", "ai", "tool", "human"], False), (["human", "ai", "tool", "nudge"], True)])
def test_the_first_call_of_a_turn_is_the_one_forced(kinds: list[str], ran: bool) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    make = {"human": lambda: HumanMessage("q"), "ai": lambda: AIMessage("a"),
            "tool": lambda: ToolMessage("r", tool_call_id="1"),
            "nudge": lambda: HumanMessage("n", additional_kwargs={"lc_source": "x"})}
    assert ran_a_tool([make[k]() for k in kinds]) is ran


@pytest.mark.parametrize(("results", "forced_after"), [
    ([], True), (["error"], True), (["error", "ok"], False), (["ok"], False)])
def test_a_call_stays_forced_until_a_result_is_not_an_error(results: list[str],
                                                            forced_after: bool) -> None:
    """The 0.5B model's forced first call ended its code string early (a SyntaxError);
    unforced, its fix was prose and JSON until the reply limit (live bench, live-mean)."""
    from langchain_core.messages import HumanMessage, ToolMessage

    history = [HumanMessage("q"), *(ToolMessage(
        "r", tool_call_id=str(i), artifact={"status": s}) for i, s in enumerate(results))]
    assert ran_a_tool(history, ok=True) is not forced_after


def test_a_cell_that_printed_nothing_keeps_the_call_forced_and_is_not_answered() -> None:
    """live-root at 16k: the 0.5B model assigned the root without printing it; the answer
    step, shown "(no output)", guessed x = -1.5. Such a result is no ground to answer on."""
    from langchain_core.messages import HumanMessage, ToolMessage

    from simagent.kernel.result import NO_OUTPUT

    silent = ToolMessage(NO_OUTPUT, tool_call_id="1", artifact={"status": "ok"})
    printed = ToolMessage("root = 1.6717", tool_call_id="2", artifact={"status": "ok"})
    assert not ran_a_tool([HumanMessage("q"), silent], ok=True)
    assert not answer_due([HumanMessage("q"), silent])
    assert ran_a_tool([HumanMessage("q"), silent, printed], ok=True)
    assert answer_due([HumanMessage("q"), silent, printed])


#: Qwen2.5-Coder-0.5B's whole reply to the canary on the live bench (8k): two calls of
#: tools it made up, the first one's code string never closed
CANARY_REPLY = (
    '{"name": "mean_reading", "arguments": {"code": "import numpy as np; data = '
    "np.loadtxt('data/measurements.csv'); mean_reading = np.mean(data); "
    'print(mean_reading)}}\n{"name": "slope_of_linear_fit", "arguments": {"code": "import '
    "numpy as np; data = np.loadtxt('data/measurements.csv'); x = data[:,0]; y = data[:,1]; "
    'slope = np.polyfit(x, y, 1); print(slope)"}}')


def test_code_written_as_text_is_read_from_calls_and_blocks() -> None:
    code = code_in_text(CANARY_REPLY, blocks=False)
    assert code is not None and code.splitlines() == [
        "import numpy as np; data = np.loadtxt('data/measurements.csv'); "
        "mean_reading = np.mean(data); print(mean_reading)",
        "import numpy as np; data = np.loadtxt('data/measurements.csv'); x = data[:,0]; "
        "y = data[:,1]; slope = np.polyfit(x, y, 1); print(slope)"]
    assert code_in_text('{"name": "f", "arguments": {"code": "a = 1\\nprint(a)"}}',
                        blocks=False) == "a = 1\nprint(a)"
    # its second reply on scipy-plot-decay: the arguments double-encoded as a string
    double = ('{"name": "run_python", "arguments": "{\\"code\\": \\"import numpy\\\\n'
              'tau = 20.0\\"}"}')
    assert code_in_text(double, blocks=False) == "import numpy\ntau = 20.0"
    block = "Run this:\n```python\nprint(2)\n```"
    assert code_in_text(block, blocks=True) == "print(2)"
    assert code_in_text(block, blocks=False) is None  # after a run, an answer may quote code
    assert code_in_text("The mean is 6.25 mV.", blocks=True) is None


def test_a_small_models_code_written_as_text_runs_as_run_python(workspace: Path) -> None:
    steps = [{"final": '{"name": "compute", "arguments": {"code": "x = 6 * 7\\n'
                       "print('x =', x)\"}}"}, {"final": "x is 42."}]
    session_model = play(workspace, "scripted:qwen2.5-coder-0.5b", 8192, steps=steps)
    assert len(session_model.bindings) == 2  # the text became a call; its result went back
    assert "x = 42" in session_model.requests[1][-1].text


def test_text_that_repeats_code_which_ran_is_not_run_again() -> None:
    """After a call printed the answer, the 0.5B model wrote that same call as text
    (live-mean, 8k); run again, it only loops to the budget."""
    from types import SimpleNamespace

    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    code = "print('x =', 6 * 7)"
    ran = AIMessage("", tool_calls=[{"name": "run_python", "args": {"code": code},
                                     "id": "c1", "type": "tool_call"}])
    history = [HumanMessage("q"), ran, ToolMessage("x = 42", tool_call_id="c1",
                                                   artifact={"status": "ok"})]
    text = '{"name": "run_python", "arguments": {"code": "' + code + '"}}'
    middleware = SmallModelMiddleware("p", ["run_python"], reply_tokens=100)
    same = middleware.read_code(SimpleNamespace(messages=history),
                                SimpleNamespace(result=[AIMessage(text)]))
    assert not same.result[-1].tool_calls  # left as the reply
    failed = [*history[:2], ToolMessage("NameError", tool_call_id="c1",
                                        artifact={"status": "error"})]
    again = middleware.read_code(SimpleNamespace(messages=failed),
                                 SimpleNamespace(result=[AIMessage(text)]))
    assert again.result[-1].tool_calls[0]["args"] == {"code": code}  # a retry runs


#: The 0.5B model's forced calls on live-root at 16k (live bench): newlines escaped once
#: too often in its JSON, then twice; each failed with "unexpected character after line
#: continuation character" until the REPL watchdog stopped the turn
OVER_ESCAPED = ("from scipy.optimize import brentq\\nx = brentq(lambda x: x**3 - x - 3, 1.0, "
                "2.0)\nprint('root', x)\\\\nx")


def test_a_call_whose_newlines_were_escaped_too_often_runs_as_meant() -> None:
    from langchain_core.messages import AIMessage

    from simagent.agent.small_tier import repaired_code, with_repaired_code

    fixed = repaired_code(OVER_ESCAPED)
    assert fixed == ("from scipy.optimize import brentq\nx = brentq(lambda x: x**3 - x - 3, "
                     "1.0, 2.0)\nprint('root', x)\nx")
    msg = AIMessage("", id="m", tool_calls=[
        {"name": "run_python", "args": {"code": OVER_ESCAPED, "timeout_s": None}, "id": "1"},
        {"name": "read_file", "args": {"file_path": "a\\nb"}, "id": "2"}])
    calls = with_repaired_code(msg).tool_calls
    assert calls[0]["args"] == {"code": fixed, "timeout_s": None}
    assert calls[1]["args"] == {"file_path": "a\\nb"}  # only run_python's code
    # code that is Python as written, or that no newline repair makes Python, is left alone
    assert repaired_code("print('a\\nb')") is None
    assert repaired_code("x = 1\\ny = (") is None
    assert repaired_code("x = 1\ny = 2") is None
    assert with_repaired_code(AIMessage("", tool_calls=[
        {"name": "run_python", "args": {"code": "x = 1"}, "id": "1"}])).tool_calls[0]["args"] \
        == {"code": "x = 1"}


#: The 1.5B model's retries on live-cooling-fit (live bench): its first call's code,
#: escaped once too often, with the ends of the JSON it escaped left after it
FIT = ("import pandas as pd\\nfrom scipy.optimize import curve_fit\\ndata = "
       "pd.read_csv('data/cooling.csv')\\nprint(f'k = {data.t_s.max()} s⁻¹')")


@pytest.mark.parametrize("debris", ['"', '""}', ""])
def test_over_escaped_code_runs_without_the_json_ends_left_after_it(debris: str) -> None:
    from simagent.agent.small_tier import repaired_code

    assert repaired_code(FIT + debris) == FIT.replace("\\n", "\n")
    # a closing brace or quote the code needs stays; no more than JSON's ends are cut
    assert repaired_code("d = {'a': 1}\\nprint(d)") == "d = {'a': 1}\nprint(d)"
    assert repaired_code("x = {\\n'a': 1}") == "x = {\n'a': 1}"
    assert repaired_code("x = 1\\nprint(x)\"}\"}\"}") is None  # six: more than JSON's


def test_a_brace_of_the_json_left_in_one_line_of_code_goes() -> None:
    """The 0.5B model's first call in a TUI session: no escaped newline, one brace."""
    from simagent.agent.small_tier import repaired_code

    assert repaired_code("print('mean =', (3 + 5 + 10) / 3)}") == \
        "print('mean =', (3 + 5 + 10) / 3)"
    # an escaped newline the code means (in a string) stays when only the brace is JSON's
    assert repaired_code("print('a\\nb')}") == "print('a\\nb')"
    assert repaired_code("print('a')}}}}}") is None  # five: more than JSON's ends


def test_the_repair_applies_to_the_models_reply_in_the_graph(workspace: Path) -> None:
    """The middleware hands the tool node the repaired call: the real graph and kernel,
    the scripted model named like a small one; the answer step shows what it printed."""
    from langchain_core.messages import HumanMessage

    model = play(workspace, "scripted:qwen2.5-coder-0.5b", 8192, steps=[
        {"tool": "run_python", "args": {"code": "x = 6 * 7\\nprint('x =', x)"}},
        {"final": "x is 42."}])
    ask = model.requests[1][-1]
    assert isinstance(ask, HumanMessage) and "Your code printed:\nx = 42" in ask.text


FAILING = {"tool": "run_python", "args": {"code": "print(1 / 0)"}}


@pytest.mark.parametrize(("name", "stopped"), [("scripted:qwen2.5-coder-0.5b", True),
                                               ("scripted:claude-sonnet-4-5", False)])
def test_at_the_tui_a_small_models_rerun_of_a_failed_cell_stops_the_turn(
        workspace: Path, name: str, stopped: bool) -> None:
    """A small model re-running the cell that just failed is stopped before the rerun runs
    (it did not act on the warning, issue 41); a large one is warned and goes on."""
    model = ScriptedChatModel.from_steps([FAILING, FAILING, FAILING, {"final": "gave up"}],
                                         window=8192, name=name)
    session = Session.create(workspace, simulator="scipy", approval="auto")
    try:
        agent = build_agent(session, model, front_end="tui")
        session.start_kernel()
        TurnRunner(session, agent).run("Divide one by zero.")
        alerts = [e.payload for e in session.trace.events(["repl_watchdog"])]
        cells = [e for e in session.trace.events(["kernel_exec"]) if e.payload["tool_call_id"]]
    finally:
        session.close()
    assert [(a["signal"], a["mode"], a["stopped"]) for a in alerts][:1] == [
        ("whitespace_rerun", "enforce" if stopped else "warn", stopped)]
    assert len(cells) == (1 if stopped else 3)  # the rerun never reached the kernel
