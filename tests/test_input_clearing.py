"""Input clearing: a cleared ``run_python`` result takes its code out of view too.

The call stays (same id, name, argument keys) with ``code`` swapped for a pointer to
``_out[n].code``, so every provider still pairs it with its result. Checked three ways:
the pure rewrite; a property test over random conversations and random clearing sets,
through the Anthropic and OpenAI (chat and Responses) message converters; and a real
graph, kernel and files, where an epoch clears results and the next request carries the
pointers, which the kernel resolves to the original code.
"""

from __future__ import annotations

import itertools
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_anthropic.chat_models import _format_messages
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_openai.chat_models.base import (
    _construct_responses_api_input,
    _convert_message_to_dict,
)

from simagent.bench.policies import POLICIES, resolve_policies
from simagent.context.boundaries import orphans, safe_cuts
from simagent.context.clearing import (
    apply_cleared,
    clearable_inputs,
    decide_epoch,
    input_pointer,
)
from simagent.context.compaction import view_of
from simagent.context.counting import count_messages
from simagent.context.epoch_cost import UNPRICED
from simagent.context.settings import ContextSettings
from simagent.context.state import CLEARED_INPUTS_KEY, current_view

CODE = "import numpy as np\n" + "# a long cell that set up the sweep\n" * 30 + "print(1)"


def raw(n: int) -> str:
    return f"/sess/outputs/{n:04d}.txt"


def kernel_result(call_id: str, n: int | None, text: str = "1", status: str = "ok"):
    return ToolMessage(text, tool_call_id=call_id, name="run_python", id=f"t-{call_id}",
                       artifact={"raw_path": raw(n) if n is not None else None,
                                 "status": status})


# ------------------------------------------------------------------- the rewrite
def test_a_cleared_cells_code_becomes_a_pointer_and_nothing_else_changes():
    ai = AIMessage(
        [{"type": "text", "text": "two things"},
         {"type": "tool_use", "id": "c1", "name": "run_python",
          "input": {"code": CODE, "timeout_s": 60}},
         {"type": "tool_use", "id": "c2", "name": "read_file",
          "input": {"file_path": "/w/a.txt"}}],
        id="ai-1",
        tool_calls=[{"name": "run_python", "args": {"code": CODE, "timeout_s": 60}, "id": "c1"},
                    {"name": "read_file", "args": {"file_path": "/w/a.txt"}, "id": "c2"}],
        additional_kwargs={"tool_calls": [
            {"id": "c1", "type": "function", "function": {
                "name": "run_python", "arguments": json.dumps({"code": CODE})}}]})
    msgs = [HumanMessage("go", id="h"), ai, kernel_result("c1", 12),
            ToolMessage("file text", tool_call_id="c2", name="read_file", id="t-c2")]
    cleared = {"c1", "c2"}
    inputs = clearable_inputs(msgs, cleared)
    assert inputs == {"c1"}  # read_file has no input worth a pointer
    view = apply_cleared(msgs, cleared, inputs)

    pointer = input_pointer(12)
    assert pointer == "# code cleared from view: _out[12].code"
    compile(pointer, "<pointer>", "exec")  # still Python: a model may echo it back
    new = view[1]
    assert (new.id, [c["id"] for c in new.tool_calls]) == ("ai-1", ["c1", "c2"])
    assert new.tool_calls[0]["args"] == {"code": pointer, "timeout_s": 60}
    assert new.tool_calls[1]["args"] == {"file_path": "/w/a.txt"}
    assert new.content[1]["input"] == {"code": pointer, "timeout_s": 60}
    assert new.content[2] == ai.content[2]
    fn = new.additional_kwargs["tool_calls"][0]["function"]
    assert json.loads(fn["arguments"]) == {"code": pointer}
    # non-mutating: the raw message keeps its code everywhere
    assert ai.tool_calls[0]["args"]["code"] == CODE and ai.content[1]["input"]["code"] == CODE
    assert json.loads(ai.additional_kwargs["tool_calls"][0]["function"]["arguments"]) == {
        "code": CODE}
    assert count_messages(view) < count_messages(apply_cleared(msgs, cleared)) - 200


def test_a_cell_whose_execution_is_unknown_keeps_its_code():
    """Without ``_out[n]`` the code could not be had back, so it stays."""
    ai = AIMessage("", id="a", tool_calls=[
        {"name": "run_python", "args": {"code": CODE}, "id": "c1"}])
    msgs = [HumanMessage("go"), ai, kernel_result("c1", None)]
    assert clearable_inputs(msgs, {"c1"}) == frozenset()
    view = apply_cleared(msgs, {"c1"}, {"c1"})  # even when asked to
    assert view[1].tool_calls[0]["args"]["code"] == CODE
    assert "result cleared" in view[2].text


def test_an_epoch_counts_what_input_clearing_frees():
    msgs: list[BaseMessage] = [HumanMessage("go")]
    for i in range(8):
        msgs += [AIMessage("", id=f"a{i}", tool_calls=[
            {"name": "run_python", "args": {"code": CODE}, "id": f"c{i}"}]),
            kernel_result(f"c{i}", i + 1, "x " * 300)]
    kw = {"total_tokens": 10**6, "trigger": 1, "keep": 2, "min_freed": 1, "prices": UNPRICED}
    plain = decide_epoch(msgs, (), **kw)
    both = decide_epoch(msgs, (), clear_inputs=True, **kw)
    assert plain[1] == both[1] == "window"  # over the trigger: the window decides
    assert plain[0] == both[0] == {f"c{i}" for i in range(6)}
    cleared = plain[0]
    only = count_messages(msgs) - count_messages(apply_cleared(msgs, cleared))
    whole = count_messages(msgs) - count_messages(
        apply_cleared(msgs, cleared, clearable_inputs(msgs, cleared)))
    assert plain[2].freed == only and both[2].freed == whole > only


def test_the_setting_is_on_for_simagent_and_off_for_the_baselines():
    assert ContextSettings().clear_inputs
    assert ContextSettings.from_mapping({"clear_inputs": False}).clear_inputs is False
    assert POLICIES["simagent"].settings.clear_inputs
    # the oracle bounds start from simagent's settings; their own middleware decides what
    # stays in view (clear_fraction is None, so simagent's clearing never runs there)
    bounds = {"oracle", "oracle-cached"}
    assert all(POLICIES[n].settings.clear_fraction is None for n in bounds)
    assert not any(p.settings.clear_inputs for n, p in POLICIES.items()
                   if n != "simagent" and n not in bounds)
    off, = resolve_policies("simagent[clear_inputs=false]")
    assert off.settings.clear_inputs is False and off.settings.clear_fraction


# ------------------------------------------------------- property: every provider
TOOLS = ("run_python", "run_python", "read_file", "grep", "record_attempt")


def conversation(seed: int) -> list[BaseMessage]:
    """Turns of steps; a step is 1-3 parallel calls (some also as Anthropic ``tool_use``
    blocks, some as Responses ``function_call`` blocks, some with OpenAI's raw
    ``tool_calls``), results in any order, some errors, some kernel results without an
    execution number."""
    rnd = random.Random(seed)
    msgs: list[BaseMessage] = []
    n = 0
    for t in range(rnd.randint(1, 5)):
        msgs.append(HumanMessage(f"request {t}", id=f"h{t}"))
        for _ in range(rnd.randint(0, 5)):
            calls = []
            for _ in range(rnd.randint(1, 3)):
                name = rnd.choice(TOOLS)
                args = ({"code": f"x{n} = {n}\n" + "y" * rnd.randint(1, 300)}
                        if name == "run_python" else {"file_path": f"/w/f{n}.txt"})
                calls.append({"name": name, "args": args, "id": f"c{n}", "type": "tool_call"})
                n += 1
            style = rnd.randint(0, 3)
            kw: dict = {}
            content: str | list = "thinking" if rnd.random() < 0.5 else ""
            if style == 1:
                content = [{"type": "text", "text": "calling"}] + [
                    {"type": "tool_use", "id": c["id"], "name": c["name"], "input": c["args"]}
                    for c in calls]
            elif style == 3:  # the Responses API reads these, not tool_calls
                content = [{"type": "text", "text": "calling"}] + [
                    {"type": "function_call", "call_id": c["id"], "id": f"fc_{c['id']}",
                     "name": c["name"], "arguments": json.dumps(c["args"])} for c in calls]
            elif style == 2:
                kw["additional_kwargs"] = {"tool_calls": [
                    {"id": c["id"], "type": "function",
                     "function": {"name": c["name"], "arguments": json.dumps(c["args"])}}
                    for c in calls]}
            msgs.append(AIMessage(content, id=f"a{calls[0]['id']}", tool_calls=calls, **kw))
            rnd.shuffle(calls)
            for c in calls:
                if c["name"] == "run_python":
                    num = int(c["id"][1:]) + 1 if rnd.random() < 0.85 else None
                    status = "error" if rnd.random() < 0.1 else "ok"
                    msgs.append(kernel_result(c["id"], num, f"out {c['id']} " * 20, status))
                else:
                    msgs.append(ToolMessage(f"text {c['id']} " * 20, tool_call_id=c["id"],
                                            name=c["name"], id=f"t-{c['id']}"))
        msgs.append(AIMessage(f"answer {t}", id=f"f{t}"))
    return msgs


def call_ids(msg: BaseMessage) -> list[str]:
    return [c["id"] for c in msg.tool_calls] if isinstance(msg, AIMessage) else []


def paired(items: list[tuple[str, list[str], list[str]]]) -> bool:
    """(role, call ids made, result ids given) per wire message: every call is answered
    before the next assistant turn, every result answers an open call of the last one."""
    open_: set[str] = set()
    for role, calls, results in items:
        if role == "assistant":
            if open_:
                return False
            open_ = set(calls)
        for rid in results:
            if rid not in open_:
                return False
            open_.discard(rid)
    return not open_


def anthropic_pairs(wire: list[dict]) -> list[tuple[str, list[str], list[str]]]:
    out = []
    for m in wire:
        blocks = m["content"] if isinstance(m["content"], list) else []
        out.append((m["role"],
                    [b["id"] for b in blocks if b.get("type") == "tool_use"],
                    [b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"]))
    return out


def openai_pairs(wire: list[dict]) -> list[tuple[str, list[str], list[str]]]:
    return [(m["role"], [c["id"] for c in m.get("tool_calls") or []],
             [m["tool_call_id"]] if m["role"] == "tool" else []) for m in wire]


def responses_pairs(items: list[dict]) -> list[tuple[str, list[str], list[str]]]:
    out: list[tuple[str, list[str], list[str]]] = []
    for it in items:
        if it.get("type") == "function_call":  # consecutive calls form one assistant turn
            if out and out[-1][0] == "assistant" and out[-1][1] and not out[-1][2]:
                out[-1][1].append(it["call_id"])
            else:
                out.append(("assistant", [it["call_id"]], []))
        elif it.get("type") == "function_call_output":
            out.append(("tool", [], [it["call_id"]]))
        elif it.get("role") == "assistant" and out and out[-1][0] == "assistant" \
                and out[-1][1]:
            continue  # the text of a turn that also made calls
        else:
            out.append((it.get("role", "?"), [], []))
    return out


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.floats(0, 1), st.booleans())
def test_random_clearing_sets_leave_every_provider_a_valid_conversation(seed, share, cut):
    msgs = conversation(seed)
    rnd = random.Random(seed ^ 0x5EED)
    results = [m.tool_call_id for m in msgs if isinstance(m, ToolMessage)]
    cleared = {r for r in results if rnd.random() < share}
    inputs = clearable_inputs(msgs, cleared)
    boundary = None
    if cut:  # a summary boundary at a random safe cut
        at = rnd.choice([c for c in safe_cuts(msgs) if c < len(msgs)] or [0])
        if at:
            boundary = {"cutoff": at, "last_dropped_id": msgs[at - 1].id,
                        "message": HumanMessage("[summary]",
                                                additional_kwargs={"lc_source":
                                                                   "simagent_summary"})}
    base = view_of(msgs, boundary)
    view = apply_cleared(base, cleared, inputs)

    # zero orphans; same messages, ids, calls and names as before clearing
    assert orphans(view) == []
    assert [m.id for m in view] == [m.id for m in base]
    assert [call_ids(m) for m in view] == [call_ids(m) for m in base]
    pointers = 0
    by_id = {c["id"]: c for m in base if isinstance(m, AIMessage) for c in m.tool_calls}
    for m in view:
        for c in m.tool_calls if isinstance(m, AIMessage) else []:
            old = by_id[c["id"]]
            assert c["name"] == old["name"] and set(c["args"]) == set(old["args"])
            if c["id"] in inputs:
                assert c["args"]["code"].startswith("# code cleared from view: _out[")
                pointers += 1
            else:
                assert c["args"] == old["args"]
    assert pointers == len(inputs & {c for m in base for c in call_ids(m)})
    # only cleared kernel results with an execution number lose their code
    names = {c["id"]: c["name"] for m in msgs if isinstance(m, AIMessage) for c in m.tool_calls}
    assert all(names.get(i) == "run_python" and i in cleared for i in inputs)

    _system, wire = _format_messages(view, model="claude-sonnet-4-5")
    assert paired(anthropic_pairs(wire))
    for m in wire:
        for b in m["content"] if isinstance(m["content"], list) else []:
            if b.get("type") == "tool_use" and b["id"] in inputs:
                assert b["input"]["code"].startswith("# code cleared")
    chat = [_convert_message_to_dict(m) for m in view]
    assert paired(openai_pairs(chat))
    for m in chat:
        for c in m.get("tool_calls") or []:
            args = json.loads(c["function"]["arguments"])
            assert isinstance(args, dict) and (c["id"] not in inputs
                                               or args["code"].startswith("# code cleared"))
    items = _construct_responses_api_input(view)
    assert paired(responses_pairs(items))
    for it in items:
        if it.get("type") == "function_call":
            args = json.loads(it["arguments"])
            assert (it["call_id"] in inputs) == args.get("code", "").startswith(
                "# code cleared"), it


# ------------------------------------------------------------------ real graph
def test_an_epoch_clears_the_code_with_the_result_on_the_real_graph(workspace):
    from simagent.agent.builder import build_agent
    from simagent.agent.runner import TurnRunner
    from simagent.agent.scripted import ScriptedChatModel
    from simagent.session import Session

    codes = [f"# step {i}: " + "the parameters of this sweep step, " * 40
             + f"\nprint('R{i}', 'v' * 3000)" for i in range(24)]
    steps = [{"tool": "run_python", "args": {"code": c}} for c in codes] + [{"final": "done"}]
    settings = ContextSettings(summarize=False, budget_check=False)
    session = Session.create(workspace, approval="auto")
    try:
        model = ScriptedChatModel.from_steps(steps, window=30_000, enforce_window=True)
        agent = build_agent(session, model, context_settings=settings)
        assert TurnRunner(session, agent).run("go").status == "done"
        clears = [e for e in session.trace.events(["context_clear"])]
        assert clears

        # the prefix (texts and call arguments) changes only at an epoch
        def shape(msgs):
            return [(m.text, [c["args"] for c in m.tool_calls] if isinstance(m, AIMessage)
                     else None) for m in msgs]
        changed = sum(shape(cur[: len(prev)]) != shape(prev)
                      for prev, cur in itertools.pairwise(model.requests))
        assert changed == len(clears)

        last = model.requests[-1]
        results = {m.tool_call_id: m for m in last if isinstance(m, ToolMessage)}
        calls = [c for m in last if isinstance(m, AIMessage) for c in m.tool_calls]
        pointed = [c for c in calls if c["args"]["code"].startswith("# code cleared")]
        assert pointed and len(pointed) < len(calls)
        for c in calls:  # a pointer exactly where the result is a placeholder
            placeholder = "result cleared" in results[c["id"]].text
            assert c["args"]["code"].startswith("# code cleared") == placeholder
        state = agent.graph.get_state(session.thread_config).values
        assert set(state[CLEARED_INPUTS_KEY]) == {c["id"] for c in pointed}
        # the raw state keeps every cell's code; the kernel gives it back by the pointer
        raw_codes = [c["args"]["code"] for m in state["messages"] if isinstance(m, AIMessage)
                     for c in m.tool_calls]
        assert raw_codes == codes
        first = pointed[0]
        n = int(first["args"]["code"].split("_out[")[1].split("]")[0])
        original = next(c["args"]["code"] for m in state["messages"]
                        if isinstance(m, AIMessage) for c in m.tool_calls
                        if c["id"] == first["id"])
        got = session.execute(f"print(repr(_out[{n}].code))")
        assert got.model_text(None).strip() == repr(original)
        # the bench's view (recall) is the model's view
        view = current_view(state)
        assert shape(view[: len(last) - 1]) == shape(
            [m for m in last if m.type != "system"][: len(last) - 1])
    finally:
        session.close()


def test_with_input_clearing_off_the_code_stays(workspace):
    from simagent.agent.builder import build_agent
    from simagent.agent.runner import TurnRunner
    from simagent.agent.scripted import ScriptedChatModel
    from simagent.session import Session

    steps = [{"tool": "run_python", "args": {"code": f"# {i} " + "p " * 300
                                             + f"\nprint('R{i}', 'v' * 3000)"}}
             for i in range(16)] + [{"final": "done"}]
    session = Session.create(workspace, approval="auto")
    try:
        model = ScriptedChatModel.from_steps(steps, window=30_000)
        agent = build_agent(session, model, context_settings=ContextSettings(
            summarize=False, budget_check=False, clear_inputs=False))
        TurnRunner(session, agent).run("go")
        assert list(session.trace.events(["context_clear"]))
        last = model.requests[-1]
        assert any("result cleared" in m.text for m in last if isinstance(m, ToolMessage))
        assert not any(c["args"]["code"].startswith("# code cleared")
                       for m in last if isinstance(m, AIMessage) for c in m.tool_calls)
    finally:
        session.close()

