"""The TUI's engine room: session, model, turns and approvals, without any UI code.

The prompt_toolkit app only forwards keystrokes here and draws ``conversation`` and
``snapshot()``. Turns run on a worker thread (``TurnRunner`` is synchronous); every
change to the conversation is handed to ``post`` so it happens on the UI's thread
(tests pass a ``post`` that calls at once and ``wait()`` for the worker). Nothing here
raises into the UI: model, kernel and session problems become notices, and the session
stays usable (``/model`` fixes a missing or broken model without leaving).

Its parts: start-up, input and commands here; running turns and routing their events
(``turn_driving``); what the status bar shows (``status_feed``).
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from simagent.agent.mcp_hubs import open_notices
from simagent.cli_input import unwritable
from simagent.config import Config, ConfigError, SessionOptions
from simagent.kernel import KernelStartError
from simagent.models import ModelError, resolve_model
from simagent.session import Session, SessionNotFound
from simagent.simulators import SimulatorError
from simagent.tui import commands, slash
from simagent.tui.entries import Conversation, NoticeEntry, PanelEntry, UserEntry
from simagent.tui.history import history_entries, history_footnotes
from simagent.tui.model_choice import NO_MODEL_HELP, model_error_line, resumed_model
from simagent.tui.status_feed import FirstToken, StatusFeed
from simagent.tui.turn_driving import TurnDriving

Post = Callable[[Callable[[], None]], None]


def _on_terminal(line: str) -> None:
    print(f"simagent: {line}", file=sys.stderr, flush=True)


class TuiController(StatusFeed, TurnDriving):
    def __init__(self, opts: SessionOptions, post: Post | None = None,
                 invalidate: Callable[[], None] | None = None) -> None:
        self.opts = opts
        self.post: Post = post or (lambda fn: fn())
        self.invalidate = invalidate or (lambda: None)
        self.conversation = Conversation()
        self.previews: dict[tuple[str, int], str] = {}
        self.session: Any = None
        self.config: Any = None
        self.resolved: Any = None
        self.runner: Any = None
        self.stats: Any = None
        self.draft = ""  # text to pre-fill the input with (a replay demo's prompt)
        self.held = ""  # a message typed before any model was chosen (see submit)
        self.notebook: Any = None  # --from-notebook, validated; its cells run at start
        self.preface: str | None = None  # its account, sent with the first prompt
        self.width = 80  # the terminal's columns, kept current by the app (for panels)
        self.quit_requested = False
        self._threads: list[threading.Thread] = []
        self._kernel_ready = threading.Event()
        self._active = False  # a turn or a background command is under way
        self._finishing = False  # the turn's reply is in; stats and approvals catch up
        self._early_cancel = threading.Event()
        self._closed = False
        self._retry: tuple[Any, float] | None = None  # (Retrying, monotonic deadline)
        self.first_token = FirstToken()  # the status bar's first-token latency
        self._confirm: Callable[[], None] | None = None  # what "y" runs (see ask)
        self._decline: Callable[[], None] | None = None  # and what any other answer runs
        self._reply: Callable[[str], None] | None = None  # takes the next line (await_answer)

    # ------------------------------------------------------------ lifecycle
    def open(self) -> bool:
        """Open the session (new or resumed); False when it cannot open at all."""
        from simagent.notebooks.load import NotebookError, read_notebook  # heavy: langchain

        try:  # the notebook first: a bad file leaves no session behind
            if self.opts.from_notebook is not None:
                self.notebook = read_notebook(self.opts.from_notebook)
            self.config = Config.load(self.opts.workspace, trust=self.opts.trust_workspace)
            spec, _where = self.config.model_spec(self.opts.model)
            if self.opts.resuming and not self.opts.model:  # the conversation's own model
                spec = resumed_model(self.opts) or spec
            # before the first paint, a slow model (a local server loading) says what it
            # does on the terminal itself; later (/model) the screen is the app's
            said = _on_terminal if sys.stderr.isatty() else None
            model_error = self._resolve(spec, progress=said) if spec else None
            self.session = Session.open(  # a replay workflow brings its simulator
                self.opts, model=self.model_id, config=self.config,
                default_simulator=(self.resolved.default_simulator if self.resolved else None)
                or (self.notebook.simulator if self.notebook else None))
        except (ConfigError, SimulatorError, SessionNotFound, NotebookError) as exc:
            self.conversation.note(f"cannot open the session: {exc}", "error")
            return False
        except Exception as exc:  # a broken state folder, an unreadable fixture...
            line = unwritable(exc, self.opts.workspace) if isinstance(exc, OSError) else None
            self.conversation.note(f"cannot open the session: {line or type(exc).__name__}"
                                   f"{'' if line else f': {exc}'}".splitlines()[0], "error")
            return False
        self._welcome()
        if self.config.ignored_line:
            self.conversation.note(self.config.ignored_line.removeprefix("simagent: "),
                                   "warning")
        if self.session.resume_info is not None:
            events = self.session.trace.events()
            shown = history_entries(events)
            for entry in shown:
                self.conversation.add(entry)
            self._footnote_history(events, shown)
            self.conversation.note(
                f"resumed session {self.session.id}; " + (
                    f"attached to the running kernel {self.session.kernel_existing}, "
                    "variables as they are there" if self.session.kernel_existing else
                    "the kernel started fresh, so earlier variables are gone"), "warning")
        if model_error:
            self.conversation.note(model_error, "error")
        if self.resolved is None:
            self.conversation.add(PanelEntry("", NO_MODEL_HELP))
        else:
            self._build_runner()
        self._start_kernel()
        self.refresh_stats(background=False)
        return True

    def _footnote_history(self, events: list[Any], shown: list[Any]) -> None:
        """The resumed answers' footnotes, traced off the UI thread (reading a session's
        raw outputs may take seconds) and set on them when ready."""
        def work() -> None:
            try:
                found = history_footnotes(events, shown)
            except Exception:  # the history stands as it was shown, without footnotes
                return

            def apply() -> None:
                for entry, footnoted, lines in found:
                    entry.footnoted, entry.lines = footnoted, lines
                self.conversation.version += 1
            self.post(apply)
            self.post(self.invalidate)

        self.spawn(work)

    def _ask_kernel_restart(self, recovery: dict) -> None:
        """An attached kernel (the person's) stopped answering and the recovery ladder
        stopped after its interrupt steps: ask before restarting it (turn's thread)."""
        def restart() -> None:
            if self.background("restart", lambda: self.session.restart_attached_kernel()
                               .message()):
                self.note("restarting the attached kernel…", "warning")

        kernel = self.session.kernel
        why = recovery.get("reason") or "it stopped answering"
        now = kernel.status()
        self.post(lambda: self.ask(f"{now.where}: {why}. Restart it? {now.on_restart}",
                                   restart, lambda: self.note(kernel.status().left_alone)))

    def _welcome(self) -> None:
        sim = self.session.simulator
        where = f"{sim.display_name} · " if sim else ""
        self.conversation.add(PanelEntry(
            "", f"simagent · {where}workspace {self.session.workspace}\n"
                "/help lists commands · ctrl+O expands tool output · ctrl+C interrupts"))

    def _resolve(self, spec: str, progress: Callable[[str], None] | None = None) -> str | None:
        """Resolve ``spec`` into ``self.resolved``; a one-line error, or None when fine."""
        try:
            resolved = resolve_model(spec, model_config=self.config.model_settings,
                                     settings_at=partial(self.config.where, "model"),
                                     progress=progress)
        except ModelError as exc:
            return model_error_line(spec, exc)
        self.resolved = resolved
        resolved.prepare_workspace(self.opts.workspace)
        if resolved.workflow is not None:  # a replay demo: its prompt, ready to send
            self.draft = resolved.workflow.prompt.strip()
        return None

    def _build_runner(self) -> str | None:
        from simagent.agent.subagents import SubagentError  # langchain: after the first paint
        from simagent.agent.turn_setup import agent_for, turn_runner_for  # likewise

        try:
            if self.runner is not None:  # /model: the same runner drives the new graph
                self.runner.switch_agent(agent_for(self.session, self.resolved))
                return None
            self.runner = turn_runner_for(self.session, self.resolved)
        except (SubagentError, ValueError) as exc:
            self.conversation.note(f"cannot build the agent: {exc}", "error")
            return str(exc)
        for line in open_notices(self.session):  # MCP servers that could not start
            self.conversation.note(line, "warning")
        self._load_pending()
        return None

    def _load_pending(self) -> None:
        """Approvals still waiting from an earlier process (a resumed, paused session)."""
        for intr in self.runner.pending_interrupts():
            self._on_event(intr)

    def _start_kernel(self) -> None:
        session = self.session
        self._kernel_ready.clear()
        session.on_kernel_consent = self._ask_kernel_restart

        def start() -> None:
            try:
                session.start_kernel()
                if line := session.kernel.status().attached_line:  # the person's kernel
                    self.post(lambda: self.conversation.note(line, "info"))
                if run_notebook:
                    self._run_notebook()
            except Exception as exc:  # KernelStartError, or a session closed under it
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                msg = first if isinstance(exc, KernelStartError) else \
                    f"{type(exc).__name__}: {first}"
                self.post(lambda: self.conversation.note(f"kernel could not start: {msg}",
                                                         "error"))
            finally:
                self._kernel_ready.set()
                self.post(self.invalidate)

        # the session that started from the notebook, once (not a /clear's successor)
        run_notebook = self.notebook is not None and self.preface is None and \
            session.notebook[0] is not None
        if run_notebook:
            self._active = True  # ctrl+C stops the cells; a prompt waits for them
        self.spawn(start)

    def _run_notebook(self) -> None:
        """Run the starting notebook's cells (on the kernel thread), progress in one
        notice; the account waits in ``preface`` for the first prompt. A failing cell or
        ctrl+C stops the run and keeps the kernel's state: the session goes on.

        Where kernel code waits (``approval.notebook_waits``: ``ask``) the cells are
        shown first and wait for one decision: all, cell by cell (each cell's source,
        then run, skip or stop), or none (the account then says none ran)."""
        from simagent.agent.approval import notebook_waits  # langchain: --from-notebook only
        from simagent.notebooks import load  # heavy (langchain): --from-notebook only

        nb = self.notebook
        plan = "all"
        if notebook_waits(self.session.approval):
            self.post(lambda: self.panel(f"{nb.path.name}: its code cells",
                                         load.cells_listing(nb)))
            plan = self.await_answer(load.plan_question(nb), load.PLAN_CHOICES) or "none"
        shown = [NoticeEntry(f"running {nb.path.name} "
                             f"({len(nb.code_cells)} code cells; ctrl+C stops)")]
        if plan != "none":
            self.post(lambda: self.conversation.add(shown[0]))

        def show(cell: Any) -> None:
            fresh = NoticeEntry(load.status_line(cell))

            def apply() -> None:  # a new entry in its place: the renderer caches notices
                entries = self.conversation.entries
                entries[entries.index(shown[0])] = fresh
                shown[0] = fresh
                self.conversation.version += 1

            self.post(apply)
            self.post(self.invalidate)

        def decide(cell: Any) -> str:  # cell by cell: its source, then the person's word
            self.post(lambda: self.panel(cell.label, cell.source))
            answer = self.await_answer(load.cell_question(cell), load.CELL_CHOICES)
            shown[0] = NoticeEntry(load.progress_line(cell))  # progress goes on below
            self.post(lambda entry=shown[0]: self.conversation.add(entry))
            return answer or "stop"

        try:
            outcome = load.none_run(nb) if plan == "none" else load.run_cells(
                self.session, nb, show, decide if plan == "each" else None)
            self.session.cancel_requested.clear()
            self._early_cancel.clear()
            window = self.runner.agent.window if self.runner is not None else None
            self.preface = load.build_account(self.session, self.notebook, outcome, window)
            level = "info" if outcome.ok else "warning" if \
                outcome.status == "interrupted" else "error"
            self.post(lambda: self.note(outcome.summary(), level))
        finally:
            self.post(self._finish)

    def await_answer(self, question: str, choices: dict[str, str]) -> str | None:
        """The person's answer to ``question`` among ``choices`` (``load.choice``): a
        worker thread waits while the UI thread takes the next line typed; a line that is
        none of them asks again. None once ctrl+C or closing ends the wait."""
        from simagent.notebooks.load import choice  # heavy (langchain), as in open

        answers: queue.Queue[str] = queue.Queue()

        def ask() -> None:
            self._reply = answers.put
            self.note(question, "warning")
            self.invalidate()

        self.post(ask)
        while not (self.session.cancel_requested.is_set() or self._closed):
            try:
                text = answers.get(timeout=0.1)
            except queue.Empty:
                continue
            if (picked := choice(text, choices)) is not None:
                return picked
            self.post(ask)
        self.post(lambda: setattr(self, "_reply", None))
        return None

    def close(self) -> None:
        """Stop the turn, give workers a few seconds, close the session (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.cancel_turn()

        deadline = time.monotonic() + 8
        for t in list(self._threads):
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        if self.session is not None:
            self.session.close_unused()

    # --------------------------------------------------------------- threads
    def spawn(self, fn: Callable[[], None]) -> threading.Thread:
        thread = threading.Thread(target=fn, daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()
        return thread

    def wait(self, timeout: float = 60.0) -> None:
        """Join worker threads (tests; the UI never blocks on them)."""
        for t in list(self._threads):
            t.join(timeout=timeout)

    # ------------------------------------------------------------- state
    @property
    def busy(self) -> bool:
        return self._active or (self.runner is not None and self.runner.busy)

    @property
    def cancelling(self) -> bool:
        """A cancel of the running turn was asked for and it has not ended yet."""
        return self.busy and self._early_cancel.is_set()

    def cancel_turn(self, *, force: bool = False) -> bool:
        """Stop the turn (thread-safe): the running cell is interrupted (a cell that
        ignores that is stopped by a kernel restart; the turn's closing notice says so).

        A turn still waiting for the kernel to finish starting never runs; the
        simulator's warm-up it interrupts runs again before the next cell. ``force`` (the
        user's second ctrl+C) abandons the turn without waiting (``TurnRunner.cancel``).
        """
        if not self.busy or self._finishing:
            return False  # nothing left to interrupt: ctrl+C means what it does when idle
        self._early_cancel.set()
        if self.runner is not None and self.runner.busy:
            self.runner.cancel(force=force)
        elif self.session is not None:
            self.session.cancel_requested.set()
            self.session.interrupt_kernel()
            if self.runner is not None:  # the turn may be starting right now
                self.spawn(self._cancel_once_started)
        return True

    def _cancel_once_started(self, limit_s: float = 5.0) -> None:
        """A cancel that lands as the runner starts (it clears old cancels) is passed on
        once it runs; a silent model would otherwise hold it until its first event."""

        deadline = time.monotonic() + limit_s
        while self._active and time.monotonic() < deadline:
            runner = self.runner
            if runner is not None and runner.busy:
                runner.cancel()
                return
            time.sleep(0.02)

    @property
    def model_id(self) -> str | None:
        return self.resolved.id if self.resolved is not None else None

    # ------------------------------------------------------------- input
    def submit(self, text: str) -> bool:
        """Everything the user sends: a command, an approval answer, or a prompt.

        True when it was taken (the input line may be cleared); False when it was
        refused with a notice, so the user's text stays where it was typed.
        """
        text = text.strip()
        if not text:
            return False
        if text.startswith("/") and not text.startswith("//"):
            spec, arg = commands.parse(text)
            if spec is None:
                self.note(commands.suggestion(text), "warning")
                return False
            if self.busy and not spec.while_busy:
                self.note(f"{spec.name} waits until the turn ends (ctrl+C interrupts it)",
                          "warning")
                return False
            try:
                getattr(slash, spec.handler)(self, arg)
            except Exception as exc:  # a command failing must never take the UI down
                self.note(f"{spec.name} failed: {type(exc).__name__}: {exc}".splitlines()[0],
                          "error")
            return True
        if self._reply is not None:  # a question with choices (await_answer) takes it
            reply, self._reply = self._reply, None
            reply(text)
            return True
        if self._confirm is not None:  # a command's y/n question (ask) takes the answer
            on_yes, self._confirm = self._confirm, None
            on_no, self._decline = self._decline, None
            if text.lower() in ("y", "yes"):
                on_yes()
            elif on_no is not None:
                on_no()
            else:
                self.note("not run", "info")
            return True
        if text.startswith("//"):
            text = text[1:]  # "//x" sends "/x" as a prompt
        if self.busy:
            self.note("a turn is running; wait for it or press ctrl+C", "warning")
            return False
        if self.conversation.pending_approvals():
            self._answer(text)
            return True
        if self.runner is None:  # keep the words, free the input line for /model
            self.held = text
            self.note("no model yet, so this was not sent: choose one with /model "
                      "provider:model and your message comes back to the input line "
                      "(/help lists commands)", "warning")
            return True
        from simagent.notebooks.load import first_prompt  # heavy (langchain), as in open

        self.conversation.add(UserEntry(text))
        prompt, self.preface = first_prompt(self.preface, text), ""  # the account goes once
        self._turn(lambda emit: self.runner.run(prompt, emit))
        return True

    # ---------------------------------------------------- command helpers
    def ask(self, question: str, on_yes: Callable[[], None],
            on_no: Callable[[], None] | None = None) -> None:
        """Show ``question`` and run ``on_yes`` if the next line typed is y/yes (any other
        line declines: ``on_no``, or "not run"; a slash command in between leaves the
        question open)."""
        self._confirm = on_yes
        self._decline = on_no
        self.note(f"{question} (y/n)", "warning")

    def panel(self, title: str, text: str) -> None:
        self.conversation.add(PanelEntry(title, text))

    def note(self, text: str, level: str = "info") -> None:
        self.conversation.note(text, level)

    def switch_model(self, spec: str) -> bool:
        previous = self.resolved
        if error := self._resolve(spec):
            self.note(error, "error")
            return False
        if self.session is None:
            return False
        if self._build_runner() is not None:
            self.resolved = previous
            return False
        if self.held and not self.draft:  # the message refused for want of a model
            self.draft, self.held = self.held, ""
        self.refresh_stats()
        return True

    def set_approval(self, mode: str) -> bool:
        """Switch the approval mode; the old one stays in force if the agent cannot be
        rebuilt (the status bar must never claim a stricter mode than the one enforced)."""
        old = self.session.approval
        self.session.approval = mode
        if self.resolved is not None and self._build_runner() is not None:
            self.session.approval = old
            return False
        return True

    @property
    def kernel_ready(self) -> bool:
        return self._kernel_ready.is_set()

    def new_conversation(self) -> bool:
        """A new session (new thread) that keeps the running kernel and its state."""
        old = self.session
        kernel = old.detach_kernel()
        try:
            new = Session.create(old.workspace, simulator=old.simulator.name
                                 if old.simulator else None, approval=old.approval,
                                 model=self.model_id, config=old.config, kernel=kernel,
                                 continued_from=old.id)
        except Exception as exc:
            old.adopt_kernel(kernel)
            self.note(f"cannot start a new conversation: {type(exc).__name__}: {exc}"
                      .splitlines()[0], "error")
            return False
        old.close("clear")
        self.session = new
        self.runner = None
        self.conversation = Conversation()
        self.previews.clear()
        self._welcome()
        if self.resolved is not None:
            self._build_runner()
        if kernel is None:  # it had died or never started: start a fresh one
            self._start_kernel()
        self.refresh_stats(background=False)
        return True
