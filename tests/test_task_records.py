"""Typed task records (``/done``, ``mark_task_done``): validation, derivation from the
real graph's messages, storage, the model's view after the checkpoint, ``simagent
context`` and the bench's ``task_record`` scorer.

Real graph, real kernel, real files; only the model is scripted.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from simagent.agent.builder import build_agent
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.bench.scorers import RunView, grade
from simagent.bench.workflow import WorkflowError, load_workflow
from simagent.context.manual import checkpoint_now
from simagent.context.settings import ContextSettings
from simagent.context.state import BOUNDARY_KEY, PENDING_CHECKPOINT_KEY
from simagent.context.stats import stats_from_trace
from simagent.context.task_records import (
    check_record,
    derive,
    filed_record,
    key_values_in,
    read_records,
    records_from_events,
)
from simagent.records import TaskRecord
from simagent.session import Session

DECAY = ("import numpy as np\nt = np.linspace(0, 5, 51)\ny = np.exp(-0.5 * t)\n"
         "np.savetxt('decay.csv', np.c_[t, y], delimiter=',')\n"
         "print('k fitted =', 0.5)")
CAPACITY = {"answer": "The SPM discharge at 1C delivers 5.02 A.h.",
            "key_values": [{"name": "discharge capacity", "value": 5.02, "unit": "A.h"},
                           {"name": "cycles", "value": 1}],
            "assumptions": ["Chen2020 parameters; the default 298.15 K ambient was kept"],
            "open_questions": ["Not checked against the DFN model"]}


@pytest.fixture
def opened(workspace):
    sessions = []

    def _open(steps):
        session = Session.create(workspace, approval="auto")
        sessions.append(session)
        model = ScriptedChatModel.from_steps(steps, window=128_000)
        agent = build_agent(session, model, context_settings=ContextSettings())
        return session, model, agent, TurnRunner(session, agent)

    yield _open
    for s in sessions:
        s.close()


def state_of(agent, session):
    return agent.graph.get_state(session.thread_config).values


def payloads(session, kind):
    return [e.payload for e in session.trace.events([kind])]


# ---------------------------------------------------------------- pure: validation
def test_a_good_record_is_accepted_and_normalized():
    record, wrong = filed_record(CAPACITY)
    assert wrong == [] and record is not None
    assert record.source == "mark_task_done"
    assert record.key_values[0].unit == "A.h" and record.key_values[1].unit == ""


@pytest.mark.parametrize(("args", "says"), [
    ({"answer": "  "}, "`answer` is empty"),
    ({"answer": "x", "key_values": [{"name": "capacity", "value": "5.02 A.h"}]},
     "key_values[0].value '5.02 A.h' mixes number and unit: give the number as `value` "
     "and 'A.h' as `unit`"),
    ({"answer": "x", "key_values": [{"name": "T", "value": 1, "unit": "K"},
                                    {"name": "t", "value": 2, "unit": "s"}]},
     "key_values[1].name 't' repeats an earlier key value"),
    ({"answer": "x", "key_values": [{"name": "delay", "value": math.nan, "unit": "s"}]},
     "key_values[0].value is nan: report a finite number"),
    ({"answer": "x", "key_values": [{"name": "", "value": 3}]}, "key_values[0].name is empty"),
    ({"answer": "x", "files_written": [""]}, "`files_written` has an empty entry"),
    ({"answer": "x", "key_values": "lots"}, "key_values: Input should be a valid list"),
    ({"key_values": []}, "answer: Field required"),
])
def test_bad_records_say_what_to_fix(args, says):
    record, wrong = filed_record(args)
    assert record is None
    assert any(says in w for w in wrong), wrong


def test_numbers_with_units_are_read_from_prose():
    kvs = key_values_in("After the DFN run the final capacity is 4.9 A.h, the **peak "
                        "temperature** was 310.2 K and x = 6 * 7; ignition delay: 1.2e-3 s.")
    got = [(k.name, k.value, k.unit) for k in kvs]
    assert got == [("capacity", 4.9, "A.h"), ("peak temperature", 310.2, "K"),
                   ("ignition delay", 0.0012, "s")]
    assert key_values_in("The value is 42 and then some.") == []


def test_check_record_grades_fields():
    record = filed_record(CAPACITY)[0]
    assert check_record(record, "key_values.Discharge Capacity", expected=5.0,
                        rel_tol=0.01, unit="A.h")[0]
    ok, detail = check_record(record, "key_values.discharge capacity", expected=4.0)
    assert not ok and detail == "discharge capacity = 5.02 A.h vs expected 4"
    assert check_record(record, "key_values.capacity") == (
        False, "no key value 'capacity' (has: discharge capacity, cycles)")
    assert check_record(record, "assumptions", contains="298.15 K")[0]
    assert not check_record(record, "files_written")[0]
    assert not check_record(record, "nonsense")[0]


def test_derive_from_plain_messages():
    msgs = [HumanMessage("fit it", id="h"),
            AIMessage("", id="a", tool_calls=[
                {"name": "read_file", "args": {"file_path": "/d/in.csv"}, "id": "c1"},
                {"name": "write_file", "args": {"file_path": "/d/bad.txt"}, "id": "c2"}]),
            ToolMessage("rows", tool_call_id="c1", name="read_file", id="t1"),
            ToolMessage("Error: denied", tool_call_id="c2", name="write_file", id="t2"),
            AIMessage("The rate is 0.5 1/s.", id="f")]
    record = derive(msgs, note="n")
    assert record.task == "fit it" and record.answer == "The rate is 0.5 1/s."
    assert record.files_read == ["/d/in.csv"] and record.files_written == []  # failed write
    assert [(k.name, k.value, k.unit) for k in record.key_values] == [("rate", 0.5, "1/s")]
    assert record.note == "n" and record.source == "/done"


def test_records_from_events_counts_a_rewritten_checkpoint_once():
    from types import SimpleNamespace as Ev

    rec = filed_record(CAPACITY)[0].model_dump()
    other = {**rec, "answer": "another task"}
    events = [Ev(id=1, ts="t1", kind="context_checkpoint",
                 payload={"cutoff_index": 4, "record": rec, "agent": "main"}),
              Ev(id=2, ts="t2", kind="context_checkpoint",  # the model call failed: again
                 payload={"cutoff_index": 4, "record": rec, "agent": "main"}),
              Ev(id=3, ts="t3", kind="context_checkpoint",
                 payload={"cutoff_index": 9, "record": other, "agent": "main"}),
              Ev(id=4, ts="t4", kind="context_checkpoint",  # a subagent's is not a task
                 payload={"cutoff_index": 2, "record": other, "agent": "helper"})]
    got = records_from_events(events)
    assert [(f.ts, f.record.answer) for f in got] == [("t2", CAPACITY["answer"]),
                                                       ("t3", "another task")]


# ---------------------------------------------------------------- /done on the graph
def test_done_derives_a_typed_record_from_the_task(opened, workspace):
    data = workspace / "notes.txt"
    data.write_text("decay constant guess: 0.4\n")
    steps = [{"tool": "read_file", "args": {"file_path": str(data)}},
             {"tool": "run_python", "args": {"code": DECAY}},
             {"final": "The decay rate is 0.5 1/s and the half-life was 1.386 s; the curve "
                       "is in decay.csv."},
             {"final": "next"}]
    session, model, agent, runner = opened(steps)
    assert runner.run("fit the decay of the signal").status == "done"
    assert (workspace / "decay.csv").is_file()
    res = checkpoint_now(agent.graph, session.thread_config, agent.context, note="decay done")
    assert res.done

    (row,) = read_records(session.paths.task_records)
    record = TaskRecord.model_validate(row["record"])
    assert record.source == "/done" and record.note == "decay done"
    assert record.task == "fit the decay of the signal"
    assert record.answer.startswith("The decay rate is 0.5 1/s")
    assert [(k.name, k.value, k.unit) for k in record.key_values] == [
        ("decay rate", 0.5, "1/s"), ("half-life", 1.386, "s")]
    assert record.files_read == [str(data)] and record.files_written == ["decay.csv"]
    assert row["history"] == res.path and Path(res.path).is_file()
    # traced with the checkpoint, kept in the boundary
    (event,) = payloads(session, "context_checkpoint")
    assert event["record"] == row["record"] and event["source"] == "command"
    assert state_of(agent, session)[BOUNDARY_KEY]["record"] == row["record"]

    runner.run("next task")
    boundary = model.requests[-1][1]
    assert boundary.additional_kwargs["lc_source"] == "simagent_checkpoint"
    block = boundary.text[boundary.text.index('<task_record source="/done">'):]
    assert "key values: decay rate = 0.5 1/s; half-life = 1.386 s" in block
    assert "files written: decay.csv" in block and f"files read: {data}" in block
    assert "note: decay done" in block


def test_done_keeps_the_unit_after_an_uncertainty(opened):
    """Issue 30 item 13: the scipy-plot-decay answer writes ``tau = 2.6753 +/- 0.0123 ms``;
    /done's record said ``tau = 2.6753`` (the unit follows the uncertainty)."""
    answer = ("The fit y = A*exp(-t/tau) + c gives tau = 2.6753 +/- 0.0123 ms, with "
              "amplitude A = 4.4969 ± 0.0151 V and baseline c = 0.2989\u202fV.")
    session, model, agent, runner = opened([{"final": answer}, {"final": "next"}])
    assert runner.run("fit the decay").status == "done"
    assert checkpoint_now(agent.graph, session.thread_config, agent.context).done
    (row,) = read_records(session.paths.task_records)
    record = TaskRecord.model_validate(row["record"])
    assert [(k.name, k.value, k.unit) for k in record.key_values] == [
        ("tau", 2.6753, "ms"), ("amplitude", 4.4969, "V"), ("baseline c", 0.2989, "V")]
    runner.run("next task")
    assert "key values: tau = 2.6753 ms; amplitude = 4.4969 V" in model.requests[-1][1].text


# ------------------------------------------------------ mark_task_done on the graph
def test_mark_task_done_files_a_typed_record_written_at_the_next_turn(opened, workspace):
    steps = [{"tool": "run_python", "args": {"code": DECAY}},
             {"tool": "mark_task_done", "args": CAPACITY},
             {"final": "done: 5.02 A.h"}, {"final": "second"}]
    session, model, agent, runner = opened(steps)
    assert runner.run("discharge the cell").status == "done"
    pending = state_of(agent, session)[PENDING_CHECKPOINT_KEY]
    assert pending["record"]["key_values"][0] == {"name": "discharge capacity",
                                                  "value": 5.02, "unit": "A.h"}
    assert not payloads(session, "context_checkpoint")
    (filed,) = records_from_events(session.trace.events())
    assert not filed.written and filed.record.answer == CAPACITY["answer"]

    runner.run("second task")
    (event,) = payloads(session, "context_checkpoint")
    record = TaskRecord.model_validate(event["record"])
    assert event["source"] == "tool" and record.source == "mark_task_done"
    assert record.assumptions == CAPACITY["assumptions"]
    assert record.files_written == ["decay.csv"]  # what the task really wrote, added
    assert record.task == "discharge the cell"
    (row,) = read_records(session.paths.task_records)
    assert row["record"] == event["record"]
    (written,) = records_from_events(session.trace.events())
    assert written.written
    text = model.requests[-1][1].text
    assert '<task_record source="mark_task_done">' in text
    assert "key values: discharge capacity = 5.02 A.h; cycles = 1" in text
    assert "open questions: Not checked against the DFN model" in text


def test_done_merges_the_record_the_model_filed(opened):
    steps = [{"tool": "mark_task_done", "args": CAPACITY}, {"final": "ok"}]
    session, _model, agent, runner = opened(steps)
    runner.run("discharge")
    assert checkpoint_now(agent.graph, session.thread_config, agent.context, note="mine").done
    (row,) = read_records(session.paths.task_records)
    record = TaskRecord.model_validate(row["record"])
    assert record.source == "/done + mark_task_done" and record.note == "mine"
    assert record.answer == CAPACITY["answer"] and record.key_values[0].value == 5.02
    assert state_of(agent, session).get(PENDING_CHECKPOINT_KEY) is None


def test_a_bad_record_comes_back_as_a_tool_error_the_model_can_fix(opened):
    bad_unit = {"answer": "cap", "key_values": [{"name": "capacity", "value": "5.02 A.h"}]}
    steps = [{"tool": "mark_task_done", "args": bad_unit},
             {"tool": "mark_task_done", "args": {"answer": "cap", "key_values": "lots"}},
             {"tool": "mark_task_done", "args": {
                 "answer": "cap", "key_values": [{"name": "capacity", "value": 5.02,
                                                  "unit": "A.h"}]}},
             {"final": "filed"}]
    session, _model, agent, runner = opened(steps)
    result = runner.run("go")
    assert result.status == "done" and result.final == "filed"
    results = [p for p in payloads(session, "tool_result") if p["name"] == "mark_task_done"]
    assert [p["status"] for p in results] == ["error", "error", "success"]
    assert "mixes number and unit" in results[0]["content"]
    assert "'A.h' as `unit`" in results[0]["content"]
    assert "key_values" in results[1]["content"] and "valid list" in results[1]["content"]
    pending = state_of(agent, session)[PENDING_CHECKPOINT_KEY]
    assert pending["record"]["key_values"] == [{"name": "capacity", "value": 5.02,
                                                "unit": "A.h"}]
    (filed,) = records_from_events(session.trace.events())  # the failed calls don't count
    assert filed.record.key_values[0].unit == "A.h"


# ------------------------------------------------------------- simagent context
def test_simagent_context_lists_the_records(opened, workspace, capsys):
    from simagent.cli import main

    steps = [{"tool": "run_python", "args": {"code": DECAY}},
             {"final": "The decay rate is 0.5 1/s."}, {"final": "two"}]
    session, _model, agent, runner = opened(steps)
    runner.run("fit")
    checkpoint_now(agent.graph, session.thread_config, agent.context)
    runner.run("two")
    stats = stats_from_trace(session.paths.trace, ContextSettings())
    assert [t.source for t in stats.task_records] == ["/done"]
    session.close()

    capsys.readouterr()
    assert main(["context", "--workspace", str(workspace), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (task,) = data["task_records"]
    assert task["written"] and task["record"]["key_values"] == [
        {"name": "decay rate", "value": 0.5, "unit": "1/s"}]
    assert main(["context", session.id, "--workspace", str(workspace)]) == 0
    text = capsys.readouterr().out
    assert "Task records (1):" in text
    line = next(ln for ln in text.splitlines() if "/done" in ln and "decay rate" in ln)
    assert line.endswith("The decay rate is 0.5 1/s.")
    assert "    decay rate = 0.5 1/s" in text and "    wrote decay.csv" in text


# ------------------------------------------------------------------ bench scorer
def _workflow(tmp_path: Path, scorers: str) -> Path:
    path = tmp_path / "wf" / "workflows" / "rec.toml"
    path.parent.mkdir(parents=True)
    path.write_text('id = "rec"\ntitle = "t"\nprompt = "p"\n'
                    '[[steps]]\nfinal = "done"\n' + scorers)
    return path


def test_task_record_scorer_grades_the_run(opened, workspace, tmp_path):
    wf = load_workflow(_workflow(tmp_path, """
[[scorers]]
kind = "task_record"
field = "key_values.discharge capacity"
expected = 5.0
rel_tol = 0.01
unit = "A.h"
[[scorers]]
kind = "task_record"
field = "assumptions"
contains = "298.15 K"
source = "mark_task_done"
[[scorers]]
kind = "task_record"
field = "key_values.voltage"
[[scorers]]
kind = "task_record"
field = "answer"
source = "/done"
"""))
    session, _model, _agent, runner = opened([{"tool": "mark_task_done", "args": CAPACITY},
                                              {"final": "ok"}])
    runner.run("go")  # the run ends on the filed record: graded though not yet written
    run = RunView(final="ok", events=session.trace.events(), step_texts={},
                  workspace=workspace)
    verdicts = grade(wf.scorers, run)
    assert [v.ok for v in verdicts] == [True, True, False, False]
    assert verdicts[0].scorer == "task_record:key_values.discharge capacity"
    assert verdicts[2].detail.startswith("no key value 'voltage'")
    assert verdicts[3].detail == "no task record from /done"


@pytest.mark.parametrize(("scorer", "says"), [
    ('kind = "task_record"\n', "task_record needs ['field']"),
    ('kind = "task_record"\nfield = "anwser"\n', "`field` must be one of"),
    ('kind = "task_record"\nfield = "answer"\nexpected = 3\n', "`expected` and `unit` grade"),
    ('kind = "task_record"\nfield = "answer"\ntolerance = 3\n', "unknown field(s) ['tolerance']"),
])
def test_task_record_scorer_fields_are_validated(tmp_path, scorer, says):
    with pytest.raises(WorkflowError, match="scorers\\[0\\]") as info:
        load_workflow(_workflow(tmp_path, "[[scorers]]\n" + scorer))
    assert says in str(info.value)
