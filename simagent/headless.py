"""``simagent run``: one headless turn, streamed to the terminal or reported as JSON.

A thin shell over a Session and its turn runner (``agent.turn_setup``): it resolves the
model and the session, prints assistant text to stdout as it streams (tool activity goes
to stderr as one-line notes, so stdout stays the answer), and maps how the turn ended to the exit
codes of design.md §3 (a cost-ceiling trip or refusal is 5, with the command that resets
it). Display text shared with the TUI is ``simagent.presentation.notices``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from functools import partial
from typing import Any, TextIO

from simagent import exit_codes
from simagent.agent.approval import MODE_HELP
from simagent.agent.confine import prompt_line
from simagent.agent.events import (
    ContextEvent,
    Event,
    Interrupt,
    Notice,
    ReasoningDelta,
    Retrying,
    TextDelta,
    ToolFinished,
    ToolOutput,
    ToolStarted,
)
from simagent.agent.mcp_hubs import open_notices
from simagent.agent.subagents import SubagentError
from simagent.agent.turn_setup import turn_runner_for
from simagent.config import Config, ConfigError, SessionOptions
from simagent.context.provenance.engine import Provenance
from simagent.exit_codes import CliError
from simagent.kernel import KernelStartError
from simagent.kernel.connection import GONE, left_running
from simagent.models import ModelError, resolve_model
from simagent.notebooks import load
from simagent.notebooks.export import ExportError, export, target
from simagent.notebooks.load import NotebookError, first_prompt, read_notebook
from simagent.outcomes import mark, outcome_of
from simagent.presentation.footnotes import final_provenance
from simagent.presentation.notices import GUARD_NOTICES, context_line, one_line
from simagent.session import Session, SessionNotFound
from simagent.simulators import SimulatorError
from simagent.trace.redact import RedactingWriter


@dataclass
class RunOptions(SessionOptions):
    prompt: str | None = None
    json: bool = False
    decision: str | None = None  # approve | reject, for a paused turn
    reset_cost_ceiling: bool = False  # clear a tripped ceiling before the turn
    notebook: str | None = None  # --notebook PATH: the session's notebook, after the turn


class StreamPrinter:
    """Renders events for a terminal: answer on ``out``, activity on ``err``.

    Each of the model's messages is a paragraph: text that follows other activity (a tool
    call between two messages) starts after a blank line, and the open line ends before
    the activity is printed, as the TUI gives each message its own entry."""

    def __init__(self, out: TextIO, err: TextIO, *, stream_text: bool) -> None:
        # activity lines quote tool arguments and results: stderr is often kept in a log
        self.out, self.err, self.stream_text = out, RedactingWriter(err), stream_text
        self.wrote_text = False
        self.line_open = False  # the answer's last line has no newline yet
        self._between = False  # activity came after the last text: a new message's next
        self._muted: set[str] = set()  # notice prefixes a context line already covered

    def end_line(self) -> None:
        """End the answer's open line (before activity, and at the end of the turn)."""
        if self.line_open:
            self.out.write("\n")
            self.out.flush()
            self.line_open = False

    def __call__(self, event: Event) -> None:
        if isinstance(event, TextDelta) and event.agent == "main" and self.stream_text:
            if self._between and self.wrote_text:
                self.out.write("\n")  # a blank line between two messages
            self._between = False
            self.out.write(event.text)
            self.out.flush()
            self.wrote_text = True
            self.line_open = not event.text.endswith("\n")
            return
        if not isinstance(event, TextDelta | ReasoningDelta):
            self.end_line()
            self._between = True
        if isinstance(event, ToolStarted):
            who = "" if event.agent == "main" else f"[{event.agent}] "
            print(f"· {who}{event.name}: {one_line(event.args)}", file=self.err, flush=True)
        elif isinstance(event, ToolOutput) and event.kind == "human":
            print(f"  ↳ {event.text}", file=self.err, flush=True)
        elif isinstance(event, ToolFinished):  # the mark says how it ended (outcomes.py)
            outcome = event.outcome or outcome_of(event.status)
            m = mark(outcome)
            last = event.content.strip().splitlines()[-1] if event.content.strip() else ""
            why = f": {last[:120]}" if outcome != "ok" and last else ""
            word = "" if outcome == "ok" else f" {m.word}"
            print(f"  {m.glyph} {event.name}{word} ({event.elapsed_s:.1f}s){why}",
                  file=self.err, flush=True)
        elif isinstance(event, Interrupt):
            for req in event.action_requests:
                args = req.get("args") or {}
                if req.get("name") == "run_python":  # the whole cell --approve would run
                    cell = "".join(f"\n    {ln}" for ln in str(args.get("code", "")).splitlines())
                    print(f"⏸ waiting for approval: run_python, this cell:{cell}",
                          file=self.err, flush=True)
                    continue
                print(f"⏸ waiting for approval: {req.get('name')} {one_line(args)}",
                      file=self.err, flush=True)
                if note := prompt_line(req):  # the real file and why it waits
                    print(f"    {note}", file=self.err, flush=True)
        elif isinstance(event, ContextEvent):
            if line := context_line(event):
                print(line, file=self.err, flush=True)
            if event.kind in GUARD_NOTICES:
                self._muted.add(GUARD_NOTICES[event.kind])
        elif isinstance(event, Notice) and not any(event.text.startswith(p)
                                                   for p in self._muted):
            print(f"! {event.text}", file=self.err, flush=True)
        elif isinstance(event, Retrying):  # one note per retry; stdout is left alone
            lost = (f"; the {event.discarded} chars streamed above are superseded"
                    if event.discarded and event.agent == "main" and self.wrote_text else "")
            print(f"! {event.reason} — retry {event.retry}/{event.max_retries} in "
                  f"{event.delay_s:.1f}s{lost}", file=self.err, flush=True)


def run_headless(opts: RunOptions, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    if opts.reset_cost_ceiling and not opts.resuming:
        raise CliError("--reset-cost-ceiling clears the ceiling of an existing session: add "
                       "--resume ID or --continue", exit_codes.USAGE)
    notebook = read_start_notebook(opts)  # before anything exists: a bad file changes nothing
    export_to = notebook_target(opts)  # likewise an unwritable --notebook PATH
    resolved, session = open_session(opts, notebook, err)
    if session.config.ignored_line:  # first: it explains whatever follows
        print(session.config.ignored_line, file=err, flush=True)

    started = False  # a new session whose turn never started is discarded, not kept
    report: dict[str, Any] | None = None  # run --json's object, once the exit code is known
    try:
        if notebook is not None and (held := load.withheld(session, notebook, err)):
            if opts.json:  # none of its cells ran, nor did the turn
                print(exit_codes.json_error(held, exit_codes.APPROVAL), file=out)
            return exit_codes.APPROVAL
        try:  # before the kernel starts: a bad subagent file or model fails fast
            runner = turn_runner_for(session, resolved, front_end="headless")
        except SubagentError as exc:
            raise CliError(str(exc), exc.code) from exc
        print(approval_line(opts, session), file=err, flush=True)  # what will wait
        for line in open_notices(session):  # servers that could not start: said at open
            print(f"! {line}", file=err, flush=True)
        try:
            session.start_kernel()
        except KernelStartError as exc:
            raise CliError(str(exc).splitlines()[0], exit_codes.KERNEL) from exc
        account = run_start_notebook(session, notebook, err, runner.agent.window) \
            if notebook else None
        printer = StreamPrinter(out, err, stream_text=not opts.json)
        if opts.reset_cost_ceiling and runner.reset_cost_ceiling():
            print("simagent: cost ceiling reset; the configured limits still apply", file=err)
        if opts.decision:
            pending = runner.pending_interrupts()
            if not pending:
                raise CliError("nothing is waiting for approval in this session",
                               exit_codes.USAGE)
            decisions = {p.interrupt_id: [{"type": opts.decision}
                                          for _ in p.action_requests] for p in pending}
            started = True
            result = runner.resume(decisions, printer, pending=pending)
        else:
            started = True
            result = runner.run(first_prompt(account, opts.prompt or ""), printer)
        show_answer(opts, session, printer, result, out, err)
        numbers = answer_numbers(session, result)
        if numbers is not None and numbers.claims:
            print(f"simagent: numbers: {numbers.summary()}", file=err)
        if export_to is not None:
            write_notebook(session, export_to, err)
        code = exit_code(session, result, err)
        report = json_report(session, result, code, numbers) if opts.json else None
        return code
    finally:
        if started:
            session.close()
            if (kernel_file := session.kernel.status().connection_file) is not None:
                how = left_running(kernel_file, f"simagent run --resume {session.id}",
                                   ' "..."')  # the TUI's words, run's command
                print(f"simagent: {how}", file=err)
        else:
            session.discard()
        # after the close: a close that raised leaves main's one error object instead
        if report is not None:
            print(json.dumps(report), file=out)


def open_session(opts: RunOptions, notebook: Any, err: TextIO = sys.stderr) -> tuple[Any, Any]:
    """(the resolved model, the new or resumed session) ``opts`` ask for; every problem
    a one-line ``CliError`` before any session exists. A model slow to build (a local
    server loading) says each step on ``err`` as it starts, as the TUI does."""
    try:
        config = Config.load(opts.workspace, trust=opts.trust_workspace)
        spec, _where = config.model_spec(opts.model)
        if not spec:  # the CLI checked this already; run_headless's other callers too
            raise CliError(config.missing_model_line(), exit_codes.USAGE)
        resolved = resolve_model(spec, model_config=config.model_settings,
                                 settings_at=partial(config.where, "model"),
                                 progress=lambda line: print(f"simagent: {line}", file=err,
                                                             flush=True))
        resolved.prepare_workspace(opts.workspace)
        session = Session.open(opts, model=resolved.id, config=config,
                               default_simulator=resolved.default_simulator or
                               (notebook.simulator if notebook else None))
    except ModelError as exc:
        raise CliError(str(exc), exc.code) from exc
    except (ConfigError, SimulatorError, SessionNotFound) as exc:
        raise CliError(str(exc), exit_codes.USAGE) from exc
    return resolved, session


def approval_line(opts: RunOptions, session: Any) -> str:
    """The approval mode in force, where it came from and what it gates: a script's log
    then says why a call ran unasked or waited."""
    where = ("--approval" if opts.approval else "the resumed session" if opts.resuming
             else session.config.approval_source()[1])
    return f"simagent: approval {session.approval} ({where}): {MODE_HELP[session.approval]}"


def show_answer(opts: RunOptions, session: Any, printer: StreamPrinter, result: Any,
                out: TextIO, err: TextIO) -> None:
    """The turn's answer on stdout (unless it streamed) and the session id on stderr;
    with ``--json`` nothing here: the report (``json_report``) is printed once the exit
    code is known."""
    if opts.json:
        return
    if printer.wrote_text:
        printer.end_line()
    elif result.final and result.status != "error":
        out.write(result.final + "\n")
    print(f"[session {session.id}]", file=err)


def answer_numbers(session: Any, result: Any) -> Provenance | None:
    """Where each number of the turn's final answer came from (``final_provenance``, as
    ACP's ``_meta`` reads it): traced against the session's raw outputs, code, tool results
    and the person's messages from before it; ``None`` without a final answer."""
    return final_provenance(session.trace.events(), result)


def json_report(session: Any, result: Any, code: int,
                numbers: Provenance | None = None) -> dict[str, Any]:
    """``run --json``'s object for a turn that ran, with the exit status the process
    leaves with (an error before the turn is ``cli._fail``'s ``{"error", "exit_code"}``).
    ``numbers``: each number the answer claims, ``{text, value, status, source}``."""
    return {
        "session_id": session.id, "status": result.status, "final": result.final,
        "tool_calls": result.tool_calls,
        "usage": {"input_tokens": result.usage.input_tokens,
                  "output_tokens": result.usage.output_tokens,
                  "cache_read": result.usage.cache_read},
        "trace_path": str(session.paths.trace), "state_dir": str(session.paths.root),
        "error": result.error, "cost_ceiling": result.cost_ceiling,
        "recovery": result.recovery, "exit_code": code,
        "numbers": [] if numbers is None else numbers.as_json()}


def exit_code(session: Any, result: Any, err: TextIO) -> int:
    """How the turn ended as an exit code (design.md §3), with the line that says what
    to run next."""
    kernel = session.kernel.status() if session.kernel_consent_needed is not None else None
    if kernel is not None and kernel.gone:
        print(f"simagent: {GONE.format(where=kernel.where)}; start a kernel "
              f"(jupyter kernel, or JupyterLab), then continue with 'simagent run "
              f"--resume {session.id} --kernel latest' (or its connection file)",
              file=err)
        return exit_codes.KERNEL_CONSENT
    if kernel is not None:  # the ladder stopped and asks
        why = session.kernel_consent_needed.get("reason") or "it stopped answering"
        print(f"simagent: {kernel.where} needs a restart that only its owner may "
              f"allow ({why}); simagent left it running, variables untouched: stop that "
              f"cell where it runs (if interrupts do not, restart the kernel there or end "
              f"its process), then continue with 'simagent run --resume {session.id} "
              f"--kernel {kernel.connection_file or session.kernel_existing}'",
              file=err)
        return exit_codes.KERNEL_CONSENT
    if result.status == "paused":
        print(f"simagent: turn paused for approval; continue with 'simagent run --resume "
              f"{session.id} --approve' (or --reject)", file=err)
        return exit_codes.APPROVAL
    if result.cost_ceiling is not None:
        what = (result.error or "").removeprefix("cost ceiling reached: ")
        print(f"simagent: cost ceiling reached: {what}; resume with 'simagent run --resume "
              f"{session.id} --reset-cost-ceiling PROMPT'", file=err)
        return exit_codes.COST_CEILING
    if result.status == "error":
        print(f"simagent: error: {result.error}", file=err)
        return exit_codes.PROVIDER if result.provider_error else exit_codes.FAILED
    if result.status == "cancelled":
        return exit_codes.CANCELLED
    return exit_codes.OK


def notebook_target(opts: RunOptions) -> Any:
    """Where ``--notebook`` writes (None without it); a path that cannot be written is a
    one-line usage error before any session exists."""
    if not opts.notebook:
        return None

    try:
        return target(opts.notebook, opts.workspace, "session")
    except ExportError as exc:
        raise CliError(str(exc), exit_codes.USAGE) from exc


def write_notebook(session: Any, path: Any, err: TextIO) -> None:
    """Write the session's notebook after the turn; a session with nothing to export
    says so on stderr and keeps the turn's exit code."""
    try:
        _, _, message = export(session.paths.root, path, session.workspace)
    except ExportError as exc:
        message = f"simagent: notebook not written: {exc}"
    print(message, file=err)


def read_start_notebook(opts: SessionOptions) -> Any:
    """The validated ``--from-notebook`` file (None without one); a bad one is a
    one-line usage error before any session or kernel exists."""
    if opts.from_notebook is None:
        return None

    try:
        return read_notebook(opts.from_notebook)
    except NotebookError as exc:
        raise CliError(str(exc), exit_codes.USAGE) from exc


def run_start_notebook(session: Any, notebook: Any, err: TextIO, window: int | None) -> str:
    """Run the notebook's cells with progress on ``err``; the model's account of it.

    A failing cell (exit 7) or ctrl+C (130) ends the run before any model call, and the
    caller discards the new session: nothing half-made is left to ``--continue``.
    """
    print(f"simagent: running {notebook.path.name} ({len(notebook.code_cells)} code cells; "
          "ctrl+C stops)", file=err, flush=True)
    with load.sigint_stops(session):
        outcome = load.run_cells(session, notebook, lambda cell: print(
            load.progress_line(cell), file=err, flush=True))
    session.cancel_requested.clear()
    if outcome.status == "interrupted":
        raise CliError(outcome.summary() + "; no turn was run", exit_codes.CANCELLED)
    if not outcome.ok:
        raise CliError(outcome.summary() + "; no turn was run", exit_codes.NOTEBOOK)
    return load.build_account(session, notebook, outcome, window)
