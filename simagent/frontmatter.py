"""YAML frontmatter of content files (skills, subagents): one parser, one set of errors.

Skills and subagent definitions are markdown with a ``---`` YAML block on top. The
subagent loader, the skills content test and the TUI's ``/skills`` all read it here,
so a file one of them accepts cannot be rejected by another for a different reason.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

_FRONTMATTER = re.compile(r"^---\n(.*?)\n---\n(.*)$", re.S)


class FrontmatterError(ValueError):
    """The file has no usable frontmatter; the message names the file and the problem."""


def read_frontmatter(path: Path) -> tuple[dict[str, Any], str]:
    """``(metadata, body)`` of a markdown file with YAML frontmatter."""
    match = _FRONTMATTER.match(path.read_text(encoding="utf-8"))
    if not match:
        raise FrontmatterError(f"{path}: no YAML frontmatter between --- lines")
    try:
        meta = yaml.safe_load(match.group(1))
    except yaml.YAMLError as exc:
        raise FrontmatterError(f"{path}: invalid YAML frontmatter: {exc}") from exc
    if not isinstance(meta, dict):
        raise FrontmatterError(f"{path}: frontmatter is not a mapping")
    return meta, match.group(2)
