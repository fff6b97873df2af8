"""What every command module of the CLI shares: the parser class that fails in one line,
the session options, progress lines and the workspace check. Standard library only, so that
``simagent --help`` stays fast."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from simagent import exit_codes
from simagent.exit_codes import CliError


class UsageError(CliError):
    """What argparse refused, said by the command it was given to (``simagent run``)."""

    def __init__(self, message: str, prog: str) -> None:
        super().__init__(f"{message} (see '{prog} --help')", exit_codes.USAGE)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one clear line, not a usage dump
        raise UsageError(message, self.prog)


def progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def session_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="M", help="provider:model, openai-compatible:MODEL@URL, "
                   "local:PATH.gguf or local:PACKAGE, scripted:PATH or replay:WORKFLOW_ID "
                   "(default: $SIMAGENT_MODEL, then config)")
    p.add_argument("--sim", metavar="S", help="simulator for a new session")
    p.add_argument("--kernel", metavar="EXISTING", help="attach to a running Jupyter kernel: "
                   "a connection file, a kernel id or 'latest' (default: config [kernel] "
                   "existing, else simagent starts its own; README: Attaching to a kernel)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--resume", metavar="ID", help="continue session ID (a prefix is enough)")
    group.add_argument("--continue", dest="continue_last", action="store_true",
                       help="continue the last session of this workspace")
    group.add_argument("--from-notebook", metavar="PATH",
                       help="start a new session from a notebook: its code cells run in the "
                            "kernel first, the model gets a short account of what they left "
                            "(README: Starting from a notebook)")
    p.add_argument("--notebook-writable", action="store_true",
                   help="let the agent's file tools change the --from-notebook file "
                        "(read-only to them by default)")
    from simagent.config import APPROVAL_MODES, DEFAULT_APPROVAL  # light: stdlib + paths

    p.add_argument("--approval", choices=APPROVAL_MODES,
                   help=f"which tools wait for approval (default: config, else "
                        f"{DEFAULT_APPROVAL}; README: Approval and confinement)")
    p.add_argument("--workspace", default=".", help="workspace folder (default: .)")
    trust_option(p)


def trust_option(p: argparse.ArgumentParser) -> None:
    """``--trust-workspace``: every command that reads a workspace's config takes it."""
    p.add_argument("--trust-workspace", action="store_true",
                   help="trust this folder's .simagent/config.toml as it is now (recorded; "
                        "until then it is ignored: it can set approval, run MCP server "
                        "commands and send a key; 'simagent trust' shows what it would do)")


def existing_workspace(path: str) -> Path:
    workspace = Path(path).expanduser().resolve()
    if not workspace.is_dir():
        what = "does not exist" if not workspace.exists() else "is not a folder"
        raise CliError(f"workspace {workspace} {what}: pass --workspace DIR, an existing "
                       "folder")
    return workspace


def writable_target(path: str) -> Path:
    """A file a command will write (``-o``, ``--notebook``): its folder must exist, and it
    must not be a folder. Checked before the work, so a typo costs no rendering."""
    target = Path(path).expanduser().resolve()
    if target.is_dir():
        raise CliError(f"{target} is a folder: give a file name in it")
    if not target.parent.is_dir():
        raise CliError(f"cannot write {target}: folder {target.parent} does not exist")
    return target


