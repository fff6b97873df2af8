"""The security table (docs/security.md, linked from the README) is the last attack-bench
run, and that run covers every attack (issue 40: "the README's security section is
generated from, or checked against, its last run"). ``make bench-attacks`` rewrites both;
this test fails when one drifts, or when the README's count of attacks does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simagent.bench import attack_cases
from simagent.bench.attack_bench import (
    README_BEGIN,
    README_END,
    readme_table,
    rows_of,
    splice_readme,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results" / "attacks.json"


def test_the_security_table_is_rendered_from_the_last_run():
    data = json.loads(RESULTS.read_text())
    page = (ROOT / "docs" / "security.md").read_text()
    section = page.split(README_BEGIN, 1)[1].split(README_END, 1)[0]
    assert section == "\n" + readme_table(data)


def test_the_readme_counts_the_attacks_the_bench_runs():
    readme = (ROOT / "README.md").read_text()
    assert f"runs {len(attack_cases.CASES)} attacks for real" in readme
    assert README_BEGIN not in readme  # the table lives on the security page


def test_the_last_run_covers_every_attack_and_each_held():
    rows = rows_of(json.loads(RESULTS.read_text()))
    assert [r.id for r in rows] == [c.id for c in attack_cases.CASES]
    assert [r.id for r in rows if r.held is not True] == []


def test_splicing_replaces_only_the_section_and_needs_its_markers():
    text = f"intro\n{README_BEGIN}\nold table\n{README_END}\nrest\n"
    out = splice_readme(text, "| new |\n")
    assert out == f"intro\n{README_BEGIN}\n| new |\n{README_END}\nrest\n"
    assert splice_readme(out, "| new |\n") == out  # idempotent
    with pytest.raises(ValueError, match="attacks:begin"):
        splice_readme("no section here\n", "| new |\n")
