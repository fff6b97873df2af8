"""Cells asked for in one model message run in the order the model wrote them
(``agent/cell_order.py``): the graph runs a message's tool calls on parallel threads."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from langchain_core.messages import AIMessage, HumanMessage

from simagent.agent.builder import build_agent
from simagent.agent.cell_order import UNSEEN_GRACE_S, CellOrder, calls_before
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.session import Session


def test_calls_before_reads_the_message_that_asked_for_the_call() -> None:
    old = AIMessage("", tool_calls=[{"name": "run_python", "args": {}, "id": "a"}])
    new = AIMessage("", tool_calls=[{"name": "run_python", "args": {}, "id": "b"},
                                    {"name": "read_file", "args": {}, "id": "r"},
                                    {"name": "run_python", "args": {}, "id": "c"}])
    messages = [HumanMessage("go"), old, new]
    assert calls_before(messages, "c", "run_python") == ["b"]  # not read_file, not a
    assert calls_before(messages, "b", "run_python") == []
    assert calls_before(messages, "zz", "run_python") == []


def test_a_later_call_waits_for_an_earlier_one_that_started() -> None:
    order, ran = CellOrder(), []
    first_in = threading.Event()

    def first() -> None:
        with order.turn("a", []):
            first_in.set()
            time.sleep(0.3)
            ran.append("a")

    t = threading.Thread(target=first)
    t.start()
    first_in.wait(5)
    with order.turn("b", ["a"]):
        ran.append("b")
    t.join(5)
    assert ran == ["a", "b"]


def test_an_earlier_call_that_never_starts_is_waited_for_only_the_grace() -> None:
    now = [0.0]
    order = CellOrder(clock=lambda: now[0])
    done = threading.Event()

    def later() -> None:
        with order.turn("b", ["a"]):
            done.set()

    t = threading.Thread(target=later)
    t.start()
    assert not done.wait(0.2)  # "a" may still be on its way
    now[0] = UNSEEN_GRACE_S + 0.01
    assert done.wait(5)  # "a" was rejected, or answered without running
    t.join(5)


def test_a_cancel_ends_the_wait() -> None:
    cancelled = threading.Event()
    order = CellOrder(cancelled.is_set)
    with order.turn("a", []):
        done = threading.Event()

        def later() -> None:
            with order.turn("b", ["a"]):
                done.set()

        t = threading.Thread(target=later)
        t.start()
        assert not done.wait(0.2)
        cancelled.set()
        assert done.wait(5)
        t.join(5)


def test_two_cells_of_one_message_run_in_the_models_order(workspace: Path) -> None:
    # the first cell is slow to reach its assignment; the second reads what it defines
    steps = [{"tools": [{"tool": "run_python",
                         "args": {"code": "import time\ntime.sleep(0.5)\nfirst = 41"}},
                        {"tool": "run_python", "args": {"code": "print(first + 1)"}}]},
             {"final": "done"}]
    session = Session.create(workspace, approval="auto")
    try:
        runner = TurnRunner(session, build_agent(session,
                                                 ScriptedChatModel.from_steps(steps)))
        session.start_kernel()
        for _ in range(3):  # the race went either way; in order every time now
            session.execute("first = None")
            result = runner.run("two cells")
            assert result.status == "done"
            cells = [e.payload["code"] for e in session.trace.events(["kernel_exec"])]
            assert cells[-2:] == ["import time\ntime.sleep(0.5)\nfirst = 41",
                                  "print(first + 1)"]
            outputs = [e.payload for e in session.trace.events(["tool_result"])]
            assert "42" in str(outputs[-1])
            runner = TurnRunner(session, build_agent(session,
                                                     ScriptedChatModel.from_steps(steps)))
    finally:
        session.close()
