"""``simagent mcp``: serve the workspace's kernel to an MCP host (stdio, or ``--http``)."""

from __future__ import annotations

import argparse
import errno
import sys

from simagent import exit_codes
from simagent.cli.common import existing_workspace, trust_option
from simagent.exit_codes import CliError


def cmd_mcp(args: argparse.Namespace) -> int:
    import os
    import secrets

    from simagent.config import Config, ConfigError
    from simagent.mcp_server import ops
    from simagent.simulators import SimulatorError, get_simulator

    workspace = existing_workspace(args.workspace)
    try:
        config = Config.load(workspace, trust=args.trust_workspace)
        approval = config.approval(args.approval)
        get_simulator(config.simulator(args.sim))  # a bad name fails now, not per client
        address = ops.host_port(args.http) if args.http else None
    except (ConfigError, SimulatorError, ValueError) as exc:
        raise CliError(str(exc)) from exc
    # the SDK and the kernel stack load only now: `simagent --help` stays fast
    from simagent.mcp_server.server import build_server, listen, serve_http, serve_stdio
    from simagent.session import Session
    from simagent.trace.redact import register

    # over HTTP whoever holds the token runs code: the kernel gets no secret-named
    # variable of this environment unless --pass-env names it
    pass_env = frozenset(n.strip() for part in args.pass_env or () for n in part.split(",")
                         if n.strip())

    def open_session() -> Session:
        # "model": whatever the host runs, unknown here; "mcp" marks the session's origin
        session = Session.create(workspace, simulator=args.sim, approval=approval,
                                 model=ops.SESSION_MODEL, config=config)
        if address is not None:
            session.kernel_secret_env = pass_env
        return session

    if config.ignored_line:  # stderr: stdout is the protocol
        print(config.ignored_line, file=sys.stderr, flush=True)
    if approval == "ask":
        print("simagent mcp: --approval ask: run_python, restore and reset will be refused "
              "(no one can approve over MCP); --approval workspace or auto lets them run",
              file=sys.stderr, flush=True)
    if address is None:
        if sys.stdin.isatty():  # a person ran it by hand: say what it waits for
            print("simagent mcp: serving MCP over stdin/stdout for an MCP host, which starts "
                  "this command itself (README: simagent as an MCP server); ctrl+C stops it",
                  file=sys.stderr, flush=True)
        serve_stdio(build_server(open_session))
        return exit_codes.OK
    host, port = address
    shown = f"[{host}]" if ":" in host else host
    try:
        sock = listen(host, port)
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno else str(exc)  # not create_server's
        raise CliError(f"cannot serve on {shown}:{port}: {why}"
                       + (" (another server has this port: choose another)"
                          if exc.errno == errno.EADDRINUSE else "")) from exc
    token = os.environ.get(ops.TOKEN_ENV) or secrets.token_urlsafe(24)
    register({token: ops.TOKEN_ENV})  # never written to a trace or output
    print(f"simagent mcp: streamable HTTP at http://{shown}:{port}/mcp\n"
          f"simagent mcp: send the header  Authorization: Bearer "
          f"{token if not os.environ.get(ops.TOKEN_ENV) else '$' + ops.TOKEN_ENV}",
          file=sys.stderr, flush=True)
    try:
        serve_http(build_server(open_session, host=host, port=port), sock, token)
    except KeyboardInterrupt:  # uvicorn closed every session, then re-raised SIGINT
        return exit_codes.CANCELLED  # 130, as the stdio server's 128 + SIGINT
    return exit_codes.OK


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """``mcp``."""
    from simagent.config import APPROVAL_MODES, DEFAULT_APPROVAL

    p = sub.add_parser(
        "mcp", help="serve the kernel to an MCP host (Claude Code, Codex, Cursor...)",
        description="Serve a simagent kernel as an MCP server: tools run_python, output, "
                    "state, figure, interrupt, restore, reset. stdio by default (one kernel "
                    "for the process); --http serves streamable HTTP (one kernel per MCP "
                    "session) behind a bearer token. README: simagent as an MCP server.")
    p.add_argument("--workspace", default=".", help="workspace folder, the kernel's working "
                   "directory (default: .)")
    p.add_argument("--sim", metavar="S", help="simulator (default: the workspace's)")
    p.add_argument("--approval", choices=APPROVAL_MODES,
                   help=f"default: config, else {DEFAULT_APPROVAL}; 'ask' refuses "
                        "run_python, restore and reset (no one to ask over MCP)")
    p.add_argument("--http", metavar="[HOST:]PORT",
                   help="serve streamable HTTP on HOST (default 127.0.0.1) at /mcp; the "
                        "token is $SIMAGENT_MCP_TOKEN, else generated and printed once. "
                        "Each kernel gets this environment without its secret-named "
                        "variables (*API_KEY*, *TOKEN*, *SECRET*, *PASSWORD*, *AUTH*...)")
    p.add_argument("--pass-env", metavar="NAME[,NAME]", action="append",
                   help="with --http: pass these secret-named variables to the kernels "
                        "anyway (repeatable)")
    trust_option(p)
    p.set_defaults(handler=cmd_mcp)
