"""Every bundled SKILL.md parses, and parses the way deepagents will load it.

A skill with broken frontmatter (an unquoted colon is enough) is skipped by the loader
with only a log line, so the agent silently loses it. These tests fail instead.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from simagent.frontmatter import FrontmatterError, read_frontmatter
from simagent.paths import content_dir

NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


def bundled_skill_files() -> list[Path]:
    shared = sorted(content_dir("skills").glob("*/SKILL.md"))
    per_sim = sorted(content_dir("simulators").glob("*/skills/*/SKILL.md"))
    return shared + per_sim


def check_skill(path: Path) -> dict:
    """The frontmatter of ``path``; raises AssertionError naming the file and the problem."""
    try:
        meta, body = read_frontmatter(path)
    except FrontmatterError as exc:
        raise AssertionError(str(exc)) from exc
    name, desc = meta.get("name"), meta.get("description")
    assert isinstance(name, str) and NAME.match(name) and len(name) <= 64, \
        f"{path}: bad name {name!r}"
    assert name == path.parent.name, f"{path}: name {name!r} != folder {path.parent.name!r}"
    assert isinstance(desc, str) and 20 <= len(desc) <= 1024, f"{path}: bad description"
    assert body.strip(), f"{path}: empty body"
    return meta


def test_there_are_bundled_skills():
    assert bundled_skill_files(), "no SKILL.md found under skills/ or simulators/*/skills/"


@pytest.mark.parametrize("path", bundled_skill_files(), ids=lambda p: p.parent.name)
def test_bundled_skill_parses(path: Path):
    check_skill(path)


def test_deepagents_loads_every_bundled_skill(tmp_path):
    from deepagents.middleware.skills import _list_skills

    from simagent.agent.backend import WorkspaceBackend

    backend = WorkspaceBackend(tmp_path)
    for source in {p.parent.parent for p in bundled_skill_files()}:
        loaded = {s["name"] for s in _list_skills(backend, str(source))}
        expected = {p.parent.name for p in source.glob("*/SKILL.md")}
        assert loaded == expected, f"deepagents skipped skills in {source}"


def test_the_checker_rejects_an_unquoted_colon(tmp_path):
    bad = tmp_path / "plotting" / "SKILL.md"
    bad.parent.mkdir()
    bad.write_text("---\nname: plotting\ndescription: How to plot: axes, labels\n---\nbody\n")
    with pytest.raises(AssertionError, match="invalid YAML"):
        check_skill(bad)
