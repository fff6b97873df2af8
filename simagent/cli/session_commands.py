"""Commands that open, run or render a session: ``tui``, ``run``, ``sessions``,
``transcript``, ``context``."""

from __future__ import annotations

import argparse
import sys

from simagent import exit_codes
from simagent.cli.common import existing_workspace, session_options, writable_target
from simagent.exit_codes import CliError


def cmd_run(args: argparse.Namespace) -> int:
    from simagent.cli.run_checks import check_run

    decision = "approve" if args.approve else "reject" if args.reject else None
    workspace, prompt = check_run(args, decision)  # before the heavy import below
    attached_kernel(args)
    from simagent.headless import RunOptions, run_headless  # langchain: seconds to load

    opts = RunOptions(prompt=prompt or None, workspace=workspace, model=args.model,
                      simulator=args.sim, resume=args.resume,
                      continue_last=args.continue_last, approval=args.approval,
                      kernel=args.kernel, trust_workspace=args.trust_workspace,
                      json=args.json, decision=decision,
                      reset_cost_ceiling=args.reset_cost_ceiling, notebook=args.notebook,
                      **notebook_options(args))
    return run_headless(opts)


def cmd_tui(args: argparse.Namespace) -> int:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise CliError("the interactive UI needs a terminal; for one headless turn use "
                       "'simagent run PROMPT'")
    from simagent.cli.run_checks import check_session

    workspace = check_session(args, need_model=False)  # before the heavy imports below
    from simagent.config import SessionOptions
    from simagent.tui.app import run_tui

    attached_kernel(args)
    if not args.trust_workspace:
        ask_trust(workspace)
    return run_tui(SessionOptions(workspace=workspace, model=args.model,
                                  simulator=args.sim, resume=args.resume,
                                  continue_last=args.continue_last, approval=args.approval,
                                  kernel=args.kernel, trust_workspace=args.trust_workspace,
                                  **notebook_options(args)))


def attached_kernel(args: argparse.Namespace) -> None:
    """``--kernel`` must name a running kernel: one line and exit 6 before any session
    exists (run and the TUI alike)."""
    if not args.kernel:
        return
    from simagent.kernel.connection import check  # (start-up speed: only with --kernel)
    from simagent.kernel.port import KernelStartError

    try:
        check(args.kernel)
    except KernelStartError as exc:
        raise CliError(str(exc), exit_codes.KERNEL) from exc


def ask_trust(workspace) -> None:
    """Before the TUI takes the screen: an untrusted workspace config is shown, with what
    it would change, and the person answers once (the answer is recorded). Anything but
    yes runs without it; the TUI then says so. The exact bytes shown are the ones
    trusted, so a file changed while the question waits is not trusted by it."""
    from simagent import workspace_trust
    from simagent.paths import workspace_config_path

    content = workspace_trust.config_bytes(workspace)
    if content is None or workspace_trust.is_trusted(workspace, content):
        return
    path = workspace_config_path(workspace)
    try:
        data = workspace_trust.parse(content, path)
    except ValueError:
        return  # the session's own load reports the file, naming it
    print(f"{path} is not trusted yet. It would:")
    for change in workspace_trust.would_change(data) or ["change nothing that acts"]:
        print(f"  - {change}")
    try:
        answer = input("Trust this folder's config? [y/N] ").strip().lower()
    except (EOFError, KeyboardInterrupt):
        answer = ""
        print()
    if answer not in ("y", "yes"):
        print("running without it (simagent trust, or --trust-workspace, trusts it later)")
        return
    workspace_trust.trust(workspace, content)


def notebook_options(args: argparse.Namespace) -> dict:
    """``--from-notebook`` / ``--notebook-writable`` as SessionOptions fields."""
    from simagent.cli.run_checks import start_notebook

    return {"from_notebook": start_notebook(args), "notebook_writable": args.notebook_writable}


def cmd_sessions(args: argparse.Namespace) -> int:
    from simagent.trace.sessions import format_sessions_table, list_sessions

    infos = list_sessions(existing_workspace(args.workspace))
    if args.json:
        import dataclasses
        import json

        print(json.dumps([{k: str(v) if k == "path" else v
                           for k, v in dataclasses.asdict(i).items()} for i in infos],
                         indent=2))
    elif not infos:
        print("no sessions in this workspace yet", file=sys.stderr)
    else:
        print(format_sessions_table(infos))
    return exit_codes.OK


def cmd_transcript(args: argparse.Namespace) -> int:
    output = writable_target(args.output) if args.output and args.output != "-" else None
    from simagent.presentation.transcript import render_html, render_markdown
    from simagent.trace import TraceLog
    from simagent.trace.sessions import find_session

    try:
        session_dir = find_session(existing_workspace(args.workspace), args.session_id)
    except LookupError as exc:
        raise CliError(str(exc)) from exc
    trace = TraceLog(session_dir / "trace.sqlite", readonly=True)
    try:
        events = trace.events()
    finally:
        trace.close()
    fmt = args.format or ("html" if args.output and args.output.endswith(".html") else "md")
    text = (render_html(events, session_dir=session_dir) if fmt == "html"
            else render_markdown(events, session_dir=session_dir))
    if output is not None:
        output.write_text(text, encoding="utf-8")
        print(args.output, file=sys.stderr)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return exit_codes.OK


def cmd_context(args: argparse.Namespace) -> int:
    from simagent.config import Config, ConfigError
    from simagent.context.panel import render_context
    from simagent.context.settings import ContextConfigError, ContextSettings
    from simagent.context.stats import stats_from_trace
    from simagent.trace.sessions import find_session

    try:
        session_dir = find_session(existing_workspace(args.workspace), args.session_id)
    except LookupError as exc:
        raise CliError(str(exc)) from exc
    try:
        settings = ContextSettings.from_config(Config.load(args.workspace))  # trusted only
    except (ConfigError, ContextConfigError) as exc:
        raise CliError(str(exc).splitlines()[0]) from exc
    stats = stats_from_trace(session_dir / "trace.sqlite", settings)
    if args.json:
        import json

        print(json.dumps({"session_id": session_dir.name, **stats.as_dict()}, indent=2))
    else:
        import shutil

        width = min(100, shutil.get_terminal_size((80, 24)).columns)
        sys.stdout.write(f"Session {session_dir.name}\n" + render_context(stats, width=width))
    return exit_codes.OK


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """``tui``, ``run``, ``sessions``, ``transcript`` and ``context``."""
    tui = sub.add_parser(
        "tui", help="the interactive terminal UI (also what `simagent` alone opens)",
        description="Chat with the agent in a full-screen terminal UI: streamed answers, "
                    "collapsible tool cards (ctrl+O), a status bar with the context share, "
                    "and slash commands (/help lists them). ctrl+C interrupts a turn and "
                    "keeps the kernel's state.")
    session_options(tui)
    tui.set_defaults(handler=cmd_tui)

    run = sub.add_parser(
        "run", help="one headless turn (streams the answer to stdout)",
        description="Run one turn headless. The answer streams to stdout, tool activity to "
                    "stderr. Exit codes: 0 ok, 2 usage/config, 3 paused for approval, "
                    "4 model/provider error, 5 cost ceiling, 6 kernel could not start (or "
                    "--kernel names none running), 7 a --from-notebook cell failed, 8 an "
                    "attached kernel needs a restart "
                    "only its owner may allow.")
    run.add_argument("prompt", nargs="*", metavar="PROMPT",
                     help="what to do; '-' (or no PROMPT with piped input) reads it from "
                          "standard input, for a prompt longer than one argument may be "
                          "(128 KiB on Linux)")
    run.add_argument("--prompt-file", metavar="PATH",
                     help="read the prompt from this file (UTF-8; any length)")
    session_options(run)
    run.add_argument("--json", action="store_true",
                     help="print one JSON object {session_id, final, tool_calls, usage, "
                          "trace_path, state_dir, error, cost_ceiling}")
    run.add_argument("--notebook", metavar="PATH",
                     help="after the turn, write the session as a Jupyter notebook to PATH "
                          "(as 'simagent notebook -o PATH' does)")
    run.add_argument("--reset-cost-ceiling", action="store_true",
                     help="clear a tripped cost ceiling of the resumed session, then run the "
                          "turn (the configured limits still apply)")
    decide = run.add_mutually_exclusive_group()
    decide.add_argument("--approve", action="store_true",
                        help="approve what a paused session is waiting for, and continue")
    decide.add_argument("--reject", action="store_true",
                        help="reject what a paused session is waiting for, and continue")
    run.set_defaults(handler=cmd_run)

    sessions = sub.add_parser("sessions", help="list this workspace's sessions",
                              description="Sessions of the workspace, newest first.")
    sessions.add_argument("--workspace", default=".", help="workspace folder (default: .)")
    sessions.add_argument("--json", action="store_true", help="print JSON")
    sessions.set_defaults(handler=cmd_sessions)

    transcript = sub.add_parser(
        "transcript", help="render a session's transcript (markdown or HTML)",
        description="Render a session from its trace: messages, tool calls with code and "
                    "output, figures (embedded in HTML), attempts, approvals, token totals.")
    transcript.add_argument("session_id", nargs="?", metavar="ID",
                            help="session id or prefix (default: the last session)")
    transcript.add_argument("--format", choices=("md", "html"), help="default: md, or html "
                            "when -o ends in .html")
    transcript.add_argument("-o", "--output", help="write to this file ('-' = stdout)")
    transcript.add_argument("--workspace", default=".", help="workspace folder (default: .)")
    transcript.set_defaults(handler=cmd_transcript)

    context = sub.add_parser(
        "context", help="the /context panel of a session (window, categories, thresholds)",
        description="What a session's context holds, from its trace: usage by category, "
                    "free space, the clearing and summary thresholds, compaction history, "
                    "subagent tokens, per-model usage and cost.")
    context.add_argument("session_id", nargs="?", metavar="ID",
                         help="session id or prefix (default: the last session)")
    context.add_argument("--json", action="store_true", help="print one JSON object")
    context.add_argument("--workspace", default=".", help="workspace folder (default: .)")
    context.set_defaults(handler=cmd_context)

