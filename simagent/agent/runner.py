"""``TurnRunner``: runs one turn of the graph and turns its streams into typed events.

One class for ``simagent run``, the TUI and the bench, so they cannot drift apart. It
writes the user's message and every approval round trip to the trace (the recorder
middleware writes the rest), streams assistant text only from the model node (tool
output never leaks into prose), and turns provider failures into a clear error result
instead of a traceback. ``cancel()`` may be called from another thread: it interrupts
the kernel (state kept) and stops the turn at the next chunk. The graph runs on a pump
thread, so a turn whose model call does not answer a cancel is abandoned after
``ABANDON_AFTER_S`` instead of holding the prompt (``simagent.turns``).

The cost ceiling is enforced in two places: mid-turn by ``CostCeilingMiddleware`` (the
turn ends as an error carrying the trip), and here before a turn starts: while a trip
stands in the trace, ``run``/``resume`` refuse without calling the model until the host
calls ``reset_cost_ceiling()`` (the user's explicit decision, e.g. a slash command).
"""

from __future__ import annotations

import contextlib
import contextvars
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage, AIMessageChunk, ToolMessage
from langgraph.types import Command

from simagent.agent import cancel_account as ca
from simagent.agent.events import (
    ContextEvent,
    Event,
    Interrupt,
    Notice,
    ReasoningDelta,
    Retrying,
    TextDelta,
    ToolError,
    ToolFinished,
    ToolOutput,
    ToolRequested,
    ToolStarted,
    TurnResult,
)
from simagent.context.guards import ceiling_tripped, reset_ceiling
from simagent.models import describe_provider_error
from simagent.turns import ABANDON_AFTER_S

if TYPE_CHECKING:
    from simagent.agent.builder import BuiltAgent
    from simagent.session import Session

OnEvent = Callable[[Event], None]
NO_RESPONSE = "(no response)"
#: langgraph saves each step's checkpoint before the next step runs. Under its default
#: ("async") a tool's saved result can belong to a checkpoint that was not yet written
#: when the process was killed; the resume then cannot see it and the call counts as
#: interrupted (``resume_repair``). One SQLite commit per step is cheap next to a model call.
DURABILITY = "sync"
_END = object()  # the pump's last item


def _agent_name(namespace: tuple[str, ...], metadata: dict[str, Any] | None) -> str:
    if not namespace:
        return "main"
    name = (metadata or {}).get("lc_agent_name")
    return str(name) if name and name != "simagent" else "subagent"


def _ceiling_message(trip: dict[str, Any]) -> str:
    """The trip's message as one line (a payload from an older trace may lack it)."""
    text = str(trip.get("message") or "").strip()
    if not text:
        text = (f"cost ceiling reached: {trip.get('scope', '?')} limit {trip.get('limit')} "
                f"{trip.get('unit', '')}".rstrip())
    return text.splitlines()[0]


def _reasoning_delta(chunk: AIMessageChunk) -> str:
    text = chunk.additional_kwargs.get("reasoning_content") or ""
    if not text and isinstance(chunk.content, list):
        for block in chunk.content:
            if isinstance(block, dict) and block.get("type") in ("reasoning", "thinking"):
                text += str(block.get("reasoning") or block.get("thinking") or "")
    return text


class TurnRunner:
    """Runs turns of ``agent`` for ``session``; swap ``agent`` to switch models."""

    #: The clock the abandon bound is measured on (a test seam: tests step it by hand).
    clock: Callable[[], float] = staticmethod(time.monotonic)

    def __init__(self, session: Session, agent: BuiltAgent) -> None:
        self.session = session
        self.agent = agent
        self._cancel = threading.Event()
        self._force = threading.Event()  # a second ctrl+C: abandon without waiting
        self.busy = False
        #: Text streamed per graph namespace since its model node last completed: what a
        #: failed attempt showed and a provider retry discards.
        self._streamed: dict[tuple[str, ...], int] = {}
        #: ToolFinished ids emitted; an abandoned turn's first event id; what it left running
        self._shown: set[str] = set()
        self._unsettled: tuple[int, threading.Thread | None] | None = None
        self._abandoned: str | None = None
        self._abandoned_pump: threading.Thread | None = None

    # ------------------------------------------------------------------ API
    def run(self, prompt: str, on_event: OnEvent | None = None) -> TurnResult:
        """One user turn: ``prompt`` in, events out, the result when it ends or pauses."""
        if (refused := self._refuse_if_tripped(on_event)) is not None:
            return refused
        turn = len(self.session.trace.events(["message_user"])) + 1
        self.session.trace.append("message_user", {"content": prompt, "turn": turn})
        return self._drive({"messages": [{"role": "user", "content": prompt}]}, on_event)

    def resume(self, decisions: list[dict[str, Any]] | dict[str, list[dict[str, Any]]],
               on_event: OnEvent | None = None, *, pending: list[Interrupt] | None = None
               ) -> TurnResult:
        """Answer paused approvals and continue the turn.

        ``decisions`` is a list (one decision per action of the single pending
        interrupt) or ``{interrupt_id: [decisions]}`` when several are pending.
        """
        if (refused := self._refuse_if_tripped(on_event)) is not None:
            return refused  # the approvals stay pending for after the reset
        pending = pending if pending is not None else self.pending_interrupts()
        if isinstance(decisions, dict):
            by_id = decisions
        else:
            if len(pending) != 1:
                raise ValueError(f"{len(pending)} approvals are pending; pass decisions "
                                 "keyed by interrupt id")
            by_id = {pending[0].interrupt_id: decisions}
        for iid, decs in by_id.items():
            self.session.trace.append("hitl_response", {"interrupt_id": iid, "decisions": decs})
        if len(by_id) == 1 and len(pending) <= 1:
            resume: Any = {"decisions": next(iter(by_id.values()))}
        else:
            resume = {iid: {"decisions": decs} for iid, decs in by_id.items()}
        return self._drive(Command(resume=resume), on_event)

    def reset_cost_ceiling(self) -> bool:
        """Clear a tripped cost ceiling so turns run again; False when none was tripped.

        The trip lives in the trace (it holds across restarts), so the reset is a trace
        event too; the configured limits still apply to the turns that follow.
        """
        if ceiling_tripped(self.session.trace.events(["cost_ceiling"])) is None:
            return False
        reset_ceiling(self.session.trace)
        return True

    def switch_agent(self, agent: BuiltAgent) -> None:
        """Continue the same thread with another agent (a new model or approval mode).

        The checkpointer thread is the session's, so history, summaries and pending
        approvals carry over; the trace records the switch when the model changes.
        """
        if self.busy:
            raise RuntimeError("cannot switch models while a turn is running")
        if agent.model_id != self.agent.model_id:
            self.session.trace.append("model_switch", {"from_model": self.agent.model_id,
                                                       "to_model": agent.model_id})
        self.agent = agent

    def pending_interrupts(self) -> list[Interrupt]:
        """Approvals the thread is waiting for (also after a restart of the process)."""
        state = self.agent.graph.get_state(self.session.thread_config)
        found = []
        for task in state.tasks or ():
            for intr in getattr(task, "interrupts", ()) or ():
                found.append(self._interrupt(intr))
        return found

    def cancel(self, *, force: bool = False) -> None:
        """Stop the running turn (thread-safe); a running cell is interrupted, state kept.

        ``force`` (a second ctrl+C) stops waiting at once: the turn is abandoned now if
        the graph has not stopped, even while a cell is still being interrupted.
        """
        if force and self.busy:
            self._force.set()
        if not self.busy or self._cancel.is_set():
            return  # idle, or already cancelling
        self._cancel.set()
        self.session.cancel_requested.set()
        self.session.interrupt_kernel()
        if (stop_reply := getattr(self.agent, "stop_reply", None)) is not None:
            threading.Thread(target=stop_reply, daemon=True).start()  # a local server's
        threading.Thread(target=self.session.keep_interrupting, daemon=True,
                         args=(lambda: self.busy and self._cancel.is_set(),)).start()

    @contextlib.contextmanager
    def _sigint_cancels(self) -> Iterator[None]:
        """While a turn runs in the main thread (``simagent run``, the bench), ctrl+C
        cancels it and a second one stops waiting for it, instead of raising
        ``KeyboardInterrupt`` at whatever line the thread is on (inside a lock's wait,
        which corrupts the lock). Elsewhere (the TUI's workers) signals never arrive."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        presses = 0

        def on_sigint(_signum: int, _frame: Any) -> None:
            nonlocal presses
            presses += 1
            force = presses > 1  # the handler only hands over; the work runs elsewhere
            threading.Thread(target=lambda: self.cancel(force=force), daemon=True).start()

        previous = signal.signal(signal.SIGINT, on_sigint)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    # ------------------------------------------------------------ internals
    def _refuse_if_tripped(self, on_event: OnEvent | None) -> TurnResult | None:
        """An error result, without touching the graph, while a trip stands; else None.

        Nothing of the turn is written (no user message, no approval answer), only a
        ``refused`` event, so the refusal costs nothing and the turn can be retried as is.
        """
        trip = ceiling_tripped(self.session.trace.events(["cost_ceiling"]))
        if trip is None:
            return None
        emit = on_event or (lambda _e: None)
        payload = {"action": "refused", **{k: trip.get(k)
                                            for k in ("scope", "limit", "spent", "unit")}}
        self.session.trace.append("cost_ceiling", payload)
        message = _ceiling_message(trip)
        emit(ContextEvent("cost_ceiling", payload))
        emit(Notice(message, level="error"))
        return TurnResult(status="error", error=message, cost_ceiling=dict(trip))

    @staticmethod
    def _interrupt(intr: Any) -> Interrupt:
        value = intr.value if isinstance(intr.value, dict) else {"value": intr.value}
        return Interrupt(interrupt_id=str(getattr(intr, "id", "") or ""),
                         action_requests=list(value.get("action_requests", [])),
                         review_configs=list(value.get("review_configs", [])))

    def _drive(self, graph_input: Any, on_event: OnEvent | None) -> TurnResult:
        emit = on_event or (lambda _e: None)
        before = self.session.usage.snapshot()
        self._cancel.clear()
        self._force.clear()
        self.session.cancel_requested.clear()
        self._streamed.clear()
        self._abandoned = None
        since = ca.last_event_id(self.session.trace)
        self.busy = True
        result = TurnResult(status="done")
        try:
            with self._sigint_cancels():
                if (left := self._unsettled) is not None:  # an abandoned turn's open calls
                    self._unsettled = None
                    ca.settle(self.session, self.agent.graph, emit, *left, self._shown)
                if not self._cancel.is_set():
                    self._stream(graph_input, emit, result)
        except KeyboardInterrupt:  # landed just before the handler was in place
            self.session.interrupt_kernel()
            result.status = "cancelled"
        except Exception as exc:  # provider and graph failures end the turn, not the app
            if self._cancel.is_set():  # the cancel ended it (e.g. a provider-retry wait)
                result.status = "cancelled"
            else:
                line = describe_provider_error(exc)
                result.status = "error"
                result.provider_error = line is not None
                result.error = line or f"{type(exc).__name__}: {exc}".splitlines()[0]
                self.session.trace.append("error", {"message": result.error, "where": "turn"})
                emit(Notice(result.error, level="error"))
        finally:
            self.busy = False
        if self._cancel.is_set() and result.status == "done":
            result.status = "cancelled"
        if result.status == "cancelled":
            if self._abandoned:  # its calls may still run: the next turn answers them
                self._unsettled = self._unsettled or (since, self._abandoned_pump)
            else:
                result.recovery = ca.settle(self.session, self.agent.graph, emit, since,
                                            None, self._shown)
            note = ca.cancel_notice(result.recovery, self._abandoned == "cell")
            self.session.trace.append("error", {"message": "turn cancelled by the user",
                                                "where": "turn"})
            emit(Notice(note, level="warning"))
        if result.cost_ceiling is not None and result.status == "done":
            # the guard ended the turn early: an error, not an answer (final keeps its note)
            result.status = "error"
            result.error = _ceiling_message(result.cost_ceiling)
            result.final = self._final_text()
            emit(Notice(result.error, level="error"))
        if result.interrupts and result.status == "done":
            result.status = "paused"
            for intr in result.interrupts:
                self.session.trace.append("hitl_request", {
                    "interrupt_id": intr.interrupt_id,
                    "action_requests": intr.action_requests})
        if result.status == "done":
            result.final = self._final_text()
        result.usage = self.session.usage.snapshot().minus(before)
        return result

    def _final_text(self) -> str:
        state = self.agent.graph.get_state(self.session.thread_config)
        for msg in reversed(state.values.get("messages", [])):
            if isinstance(msg, AIMessage):
                return msg.text.strip() or NO_RESPONSE
        return NO_RESPONSE

    def _stream(self, graph_input: Any, emit: OnEvent, result: TurnResult) -> None:
        """Consume the graph's stream from a pump thread until it ends or is cancelled.

        A cancel stops the pump at its next item; a pump that yields nothing for
        ``ABANDON_AFTER_S`` after the cancel (a model call that has not answered, or one
        still streaming) is abandoned: the turn ends now and the guard keeps the late reply
        out of the state. A cell still running is waited for, and the clock starts again
        when it ends: the kernel interrupts it and, past its grace period, restarts, so
        that wait is bounded and its outcome is real.
        """
        turn = self.session.turns.begin()
        items: queue.Queue[Any] = queue.Queue()
        stop = threading.Event()
        # the caller's context variables (callbacks, tracing) reach the graph as before
        pump = threading.Thread(target=contextvars.copy_context().run,
                                args=(self._pump, graph_input, turn, items, stop),
                                name=f"simagent-turn-{turn}", daemon=True)
        pump.start()
        quiet_since: float | None = None  # since the cancel, nothing moved (graph, kernel)
        while True:
            try:
                item = items.get(timeout=0.05)
            except queue.Empty:
                if not self._cancel.is_set():
                    continue
                stop.set()
                now = self.clock()
                if self.session.kernel_state in ("busy", "restarting", "starting"):
                    quiet_since = now  # a cell has its own bounded way out: wait for it
                quiet_since = quiet_since or now
                if not self._force.is_set() and now - quiet_since < ABANDON_AFTER_S:
                    continue
                self._abandon(turn, pump, emit)
                return
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            if not stop.is_set():
                self._on_item(item, emit, result)
            if self._cancel.is_set():
                stop.set()  # the pump closes the stream; wait for it above

    def _pump(self, graph_input: Any, turn: int, items: queue.Queue[Any],
              stop: threading.Event) -> None:
        """Run the graph (its nodes see ``turn``) and hand its items over until stopped."""
        self.session.turns.bind(turn)
        try:
            stream = self.agent.graph.stream(
                graph_input, self.session.thread_config,
                stream_mode=["messages", "updates", "custom"], subgraphs=True,
                durability=DURABILITY)
            try:
                for item in stream:
                    if stop.is_set():
                        break
                    items.put(item)
            finally:
                stream.close()
        except BaseException as exc:  # handed to the turn's thread
            items.put(exc)
        finally:
            items.put(_END)

    def _abandon(self, turn: int, pump: threading.Thread, emit: OnEvent) -> None:
        self.session.turns.abandon(turn, pump)
        self._abandoned = "cell" if self.session.kernel_state in ca.STOPPING else "model"
        logged, said = ca.ABANDONED[self._abandoned]  # the second ctrl+C: what it left
        self.session.trace.append("error", {"message": logged, "where": "turn"})
        emit(Notice(said, level="warning"))
        self._abandoned_pump = pump if self._abandoned == "cell" else None
        if self._abandoned == "cell":  # tell how the cell ended once it has
            since = ca.last_event_id(self.session.trace)
            threading.Thread(target=ca.follow, daemon=True,
                             args=(self.session, pump, emit, since, self._shown)).start()

    def _on_item(self, item: Any, emit: OnEvent, result: TurnResult) -> None:
        namespace, mode, data = item
        if mode == "messages":
            self._on_message(namespace, data, emit)
        elif mode == "custom":
            self._on_custom(namespace, data, emit, result)
        elif mode == "updates":
            self._on_update(namespace, data, emit, result)

    def _on_message(self, namespace: tuple[str, ...], data: Any, emit: OnEvent) -> None:
        chunk, metadata = data
        if not isinstance(chunk, AIMessageChunk):
            return
        if (metadata or {}).get("langgraph_node") != "model":
            return  # only the model's own prose; never tool output or summaries
        agent = _agent_name(namespace, metadata)
        if thinking := _reasoning_delta(chunk):
            emit(ReasoningDelta(thinking, agent))
        text = chunk.content if isinstance(chunk.content, str) else ""
        if isinstance(chunk.content, list):
            text = "".join(b.get("text", "") for b in chunk.content
                           if isinstance(b, dict) and b.get("type") == "text")
        if text:
            self._streamed[namespace] = self._streamed.get(namespace, 0) + len(text)
            emit(TextDelta(text, agent))

    def _on_custom(self, namespace: tuple[str, ...], item: Any, emit: OnEvent,
                   result: TurnResult) -> None:
        if not isinstance(item, dict):
            return
        kind = item.get("type")
        if kind == "provider_retry":  # ProviderRetryMiddleware, before its backoff wait
            emit(Retrying(int(item.get("retry", 0)), int(item.get("max_retries", 0)),
                          float(item.get("delay_s", 0.0)), str(item.get("cause", "")),
                          str(item.get("reason", "")), str(item.get("agent", "main")),
                          self._streamed.pop(namespace, 0)))
        elif kind == "tool_started":
            result.tool_calls += 1
            emit(ToolStarted(item["tool_call_id"], item["name"], item.get("args") or {},
                             item.get("agent", "main")))
        elif kind == "tool_output":
            emit(ToolOutput(item["tool_call_id"], item.get("kind", "stdout"),
                            item.get("text", ""), item.get("path")))
        elif kind == "tool_finished":
            self._shown.add(str(item["tool_call_id"]))
            cls = ToolError if item.get("status") == "error" else ToolFinished
            emit(cls(item["tool_call_id"], item["name"], item.get("status", "success"),
                     item.get("content", ""), float(item.get("elapsed_s", 0.0)),
                     item.get("agent", "main"), item.get("raw_path"), item.get("outcome"),
                     item.get("recovery")))
        elif kind == "context":
            event = ContextEvent(item.get("kind", "context"), dict(item.get("detail") or {}))
            if event.kind == "cost_ceiling" and event.detail.get("action") == "tripped":
                result.cost_ceiling = dict(event.detail)
            emit(event)
        elif kind == "notice":
            emit(Notice(str(item.get("text", "")), item.get("level", "info")))

    def _on_update(self, namespace: tuple[str, ...], data: Any, emit: OnEvent,
                   result: TurnResult) -> None:
        if not isinstance(data, dict):
            return
        for node, update in data.items():
            if node == "__interrupt__":  # a subagent's reaches every namespace up to the
                for intr in update or ():  # root: one approval, told once
                    found = self._interrupt(intr)
                    if all(i.interrupt_id != found.interrupt_id for i in result.interrupts):
                        result.interrupts.append(found)
                        emit(found)
                continue
            if node != "model" or not isinstance(update, dict):
                continue
            self._streamed.pop(namespace, None)  # that call's text is kept: not discardable
            agent = "main" if not namespace else "subagent"
            for msg in update.get("messages", []) or []:
                if isinstance(msg, AIMessage):
                    for call in msg.tool_calls:
                        emit(ToolRequested(call["id"] or "", call["name"],
                                           dict(call["args"]), agent))
                elif isinstance(msg, ToolMessage):  # answered in the model node itself: a
                    # structured report (submit_report), filed or sent back as invalid
                    status = msg.status or "success"
                    cls = ToolError if status == "error" else ToolFinished
                    emit(cls(msg.tool_call_id, msg.name or "?", status, msg.text, 0.0, agent))
