"""``simagent bench ...``: the benchmark commands (design.md §9). Each handler imports the
bench only when it runs."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from simagent import exit_codes
from simagent.cli.common import Parser, progress
from simagent.exit_codes import CliError


def cmd_bench_kernel(args: argparse.Namespace) -> int:
    from simagent.bench.kernel_bench import format_table, run_kernel_bench
    from simagent.kernel import KernelStartError

    try:
        results, detail = run_kernel_bench(progress=None if args.json else progress)
    except KernelStartError as exc:
        raise CliError(str(exc).splitlines()[0], exit_codes.KERNEL) from exc
    if args.json:
        import json

        print(json.dumps(results, indent=2))
    else:
        print(format_table(results, detail))
    return exit_codes.OK


def cmd_bench_cli(args: argparse.Namespace) -> int:
    from simagent.bench.cli_bench import as_json, format_table, run_cli_bench

    if args.runs < 1:
        raise CliError("--runs must be at least 1")
    rows = run_cli_bench(args.runs, progress=None if args.json else progress)
    if args.json:
        import json

        print(json.dumps(as_json(rows), indent=2))
    else:
        print(format_table(rows))
    return exit_codes.OK if all(r.ok for r in rows) else exit_codes.FAILED


def cmd_bench_faults(args: argparse.Namespace) -> int:
    from simagent.bench import fault_cases
    from simagent.bench.fault_bench import as_json, format_table, run_faults

    cases = _selected(fault_cases, args)
    rows = run_faults(cases, fast=args.fast, progress=None if args.json else progress)
    if args.json:
        import json

        print(json.dumps(as_json(rows), indent=2))
    else:
        print(format_table(rows))
    return exit_codes.OK if all(r.survived for r in rows) else exit_codes.FAILED


def cmd_bench_attacks(args: argparse.Namespace) -> int:
    from pathlib import Path

    from simagent.bench import attack_cases
    from simagent.bench.attack_bench import as_json, failed, format_table, run_attacks, write_out
    from simagent.bench.workflow_runs import git_commit

    if args.readme and (args.only or args.fast):
        raise CliError("--readme renders the whole bench's table: leave out --only and --fast")
    if args.readme and not Path(args.readme).is_file():
        raise CliError(f"--readme {args.readme}: no such file")
    cases = _selected(attack_cases, args)
    rows = run_attacks(cases, progress=None if args.json else progress)
    commit = git_commit(mark_dirty=True)
    if args.json:
        import json

        print(json.dumps(as_json(rows, commit), indent=2))
    else:
        print(format_table(rows))
    if args.out:
        data, table = write_out(rows, Path(args.out), commit)
        print(f"wrote {data} and {table}", file=sys.stderr)
    if args.readme:
        from simagent.bench.attack_bench import readme_table, splice_readme

        readme = Path(args.readme)
        try:
            readme.write_text(splice_readme(readme.read_text(encoding="utf-8"),
                                            readme_table(as_json(rows, commit))),
                              encoding="utf-8")
        except ValueError as exc:
            raise CliError(f"{readme}: {exc}") from exc
        print(f"updated the security table in {readme}", file=sys.stderr)
    return exit_codes.FAILED if failed(rows) else exit_codes.OK


def _selected(catalogue: Any, args: argparse.Namespace) -> list[Any]:
    """The cases ``--only`` and ``--fast`` pick from a catalogue module (its ``select``)."""
    try:
        return catalogue.select(args.only.split(",") if args.only else None, fast=args.fast)
    except ValueError as exc:
        raise CliError(str(exc)) from exc


def cmd_bench_ensemble(args: argparse.Namespace) -> int:
    from simagent.bench.ensemble_bench import format_table, run_ensemble_bench
    from simagent.kernel import KernelStartError

    if (args.cases is not None and args.cases < 1) or args.seconds <= 0 or \
            (args.workers is not None and args.workers < 1) or args.rounds < 1:
        raise CliError("--cases, --workers and --rounds must be at least 1 and --seconds "
                       "positive")
    try:
        results = run_ensemble_bench(cases=args.cases, seconds=args.seconds,
                                     workers=args.workers, rounds=args.rounds,
                                     progress=None if args.json else progress)
    except KernelStartError as exc:
        raise CliError(str(exc).splitlines()[0], exit_codes.KERNEL) from exc
    if args.json:
        import json

        print(json.dumps(results, indent=2))
    else:
        print(format_table(results))
    return exit_codes.OK


def cmd_bench_counting(args: argparse.Namespace) -> int:
    from simagent.bench.counting_bench import format_table, run_counting_bench
    from simagent.bench.workflow import WorkflowError

    try:
        result = run_counting_bench(args.workflow, args.policy,
                                    progress=None if args.json else progress)
    except (WorkflowError, ValueError) as exc:
        raise CliError(str(exc)) from exc
    if args.json:
        import json

        print(json.dumps(result, indent=2))
    else:
        print(format_table(result))
    return exit_codes.OK


def cmd_bench_tool_schemas(args: argparse.Namespace) -> int:
    from simagent.bench.tool_schema_bench import format_table, run_tool_schema_bench

    try:
        result = run_tool_schema_bench(args.server)
    except FileNotFoundError as exc:
        raise CliError(str(exc)) from exc
    if args.json:
        import json

        print(json.dumps(result, indent=2))
    else:
        print(format_table(result))
    return exit_codes.OK if result["verdict_unchanged"] else exit_codes.FAILED


def cmd_bench_provenance(args: argparse.Namespace) -> int:
    from simagent.bench.provenance_set import report

    text = report()
    print(text)
    if args.out:
        from pathlib import Path

        Path(args.out).write_text(text + "\n", encoding="utf-8")
    return exit_codes.OK


def _add_bench_provenance(bench_sub: argparse._SubParsersAction) -> None:
    prov = bench_sub.add_parser(
        "provenance", help="the number provenance engine on its labelled set",
        description="Traces every answer of the labelled set (bench/provenance/: bench "
                    "sessions' answers, fabricated variants and hand-written traps) and "
                    "prints precision and recall per label (sourced, derived, input, "
                    "unsourced, ignored) and every miss.")
    prov.add_argument("--out", metavar="FILE", help="also write the report to FILE")
    prov.set_defaults(handler=cmd_bench_provenance)


def cmd_bench_list(args: argparse.Namespace) -> int:
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


def cmd_bench_run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from simagent.bench.policies import resolve_policies
    from simagent.bench.report import short_table, write_report
    from simagent.bench.row_pool import default_jobs
    from simagent.bench.workflow import WorkflowError, resolve_workflows
    from simagent.bench.workflow_runs import BenchPlan, run_bench

    if args.mode == "live" and not args.model:
        raise CliError("--mode live needs --model provider:model (replay needs no model)")
    if args.epochs < 1:
        raise CliError("--epochs must be at least 1")
    if args.jobs is not None and args.jobs < 1:
        raise CliError("--jobs must be at least 1")
    if args.jobs is None:
        args.jobs = default_jobs()
    try:
        plan = BenchPlan(resolve_workflows(args.workflows), resolve_policies(args.policy),
                         epochs=args.epochs, mode=args.mode, model=args.model,
                         windows=parse_windows(args.window) if args.window else None)
    except (WorkflowError, ValueError) as exc:
        raise CliError(str(exc)) from exc
    out = Path(args.out)
    if args.fresh and (out / "records.jsonl").exists():
        (out / "records.jsonl").unlink()
    from simagent.models import ModelError

    try:
        rows = run_bench(plan, out, progress=None if args.json else _bench_progress,
                         jobs=args.jobs, notebooks=True)
    except ModelError as exc:  # live: a model that cannot be resolved (finished rows kept)
        raise CliError(str(exc), exc.code) from exc
    if args.mode == "replay":  # do the workflows' sessions export to notebooks that re-run?
        from simagent.bench import notebook_rerun
        from simagent.bench.workflow_runs import git_commit

        # the rows' commit: the workers checked notebooks under it (HEAD may move meanwhile)
        notebook_rerun.run(plan.workflows, out, rows[0].get("commit") if rows else git_commit(),
                           None if args.json else _bench_progress)
    report = write_report(rows, out, mode=args.mode)
    if args.json:
        import json

        from simagent.bench.workflow_runs import summarize

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


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The ``bench`` command and its subcommands."""
    bench = sub.add_parser("bench", help="measure simagent: workflows x context policies, "
                           "kernel micro-benchmarks",
                           description="Benchmarks, measured side by side in one run.")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="BENCH", required=True,
                                     parser_class=Parser)
    for add in (_add_bench_kernel, _add_bench_cli, _add_bench_faults, _add_bench_attacks,
                _add_bench_ensemble, _add_bench_counting, _add_bench_tool_schemas,
                _add_bench_provenance, _add_bench_list, _add_bench_run):  # --help's order
        add(bench_sub)


def _add_bench_kernel(bench_sub: argparse._SubParsersAction) -> None:
    kernel = bench_sub.add_parser(
        "kernel", help="kernel round trip, capture throughput, interrupt and restart times",
        description="Round trip of 1+1 through simagent's Kernel vs bare jupyter_client "
                    "(ratio of p50s, interleaved), capture throughput and peak RSS growth "
                    "for 10 MB and 100 MB of progress-bar/log output, interrupt latency, "
                    "restart time.")
    kernel.add_argument("--json", action="store_true", help="print one JSON object")
    kernel.set_defaults(handler=cmd_bench_kernel)


def _add_bench_cli(bench_sub: argparse._SubParsersAction) -> None:
    cli = bench_sub.add_parser(
        "cli", help="how fast each usage error is answered (whole processes)",
        description="Each usage error a new user meets (an empty prompt, a missing "
                    "scripted: file, a bad --from-notebook path, a workspace that is a "
                    "file, a bad -o folder, a broken config...) as a real simagent process, "
                    "timed over several runs: min, median and max seconds, and whether the "
                    "median is under 1 s with one error line and exit 2. Exit 1 when a case "
                    "misses.")
    cli.add_argument("--runs", type=int, default=5, metavar="N", help="runs per case "
                     "(default: 5)")
    cli.add_argument("--json", action="store_true", help="print one JSON object")
    cli.set_defaults(handler=cmd_bench_cli)


def _add_bench_faults(bench_sub: argparse._SubParsersAction) -> None:
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
    _catalogue_options(faults, "fault", "the quick subset (what make test runs), smaller sizes")
    faults.set_defaults(handler=cmd_bench_faults)


def _catalogue_options(parser: argparse.ArgumentParser, noun: str, fast_help: str) -> None:
    """``--fast`` and ``--only``, which :func:`_selected` reads."""
    parser.add_argument("--fast", action="store_true", help=fast_help)
    parser.add_argument("--only", metavar="IDS", help=f"comma-separated {noun} ids")


def _add_bench_attacks(bench_sub: argparse._SubParsersAction) -> None:
    attacks = bench_sub.add_parser(
        "attacks", help="run every attack simagent holds against; one row each",
        description="Each attack run for real against the real product (the simagent CLI, "
                    "its kernel and graph, real MCP servers, a listener on 127.0.0.1, a "
                    "second uid through setpriv where the machine allows): a cloned "
                    "folder's config, a mailed notebook, paths and links out of the "
                    "workspace, a link flipped mid-write, reads of credentials, MCP tool "
                    "servers that hang, flood, crash or inject, MCP over HTTP without the "
                    "token or from a foreign Origin, another uid on the Dask cluster, "
                    "secrets in cards, outputs, logs and exports, file permissions. One row "
                    "per attack: held, broken or skipped, with what was observed. Exit 1 "
                    "when an attack was not held.")
    attacks.add_argument("--json", action="store_true", help="print one JSON object")
    _catalogue_options(attacks, "attack", "the quick subset (what make test runs)")
    attacks.add_argument("--out", metavar="DIR",
                         help="also write DIR/attacks.json and DIR/attacks.md")
    attacks.add_argument("--readme", metavar="PATH",
                         help="also render the table into PATH's security section (between "
                              "its attacks:begin and attacks:end lines); whole bench only")
    attacks.set_defaults(handler=cmd_bench_attacks)


def _add_bench_ensemble(bench_sub: argparse._SubParsersAction) -> None:
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
    bens.set_defaults(handler=cmd_bench_ensemble)


def _add_bench_counting(bench_sub: argparse._SubParsersAction) -> None:
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
    bcount.set_defaults(handler=cmd_bench_counting)


def _add_bench_tool_schemas(bench_sub: argparse._SubParsersAction) -> None:
    btools = bench_sub.add_parser(
        "tool-schemas", help="MCP tool schemas: input tokens with deferral vs all loaded",
        description="One workflow played twice through the real graph against a real MCP "
                    "server (default: the test suite's 40-tool server): every schema sent, "
                    "then deferred behind find_tools. Reports input tokens per request and "
                    "in total, and whether the verdict is unchanged (exit 1 if not).")
    btools.add_argument("--server", metavar="PATH", help="a stdio MCP server script "
                        "(default: tests/mcp_servers/forty_tools.py of a checkout)")
    btools.add_argument("--json", action="store_true", help="print one JSON object")
    btools.set_defaults(handler=cmd_bench_tool_schemas)


def _add_bench_list(bench_sub: argparse._SubParsersAction) -> None:
    blist = bench_sub.add_parser("list", help="list the bundled workflows",
                                 description="The bundled bench workflows (bench/workflows).")
    blist.add_argument("--json", action="store_true", help="print JSON")
    blist.set_defaults(handler=cmd_bench_list)


def _add_bench_run(bench_sub: argparse._SubParsersAction) -> None:
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
    brun.add_argument("--jobs", type=int, metavar="N",
                      help="replay N workflows at a time in worker processes (default: one "
                           "per core, at most 4); the records are the same for any N")
    brun.add_argument("--fresh", action="store_true", help="ignore finished rows in --out")
    brun.add_argument("--json", action="store_true", help="print one JSON summary")
    brun.set_defaults(handler=cmd_bench_run)
