"""What the TUI's status bar shows, fed from the controller: the snapshot, the context
statistics (read off the trace in the background), a provider retry's countdown and the
model's first-token latency (:class:`FirstToken`).

A provider retry (``Retrying``) shows as a countdown: a ticker thread redraws the bar
until the wait is over, and text the failed attempt streamed is taken back out of the
transcript (the retry streams the reply anew). A mixin of ``TuiController``.
"""

from __future__ import annotations

import time
from typing import Any

from simagent.agent.events import ReasoningDelta, TextDelta, ToolFinished, ToolRequested
from simagent.tui.entries import AssistantEntry
from simagent.tui.status import StatusSnapshot

#: How often a provider retry's countdown, or the wait for a first token, redraws the bar
#: (under a second, so the whole seconds it shows never skip one).
RETRY_TICK_S = 0.25


class FirstToken:
    """How long the main model takes to say anything, per call (monotonic seconds).

    The model is asked when a turn starts and again when a tool's result goes back to
    it (``ToolFinished``); its first token is its first text, reasoning or tool call.
    Pure state: the caller passes the clock."""

    def __init__(self) -> None:
        self.asked_at: float | None = None
        self.latency_s: float | None = None

    def ask(self, now: float, *, new_turn: bool = False) -> None:
        self.asked_at = now
        if new_turn:
            self.latency_s = None

    def see(self, event: Any, now: float) -> None:
        if getattr(event, "agent", None) != "main":
            return
        if isinstance(event, TextDelta | ReasoningDelta | ToolRequested):
            if self.asked_at is not None:
                self.latency_s = now - self.asked_at
                self.asked_at = None
        elif isinstance(event, ToolFinished):
            self.asked_at = now

    def stop(self) -> None:
        """The turn ended (answered, cancelled, failed): nothing is waited for."""
        self.asked_at = None

    def waiting_s(self, now: float) -> float | None:
        return None if self.asked_at is None else now - self.asked_at


class StatusFeed:
    """The status bar's data (see the module docstring)."""

    def snapshot(self) -> StatusSnapshot:
        from simagent.context.panel import status_label  # heavy (langchain): not at first paint

        s = self.session
        label, level = status_label(self.stats) if self.stats is not None else ("ctx –", "dim")
        return StatusSnapshot(
            simulator=s.simulator.name if s and s.simulator else None, model=self.model_id,
            session_id=s.id if s else "no session", approval=s.approval if s else "?",
            kernel=s.kernel_state if s else "stopped",
            cost_usd=self.stats.cost_usd if self.stats is not None else 0.0,
            ctx_label=label, ctx_level=level, busy=self.busy, retry=self.retry_label(),
            waiting_s=self.first_token.waiting_s(time.monotonic()),
            first_token_s=self.first_token.latency_s)

    def model_asked(self, *, new_turn: bool = False) -> None:
        """The model was asked (UI thread): count the wait on the bar until it answers."""
        self.first_token.ask(time.monotonic(), new_turn=new_turn)
        asked = self.first_token.asked_at

        def tick() -> None:
            while self.first_token.asked_at == asked and self.busy and not self._closed:
                self.post(self.invalidate)
                time.sleep(RETRY_TICK_S)

        self.spawn(tick)

    def model_event(self, event: Any) -> None:
        """A turn's event (UI thread): the first token, or a tool result going back."""
        was = self.first_token.asked_at
        self.first_token.see(event, time.monotonic())
        if self.first_token.asked_at is not None and self.first_token.asked_at != was:
            self.model_asked()

    def retry_label(self, now: float | None = None) -> str | None:
        """The waiting retry's countdown (``provider 503 — retry 2/5 in 3s``), or None."""
        state = self._retry
        if state is None or not self.busy:
            return None
        event, deadline = state
        return event.label(deadline - (time.monotonic() if now is None else now))

    def _retrying(self, event: Any) -> None:
        """Start the countdown for ``event`` and take back the failed attempt's text."""
        state = (event, time.monotonic() + event.delay_s)
        self._retry = state
        entries = self.conversation.entries
        last = entries[-1] if entries else None
        if (event.discarded and event.agent == "main" and isinstance(last, AssistantEntry)
                and last.agent == "main"):
            last.text = last.text[: max(0, len(last.text) - event.discarded)]
            if not last.text:
                entries.remove(last)
            self.conversation.version += 1

        def tick() -> None:
            while self._retry is state and not self._closed:
                self.post(self.invalidate)
                if time.monotonic() > state[1]:
                    return  # "now": the retry is under way; its next event clears this
                time.sleep(RETRY_TICK_S)

        self.spawn(tick)

    def context_stats(self) -> Any:
        from simagent.context.stats import stats_from_trace  # heavy (langchain), as above

        s = self.session
        window = self.runner.agent.window if self.runner is not None else None
        return stats_from_trace(s.paths.trace, s.context_settings, model_id=self.model_id,
                                window=window)

    def refresh_stats(self, background: bool = True) -> None:
        def work() -> None:
            try:
                stats = self.context_stats()
            except Exception:  # a half-written trace must not break the status bar
                return

            def apply() -> None:
                self.stats = stats

            self.post(apply)
            self.post(self.invalidate)

        if self.session is None:
            return
        if background:
            self.spawn(work)
        else:
            work()
