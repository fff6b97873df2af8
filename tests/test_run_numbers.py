"""``simagent run``'s numbers: each number of the final answer traced to the cell and
output line that printed it (``context/provenance``), in ``--json`` and as one stderr
line. Real graph and session; the model is scripted."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import cli_fork
import pytest

from simagent import exit_codes
from simagent.headless import RunOptions, run_headless

STEPS = [
    {"tool": "run_python",
     "args": {"code": "print('k_fit =', 0.31647)\nprint('tau_ms =', 2.6753)"}},
    {"final": "k is 0.316 and tau is 2.68 (in ms), 2.36 apart; R0 is 3.9 (fit of 250 "
              "points)."},
]


def _script(tmp_path: Path, steps: list[dict]) -> str:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(steps))
    return f"scripted:{path}"


def _check(data: dict, stderr: str) -> None:
    by_text = {n["text"]: n for n in data["numbers"]}
    assert {t: n["status"] for t, n in by_text.items()} == {
        "0.316": "sourced", "2.68": "sourced", "2.36": "derived", "3.9": "unsourced",
        "250": "input"}
    k = by_text["0.316"]
    assert k["value"] == 0.316
    printed = [p for p in (Path(data["state_dir"]) / "outputs").glob("*.txt")
               if "k_fit" in p.read_text()]
    assert (k["source"]["execution"], k["source"]["line"], k["source"]["excerpt"]) == \
        (int(printed[0].stem), 1, "k_fit = 0.31647")
    assert by_text["2.68"]["source"]["line"] == 2
    assert by_text["3.9"]["source"] is None
    assert "simagent: numbers: 2 sourced, 1 derived, 1 input, 1 unsourced" in \
        stderr.splitlines()


def test_run_json_traces_each_number_of_the_answer(workspace: Path, tmp_path: Path):
    out, err = io.StringIO(), io.StringIO()
    code = run_headless(RunOptions(workspace=workspace, model=_script(tmp_path, STEPS),
                                   prompt="fit the 250 points", json=True,
                                   approval="auto"), out, err)
    assert code == exit_codes.OK, err.getvalue()
    _check(json.loads(out.getvalue()), err.getvalue())


@pytest.mark.real
def test_run_json_numbers_end_to_end_on_a_kernel_process(workspace: Path, tmp_path: Path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("SIMAGENT_MODEL", "SIMAGENT_TEST_KERNEL")}
    proc = cli_fork.run([sys.executable, "-m", "simagent", "run", "--json", "--approval",
                         "auto", "--model", _script(tmp_path, STEPS),
                         "fit the 250 points"], cwd=workspace, env=env, text=True,
                        capture_output=True, timeout=180)
    assert proc.returncode == exit_codes.OK, proc.stderr
    _check(json.loads(proc.stdout), proc.stderr)
