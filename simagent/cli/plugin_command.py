"""``simagent plugins``: what is loaded through the plugin hooks (simagent.hookspecs)."""

from __future__ import annotations

import argparse

from simagent import exit_codes


def cmd_plugins(args: argparse.Namespace) -> int:
    from simagent.plugins import listing

    found = listing()
    if args.json:
        import json

        print(json.dumps({"plugins": [p.as_dict() for p in found if not p.error],
                          "failed": [p.as_dict() for p in found if p.error]}, indent=2))
        return exit_codes.OK
    name_w = max((len(p.name) for p in found), default=0)
    source_w = max((len(p.source) for p in found), default=0)
    for p in found:
        what = f"not loaded: {p.error}" if p.error else ", ".join(p.hooks) or "(no hooks)"
        print(f"{p.name:<{name_w}}  {p.source:<{source_w}}  {what}")
    return exit_codes.OK


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """``plugins``."""
    plugins = sub.add_parser(
        "plugins", help="list the plugins loaded (built-in and installed) and their hooks",
        description="Every plugin simagent loads: its own built-in modules and the installed "
                    "packages with an entry point in the 'simagent' group, where each comes "
                    "from and the hooks it implements (model kinds, simulators, tools, bench "
                    "policies, workflow sources). A plugin that could not be loaded is listed "
                    "with why; it never stops simagent.")
    plugins.add_argument("--json", action="store_true",
                         help="print JSON: {plugins: [...], failed: [...]}")
    plugins.set_defaults(handler=cmd_plugins)
