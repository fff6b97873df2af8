"""The ``simagent`` command line (design.md §3).

Start-up must stay fast: this module imports only the standard library. Each command's
handler imports what it needs when it runs, and a test proves ``simagent --help`` never
loads deepagents, langchain or matplotlib.
"""


import argparse
import sys
from collections.abc import Callable, Sequence

from simagent import __version__, exit_codes
from simagent.cli import (
    acp_command,
    bench_commands,
    mcp_command,
    notebook_command,
    plugin_command,
    session_commands,
    workspace_commands,
)
from simagent.cli.arguments import refuse_dropped, share_top_options
from simagent.cli.bench_commands import parse_windows
from simagent.cli.common import Parser, session_options
from simagent.exit_codes import CliError

__all__ = ["CliError", "build_parser", "entry", "main", "parse_windows"]

# Each command module adds its own subparsers; a new command is a new module in this list.
COMMAND_MODULES = (session_commands, workspace_commands, bench_commands, mcp_command,
                   acp_command, notebook_command, plugin_command)


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
    share_top_options(parser)  # `simagent --model M run x` keeps M
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every way it can fail is one stderr line and an exit code, and,
    with ``--json``, one JSON object ``{"error", "exit_code"}`` on stdout as well, so a
    script always has something to parse."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # before parsing succeeds, --json is known only from the words given
    wants_json = "--json" in argv[:argv.index("--")] if "--" in argv else "--json" in argv
    parser = build_parser()
    args: argparse.Namespace | None = None
    try:
        args = parser.parse_args(argv)
        wants_json = bool(getattr(args, "json", False))
        refuse_dropped(parser, args)
        handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
        if handler is None:
            parser.print_help()
            return exit_codes.OK
        from simagent.cli_input import undecodable_argument

        if (line := undecodable_argument(vars(args))) is not None:
            raise CliError(line)
        return handler(args)
    except CliError as exc:
        return _fail(f"{getattr(exc, 'prog', 'simagent')}: error: {exc}", exc.code,
                     wants_json)
    except KeyboardInterrupt:
        return _fail("simagent: interrupted", exit_codes.CANCELLED, wants_json)
    except OSError as exc:
        from simagent.cli_input import unwritable

        line = unwritable(exc, getattr(args, "workspace", None))
        if line is None:
            return _internal(exc, wants_json)
        return _fail(f"simagent: error: {line}", exit_codes.USAGE, wants_json)
    except Exception as exc:
        return _internal(exc, wants_json)


def _fail(line: str, code: int, as_json: bool) -> int:
    """Say why the command failed: the line on stderr, and a JSON object on stdout."""
    print(line, file=sys.stderr)
    if as_json:
        print(exit_codes.json_error(line.split(": ", 2)[-1] if ": error: " in line else line,
                                    code))
    return code


def _internal(exc: Exception, as_json: bool = False) -> int:
    """An unexpected error: one line, not a traceback; SIMAGENT_DEBUG shows it."""
    import os

    if os.environ.get("SIMAGENT_DEBUG"):
        raise exc
    first = (str(exc).splitlines() or [""])[0]
    return _fail(f"simagent: internal error: {type(exc).__name__}: {first} "
                 "(set SIMAGENT_DEBUG=1 for the traceback)", exit_codes.FAILED, as_json)


def entry() -> None:
    """The ``simagent`` command: ``main``, then an exit that does not wait for a model
    call the user abandoned with ctrl+C (``simagent.turns.exit_process``).

    Before anything loads, ``rfc3987_syntax`` is marked absent: when it is installed (the
    jsonschema extras jupyter_server asks for), jsonschema, under the MCP SDK, builds its
    IRI grammar at import, 1.3 s of CPU at every start, for a format check simagent never
    makes. No person's code runs in this process (kernels are processes of their own)."""
    sys.modules.setdefault("rfc3987_syntax", None)
    code = main()
    if "simagent.turns" in sys.modules:
        from simagent.turns import exit_process

        exit_process(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
