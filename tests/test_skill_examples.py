"""Every example in every bundled skill runs in a real kernel and shows what it claims.

A skill is a promise to the model; these tests keep the promise true for the installed
versions. Each SKILL.md's python blocks run in order in one fresh kernel (with the
simulator's environment), and each ``<!-- expect: ... -->`` must match the block output.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from simagent.paths import content_dir
from simagent.skill_examples import ExampleFormatError, examples, run_skill, simulator_of


def skill_files() -> list[Path]:
    return sorted(content_dir("skills").glob("*/SKILL.md")) + sorted(
        content_dir("simulators").glob("*/skills/*/SKILL.md"))


def _id(path: Path) -> str:
    return path.parent.name


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("path", skill_files(), ids=_id)
def test_skill_examples_run_and_match_their_claims(path):
    blocks = examples(path.read_text(encoding="utf-8"), str(path))
    runnable = [b for b in blocks if b.no_run is None]
    outcomes = list(run_skill(path))
    failed = [o for o in outcomes if not o.ok]
    assert not failed, (f"{path}:{failed[0].example.line}: {failed[0].detail}\n"
                        f"{failed[0].output[-2000:]}")
    assert len(outcomes) == len(runnable)


@pytest.mark.parametrize("path", [p for p in skill_files() if simulator_of(p)], ids=_id)
def test_simulator_skills_carry_verified_examples(path):
    blocks = examples(path.read_text(encoding="utf-8"), str(path))
    runnable = [b for b in blocks if b.no_run is None]
    assert runnable, f"{path} has no runnable example"
    assert any(b.expects or "assert " in b.code for b in runnable), \
        f"{path}: no example checks its claims (assert or <!-- expect -->)"


def test_extractor_reads_expectations_and_no_run_reasons():
    text = ("intro\n```python\nprint(1)\n```\n<!-- expect: ^1$ -->\n<!-- expect: 1 -->\n\n"
            "<!-- no-run: needs a cluster -->\n```python\nboom()\n```\n"
            "```text\nnot python\n```\n```python\nx = 2\n```\n")
    a, b, c = examples(text)
    assert a.code == "print(1)\n" and a.expects == ("^1$", "1") and a.line == 2
    assert b.no_run == "needs a cluster" and b.expects == ()
    assert c.code == "x = 2\n" and c.no_run is None


def test_a_no_run_comment_applies_only_to_the_next_block():
    text = ("<!-- no-run: needs a cluster -->\n```python\nboom()\n```\n"
            "<!-- expect: ok -->\n```python\nprint('ok')\n```\n")
    first, second = examples(text)
    assert first.no_run == "needs a cluster" and second.no_run is None


def test_extractor_rejects_a_bad_regex():
    with pytest.raises(ExampleFormatError, match="block 0: bad expect regex"):
        examples("```python\nx\n```\n<!-- expect: ([ -->\n")


def test_runner_stops_at_a_false_claim(tmp_path):
    skill = tmp_path / "demo" / "SKILL.md"
    skill.parent.mkdir()
    skill.write_text("---\nname: demo\ndescription: demo skill for the runner\n---\n"
                     "```python\nx = 41\nprint('x is', x)\n```\n<!-- expect: x is 41 -->\n"
                     "```python\nprint(x + 1)\n```\n<!-- expect: ^43$ -->\n"
                     "```python\nprint('never runs')\n```\n")
    outcomes = list(run_skill(skill))
    assert [o.ok for o in outcomes] == [True, False]
    assert "does not match '^43$'" in outcomes[1].detail and outcomes[1].output.strip() == "42"
