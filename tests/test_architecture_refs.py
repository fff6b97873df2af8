"""ARCHITECTURE.md names code as ``file.py::name``: every such name must exist.

Its single facts and its walks (a ``run_python`` result to the model, ctrl+C to the kernel
and back, a session to a notebook) are read by people changing the code; a hop that was
renamed away would send them to nothing, so a rename fails here until the map follows.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REF = re.compile(r"`([\w/]+\.py)::([\w.]+)")


def _defines(source: str, name: str) -> bool:
    return re.search(rf"(?:def|class)\s+{re.escape(name)}\b|^\s*{re.escape(name)}\s*[:=]",
                     source, re.M) is not None


def test_every_file_and_name_architecture_names_exists() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    refs = REF.findall(text)
    assert len(refs) > 40  # the walks are there
    missing = []
    for path, name in refs:
        file = ROOT / path if (ROOT / path).exists() else ROOT / "simagent" / path
        if not file.is_file():
            missing.append(f"{path} (no such file)")
            continue
        source = file.read_text(encoding="utf-8")
        missing += [f"{path}::{name} ({part})" for part in name.split(".")
                    if not _defines(source, part)]
    assert not missing, "ARCHITECTURE.md names what is not there:\n" + "\n".join(missing)


def test_a_renamed_name_is_caught() -> None:
    assert _defines("def select(records):\n    pass\n", "select")
    assert not _defines("def selected(records):\n    pass\n", "select")
