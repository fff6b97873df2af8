"""One short study per simulator, end to end: real graph, real kernel, real simulator.

The scripted model runs the study's code with ``run_python`` and answers with a number
quoted from the kernel's output in the request it received; an independent computation
in a separate plain Python process must agree. See ``tests/studies/<name>.toml``.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from simagent.agent.builder import build_agent
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.session import Session
from simagent.simulators import get_simulator

STUDIES = sorted((Path(__file__).parent / "studies").glob("*.toml"))


def test_every_bundled_simulator_has_a_study():
    assert {p.stem for p in STUDIES} >= {"ase", "cantera", "fipy", "pybamm", "scipy", "simpy"}


@pytest.mark.slow
@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_study_answer_matches_a_direct_computation(path, workspace):
    study = tomllib.loads(path.read_text())
    session = Session.create(workspace, simulator=path.stem, approval="auto")
    try:
        model = ScriptedChatModel.from_steps([
            {"tool": "run_python", "args": {"code": study["code"]}},
            {"final": study["final"]}])
        result = TurnRunner(session, build_agent(session, model)).run(study["prompt"])
        assert result.status == "done", result
        assert session.simulator.display_name in model.requests[0][0].text
    finally:
        session.close()
    found = re.search(study["answer_regex"], result.final)
    assert found, f"no number in the answer: {result.final!r}"
    answer = float(found.group(1))
    env = {**os.environ, **dict(get_simulator(path.stem).env)}
    direct = subprocess.run([sys.executable, "-c", study["direct"]], capture_output=True,
                            text=True, timeout=300, env=env)
    assert direct.returncode == 0, direct.stderr[-2000:]
    expected = float(re.search(r"EXPECTED\s+([-+0-9.eE]+)", direct.stdout).group(1))
    assert math.isclose(answer, expected, rel_tol=study.get("rel_tol", 1e-6)), \
        (answer, expected)
