"""Running turns for the TUI: on a worker thread, their events handed to the UI thread,
approvals asked and answered, background jobs that must not overlap a turn.

A mixin of ``TuiController`` (its state lives there: ``session``, ``runner``,
``conversation``, ``post``); kept apart so start-up and input read on their own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simagent.agent.confine import prompt_line
from simagent.agent.events import Interrupt, Retrying
from simagent.presentation.footnotes import trace_last
from simagent.presentation.previews import action_preview, file_now
from simagent.tui.entries import ApprovalEntry, answer_sources


class TurnDriving:
    """Turns, their events and approvals (see the module docstring)."""

    def _on_event(self, event: Any) -> None:
        try:
            self.model_event(event)
            if isinstance(event, Retrying):
                self._retrying(event)
                return
            self._retry = None  # anything the turn does next ends a retry's wait
            if isinstance(event, Interrupt):
                self._preview(event)
            self.conversation.apply(event)
        except Exception as exc:  # an odd event must not break the UI loop
            self.note(f"could not show an event: {type(exc).__name__}: {exc}"
                      .splitlines()[0], "error")

    def _preview(self, event: Any) -> None:
        for i, req in enumerate(event.action_requests):
            args = dict(req.get("args") or {})
            current = file_now(str(req.get("name")), args, self.session.workspace)
            preview = action_preview(str(req.get("name")), args, current)
            note = prompt_line(req)  # the real file and why it waits
            self.previews[(event.interrupt_id, i)] = f"{note}\n{preview}" if note else preview

    def _turn(self, call: Callable[[Callable[[Any], None]], Any]) -> None:
        def emit(event: Any) -> None:
            self.post(lambda: self._on_event(event))
            self.post(self.invalidate)

        def work() -> None:
            try:
                while not self._kernel_ready.wait(0.1):
                    if self._early_cancel.is_set():
                        break  # the kernel is still starting: do not wait for it
                if self._early_cancel.is_set():
                    self.post(lambda: self.conversation.note(
                        "Turn cancelled before it started; the kernel kept its state.",
                        "warning"))
                    return
                self.post(lambda: self.model_asked(new_turn=True))
                self._footnote_answer(call(emit))
            except Exception as exc:  # TurnRunner reports its own; this is a last resort
                msg = f"{type(exc).__name__}: {exc}".splitlines()[0]
                self.post(lambda: self.conversation.note(msg, "error"))
            finally:
                self._finishing = True
                pending = self._pending_safely()
                self.post(self.conversation.end_turn)
                self.post(lambda: self._resync_approvals(pending))
                self.refresh_stats(background=False)
                self.post(self._finish)  # after the queued events, not before them

        self._early_cancel.clear()
        self._active = True  # before the thread starts: a second Enter is refused
        self.spawn(work)

    def _footnote_answer(self, result: Any) -> None:
        """On the turn's thread, once, as it ends: the final answer's numbers traced to
        the session's outputs on disk (``presentation/footnotes``), then handed to the
        view, which draws them from then on without tracing again."""
        if self.session is None or not getattr(result, "final", None) \
                or getattr(result, "status", None) == "error":
            return
        try:
            traced = trace_last(self.session.trace.events())
            if traced is None:
                return
            footnoted, lines = answer_sources(traced)
        except Exception as exc:  # the answer stands without its footnotes
            msg = f"could not trace the answer's numbers: {type(exc).__name__}: {exc}"
            self.post(lambda: self.conversation.note(msg.splitlines()[0], "warning"))
            return
        self.post(lambda: self.conversation.footnote(footnoted, lines))

    def _finish(self) -> None:
        self._active = False
        self._finishing = False
        self._retry = None
        self.first_token.stop()
        self.invalidate()

    def _pending_safely(self) -> list[Any] | None:
        try:
            return self.runner.pending_interrupts() if self.runner is not None else []
        except Exception:
            return None

    def _resync_approvals(self, pending: list[Any] | None) -> None:
        """Approvals the graph still waits for are open again in the view.

        A resume can end before the graph consumed it (a cost-ceiling refusal, an error,
        a cancel); its answered entries then become pending again instead of vanishing.
        """
        if not pending:
            return
        for intr in pending:
            entries = [e for e in self.conversation.entries
                       if isinstance(e, ApprovalEntry) and e.interrupt_id == intr.interrupt_id]
            if not entries:
                self._on_event(intr)
                continue
            for e in entries:
                e.decision, e.sent = None, None
        self.conversation.version += 1

    def background(self, label: str, fn: Callable[[], str | None]) -> bool:
        """Run a command's slow part off the UI thread, holding the turn slot.

        ``fn`` returns a line for the user (or None); failures become an error notice.
        False (and a notice) when a turn or another command is under way.
        """
        if self.busy:
            self.note(f"{label} waits until the running work ends", "warning")
            return False
        self._active = True

        def work() -> None:
            try:
                line = fn()
                if line:
                    self.post(lambda: self.note(line, "context" if line.startswith("~")
                                                else "info"))
            except Exception as exc:
                msg = f"{label} failed: {type(exc).__name__}: {exc}".splitlines()[0]
                self.post(lambda: self.note(msg, "error"))
            finally:
                self.refresh_stats(background=False)
                self.post(self._finish)

        self.spawn(work)
        return True

    def _answer(self, text: str) -> None:
        """The user's answer to the first pending approval; resume when all are answered."""
        entry = self.conversation.pending_approvals()[0]
        word = text.strip().lower()
        if word in ("y", "yes", "approve") and "approve" in entry.allowed:
            decision: dict[str, Any] = {"type": "approve"}
        elif word in ("n", "no", "reject") and "reject" in entry.allowed:
            decision = {"type": "reject"}
        elif "respond" in entry.allowed:
            decision = {"type": "respond", "message": text}
        else:
            decision = {"type": "reject", "message": text}
        entry.decision = decision["type"] + (f": {text}" if "message" in decision else "")
        entry.sent = decision
        self.conversation.version += 1
        group = [e for e in self.conversation.entries
                 if isinstance(e, ApprovalEntry) and e.interrupt_id == entry.interrupt_id]
        if any(e.decision is None for e in group) or self.runner is None:
            return
        if self.conversation.pending_approvals():
            return  # other interrupts still wait; answer them all, then resume once
        pending = self.runner.pending_interrupts()
        decisions: dict[str, list[dict[str, Any]]] = {}
        for e in self.conversation.entries:
            if isinstance(e, ApprovalEntry) and e.sent is not None:
                decisions.setdefault(e.interrupt_id, []).append(e.sent)
                e.sent = None
        decisions = {k: v for k, v in decisions.items()
                     if any(p.interrupt_id == k for p in pending)}
        if not decisions:
            self.conversation.note("nothing is waiting for approval any more", "warning")
            return
        self._turn(lambda emit: self.runner.resume(decisions, emit, pending=pending))
