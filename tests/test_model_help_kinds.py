"""``--model``'s help names every model kind simagent accepts (issue 37, defect 17): the
help text lives in the CLI's stdlib-only ``common.py`` (fast ``--help``), the kinds come from
plugins (``register_model_kinds``), so this test is what keeps the two from drifting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from simagent.models import PROVIDER_KIND, model_kinds

SIMAGENT = str(Path(sys.executable).parent / "simagent")


@pytest.mark.slow
@pytest.mark.parametrize("command", [["run"], ["tui"]])
def test_model_help_names_every_registered_kind(command: list[str]) -> None:
    done = subprocess.run([SIMAGENT, *command, "--help"], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # argparse wraps lines
    model_help = text[text.rindex("--model M "):].split(" --sim ")[0]  # its option line
    kinds = [k for k in model_kinds() if k != PROVIDER_KIND]
    assert {"local", "replay", "scripted", "openai-compatible"} <= set(kinds)  # built-ins
    for prefix in kinds:
        assert f"{prefix}:" in model_help, (prefix, model_help)
