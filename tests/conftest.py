"""Shared fixtures: every test gets its own state home; kernels are real ipykernels."""

from __future__ import annotations

from pathlib import Path

import pytest

from simagent.paths import SessionPaths


@pytest.fixture(autouse=True)
def _state_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path_factory.mktemp("simagent-home")
    monkeypatch.setenv("SIMAGENT_HOME", str(home))
    return home


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace"
    ws.mkdir()
    return ws


@pytest.fixture
def session_paths(tmp_path: Path) -> SessionPaths:
    return SessionPaths(tmp_path / "session").ensure()
