"""What argparse leaves unchecked: options given before the command, and empty values.

``simagent --model M run x``: argparse copies every value of a subcommand's namespace,
defaults included, over the top-level one, so an option given before the command was
silently replaced by the command's default. :func:`share_top_options` makes a command's
copy of a top-level option default to "not given" (``SUPPRESS``), so a value before the
command is honoured and one after it wins; :func:`refuse_dropped` refuses, in one line, a
top-level option the chosen command does not take. Standard library only (start-up speed).
"""

from __future__ import annotations

import argparse

from simagent.exit_codes import CliError

#: The options at most one of which a session takes (a mutually exclusive group in each
#: parser; given on both sides of the command, argparse cannot see them together).
ONE_OF = ("resume", "continue_last", "from_notebook")


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    return [p for a in parser._actions if isinstance(a, argparse._SubParsersAction)
            for p in dict.fromkeys(a.choices.values())]


def share_top_options(parser: argparse.ArgumentParser) -> None:
    """Let every command (at any depth) keep a top-level option's value unless it is given
    again after the command; each command records which options it takes."""
    top = {d: a.default for d, a in _options(parser).items() if d != "version"}
    parser.set_defaults(command_takes=frozenset(top), command_prog=parser.prog)
    pending = _subparsers(parser)
    while pending:
        sub = pending.pop()
        options = _options(sub)
        for dest, action in options.items():
            if dest in top and action.default == top[dest]:  # another default would win
                action.default = argparse.SUPPRESS
        sub.set_defaults(command_takes=frozenset(options), command_prog=sub.prog)
        pending.extend(_subparsers(sub))


def refuse_dropped(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """One line for a top-level option the command does not take, for two of ``ONE_OF``
    given on either side of it, and for an option given an empty value."""
    options = _options(parser)
    prog = getattr(args, "command_prog", parser.prog)
    takes = getattr(args, "command_takes", frozenset())
    for dest, action in options.items():
        if dest == "version":
            continue
        value = getattr(args, dest, action.default)
        if dest not in takes and value != action.default:
            raise CliError(f"{action.option_strings[-1]} is not an option of '{prog}': "
                           f"leave it out ('{prog} --help' lists its options)")
        if isinstance(value, str) and not value.strip():
            raise CliError(f"{action.option_strings[-1]} got an empty value"
                           + (": leave it out to let simagent start its own kernel"
                              if dest == "kernel" else ""))
    given = [options[d].option_strings[-1] for d in ONE_OF if d in options
             and getattr(args, d, None)]
    if len(given) > 1:
        raise CliError(f"{' and '.join(given)} do not go together: give one of them")
