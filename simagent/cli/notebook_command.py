"""``simagent notebook``: write a session as a Jupyter notebook (simagent.notebooks)."""

from __future__ import annotations

import argparse
import sys

from simagent import exit_codes
from simagent.exit_codes import CliError


def cmd_notebook(args: argparse.Namespace) -> int:
    from simagent.cli.common import existing_workspace, writable_target

    workspace = existing_workspace(args.workspace)
    if args.output:
        writable_target(args.output)  # before nbformat loads
    from simagent.notebooks.export import ExportError, export
    from simagent.trace.sessions import find_session

    try:
        session_dir = find_session(workspace, args.session_id)
        _, _, message = export(session_dir, args.output, workspace, all_cells=args.all,
                               earlier=not args.no_earlier)
    except (LookupError, ExportError) as exc:
        raise CliError(str(exc)) from exc
    print(message, file=sys.stderr)
    return exit_codes.OK


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """``notebook``."""
    nb = sub.add_parser(
        "notebook", help="write a session as a Jupyter notebook that re-runs",
        description="Write a session as an nbformat 4 notebook: your requests, answers, "
                    "subagent reports and task records as markdown; the code cells that "
                    "define the kernel's state (the cells a restart would replay), in "
                    "order, with their real outputs and figures. Run top to bottom in a "
                    "fresh kernel it rebuilds the session's state; cells that may not "
                    "re-run by themselves are named in the notebook and in the message.")
    nb.add_argument("session_id", nargs="?", metavar="ID",
                    help="session id or prefix (default: the last session)")
    nb.add_argument("-o", "--output", metavar="PATH",
                    help="the notebook file (default: <session id>.ipynb in the workspace)")
    nb.add_argument("--all", action="store_true",
                    help="also write failed and display-only cells, tagged simagent-failed "
                         "/ simagent-display and skip-execution (nbclient skips them)")
    nb.add_argument("--no-earlier", action="store_true",
                    help="leave out cells that ran before a /reset (default: shown under a "
                         "heading of their own, not re-run)")
    nb.add_argument("--workspace", default=".", help="workspace folder (default: .)")
    nb.set_defaults(handler=cmd_notebook)
