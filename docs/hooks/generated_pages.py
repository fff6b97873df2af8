"""Pages the docs site builds from the code itself, so they cannot drift (issue 37).

mkdocs runs :func:`on_files` (``hooks:`` in mkdocs.yml); nothing is written into the tree.
Each page is a pure function of what it renders, and tests/test_docs_examples.py checks
them without mkdocs:

- ``reference/cli.md``: every parser of ``simagent.cli.build_parser()``, its help as
  argparse prints it;
- ``reference/context-settings.md``: every field of ``ContextSettings`` (the ``[context]``
  table), its default and the comment beside its definition;
- ``architecture.md``: ARCHITECTURE.md as it is;
- ``bench-results.md``: the result files the bench commands write under docs/results/.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import os
from dataclasses import MISSING, fields
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
#: argparse wraps help at the terminal's width: a fixed one keeps the page the same anywhere.
HELP_COLUMNS = "100"


def parsers(parser: argparse.ArgumentParser, name: str = "simagent"
            ) -> list[tuple[str, argparse.ArgumentParser]]:
    """(full command, parser) for the parser and every subcommand under it, depth first,
    each once (aliases point to the same parser)."""
    out = [(name, parser)]
    seen: set[int] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    out += parsers(sub, f"{name} {sub_name}")
    return out


def cli_reference() -> str:
    """The CLI reference page: each command's ``--help``, generated from the parser."""
    from simagent.cli import build_parser  # the package under documentation

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        commands = parsers(build_parser())
        parts = ["# CLI reference\n",
                 "Generated from `simagent.cli.build_parser()` when the site is built "
                 "(`make docs`): each command's `--help`, exactly as it prints.\n"]
        for command, parser in commands:
            help_text = parser.format_help().replace(parser.prog, command, 1).rstrip()
            parts.append(f"## `{command}`\n\n```text\n{help_text}\n```\n")
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return "\n".join(parts)


def _comment(lines: list[str], lineno: int) -> str:
    """The ``#:`` lines above source line ``lineno`` (1-based) and a trailing ``# ...``."""
    above = []
    row = lineno - 2
    while row >= 0 and lines[row].strip().startswith("#:"):
        above.insert(0, lines[row].strip()[2:].strip())
        row -= 1
    own = lines[lineno - 1]
    inline = own.split("  # ", 1)[1].strip() if "  # " in own else ""
    return " ".join([*above, inline]).strip()


def module_constants(module: ModuleType) -> dict[str, str]:
    """The comment of each module-level constant of ``module``, by name."""
    module_source = inspect.getsource(module)
    module_lines = module_source.splitlines()
    body = ast.parse(module_source).body
    constants = {node.targets[0].id: _comment(module_lines, node.lineno) for node in body
                 if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}
    constants.update({node.target.id: _comment(module_lines, node.lineno) for node in body
                      if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)})
    return constants


def field_comments(cls: type, *homes: ModuleType) -> dict[str, str]:
    """The comment of each dataclass field as written in its source, followed by the
    comment of the module constant its default names (``EVICT_TOKENS``: why that number
    is written there, once), in the class's module or one of ``homes`` (where the
    numbers it imports live)."""
    constants: dict[str, str] = {}
    for module in (*homes, inspect.getmodule(cls)):
        constants.update({k: v for k, v in module_constants(module).items() if v})
    source = inspect.getsource(cls)
    lines = source.splitlines()
    out: dict[str, str] = {}
    for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        own = _comment(lines, node.lineno)
        named = node.value.id if isinstance(node.value, ast.Name) else None
        extra = constants.get(named, "") if named else ""
        out[node.target.id] = " ".join(
            part for part in (own, f"`{named}`: {extra}" if extra else "") if part)
    return out


def _default(f) -> str:
    value = f.default_factory() if f.default is MISSING else f.default
    if isinstance(value, dict):
        value = dict(value)
    return "unset" if value is None else repr(value).replace("|", "\\|")


def context_settings_reference() -> str:
    """The ``[context]`` table's keys, from ``ContextSettings``' own definition."""
    from simagent.context import thresholds
    from simagent.context.settings import ContextSettings

    notes = field_comments(ContextSettings, thresholds)
    rows = ["| key | type | default | what it does |", "|---|---|---|---|"]
    for f in fields(ContextSettings):
        note = notes.get(f.name, "").replace("|", "\\|")
        kind = str(f.type).replace("|", "\\|")
        rows.append(f"| `{f.name}` | `{kind}` | `{_default(f)}` | {note} |")
    return ("# `[context]` settings\n\n"
            "Generated from `simagent.context.settings.ContextSettings` (its defaults are the "
            "numbers of `simagent/context/thresholds.py`) when the site is "
            "built: every key the `[context]` table accepts (any other is an error naming "
            "the known ones), its default, and the comment beside its definition. How the "
            "layers use them: [Context management](../context.md).\n\n"
            + "\n".join(rows) + "\n")


def architecture() -> str:
    return (ROOT / "ARCHITECTURE.md").read_text()


def bench_results() -> str:
    """The result files the measuring commands committed under docs/results/."""
    results = sorted((ROOT / "docs" / "results").glob("*.md"))
    parts = ["# Bench results\n",
             "Each table below is a file a measuring command wrote (its commit and date "
             "are in the file); none is typed by hand. `make bench-attacks` writes "
             "`docs/results/attacks.md`. `make run` writes the main bench's headline table to "
             "`docs/results/bench-summary.md`, and its whole report (with its figures) to "
             "`bench-out/report.md` on your machine.\n"]
    if not results:
        parts.append("No result file is committed yet.\n")
    for path in results:
        body = path.read_text()
        # one page: each file's headings go one level down under its own
        body = "\n".join(f"#{line}" if line.startswith("#") else line
                         for line in body.splitlines())
        parts.append(f"## `docs/results/{path.name}`\n\n{body}\n")
    return "\n".join(parts)


PAGES = {
    "reference/cli.md": cli_reference,
    "reference/context-settings.md": context_settings_reference,
    "architecture.md": architecture,
    "bench-results.md": bench_results,
}


def on_files(files, config):  # mkdocs hook
    from mkdocs.structure.files import File  # only when mkdocs runs this

    for uri, render in PAGES.items():
        files.append(File.generated(config, uri, content=render()))
    return files
