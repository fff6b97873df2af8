"""The dropped-items ledger and ``recall`` (issue 16, item 2).

Pure core on built messages first (extraction, pointers into a real history file, caps,
search); then the real graph, a real kernel and a scripted model: clearing epochs, a
summary, ``/compact`` and ``/done`` each write an entry, and ``recall`` — called by the
model through the graph — gets a dropped number back with its pointer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from simagent.agent.builder import build_agent
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.agent.tools import RECALL, session_tools
from simagent.bench.policies import UNMANAGED
from simagent.context.clearing import apply_cleared
from simagent.context.ledger import (
    MAX_PER_KIND,
    RECALL_HITS,
    Ledger,
    extract,
    ledger_recall,
    numbers_in,
    read_entries,
    recall_text,
    render_hits,
    search,
    trace_fields,
)
from simagent.context.manual import checkpoint_now, compact_now
from simagent.context.panel import render_context
from simagent.context.settings import ContextSettings
from simagent.context.stats import stats_from_trace
from simagent.context.summary import boundary_message, offload
from simagent.session import Session


def call(name: str, args: dict, cid: str) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": cid}])


def kernel_result(text: str, cid: str, raw: str | None) -> ToolMessage:
    return ToolMessage(text, tool_call_id=cid, name="run_python",
                       artifact={"raw_path": raw, "status": "ok"})


def session_like(tmp_path: Path) -> list:
    raw = str(tmp_path / "s" / "outputs" / "0007.txt")
    return [
        HumanMessage("fit the decay and report tau"),
        AIMessage("Fitting with curve_fit; a single exponential is enough here.",
                  tool_calls=[{"name": "run_python", "args": {"code": "fit()"}, "id": "c1"}]),
        kernel_result("n_samples=41\ntau0_ms=2.25\nrms_residual_V=0.0406 (n=41)\n"
                      "wrote results/fit.csv\n"
                      "[figure fig-0a1b2c3d 640x480: /tmp/art/fig-0a1b2c3d.png]\n"
                      "x" * 900, "c1", raw),
        call("record_attempt", {"rationale": "baseline", "parameters": {"model": "exp1"},
                                "metrics": {"tau0_ms": 2.25}, "outcome": "accepted"}, "c2"),
        ToolMessage("attempt #1 recorded: model=exp1", tool_call_id="c2", name="record_attempt"),
        call("read_file", {"file_path": "/data/decay.csv"}, "c3"),
        ToolMessage("t,V\n0.0,4.5017", tool_call_id="c3", name="read_file"),
        AIMessage("Decision: keep exp1; the residual of 0.0406 V is at the noise level."),
    ]


# ------------------------------------------------------------------- pure core
@pytest.mark.parametrize(("line", "values", "score"), [
    ("capacity_Ah = 4.955", ("capacity_Ah=4.955 Ah",), 3),  # unit from the name
    ("T_ad_stoich_300K=2387.6 K", ("T_ad_stoich_300K=2387.6 K",), 3),
    ('"Negative particle diffusivity [m2.s-1]": 3.3e-14',
     ("Negative particle diffusivity [m2.s-1]=3.3e-14",), 3),
    ("the voltage fell to 2.5 V after 3600 s", ("2.5 V", "3600 s"), 2),
    ("gives tau = 2.6753 +/- 0.0123 ms, with", ("gives tau=2.6753 ms",), 3),  # issue 30
    ("tau = 2.6753 ± 0.0123 ms", ("tau=2.6753 ms",), 3),
    ("PLATE_ORDER 1.760 1.922", ("1.760", "1.922"), 1),
    ("  1.0  2.0  3.0", (), 0),  # no label: a data row says nothing by itself
    ("see fig-0a1b2c3d and run_42_final", (), 0),  # ids are not numbers
    ("x = 1, " * 80, (), 0),  # a dump, not a result
])
def test_numbers_keep_their_units_and_names(line, values, score):
    assert numbers_in(line) == (values, score)


def test_items_point_at_the_raw_output_and_the_history_line(tmp_path):
    msgs = session_like(tmp_path)
    history = tmp_path / "history.md"
    offload(history, [HumanMessage("earlier")], kind="summary", first_index=0)
    starts = offload(history, msgs, kind="summary", first_index=1)
    lines = history.read_text(encoding="utf-8").split("\n")
    for start, msg in zip(starts, msgs, strict=True):  # each start is the message's text
        assert lines[start - 1] == msg.text.split("\n")[0]
    items, found = extract(msgs, history=history, starts=starts)
    by = {(it.kind, it.text): it for it in items}
    assert found >= len(items)

    tau = by[("number", "tau0_ms=2.25")]
    assert tau.values == ("tau0_ms=2.25 ms",) and tau.source == "run_python"
    assert tau.handle == "_out[7]" and tau.path.endswith("outputs/0007.txt")
    path, line = tau.history.rsplit(":", 1)
    assert path == str(history) and lines[int(line) - 1] == "tau0_ms=2.25"
    assert tau.pointer() == f"_out[7] · {tau.history}"  # the handle names the raw file

    fig = next(it for it in items if it.kind == "figure")
    assert fig.path == "/tmp/art/fig-0a1b2c3d.png" and "fig-0a1b2c3d" in fig.text
    files = {it.text for it in items if it.kind == "file"}
    assert {"results/fit.csv", "/data/decay.csv"} <= files
    (attempt,) = [it for it in items if it.kind == "attempt"]
    assert attempt.text == "baseline; model=exp1; tau0_ms=2.25; accepted"
    assert any(it.kind == "decision" and it.text.startswith("Decision: keep exp1")
               for it in items)
    assert [it.text for it in items if it.kind == "request"] == ["fit the decay and report tau"]


def test_simagents_own_messages_and_placeholders_are_not_items(tmp_path):
    msgs = session_like(tmp_path)
    summary = boundary_message("summary", "tau0_ms=9.99", tmp_path / "h.md", 3)
    cleared = apply_cleared(msgs, {"c1"})  # the placeholder, not the result
    items, _ = extract([summary, *cleared])
    texts = " ".join(it.text for it in items)
    assert "9.99" not in texts and "result cleared" not in texts
    assert not any(it.kind == "number" and "tau0_ms" in it.text for it in items)
    assert any(it.kind == "attempt" for it in items)  # the rest of the session still counts


def test_a_ledger_entry_is_bounded_and_numbers_are_deduplicated():
    lines = [f"step {i} took {i} iterations" for i in range(300)]  # labelled, no unit
    lines += [f"E_{i}_eV = {i / 7:.4f}" for i in range(60)]  # name = value: preferred
    lines += ["final energy = -3.5 eV"] * 50  # one line, many times
    msgs = [call("run_python", {"code": "go()"}, "c1"),
            kernel_result("\n".join(lines), "c1", None)]
    items, found = extract(msgs)
    numbers = [it for it in items if it.kind == "number"]
    assert len(numbers) == MAX_PER_KIND["number"] and found > len(numbers) + 300
    assert all(it.values[0].startswith(("E_", "final energy")) for it in numbers)
    assert sum(it.text == "final energy = -3.5 eV" for it in numbers) == 1
    assert numbers[-1].text == "final energy = -3.5 eV"  # message order kept


def test_recall_searches_the_ledger_the_history_and_the_files_it_points_to(session_paths):
    raw = session_paths.outputs / "0003.txt"
    raw.write_text("progress 10%\nSOLVER-NOTE converged after many sweeps\n"
                   + "x" * 5000 + "\n", encoding="utf-8")
    history = session_paths.conversation_history / "t.md"
    msgs = [call("run_python", {"code": "solve()"}, "c1"),
            kernel_result("peak_T_K = 2387.6 K\n[... 5,000 chars omitted ...]", "c1", str(raw))]
    ledger = Ledger(session_paths.ledger)
    starts = offload(history, msgs, kind="summary", first_index=0)
    entry = ledger.record("summary", msgs, history=history, starts=starts)
    assert entry["id"] == 1 and read_entries(session_paths.ledger)[0]["kind"] == "summary"

    hits = search("PEAK_t_k", ledger=session_paths.ledger,
                  history_dir=session_paths.conversation_history)
    assert hits[0].kind == "number" and hits[0].text == "peak_T_K = 2387.6 K"
    assert "_out[3]" in hits[0].pointer and f"{history}:" in hits[0].pointer
    # a line the ledger did not list, found in the raw output its entry points to
    (note,) = search("solver-note converged", ledger=session_paths.ledger,
                     history_dir=session_paths.conversation_history)
    assert note.kind == "output" and note.pointer == f"_out[3] · {raw}:2"
    # a line only the history file holds (the call's code)
    (code,) = search("solve()", ledger=session_paths.ledger,
                     history_dir=session_paths.conversation_history)
    assert code.kind == "history" and code.pointer.startswith(f"{history}:")
    assert search("peak nowhere", ledger=session_paths.ledger) == []
    assert "nothing that left your context" in recall_text(session_paths, "peak nowhere")
    assert "give words" in render_hits("  ", [])


def test_recall_output_is_bounded(session_paths):
    lines = [f"value_{i} = {i}.5 K " + "w" * 400 for i in range(200)]
    msgs = [call("run_python", {"code": "x"}, "c1"), kernel_result("\n".join(lines), "c1", None)]
    history = session_paths.conversation_history / "t.md"
    Ledger(session_paths.ledger).record(
        "summary", msgs, history=history,
        starts=offload(history, msgs, kind="summary", first_index=0))
    text = recall_text(session_paths, "value_")
    assert text.count("\n- [") == RECALL_HITS and "narrow the query" in text
    assert len(text) < RECALL_HITS * 600


def test_ledger_recall_counts_the_facts_recall_finds(session_paths):
    assert ledger_recall(session_paths, ["anything"]) is None  # no ledger: no metric
    msgs = [call("run_python", {"code": "x"}, "c1"),
            kernel_result("tau_ref_1000K_1atm_ms=0.3119", "c1", None)]
    Ledger(session_paths.ledger).record("clear", msgs[1:], calls={"c1": msgs[0].tool_calls[0]})
    assert ledger_recall(session_paths, []) is None
    assert ledger_recall(session_paths, ["tau_ref_1000K_1atm_ms=0.3119", "lost fact 42"]) == 0.5


def test_trace_fields_summarize_an_entry_for_context(session_paths):
    msgs = session_like(session_paths.root)
    entry = Ledger(session_paths.ledger).record("summary", msgs)
    fields = trace_fields(entry)
    assert fields["ledger"] == 1 and fields["ledger_items"] == len(entry["items"])
    assert sum(fields["ledger_kinds"].values()) == fields["ledger_items"]
    assert fields["ledger_path"] == str(session_paths.ledger)
    assert 0 < len(fields["ledger_preview"]) <= 6 and trace_fields(None) == {}


# ------------------------------------------------------- real graph and kernel
def open_session(workspace: Path, steps, settings: ContextSettings, window: int):
    session = Session.create(workspace, approval="auto")
    model = ScriptedChatModel.from_steps(steps, window=window, enforce_window=True)
    agent = build_agent(session, model, context_settings=settings)
    return session, model, agent, TurnRunner(session, agent)


@pytest.fixture
def opened(workspace):
    sessions = []

    def _open(*args, **kw):
        out = open_session(workspace, *args, **kw)
        sessions.append(out[0])
        return out

    yield _open
    for s in sessions:
        s.close()


def payloads(session, kind):
    return [e.payload for e in session.trace.events([kind])]


@pytest.mark.slow
def test_clearing_and_a_summary_write_entries_and_the_model_recalls_a_dropped_value(opened):
    steps = [{"tool": "run_python",
              "args": {"code": f"print('R{i} value_mV =', {i} * 37.5, 'mV')\nprint('v' * 3000)"}}
             for i in range(24)] + [{"final": "swept"}]
    # a first turn under clearing only: epochs clear the older results
    session, _model, _agent, runner = opened(
        steps, ContextSettings(summarize=False, budget_check=False), 30_000)
    assert runner.run("sweep R").status == "done"
    # the same thread, rebuilt with summaries only and a low trigger: the next turn's
    # first call summarizes, then the model asks recall for a value that left the view
    model = ScriptedChatModel.from_steps(
        [{"tool": RECALL, "args": {"query": "R2 value_mV"}, "id": "recall-1"},  # ids unique
         {"final": "{out[-1]|R2 value_mV = \\S+ mV}"}], window=30_000, enforce_window=True)
    agent = build_agent(session, model, context_settings=ContextSettings(
        clear_fraction=None, summary_fraction=0.1))
    result = TurnRunner(session, agent).run("what was R2?")
    assert result.status == "done", result.error
    assert result.final == "R2 value_mV = 75.0 mV"

    clears, summaries = payloads(session, "context_clear"), payloads(session, "context_summary")
    assert clears and summaries
    entries = read_entries(session.paths.ledger)
    # one entry per compaction, and each compaction's event names its entry
    assert len(entries) == len(clears) + len(summaries)
    assert sorted(p["ledger"] for p in clears + summaries) == [e["id"] for e in entries]
    kinds = {e["id"]: e["kind"] for e in entries}
    assert {kinds[p["ledger"]] for p in clears} == {"clear"}
    assert {kinds[p["ledger"]] for p in summaries} == {"summary"}
    for p in clears:  # a clear's entry lists the cleared results' numbers
        assert p["ledger_items"] >= p["cleared"] and p["ledger_kinds"]["number"] >= 1

    # the model's recall call answered through the graph, with the pointers
    answer = next(m for m in model.requests[-1] if isinstance(m, ToolMessage)
                  and m.name == RECALL).text
    first = answer.splitlines()[1]
    assert first.startswith("- [number] R2 value_mV = 75.0 mV")
    handle, at = first.split("⟶ ")[1].split(" · ")
    assert handle == "_out[4]"  # and the entries keep the raw file it names
    raw = next(it["path"] for e in entries for it in e["items"] if it["text"].startswith("R2 "))
    assert Path(raw).name == "0004.txt" and Path(raw).read_text().startswith("R2 value_mV")
    hist, line = at.rsplit(":", 1)  # the summary's entry: history file and line
    assert hist == summaries[0]["path"]
    assert Path(hist).read_text().split("\n")[int(line) - 1] == "R2 value_mV = 75.0 mV"
    assert ledger_recall(session, ["R2 value_mV = 75.0 mV", "R0 value_mV = 0.0 mV"]) == 1.0


def test_compact_and_done_write_entries_that_context_shows(opened, workspace):
    steps = [{"tool": "run_python", "args": {"code": f"print('C{i} =', {i} * 11, 'J')"}}
             for i in range(6)] + [{"final": "first done"}, {"final": "second"},
                                   {"final": "third"}]
    session, _model, agent, runner = opened(steps, ContextSettings(), 128_000)
    runner.run("first task")
    res = compact_now(agent.graph, session.thread_config, agent.context, focus="the C values")
    assert res.done
    (p,) = payloads(session, "context_summary")
    assert p["reason"] == "manual" and p["ledger"] == 1 and p["ledger_kinds"]["number"] >= 4
    (entry,) = read_entries(session.paths.ledger)
    assert entry["kind"] == "summary" and entry["focus"] == "the C values"
    assert "C2 = 22 J" in recall_text(session.paths, "C2 =")

    runner.run("second task")
    done = checkpoint_now(agent.graph, session.thread_config, agent.context, note="C known")
    assert done.done
    (c,) = payloads(session, "context_checkpoint")
    assert c["ledger"] == 2 and [e["kind"] for e in read_entries(session.paths.ledger)] == [
        "summary", "checkpoint"]

    stats = stats_from_trace(session.paths.trace, session.context_settings)
    assert stats.ledger_entries == 2 and stats.ledger.id == 2
    assert stats.ledger.after == "checkpoint"
    assert [b.ledger_items for b in stats.boundaries] == [p["ledger_items"],
                                                          c["ledger_items"]]
    panel = render_context(stats, width=100)
    assert "Ledger: 2 entries; latest #2 after a checkpoint" in panel
    assert f"ledger {p['ledger_items']}" in panel and "recall(query) searches it" in panel
    assert json.loads(json.dumps(stats.as_dict()))["ledger"]["id"] == 2


def test_policies_without_a_ledger_offer_no_recall_and_write_none(workspace):
    session = Session.create(workspace, approval="auto")
    try:
        (recall,) = [t for t in session_tools(session) if t.name == RECALL]
        assert f"up to {RECALL_HITS} lines" in recall.description  # says what it returns
        assert RECALL not in [t.name for t in session_tools(session, UNMANAGED)]
    finally:
        session.close()
    assert not session.paths.ledger.exists()


def test_an_emergency_truncation_writes_an_entry_too(opened):
    code = "print('E{i}_V =', {i} / 8, 'V')\nprint('w' * 2000)"
    steps = [{"tool": "run_python", "args": {"code": code.format(i=i)}}
             for i in range(12)] + [{"final": "{out[-1]|E\\d+_V}"}]
    # only the provider's refusal compacts here (the configured window hides the model's)
    settings = ContextSettings(window=500_000, summarize=False, clear_fraction=None,
                               budget_check=False)
    session, model, _agent, runner = opened(steps, settings, 14_000)
    assert runner.run("go").status == "done"
    events = payloads(session, "context_emergency")
    assert events and len(model.cursor.rejected) == len(events)
    kinds = {e["id"]: e["kind"] for e in read_entries(session.paths.ledger)}
    assert [kinds[p["ledger"]] for p in events] == ["emergency"] * len(events)
    assert "- [number] E0_V = 0.0 V  ⟶ _out[" in recall_text(session.paths, "E0_V")
