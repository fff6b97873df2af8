"""The ``simagent`` command line (design.md §3).

Start-up must stay fast: this module imports only the standard library. Each command's
handler imports what it needs when it runs, and a test proves ``simagent --help`` never
loads deepagents, langchain or matplotlib.
"""


import argparse
import sys
from collections.abc import Callable, Sequence

from simagent import __version__, exit_codes, model_kinds  # noqa: F401  (kinds register)
from simagent.cli import (
    bench_commands,
    mcp_command,
    notebook_command,
    session_commands,
    workspace_commands,
)
from simagent.cli.bench_commands import parse_windows
from simagent.cli.common import Parser, session_options
from simagent.exit_codes import CliError

__all__ = ["CliError", "build_parser", "entry", "main", "parse_windows"]

# Each command module adds its own subparsers; a new command is a new module in this list.
COMMAND_MODULES = (session_commands, workspace_commands, bench_commands, mcp_command,
                   notebook_command)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="simagent",
        description="A chat assistant that runs simulations in a persistent Python kernel.",
    )
    parser.add_argument("--version", action="version", version=f"simagent {__version__}")
    session_options(parser)  # `simagent` alone opens the TUI with these
    parser.set_defaults(handler=session_commands.cmd_tui)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for module in COMMAND_MODULES:
        module.add_parsers(sub)
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
    call the user abandoned with ctrl+C (``simagent.turns.exit_process``)."""
    code = main()
    if "simagent.turns" in sys.modules:
        from simagent.turns import exit_process

        exit_process(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
