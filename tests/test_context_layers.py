"""Every context layer on the real graph, a real kernel and real files.

The scripted model stands in for the provider; with ``enforce_window`` it refuses a
request over its window exactly as a provider does, so "no overflow" is checked, not
assumed. Windows are small so that a few dozen kernel calls cross every threshold.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool

from simagent.agent.builder import build_agent
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.context import thresholds as th
from simagent.context.manual import checkpoint_now, compact_now
from simagent.context.recall import recall, request_text
from simagent.context.settings import ContextSettings
from simagent.context.state import BOUNDARY_KEY, current_view
from simagent.context.summary import CHECKPOINT_SECTIONS
from simagent.kernel_api.outputs import count_lines, raw_name
from simagent.session import Session

BIG = 120_000


@tool("dump")
def dump(n: int) -> str:
    """Return n characters of a numbered report."""
    head = f"REPORT-START rows={n}\n"
    body = "".join(f"row {i:06d} " + "y" * 40 + "\n" for i in range(n // 52 + 1))
    return (head + body)[:n - 11] + "\nREPORT-END"


def make(workspace: Path, steps, *, settings: ContextSettings, window: int,
         enforce: bool = True, tools=()):
    session = Session.create(workspace, approval="auto")
    model = ScriptedChatModel.from_steps(steps, window=window, enforce_window=enforce)
    agent = build_agent(session, model, extra_tools=list(tools), context_settings=settings)
    return session, model, agent, TurnRunner(session, agent)


@pytest.fixture
def opened(workspace):
    sessions = []

    def _open(steps, **kw):
        out = make(workspace, steps, **kw)
        sessions.append(out[0])
        return out

    yield _open
    for s in sessions:
        s.close()


def kinds(session, *names):
    return [(e.id, e.kind, e.payload) for e in session.trace.events(list(names))]


def state_of(agent, session):
    return agent.graph.get_state(session.thread_config).values


# ------------------------------------------------------------------------ cap
@pytest.mark.slow
def test_run_python_cap_keeps_head_tail_and_the_error(opened):
    code = ("print('HEAD-MARK')\nfor i in range(3000):\n    print(f'line {i:05d} ' + 'x' * 40)\n"
            "raise ValueError('boom at the end')")
    session, _model, agent, runner = opened(
        [{"tool": "run_python", "args": {"code": code}}, {"final": "ok"}],
        settings=ContextSettings(tool_caps={"run_python": 8_000}), window=128_000)
    assert runner.run("go").status == "done"
    result = next(m for m in state_of(agent, session)["messages"] if isinstance(m, ToolMessage))
    text = result.text
    assert len(text) < 8_000 + 2_500
    assert text.startswith("HEAD-MARK") and "line 02999" in text
    assert "ValueError: boom at the end" in text.splitlines()[-1]
    raw = result.artifact["raw_path"]
    assert f"full output: {raw}" in text and Path(raw).read_text().count("\nline ") >= 2999
    assert result.artifact["status"] == "error"
    # the marker names the omitted lines (tests/test_cut_lines.py pages them back) and the
    # artifact the output's length, for the placeholder that replaces it later
    assert result.artifact["lines"] == count_lines(raw) > 3001
    assert re.search(rf"lines \d+-\d+ of {count_lines(raw)} not shown: _out\[\d+\]\.slice",
                     text)


def test_generic_tool_cap_saves_the_full_result(opened):
    session, _model, agent, runner = opened(
        [{"tool": "dump", "args": {"n": 100_000}}, {"final": "{out[-1]|REPORT-END}"}],
        settings=ContextSettings(), window=128_000, tools=[dump])
    assert runner.run("go").final == "REPORT-END"
    msg = next(m for m in state_of(agent, session)["messages"] if isinstance(m, ToolMessage))
    assert len(msg.text) < th.TOOL_CAP_CHARS + 500 and msg.text.startswith("REPORT-START")
    path = session.paths.large_tool_results / f"{msg.tool_call_id}.full.txt"
    assert f"full result: {path}" in msg.text
    assert len(path.read_text()) == 100_000


def test_eviction_lands_in_the_session_dir_and_the_preview_names_it(opened):
    session, model, agent, runner = opened(
        [{"tool": "dump", "args": {"n": BIG}}, {"final": "done"}],
        settings=ContextSettings(tool_caps={"dump": 0}), window=128_000, tools=[dump])
    runner.run("go")
    msg = next(m for m in state_of(agent, session)["messages"] if isinstance(m, ToolMessage))
    path = session.paths.large_tool_results / msg.tool_call_id
    assert path.is_file() and len(path.read_text()) == BIG
    assert str(path) in msg.text and len(msg.text) < 5_000
    (_, _, payload), = kinds(session, "context_eviction")
    assert payload["path"] == str(path) and payload["chars"] == BIG
    assert payload["tokens_after"] < payload["tokens_before"] // 10
    # the request after the eviction carries the path the model needs
    assert str(path) in request_text(model.requests[-1])


# ----------------------------------------------------------- the long session
def long_steps(n_calls: int) -> list[dict]:
    steps = [{"tool": "execute", "args": {"command": "seq 1 40000"}}]
    for i in range(n_calls):
        if i % 20 == 7:  # multi-MB output with a progress bar
            code = (f"import sys\nprint('FACT-{i:03d} = {i * 7919}')\n"
                    "for k in range(200):\n    sys.stdout.write(f'\\rstep {k}/200')\n"
                    "print()\nblock = 'z' * 99 + '\\n'\nfor k in range(25_000):\n"
                    "    sys.stdout.write(block)\nprint('tail', 42)")
        else:  # the model's code is long too (kept: this test runs without input clearing)
            code = (f"# sweep step {i}: " + "parameters under study, " * 50 + "\n"
                    f"print('FACT-{i:03d} = {i * 7919}')\n"
                    f"for k in range(40):\n    print('sweep', {i}, k, 'residual', k * 1e-3)")
        steps.append({"tool": "run_python", "args": {"code": code}})
        if i == n_calls // 2:
            steps.append({"say": "Halfway: the sweep converges."})
    steps.append({"final": "last: {out[-1]|FACT-\\d+ = \\d+}"})
    return steps


@pytest.mark.slow
def test_long_session_crosses_every_threshold_in_order_without_overflow(opened):
    n = 64
    # inputs stay in view, so the history grows past the summary trigger (input clearing
    # on its own is tested in test_input_clearing.py)
    settings = ContextSettings(evict_tokens=5_000, clear_inputs=False,
                               tool_caps={"run_python": 6_000, "execute": 0})
    # the window is sized so the real-token history crosses the summary trigger (85 %)
    session, model, agent, runner = opened(long_steps(n), settings=settings, window=32_000,
                                           enforce=True)
    result = runner.run("run the sweep")
    assert result.status == "done", result.error
    assert result.final == f"last: FACT-{n - 1:03d} = {(n - 1) * 7919}"
    assert model.cursor.rejected == []  # the provider never saw an over-long request
    assert not kinds(session, "context_emergency")
    assert max(model.cursor.request_tokens) <= 32_000

    first = {}
    for eid, kind, _ in kinds(session, "context_eviction", "context_clear", "context_summary"):
        first.setdefault(kind, eid)
    assert first["context_eviction"] < first["context_clear"] < first["context_summary"]
    for _, kind, p in kinds(session, "context_clear", "context_summary"):
        assert p["tokens_after"] < p["tokens_before"], (kind, p)

    # every fact printed by every call is still reachable from the final request
    facts = [f"FACT-{i:03d} = {i * 7919}" for i in range(n)]
    roots = [session.paths.root]
    assert recall(facts, model.requests[-1], roots) == 1.0
    # the raw state kept every message: nothing was mutated
    raw = state_of(agent, session)["messages"]
    assert sum(isinstance(m, ToolMessage) for m in raw) == n + 1
    assert all("result cleared" not in m.text for m in raw if isinstance(m, ToolMessage))


def test_clearing_happens_in_epochs_and_keeps_the_prefix_stable(opened):
    steps = [{"tool": "run_python", "args": {"code": f"print('R{i}', 'v' * 3000)"}}
             for i in range(24)] + [{"final": "done"}]
    settings = ContextSettings(summarize=False, budget_check=False,
                               clear_by_expected=False)  # reads to come: more, smaller epochs
    session, model, _agent, runner = opened(steps, settings=settings, window=30_000)
    assert runner.run("go").status == "done"
    clears = kinds(session, "context_clear")
    assert 1 <= len(clears) <= 4
    changed = 0
    reqs = model.requests
    for prev, cur in itertools.pairwise(reqs):
        if [m.text for m in cur[: len(prev)]] != [m.text for m in prev]:
            changed += 1
    assert changed == len(clears)  # the prefix only changes at an epoch
    last = reqs[-1]
    placeholders = [m for m in last if isinstance(m, ToolMessage) and "result cleared" in m.text]
    assert placeholders
    for m in placeholders:  # each names its handle, whose raw output exists, with its
        n = int(m.text.split("full output: _out[")[1].split("]")[0])  # true length
        path = session.paths.outputs / raw_name(n)
        assert path.is_file()
        assert f"full output: _out[{n}] ({count_lines(path)} line" in m.text
    recent = [m for m in last if isinstance(m, ToolMessage)][-3:]
    assert all("result cleared" not in m.text for m in recent)


def test_record_attempt_and_errors_are_never_cleared(opened):
    steps = [{"tool": "record_attempt", "args": {"rationale": "first", "parameters": {"a": 1},
                                                 "metrics": {"m": 2}, "outcome": "ok"}},
             {"tool": "run_python", "args": {"code": "1/0"}}]
    steps += [{"tool": "run_python", "args": {"code": f"print('R{i}', 'v' * 3000)"}}
              for i in range(20)] + [{"final": "done"}]
    session, model, _agent, runner = opened(
        steps, settings=ContextSettings(summarize=False, budget_check=False), window=30_000)
    runner.run("go")
    assert kinds(session, "context_clear")
    last = model.requests[-1]
    results = [m for m in last if isinstance(m, ToolMessage)]
    assert "result cleared" not in results[0].text  # record_attempt
    assert "ZeroDivisionError" in results[1].text  # the error
    assert "result cleared" in results[2].text


# ------------------------------------------------------------------ emergency
def test_overflow_triggers_one_emergency_compaction_and_one_retry(opened):
    steps = [{"tool": "run_python", "args": {"code": f"print('E{i}', 'w' * 2000)"}}
             for i in range(12)] + [{"final": "{out[-1]|E\\d+}"}]
    settings = ContextSettings(window=500_000, summarize=False, clear_fraction=None,
                               budget_check=False)
    session, model, _agent, runner = opened(steps, settings=settings, window=10_000)
    result = runner.run("go")
    assert result.status == "done", result.error
    assert result.final == "E11"
    events = kinds(session, "context_emergency")
    assert len(model.cursor.rejected) == len(events) >= 1
    for _, _, p in events:
        assert p["tokens_after"] < p["tokens_before"] and p["kept"] >= th.EMERGENCY_MIN_MESSAGES
        assert "context_length_exceeded" in p["error"]
    # the first emergency: exactly one rejected request, then one accepted retry
    first_id = events[0][0]
    assert first_id < kinds(session, "model_usage")[-1][0]
    assert recall([f"E{i} " for i in range(12)], model.requests[-1], [session.paths.root]) == 1.0


def test_overflow_that_compaction_cannot_fix_fails_after_one_retry(opened):
    steps = [{"tool": "run_python", "args": {"code": "print('small')"}},
             {"tool": "dump", "args": {"n": 12_000}}, {"final": "never"}]
    settings = ContextSettings(window=500_000, summarize=False, clear_fraction=None,
                               budget_check=False, evict_tokens=None, tool_caps={"dump": 0})
    session, model, _agent, runner = opened(steps, settings=settings, window=7_000,
                                           tools=[dump])
    result = runner.run("go")
    assert result.status == "error" and "maximum context length" in (result.error or "")
    assert len(kinds(session, "context_emergency")) == 1
    assert len(model.cursor.rejected) == 2  # the request and the single retry


# -------------------------------------------------------- budget and counting
@pytest.mark.slow
def test_budget_check_compacts_before_the_call(opened):
    steps = [{"tool": "run_python", "args": {"code": f"print('B{i}', 'q' * 4000)"}}
             for i in range(8)] + [{"final": "done"}]
    # the tier trigger alone would never fire; the reply reserve leaves little history room
    settings = ContextSettings(summary_fraction=1.0, clear_fraction=None,
                               max_output_tokens=14_000)
    session, model, _agent, runner = opened(steps, settings=settings, window=24_000)
    assert runner.run("go").status == "done"
    summaries = kinds(session, "context_summary")
    assert summaries and summaries[0][2]["reason"] == "budget"
    assert model.cursor.rejected == []


def test_trace_counts_match_what_the_model_received(opened):
    session, model, _agent, runner = opened(
        [{"tool": "run_python", "args": {"code": "print(1)"}}, {"final": "ok"}],
        settings=ContextSettings(), window=128_000)
    runner.run("go")
    usage = [p for _, _, p in kinds(session, "model_usage")]
    for p, counted in zip(usage, model.cursor.request_tokens, strict=True):
        assert sum(p["request"].values()) == counted == p["input_tokens"]
        assert p["request"]["skills_index"] > 0 and p["request"]["memory_index"] > 0
        assert p["request"]["tool_schemas"] > 1000 and p["window"] == 128_000


# ------------------------------------------------------------- manual layers
def test_compact_now_summarizes_with_focus_and_keeps_raw_state(opened):
    steps = [{"tool": "run_python", "args": {"code": f"print('C{i} =', {i} * 11)"}}
             for i in range(6)] + [{"final": "first done"}, {"final": "second"}]
    session, model, agent, runner = opened(steps, settings=ContextSettings(),
                                           window=128_000)
    runner.run("first task")
    n_raw = len(state_of(agent, session)["messages"])
    res = compact_now(agent.graph, session.thread_config, agent.context, focus="the C values")
    assert res.done and res.dropped > 0 and Path(res.path).is_file()
    runner.run("and now?")
    req = model.requests[-1]
    assert isinstance(req[0], SystemMessage)
    summary = req[1]
    assert summary.additional_kwargs["lc_source"] == "simagent_summary"
    assert res.path in summary.text and "Focus: the C values" in summary.text
    assert "C4 = 44" in summary.text  # numbers that matter survive the summary
    assert "C5 = 55" in request_text(req)  # and the newest stay verbatim
    assert len(state_of(agent, session)["messages"]) == n_raw + 2  # raw state intact
    (_, _, p), = kinds(session, "context_summary")
    assert p["reason"] == "manual" and p["focus"] == "the C values"


def test_mark_task_done_slices_the_finished_task_at_the_next_turn(opened):
    steps = [{"tool": "run_python", "args": {"code": "print('T1 result =', 6 * 7)"}},
             {"tool": "mark_task_done", "args": {"answer": "T1 computed: 42"}},
             {"final": "task one done"}, {"final": "task two"}]
    session, model, _agent, runner = opened(steps, settings=ContextSettings(),
                                           window=128_000)
    runner.run("task one")
    assert not kinds(session, "context_checkpoint")  # nothing sliced mid-task
    runner.run("task two")
    req = model.requests[-1]
    # the task record, the kernel state card (the session's kernel holds what T1 made),
    # then the new question last
    assert [type(m).__name__ for m in req] == ["SystemMessage"] + ["HumanMessage"] * 3
    record, card, user = req[1], req[2], req[3]
    assert record.additional_kwargs["lc_source"] == "simagent_checkpoint"
    assert card.additional_kwargs["lc_source"] == "simagent_state_card"
    assert 'after="checkpoint"' in card.text
    for section in CHECKPOINT_SECTIONS:
        assert f"# {section}" in record.text
    assert "T1 computed: 42" in record.text and user.text == "task two"
    (_, _, p), = kinds(session, "context_checkpoint")
    assert p["source"] == "tool" and Path(p["path"]).read_text().count("T1 result = 42") >= 1


def test_done_command_checkpoints_between_turns(opened):
    steps = [{"tool": "run_python", "args": {"code": "print('D =', 5)"}},
             {"final": "one"}, {"final": "two"}]
    session, model, agent, runner = opened(steps, settings=ContextSettings(),
                                           window=128_000)
    runner.run("one")
    res = checkpoint_now(agent.graph, session.thread_config, agent.context, note="D found")
    assert res.done
    again = checkpoint_now(agent.graph, session.thread_config, agent.context)
    assert not again.done and "nothing to checkpoint" in again.message
    runner.run("two")
    req = model.requests[-1]
    assert req[1].additional_kwargs["lc_source"] == "simagent_checkpoint"
    assert "D found" in req[1].text and req[3].text == "two"
    # /done leaves a kernel state card between the record and the next question
    assert req[2].additional_kwargs["lc_source"] == "simagent_state_card"
    assert 'after="checkpoint"' in req[2].text and "np=numpy" in req[2].text
    (_, _, card), = kinds(session, "context_state_card")
    assert card["reason"] == "checkpoint"
    assert card["tokens"] == agent.context.ruler.count(req[2].text)
    boundary = state_of(agent, session)[BOUNDARY_KEY]
    assert boundary["kind"] == "checkpoint"
    assert [m.text for m in current_view(state_of(agent, session))][-2:] == ["two", "two"]


def test_a_rebuilt_agent_sees_the_same_view(opened, workspace):
    steps = [{"tool": "run_python", "args": {"code": f"print('S{i}', 'v' * 3000)"}}
             for i in range(22)] + [{"final": "done"}, {"final": "again"}]
    settings = ContextSettings(summarize=False, budget_check=False)
    session, model, _agent, runner = opened(steps, settings=settings, window=30_000)
    runner.run("go")
    assert kinds(session, "context_clear")
    # another model object (a /model switch) on the same thread
    model2 = ScriptedChatModel.from_steps([{"final": "switched"}], window=30_000)
    runner.switch_agent(build_agent(session, model2, context_settings=settings))
    runner.run("next")
    cleared_before = [m.text for m in model.requests[-1] if isinstance(m, ToolMessage)]
    cleared_after = [m.text for m in model2.requests[-1] if isinstance(m, ToolMessage)]
    assert cleared_after == cleared_before


def test_summary_model_is_configurable(workspace, tmp_path):
    from simagent.agent.context_layers import build_summarizer
    from simagent.context.summary import ExtractiveSummarizer, ModelSummarizer

    script = tmp_path / "summ.json"
    script.write_text('[{"final": "# Session intent\\nfrom the cheap model"}]')
    chat = ScriptedChatModel.from_steps([])
    assert isinstance(build_summarizer(ContextSettings(), chat, "scripted"),
                      ExtractiveSummarizer)
    cheap = build_summarizer(ContextSettings(summary_model=f"scripted:{script}"), chat, "x")
    assert isinstance(cheap, ModelSummarizer)
    text = cheap([HumanMessage("hello")], kind="summary")
    assert text == "# Session intent\nfrom the cheap model"


# ----------------------------------------------------- regressions from review
def test_a_summary_never_hides_the_result_just_asked_for():
    from langchain_core.messages import AIMessage

    from simagent.context.boundaries import cut_keeping_tokens
    from simagent.context.counting import count_messages

    msgs = [HumanMessage("go", id="h"),
            AIMessage("", id="a", tool_calls=[{"name": "run_python", "args": {}, "id": "c"}]),
            ToolMessage("r" * 40_000, tool_call_id="c", id="t")]
    cut = cut_keeping_tokens(msgs, 1_000, count_messages)
    assert cut == 1 and isinstance(msgs[cut], AIMessage)  # the call and its result stay


def test_model_summaries_do_not_stream_as_the_answer_and_are_accounted(opened, tmp_path):
    from simagent.agent.events import TextDelta

    script = tmp_path / "summ.json"
    script.write_text('[{"final": "SUMMARY-TEXT from the cheap model"}]')
    steps = [{"tool": "run_python", "args": {"code": f"print('S{i}', 'v' * 3000)"}}
             for i in range(14)] + [{"final": "THE-ANSWER"}]
    settings = ContextSettings(summary_model=f"scripted:{script}", clear_fraction=None)
    session, _model, _agent, runner = opened(steps, settings=settings, window=16_000)
    events = []
    assert runner.run("go", events.append).final == "THE-ANSWER"
    streamed = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert "SUMMARY-TEXT" not in streamed and "THE-ANSWER" in streamed
    assert any(p["summarizer"].startswith("scripted:") for _, _, p in
               kinds(session, "context_summary"))
    assert [p for _, _, p in kinds(session, "model_usage") if p["agent"] == "summarizer"]
    assert "summarizer" in session.usage.by_agent


def test_two_task_marks_in_one_reply_and_compact_after_a_failed_turn(opened):
    steps = [{"tools": [{"tool": "mark_task_done", "args": {"answer": "a"}},
                        {"tool": "mark_task_done", "args": {"answer": "b"}}]},
             {"final": "done"}]
    session, _model, agent, runner = opened(steps, settings=ContextSettings(),
                                           window=128_000)
    assert runner.run("go").status == "done"
    assert state_of(agent, session)["simagent_pending_checkpoint"]["record"]["answer"] == "b"
    # a turn that fails (the script is exhausted mid-way is fine; force a provider error)
    failing = ScriptedChatModel.from_steps([], window=1_000, enforce_window=True)
    runner.switch_agent(build_agent(session, failing, context_settings=ContextSettings(
        emergency=False, summarize=False, clear_fraction=None, budget_check=False)))
    assert runner.run("again").status == "error"
    res = compact_now(agent.graph, session.thread_config, agent.context)
    assert "paused" not in res.message


def test_capped_full_text_survives_eviction_of_the_preview(opened):
    session, _model, agent, runner = opened(
        [{"tool": "dump", "args": {"n": 300_000}}, {"final": "ok"}],
        settings=ContextSettings(evict_tokens=1_000), window=128_000, tools=[dump])
    runner.run("go")
    msg = next(m for m in state_of(agent, session)["messages"] if isinstance(m, ToolMessage))
    full = session.paths.large_tool_results / f"{msg.tool_call_id}.full.txt"
    assert len(full.read_text()) == 300_000  # eviction wrote the preview elsewhere
    assert kinds(session, "context_eviction")
