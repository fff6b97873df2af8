"""One home for paths: content folders, state home precedence, session layout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from simagent import paths


def test_content_folders_resolve_in_a_checkout() -> None:
    for name in paths.CONTENT_FOLDERS:
        assert paths.content_dir(name).is_dir(), name
    assert (paths.content_dir("skills") / "python-and-kernel" / "SKILL.md").is_file()
    with pytest.raises(ValueError):
        paths.content_dir("nope")


def test_state_home_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SIMAGENT_HOME", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "x"))
    assert paths.state_home() == tmp_path / "a"
    monkeypatch.delenv("SIMAGENT_HOME")
    assert paths.state_home() == tmp_path / "x" / "simagent"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert paths.state_home() == tmp_path / "h" / ".local" / "share" / "simagent"


def test_session_layout_and_ids(tmp_path: Path) -> None:
    sid = paths.new_session_id()
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", sid)
    sp = paths.SessionPaths.for_session(tmp_path, sid)
    key = paths.workspace_key(tmp_path)
    assert len(key) == 12 and sp.root == paths.state_home() / "workspaces" / key / "sessions" / sid
    assert paths.workspace_key(tmp_path / "." ) == key  # the real path is what counts
    sp.ensure()
    assert sp.outputs.is_dir() and sp.artifacts.is_dir()
    assert sp.trace.name == "trace.sqlite" and sp.checkpoints.name == "checkpoints.sqlite"
