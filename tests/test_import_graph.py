"""Imports run one way (issue 25): no simagent module imports, directly or through others,
a module that imports it back.

grimp (the graph import-linter builds) reads every import statement, those inside
functions included, so a cycle hidden in a lazy import counts; ``if TYPE_CHECKING:``
imports are left out because they never run. The layers themselves are import-linter's
contracts in pyproject.toml (``make lint``, run by ``.ci/run``).

An import inside a function hides an edge from a reader of the module's top, so each one
outside ``simagent.cli`` (whose commands import late to keep start-up fast) says on its line
why it waits: an optional extra, code run inside the user's kernel, or a heavy library kept
off the CLI's start-up path.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import grimp
import pytest


def import_cycles(package: str) -> list[list[str]]:
    """Each group of ``package``'s modules that import one another in a ring (strongly
    connected components of more than one module), sorted; none in a one-way package."""
    graph = grimp.build_graph(package, cache_dir=None, exclude_type_checking_imports=True)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(
                        graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return sorted(groups)


def test_simagent_has_no_import_cycle() -> None:
    assert import_cycles("simagent") == []


def test_a_cycle_hidden_in_a_function_is_found(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "toy_cycle"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "high.py").write_text("from toy_cycle.low import base\nimport toy_cycle.typed\n")
    (pkg / "low" / "base.py").write_text("def later():\n    from toy_cycle import high\n")
    (pkg / "typed.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    from toy_cycle import high\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles("toy_cycle") == [["toy_cycle.high", "toy_cycle.low.base"]]


def _reason(line: str) -> bool:
    """Whether ``line`` has a comment with words in it besides a linter's ``noqa``."""
    comment = line.partition("#")[2]
    return any(c.isalpha() for c in re.sub(r"noqa(:\s*[A-Z0-9, ]+)?", "", comment))


def _function_imports(node: ast.AST, in_function: bool = False
                      ) -> list[ast.Import | ast.ImportFrom]:
    """The import statements under ``node`` that sit inside a function or method."""
    found = []
    for child in ast.iter_child_nodes(node):
        if in_function and isinstance(child, ast.Import | ast.ImportFrom):
            found.append(child)
        found += _function_imports(child, in_function or isinstance(
            child, ast.FunctionDef | ast.AsyncFunctionDef))
    return found


def unexplained_function_imports(package_dir: Path, skip: tuple[str, ...] = ("cli",)
                                 ) -> list[str]:
    """``path:line`` of each import inside a function (in modules outside ``skip``) that
    carries no reason comment: a ``#`` on the import's line, or, for an import spread over
    lines, on the line before it. Such an import is only for an optional extra, code run
    inside the user's kernel, or a heavy library off the CLI's start-up path (issue 25)."""
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        relative = path.relative_to(package_dir)
        if relative.parts[0] in skip:
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in _function_imports(ast.parse("\n".join(lines), filename=str(path))):
            said = _reason(lines[node.lineno - 1]) or (
                node.end_lineno != node.lineno
                and lines[node.lineno - 2].lstrip().startswith("#")
                and _reason(lines[node.lineno - 2]))
            if not said:
                found.append(f"{package_dir.name}/{relative}:{node.lineno}")
    return found


def test_each_import_inside_a_function_says_why() -> None:
    package_dir = Path(__file__).resolve().parent.parent / "simagent"
    assert unexplained_function_imports(package_dir) == []


def test_an_unexplained_import_in_a_function_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "toy"
    (pkg / "cli").mkdir(parents=True)
    (pkg / "cli" / "run.py").write_text("def go():\n    import json\n")
    (pkg / "top.py").write_text("import os\n\n\ndef a():\n    import json\n\n\n"
                                "def b():\n    import csv  # the reason\n"
                                "    # reason for the next one\n    from os import (\n"
                                "        path,\n    )\n    from os import (\n        sep,\n    )\n"
                                "class C:\n    def m(self):\n        import sys\n"
                                "def d():\n    import re  # noqa: F401\n")
    assert unexplained_function_imports(pkg) == ["toy/top.py:5", "toy/top.py:14",
                                                 "toy/top.py:19", "toy/top.py:21"]
