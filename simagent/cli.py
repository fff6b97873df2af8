"""The ``simagent`` command line (design.md §3).

Start-up must stay fast: this module imports only the standard library. Each command's
handler imports what it needs when it runs, and a test proves ``simagent --help`` never
loads deepagents, langchain or matplotlib.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from simagent import __version__, exit_codes


class CliError(Exception):
    """A one-line error for the user, with the exit code to leave with."""

    def __init__(self, message: str, code: int = exit_codes.USAGE) -> None:
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one clear line, not a usage dump
        self.exit(exit_codes.USAGE, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _cmd_bench_kernel(args: argparse.Namespace) -> int:
    from simagent.bench.kernel_bench import format_table, run_kernel_bench
    from simagent.kernel import KernelStartError

    try:
        results, detail = run_kernel_bench(progress=None if args.json else _progress)
    except KernelStartError as exc:
        raise CliError(str(exc).splitlines()[0], exit_codes.KERNEL) from exc
    if args.json:
        import json

        print(json.dumps(results, indent=2))
    else:
        print(format_table(results, detail))
    return exit_codes.OK


def _cmd_bench_faults(args: argparse.Namespace) -> int:
    from simagent.bench import fault_cases
    from simagent.bench.fault_bench import as_json, format_table, run_faults

    try:
        cases = fault_cases.select(args.only.split(",") if args.only else None,
                                   fast=args.fast)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    rows = run_faults(cases, fast=args.fast, progress=None if args.json else _progress)
    if args.json:
        import json

        print(json.dumps(as_json(rows), indent=2))
    else:
        print(format_table(rows))
    return exit_codes.OK if all(r.survived for r in rows) else exit_codes.FAILED


def _cmd_bench_ensemble(args: argparse.Namespace) -> int:
    from simagent.bench.ensemble_bench import format_table, run_ensemble_bench
    from simagent.kernel import KernelStartError

    if (args.cases is not None and args.cases < 1) or args.seconds <= 0 or \
            (args.workers is not None and args.workers < 1) or args.rounds < 1:
        raise CliError("--cases, --workers and --rounds must be at least 1 and --seconds "
                       "positive")
    try:
        results = run_ensemble_bench(cases=args.cases, seconds=args.seconds,
                                     workers=args.workers, rounds=args.rounds,
                                     progress=None if args.json else _progress)
    except KernelStartError as exc:
        raise CliError(str(exc).splitlines()[0], exit_codes.KERNEL) from exc
    if args.json:
        import json

        print(json.dumps(results, indent=2))
    else:
        print(format_table(results))
    return exit_codes.OK


def _cmd_bench_counting(args: argparse.Namespace) -> int:
    from simagent.bench.counting_bench import format_table, run_counting_bench
    from simagent.bench.workflow import WorkflowError

    try:
        result = run_counting_bench(args.workflow, args.policy,
                                    progress=None if args.json else _progress)
    except (WorkflowError, ValueError) as exc:
        raise CliError(str(exc)) from exc
    if args.json:
        import json

        print(json.dumps(result, indent=2))
    else:
        print(format_table(result))
    return exit_codes.OK


def _cmd_bench_list(args: argparse.Namespace) -> int:
    from simagent.bench.workflow import WorkflowError, resolve_workflows

    try:
        wfs = resolve_workflows(None)
    except WorkflowError as exc:
        raise CliError(str(exc)) from exc
    rows = [{"id": w.id, "title": w.title, "simulator": w.simulator or "scipy", "long": w.long,
             "tool_calls": w.tool_steps, "probes": len(w.probes), "scorers": len(w.scorers),
             "path": str(w.path)} for w in wfs]
    if args.json:
        import json

        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print(f"{r['id']:<28} {r['simulator']:<8} {'long ' if r['long'] else '     '}"
                  f"{r['tool_calls']:>3} calls  {r['title']}")
    return exit_codes.OK


def _cmd_bench_run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from simagent.bench.policies import resolve_policies
    from simagent.bench.report import short_table, write_report
    from simagent.bench.runner import BenchPlan, run_bench
    from simagent.bench.workflow import WorkflowError, resolve_workflows

    if args.mode == "live" and not args.model:
        raise CliError("--mode live needs --model provider:model (replay needs no model)")
    if args.epochs < 1:
        raise CliError("--epochs must be at least 1")
    try:
        plan = BenchPlan(resolve_workflows(args.workflows), resolve_policies(args.policy),
                         epochs=args.epochs, mode=args.mode, model=args.model,
                         windows=parse_windows(args.window) if args.window else None)
    except (WorkflowError, ValueError) as exc:
        raise CliError(str(exc)) from exc
    out = Path(args.out)
    if args.fresh and (out / "records.jsonl").exists():
        (out / "records.jsonl").unlink()
    rows = run_bench(plan, out, progress=None if args.json else _bench_progress)
    report = write_report(rows, out, mode=args.mode)
    if args.json:
        import json

        from simagent.bench.runner import summarize

        print(json.dumps({"out": str(out), "report": str(report),
                          "records": str(out / "records.jsonl"),
                          "policies": summarize(rows), "rows": len(rows)}, indent=2))
    else:
        print("\n" + short_table(rows))
        print(f"\nreport: {report}")
    # raw at an enforced window is meant to be refused; simagent must pass everywhere
    failed = [r for r in rows if r["verdict"] != "pass" and (
        r["policy"] == "simagent" or (r["policy"] == "raw" and not r.get("enforced")))]
    return exit_codes.FAILED if failed else exit_codes.OK


def parse_windows(spec: str) -> list[int]:
    """``128k,32k,16000`` -> [128000, 32000, 16000]; a clear error for anything else."""
    out = []
    for part in (p.strip().lower() for p in spec.split(",") if p.strip()):
        try:
            value = float(part[:-1]) * 1000 if part.endswith("k") else float(part)
        except ValueError:
            raise ValueError(f"--window: {part!r} is not a number of tokens "
                             "(e.g. 128k,32k,16000)") from None
        if value <= 1000 or value != int(value):
            raise ValueError(f"--window: {part!r} must be a whole number of tokens > 1000")
        out.append(int(value))
    if not out:
        raise ValueError("--window needs at least one window, e.g. 128k,32k,16k")
    return list(dict.fromkeys(out))


def _bench_progress(message: str) -> None:
    """One redrawn line on a terminal, plain lines otherwise (logs, CI)."""
    if sys.stderr.isatty():
        sys.stderr.write(f"\r\033[K{message[:150]}")
    elif " step " not in message:  # per-step updates only redraw a terminal line
        sys.stderr.write(message + "\n")
    sys.stderr.flush()


def _cmd_run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from simagent.headless import RunOptions, run_headless

    decision = "approve" if args.approve else "reject" if args.reject else None
    from simagent.cli_input import argv_text

    prompt = argv_text(" ".join(args.prompt))
    if not prompt.strip() and decision is None:
        what = "an empty PROMPT" if args.prompt else "no PROMPT"
        raise CliError(f"run got {what}: say what to do, e.g. simagent run 'plot sin(x)' "
                       "(or --approve/--reject with --resume)")
    if decision and not (args.resume or args.continue_last):
        raise CliError("--approve/--reject continue a paused session: add --resume ID "
                       "or --continue")
    if args.reset_cost_ceiling and not (args.resume or args.continue_last):
        raise CliError("--reset-cost-ceiling clears the ceiling of an existing session: add "
                       "--resume ID or --continue")
    opts = RunOptions(prompt=prompt or None,
                      workspace=Path(args.workspace).resolve(), model=args.model,
                      simulator=args.sim, resume=args.resume,
                      continue_last=args.continue_last, approval=args.approval,
                      json=args.json, decision=decision,
                      reset_cost_ceiling=args.reset_cost_ceiling)
    return run_headless(opts)


def _cmd_tui(args: argparse.Namespace) -> int:
    from pathlib import Path

    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise CliError("the interactive UI needs a terminal; for one headless turn use "
                       "'simagent run PROMPT'")
    from simagent.config import SessionOptions
    from simagent.tui.app import run_tui

    return run_tui(SessionOptions(workspace=Path(args.workspace).resolve(), model=args.model,
                                  simulator=args.sim, resume=args.resume,
                                  continue_last=args.continue_last, approval=args.approval))


def _cmd_sessions(args: argparse.Namespace) -> int:
    from simagent.trace.sessions import format_sessions_table, list_sessions

    infos = list_sessions(args.workspace)
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


def _cmd_transcript(args: argparse.Namespace) -> int:
    from pathlib import Path

    from simagent.trace import TraceLog
    from simagent.trace.sessions import find_session
    from simagent.trace.transcript import render_html, render_markdown

    try:
        session_dir = find_session(args.workspace, args.session_id)
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
    if args.output and args.output != "-":
        Path(args.output).write_text(text, encoding="utf-8")
        print(args.output, file=sys.stderr)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return exit_codes.OK


def _cmd_context(args: argparse.Namespace) -> int:
    from simagent.config import Config, ConfigError
    from simagent.context.panel import render_context
    from simagent.context.stats import stats_from_trace
    from simagent.context.thresholds import ContextConfigError, ContextSettings
    from simagent.trace.sessions import find_session

    try:
        session_dir = find_session(args.workspace, args.session_id)
    except LookupError as exc:
        raise CliError(str(exc)) from exc
    try:
        settings = ContextSettings.from_config(Config.load(args.workspace))
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


def _cmd_init(args: argparse.Namespace) -> int:
    from simagent.config import Config, ConfigError
    from simagent.simulators import DEFAULT_SIMULATOR, SimulatorError, get_simulator
    from simagent.workspace_init import check_in_kernel, install_hint, write_workspace_config

    workspace = _existing_workspace(args.workspace)
    try:
        config = Config.load(workspace)
        sim = get_simulator(args.sim or config.simulator() or DEFAULT_SIMULATOR)
    except (ConfigError, SimulatorError) as exc:
        raise CliError(str(exc)) from exc
    if sim is None:
        raise CliError("no simulator is bundled; pass --sim NAME")
    try:
        path = write_workspace_config(workspace, sim.name, args.model)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    print(f"wrote {path} (simulator = {sim.name!r})")
    if args.no_check:
        return exit_codes.OK
    _progress(f"checking {', '.join(sim.packages) or 'nothing'} in the kernel...")
    check = check_in_kernel([sim], workspace=workspace,
                            kernel_name=config.kernel_name())[sim.name]
    if check.start_failed:
        raise CliError(check.error or "kernel could not start", exit_codes.KERNEL)
    if check.error:
        raise CliError(f"{sim.display_name}: {check.error}", exit_codes.FAILED)
    for c in check.imports:
        print(f"  {'ok  ' if c.ok else 'FAIL'} import {c.package}: {c.detail}")
    if check.warmup_ok is not None:
        print(f"  {'ok  ' if check.warmup_ok else 'FAIL'} warm-up: "
              f"{check.warmup_output.splitlines()[-1] if check.warmup_output else ''}")
    if not check.ok:
        print(f"simagent: error: {sim.display_name} is not usable in the kernel; fix: "
              f"{install_hint(sim)}", file=sys.stderr)
        return exit_codes.FAILED
    print(f"{sim.display_name} is ready. Try: simagent run "
          f"{(sim.example_prompts or ('...',))[0]!r}")
    return exit_codes.OK


def _cmd_simulators(args: argparse.Namespace) -> int:
    from simagent.simulators import SimulatorError, discover

    try:
        sims = discover()
    except SimulatorError as exc:
        raise CliError(str(exc)) from exc
    records = [s.as_dict() for s in sims.values()]
    if args.json:
        import json

        print(json.dumps(records, indent=2))
        return exit_codes.OK
    for r in records:
        mark = "installed" if r["installed"] else "missing  "
        print(f"{r['name']:<10} {mark}  {r['display_name']}  (skills: "
              f"{', '.join(r['skills']) or '-'}; subagents: {', '.join(r['subagents']) or '-'})")
    return exit_codes.OK


def _cmd_doctor(args: argparse.Namespace) -> int:

    from simagent.doctor import failed, render, run_checks

    checks = run_checks(_existing_workspace(args.workspace), in_kernel=not args.quick,
                        progress=None if args.json else _progress)
    if args.json:
        import json

        print(json.dumps([c.as_dict() for c in checks], indent=2))
    else:
        sys.stdout.write(render(checks))
    return exit_codes.FAILED if failed(checks) else exit_codes.OK


def _existing_workspace(path: str):
    from pathlib import Path

    workspace = Path(path).expanduser().resolve()
    if not workspace.is_dir():
        raise CliError(f"workspace {workspace} is not a folder")
    return workspace


def _cmd_memory(args: argparse.Namespace) -> int:
    from simagent.agent.memory import ensure_memory, list_notes, read_note, render_notes

    folder = ensure_memory(_existing_workspace(args.workspace))
    if args.note:
        try:
            path, text = read_note(folder, args.note)
        except LookupError as exc:
            raise CliError(str(exc)) from exc
        sys.stdout.write(f"{path}\n\n{text}")
    else:
        sys.stdout.write(render_notes(list_notes(folder), folder))
    return exit_codes.OK


def _progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def _session_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="M", help="provider:model, openai-compatible:MODEL@URL "
                   "or scripted:PATH (default: $SIMAGENT_MODEL, then config)")
    p.add_argument("--sim", metavar="S", help="simulator for a new session")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--resume", metavar="ID", help="continue session ID (a prefix is enough)")
    group.add_argument("--continue", dest="continue_last", action="store_true",
                       help="continue the last session of this workspace")
    from simagent.config import APPROVAL_MODES, DEFAULT_APPROVAL  # light: stdlib + paths

    p.add_argument("--approval", choices=APPROVAL_MODES,
                   help=f"which tools wait for approval (default: config, else "
                        f"{DEFAULT_APPROVAL}; README: Approval and confinement)")
    p.add_argument("--workspace", default=".", help="workspace folder (default: .)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="simagent",
        description="A chat assistant that runs simulations in a persistent Python kernel.",
    )
    parser.add_argument("--version", action="version", version=f"simagent {__version__}")
    _session_options(parser)  # `simagent` alone opens the TUI with these
    parser.set_defaults(handler=_cmd_tui)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    tui = sub.add_parser(
        "tui", help="the interactive terminal UI (also what `simagent` alone opens)",
        description="Chat with the agent in a full-screen terminal UI: streamed answers, "
                    "collapsible tool cards (ctrl+O), a status bar with the context share, "
                    "and slash commands (/help lists them). ctrl+C interrupts a turn and "
                    "keeps the kernel's state.")
    _session_options(tui)
    tui.set_defaults(handler=_cmd_tui)

    run = sub.add_parser(
        "run", help="one headless turn (streams the answer to stdout)",
        description="Run one turn headless. The answer streams to stdout, tool activity to "
                    "stderr. Exit codes: 0 ok, 2 usage/config, 3 paused for approval, "
                    "4 model/provider error, 5 cost ceiling, 6 kernel could not start.")
    run.add_argument("prompt", nargs="*", metavar="PROMPT", help="what to do")
    _session_options(run)
    run.add_argument("--json", action="store_true",
                     help="print one JSON object {session_id, final, tool_calls, usage, "
                          "trace_path, state_dir, error, cost_ceiling}")
    run.add_argument("--reset-cost-ceiling", action="store_true",
                     help="clear a tripped cost ceiling of the resumed session, then run the "
                          "turn (the configured limits still apply)")
    decide = run.add_mutually_exclusive_group()
    decide.add_argument("--approve", action="store_true",
                        help="approve what a paused session is waiting for, and continue")
    decide.add_argument("--reject", action="store_true",
                        help="reject what a paused session is waiting for, and continue")
    run.set_defaults(handler=_cmd_run)

    sessions = sub.add_parser("sessions", help="list this workspace's sessions",
                              description="Sessions of the workspace, newest first.")
    sessions.add_argument("--workspace", default=".", help="workspace folder (default: .)")
    sessions.add_argument("--json", action="store_true", help="print JSON")
    sessions.set_defaults(handler=_cmd_sessions)

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
    transcript.set_defaults(handler=_cmd_transcript)

    context = sub.add_parser(
        "context", help="the /context panel of a session (window, categories, thresholds)",
        description="What a session's context holds, from its trace: usage by category, "
                    "free space, the clearing and summary thresholds, compaction history, "
                    "subagent tokens, per-model usage and cost.")
    context.add_argument("session_id", nargs="?", metavar="ID",
                         help="session id or prefix (default: the last session)")
    context.add_argument("--json", action="store_true", help="print one JSON object")
    context.add_argument("--workspace", default=".", help="workspace folder (default: .)")
    context.set_defaults(handler=_cmd_context)

    init = sub.add_parser(
        "init", help="set up this workspace for a simulator and check it imports",
        description="Write .simagent/config.toml in the workspace (simulator, optionally the "
                    "model; other settings are kept) and check, in a real kernel, that the "
                    "simulator's packages import and its warm-up runs.")
    init.add_argument("--sim", metavar="S", help="simulator name (default: the workspace's, "
                      "else scipy; see 'simagent simulators')")
    init.add_argument("--model", metavar="M", help="also set the workspace's model")
    init.add_argument("--no-check", action="store_true", help="write the config only")
    init.add_argument("--workspace", default=".", help="workspace folder (default: .)")
    init.set_defaults(handler=_cmd_init)

    sims = sub.add_parser("simulators", help="list simulators (bundled and plug-ins)",
                          description="Every simulator simagent knows: bundled folders and "
                                      "the simagent.simulators entry points, with whether "
                                      "its packages are installed.")
    sims.add_argument("--json", action="store_true", help="print JSON")
    sims.set_defaults(handler=_cmd_simulators)

    doctor = sub.add_parser("doctor", help="check the environment, with a fix per problem",
                            description="Check Python, the state folder, the kernel, the "
                                        "model, every simulator (imports in a real kernel) "
                                        "and tmux; each problem gets a one-line fix. Exit 1 "
                                        "when a required check fails.")
    doctor.add_argument("--quick", action="store_true",
                        help="find simulator packages without importing them in a kernel")
    doctor.add_argument("--json", action="store_true", help="print JSON")
    doctor.add_argument("--workspace", default=".", help="workspace folder (default: .)")
    doctor.set_defaults(handler=_cmd_doctor)

    memory = sub.add_parser("memory", help="list the workspace's memory notes or show one",
                            description="The workspace memory: the MEMORY.md index (what the "
                                        "agent sees each turn) or one note in full.")
    memory.add_argument("note", nargs="?", help="a note's file name, slug or title prefix")
    memory.add_argument("--workspace", default=".", help="workspace folder (default: .)")
    memory.set_defaults(handler=_cmd_memory)

    bench = sub.add_parser("bench", help="measure simagent: workflows x context policies, "
                           "kernel micro-benchmarks",
                           description="Benchmarks, measured side by side in one run.")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="BENCH", required=True,
                                     parser_class=_Parser)
    kernel = bench_sub.add_parser(
        "kernel", help="kernel round trip, capture throughput, interrupt and restart times",
        description="Round trip of 1+1 through simagent's Kernel vs bare jupyter_client "
                    "(ratio of p50s, interleaved), capture throughput and peak RSS growth "
                    "for 10 MB and 100 MB of progress-bar/log output, interrupt latency, "
                    "restart time.")
    kernel.add_argument("--json", action="store_true", help="print one JSON object")
    kernel.set_defaults(handler=_cmd_bench_kernel)

    faults = bench_sub.add_parser(
        "faults", help="run every fault simagent survives; one row each",
        description="Kernel deaths (os._exit, segfault, OOM kill, SIGINT ignored, frozen, "
                    "forks, 1 GiB without a newline), provider faults over real HTTP "
                    "(429, 5xx, resets, timeouts, cut streams, bad tool JSON, empty "
                    "replies), the REPL watchdog and data faults (SIGKILL, full disk, "
                    "secrets), each against the real graph and kernel. One row per fault: "
                    "survived, state restored, seconds to recover, bytes lost. Exit 1 when "
                    "a fault was not survived.")
    faults.add_argument("--json", action="store_true", help="print JSON rows")
    faults.add_argument("--fast", action="store_true",
                        help="the quick subset (what make test runs), smaller sizes")
    faults.add_argument("--only", metavar="IDS", help="comma-separated fault ids")
    faults.set_defaults(handler=_cmd_bench_faults)

    bens = bench_sub.add_parser(
        "ensemble", help="parameter sweeps on Dask: speed-up over a serial loop",
        description="The same CPU-bound cases (~--seconds each) run as a serial loop and "
                    "through ensemble() on the kernel's Dask LocalCluster, alternating "
                    "for --rounds rounds in one run. "
                    "Reports speedup (serial wall / ensemble wall), overhead_s per case "
                    "((ensemble wall x workers - sum of case times) / cases) and the "
                    "cluster start time (paid once per session, not in the ensemble wall).")
    bens.add_argument("--json", action="store_true", help="print one JSON object")
    bens.add_argument("--cases", type=int, metavar="N",
                      help="number of cases (default: 4 per worker)")
    bens.add_argument("--seconds", type=float, default=1.0, metavar="S",
                      help="CPU time of one case (default: 1.0)")
    bens.add_argument("--workers", type=int, metavar="W",
                      help="local cluster workers (default: one per core)")
    bens.add_argument("--rounds", type=int, default=2, metavar="R",
                      help="serial/ensemble pairs, interleaved and summed (default: 2)")
    bens.set_defaults(handler=_cmd_bench_ensemble)

    bcount = bench_sub.add_parser(
        "counting", help="counting cost per model call: chars/4 vs the real tokenizer",
        description="Replays one workflow (default: the one with the most raw tokens) "
                    "through the real graph, keeps every request, and times one "
                    "measurement per request with chars/4 (the old ruler) and with the "
                    "o200k tokenizer, cold and warm cache, in one run (median ms); also "
                    "reports the real/approx token ratio on those requests.")
    bcount.add_argument("workflow", nargs="?", metavar="WF",
                        help="a bundled workflow id (default: scipy-stiff-kinetics)")
    bcount.add_argument("--policy", default="simagent", metavar="P",
                        help="the policy the requests come from (default: simagent)")
    bcount.add_argument("--json", action="store_true", help="print one JSON object")
    bcount.set_defaults(handler=_cmd_bench_counting)

    blist = bench_sub.add_parser("list", help="list the bundled workflows",
                                 description="The bundled bench workflows (bench/workflows).")
    blist.add_argument("--json", action="store_true", help="print JSON")
    blist.set_defaults(handler=_cmd_bench_list)

    brun = bench_sub.add_parser(
        "run", help="run workflows under context policies and score tokens and recall",
        description="Run bench workflows under each context policy. Replay mode executes a "
                    "workflow's kernel steps once, then replays its scripted trajectory "
                    "through the real graph per policy (no key needed); live mode runs a "
                    "real model. Writes records.jsonl, report.md and PNG plots to --out; an "
                    "interrupted run resumes without redoing finished rows. Exit 1 when a "
                    "simagent run fails its scorers, or a raw run at a window that is not "
                    "enforced.")
    brun.add_argument("workflows", nargs="*", metavar="WF",
                      help="bundled workflow ids or workflow files (default: all bundled)")
    brun.add_argument("--mode", choices=("replay", "live"), default="replay")
    brun.add_argument("--policy", default="all", metavar="P,...",
                      help="policies: raw, simagent, stock, sliding-window, "
                           "compress-tool-results, truncate, or all (default); a policy "
                           "may change [context] settings, e.g. "
                           "'simagent[clear_fraction=0.3;tool_cap_chars=4000]'")
    brun.add_argument("--model", metavar="M", help="the model for --mode live")
    brun.add_argument("--epochs", type=int, default=1, help="runs per workflow and policy")
    brun.add_argument("--window", metavar="N,...",
                      help="replay at each of these context windows (tokens; 128k, 32k, "
                           "16000), the model refusing longer requests like a provider; "
                           "default: a workflow's `windows`, else its declared window, "
                           "not enforced")
    brun.add_argument("--out", default="bench-out", help="output folder (default: bench-out)")
    brun.add_argument("--fresh", action="store_true", help="ignore finished rows in --out")
    brun.add_argument("--json", action="store_true", help="print one JSON summary")
    brun.set_defaults(handler=_cmd_bench_run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return exit_codes.OK
    try:
        from simagent.cli_input import undecodable_argument

        if (line := undecodable_argument(vars(args))) is not None:
            raise CliError(line)
        return handler(args)
    except CliError as exc:
        print(f"simagent: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("simagent: interrupted", file=sys.stderr)
        return exit_codes.CANCELLED
    except OSError as exc:
        from simagent.cli_input import unwritable

        if (line := unwritable(exc, getattr(args, "workspace", None))) is None:
            return _internal(exc)
        print(f"simagent: error: {line}", file=sys.stderr)
        return exit_codes.USAGE
    except Exception as exc:
        return _internal(exc)


def _internal(exc: Exception) -> int:
    """An unexpected error: one line, not a traceback; SIMAGENT_DEBUG shows it."""
    import os

    if os.environ.get("SIMAGENT_DEBUG"):
        raise exc
    first = (str(exc).splitlines() or [""])[0]
    print(f"simagent: internal error: {type(exc).__name__}: {first} "
          "(set SIMAGENT_DEBUG=1 for the traceback)", file=sys.stderr)
    return exit_codes.FAILED


def entry() -> None:
    """The ``simagent`` command: ``main``, then an exit that does not wait for a model
    call the user abandoned with ctrl+C (``simagent.agent.turns.exit_process``)."""
    code = main()
    if "simagent.agent.turns" in sys.modules:
        from simagent.agent.turns import exit_process

        exit_process(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
