"""``simagent acp``: simagent as an Agent Client Protocol agent on stdin/stdout, for an
editor (Zed, JetBrains, Neovim), JupyterLab's chat (jupyter-ai 3) or ``acpx``."""

from __future__ import annotations

import argparse
import os
import stat
import sys

from simagent import exit_codes
from simagent.cli.common import trust_option
from simagent.exit_codes import CliError

EPILOG = """\
A client starts this command itself and speaks ACP (JSON-RPC 2.0, one message a line) on
its stdin and stdout; stdout carries nothing else (notes and logs go to stderr). Each ACP
session is one simagent session: session/new's cwd is the workspace (its
.simagent/config.toml names the model unless --model does), and the ACP session id is the
simagent session id (simagent sessions lists it), so session/load resumes it after a
restart of this command, its history sent again as updates.

Zed (settings.json):
  {"agent_servers": {"simagent": {"type": "custom",
                                  "command": "<venv>/bin/simagent", "args": ["acp"]}}}
acpx:   acpx --agent '<venv>/bin/simagent acp' exec "..."

Kernel: the _meta key "simagent.kernel" on session/new or session/prompt names a running
kernel to attach to (a connection file, a kernel id or 'latest', as --kernel takes);
without one, simagent starts its own kernel at the first prompt and says so once.
Modes: ask, workspace, auto (the approval modes). Slash commands are advertised.
A second prompt while one runs in the same session is refused with a JSON-RPC error
(-32600); send session/cancel to stop the running one (the cell is interrupted, the
kernel's state kept). When stdin closes, running turns are cancelled, sessions saved,
simagent's own kernels stopped (attached ones run on) and the command exits 0.
"""


def cmd_acp(args: argparse.Namespace) -> int:
    try:
        mode = os.fstat(sys.stdout.fileno()).st_mode
    except (OSError, ValueError):
        mode = 0
    if stat.S_ISREG(mode) or mode == 0:
        raise CliError("simagent acp speaks ACP on stdout: run it from an ACP client, whose "
                       "pipe is its stdout, not with stdout redirected to a file",
                       exit_codes.USAGE)
    if sys.stdin.isatty():  # a person ran it by hand: say what it waits for
        print("simagent acp: serving ACP on stdin/stdout for a client that starts this "
              "command itself (simagent acp --help); ctrl+C stops it", file=sys.stderr,
              flush=True)
    # the SDK and the agent stack load only now: `simagent --help` stays fast
    from simagent.acp.agent import AcpOptions
    from simagent.acp.server import serve

    return serve(AcpOptions(model=args.model, approval=args.approval, kernel=args.kernel,
                            trust_workspace=args.trust_workspace))


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """``acp``."""
    from simagent.config import APPROVAL_MODES, DEFAULT_APPROVAL

    p = sub.add_parser(
        "acp", help="serve simagent to an ACP client (Zed, JupyterLab chat, acpx)",
        description="Serve simagent as an Agent Client Protocol agent over stdio: the same "
                    "graph, context layers, trace and approval as simagent run, driven by "
                    "the client's prompts.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", metavar="M", help="the model of every session (default: "
                   "$SIMAGENT_MODEL, then the workspace's config)")
    p.add_argument("--approval", choices=APPROVAL_MODES,
                   help=f"the starting mode (default: config, else {DEFAULT_APPROVAL}); the "
                        "client may switch modes per session")
    p.add_argument("--kernel", metavar="EXISTING", help="attach every session to this "
                   "running kernel (a connection file, a kernel id or 'latest'), unless the "
                   "client names one in _meta simagent.kernel")
    trust_option(p)
    p.set_defaults(handler=cmd_acp)
