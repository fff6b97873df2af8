"""Imports run one way (issue 25): no simagent module imports, directly or through others,
a module that imports it back.

grimp (the graph import-linter builds) reads every import statement, those inside
functions included, so a cycle hidden in a lazy import counts; ``if TYPE_CHECKING:``
imports are left out because they never run. The layers themselves are import-linter's
contracts in pyproject.toml (``make lint``, run by ``.ci/run``).
"""

from __future__ import annotations

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
