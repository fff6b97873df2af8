"""Commands about the workspace and the machine: ``init``, ``simulators``, ``doctor``,
``memory``."""

from __future__ import annotations

import argparse
import sys

from simagent import exit_codes
from simagent.cli.common import existing_workspace, progress, trust_option
from simagent.exit_codes import CliError


def cmd_init(args: argparse.Namespace) -> int:
    from simagent.config import Config, ConfigError
    from simagent.simulators import DEFAULT_SIMULATOR, SimulatorError, get_simulator
    from simagent.workspace_init import check_in_kernel, install_hint, write_workspace_config

    workspace = existing_workspace(args.workspace)
    try:
        config = Config.load(workspace)
        sim = get_simulator(args.sim or config.simulator() or DEFAULT_SIMULATOR)
    except (ConfigError, SimulatorError) as exc:
        raise CliError(str(exc)) from exc
    if sim is None:
        raise CliError("no simulator is bundled; pass --sim NAME")
    try:  # the person's own words: trusted, unless it keeps lines of an untrusted file
        path = write_workspace_config(workspace, sim.name, args.model,
                                      trust=not (config.trust and config.trust.ignored))
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    print(f"wrote {path} (simulator = {sim.name!r})")
    if config.ignored_line:
        print(f"{config.ignored_line} (its other lines were kept, so it is still not "
              "trusted)", file=sys.stderr)
    if args.no_check:
        return exit_codes.OK
    progress(f"checking {', '.join(sim.packages) or 'nothing'} in the kernel...")
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


def cmd_simulators(args: argparse.Namespace) -> int:
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


def cmd_doctor(args: argparse.Namespace) -> int:

    from simagent.doctor import failed, render, run_checks

    checks = run_checks(existing_workspace(args.workspace), in_kernel=not args.quick,
                        trust=args.trust_workspace, progress=None if args.json else progress)
    if args.json:
        import json

        print(json.dumps([c.as_dict() for c in checks], indent=2))
    else:
        sys.stdout.write(render(checks))
    return exit_codes.FAILED if failed(checks) else exit_codes.OK


def cmd_trust(args: argparse.Namespace) -> int:
    from simagent import workspace_trust
    from simagent.paths import workspace_config_path

    if args.list:
        folders = workspace_trust.read_store()
        for folder, digest in folders.items():
            print(f"{folder}  (config sha256 {digest[:12]})")
        if not folders:
            print("no trusted folders")
        return exit_codes.OK
    workspace = existing_workspace(args.workspace)
    if args.revoke:
        gone = workspace_trust.revoke(workspace)
        print(f"{workspace}: {'no longer trusted' if gone else 'was not trusted'}")
        return exit_codes.OK
    content = workspace_trust.config_bytes(workspace)
    if content is None:
        raise CliError(f"{workspace} has no .simagent/config.toml to trust")
    path = workspace_config_path(workspace)
    try:  # what is shown is what is trusted: the bytes read once
        data = workspace_trust.parse(content, path)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    changes = workspace_trust.would_change(data) or ["change nothing that acts"]
    print(f"{path} would:")
    for change in changes:
        print(f"  - {change}")
    workspace_trust.trust(workspace, content)
    print(f"trusted {workspace} with this content (a changed file asks again; "
          "'simagent trust --revoke' undoes it)")
    return exit_codes.OK


def cmd_memory(args: argparse.Namespace) -> int:
    from simagent.context.memory import ensure_memory, list_notes, read_note, render_notes

    folder = ensure_memory(existing_workspace(args.workspace))
    if args.note:
        try:
            path, text = read_note(folder, args.note)
        except LookupError as exc:
            raise CliError(str(exc)) from exc
        sys.stdout.write(f"{path}\n\n{text}")
    else:
        sys.stdout.write(render_notes(list_notes(folder), folder))
    return exit_codes.OK



def add_parsers(sub: argparse._SubParsersAction) -> None:
    """``init``, ``simulators``, ``doctor`` and ``memory``."""
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
    init.set_defaults(handler=cmd_init)

    sims = sub.add_parser("simulators", help="list simulators (bundled and plug-ins)",
                          description="Every simulator simagent knows: bundled folders, "
                                      "the simagent.simulators entry points and plugins' "
                                      "register_simulators hooks, with whether its packages "
                                      "are installed.")
    sims.add_argument("--json", action="store_true", help="print JSON")
    sims.set_defaults(handler=cmd_simulators)

    doctor = sub.add_parser("doctor", help="check the environment, with a fix per problem",
                            description="Check Python, the state folder, the kernel, the "
                                        "model, every simulator (imports in a real kernel) "
                                        "and tmux; each problem gets a one-line fix. Exit 1 "
                                        "when a required check fails.")
    doctor.add_argument("--quick", action="store_true",
                        help="find simulator packages without importing them in a kernel")
    doctor.add_argument("--json", action="store_true", help="print JSON")
    doctor.add_argument("--workspace", default=".", help="workspace folder (default: .)")
    trust_option(doctor)
    doctor.set_defaults(handler=cmd_doctor)

    trust = sub.add_parser(
        "trust", help="trust this folder's .simagent/config.toml (or list, or revoke)",
        description="A workspace's .simagent/config.toml can set approval, run MCP server "
                    "commands and send a key to an endpoint, so it takes effect only once "
                    "you trust the folder with that content (a changed file asks again). "
                    "Without options: show what the file would change and trust it.")
    what = trust.add_mutually_exclusive_group()
    what.add_argument("--list", action="store_true", help="list the trusted folders")
    what.add_argument("--revoke", action="store_true", help="stop trusting this folder")
    trust.add_argument("--workspace", default=".", help="workspace folder (default: .)")
    trust.set_defaults(handler=cmd_trust)

    memory = sub.add_parser("memory", help="list the workspace's memory notes or show one",
                            description="The workspace memory: the MEMORY.md index (what the "
                                        "agent sees each turn) or one note in full.")
    memory.add_argument("note", nargs="?", help="a note's file name, slug or title prefix")
    memory.add_argument("--workspace", default=".", help="workspace folder (default: .)")
    memory.set_defaults(handler=cmd_memory)

