"""The ``simagent`` command line (design.md §3).

Start-up must stay fast: this module imports only the standard library. Each command's
handler imports what it needs when it runs, and a test proves ``simagent --help`` never
loads deepagents, langchain or matplotlib.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from simagent import __version__

# Exit codes (design.md §3); one home, read by every command.
EXIT_OK = 0
EXIT_USAGE = 2
EXIT_APPROVAL = 3
EXIT_PROVIDER = 4
EXIT_COST_CEILING = 5
EXIT_KERNEL = 6


class CliError(Exception):
    """A one-line error for the user, with the exit code to leave with."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one clear line, not a usage dump
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _cmd_bench_kernel(args: argparse.Namespace) -> int:
    from simagent.bench.kernel_bench import format_table, run_kernel_bench
    from simagent.kernel import KernelStartError

    try:
        results, detail = run_kernel_bench(progress=None if args.json else _progress)
    except KernelStartError as exc:
        raise CliError(str(exc).splitlines()[0], EXIT_KERNEL) from exc
    if args.json:
        import json

        print(json.dumps(results, indent=2))
    else:
        print(format_table(results, detail))
    return EXIT_OK


def _progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="simagent",
        description="A chat assistant that runs simulations in a persistent Python kernel.",
    )
    parser.add_argument("--version", action="version", version=f"simagent {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    bench = sub.add_parser("bench", help="measure simagent (kernel micro-benchmarks)",
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_OK
    try:
        return handler(args)
    except CliError as exc:
        print(f"simagent: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("simagent: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
