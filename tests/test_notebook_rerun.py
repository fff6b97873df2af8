"""A bundled workflow's session is a notebook that re-runs to the same numbers (issue 24).

Each workflow is played the way a person runs the zero-key demo (``simagent run --model
replay:WF``: the real graph, a real kernel), exported with ``simagent notebook``, and
re-executed by the bench's notebook check (:mod:`simagent.bench.notebook_rerun`): a fresh
kernel in a fresh folder holding only the workflow's inputs, no cell may fail, and every
number its reports gave must come out the same to the digits shown. One workflow per
simulator the issue names, each with reported key values: cantera in ``make test``;
pybamm and scipy's stiff kinetics, a minute of simulation each, in ``make test-deep``.
"""

from __future__ import annotations

import json

import nbformat
import pytest
from test_notebooks import _cli

from simagent.bench import notebook_rerun
from simagent.bench.workflow import resolve_workflows
from simagent.notebooks import rerun

WORKFLOWS = [pytest.param("pybamm-rate-capability", marks=pytest.mark.deep),
             "cantera-source-subagent",
             pytest.param("scipy-stiff-kinetics", marks=pytest.mark.deep)]


@pytest.mark.slow
@pytest.mark.parametrize("name", WORKFLOWS)
def test_a_workflow_session_exports_to_a_notebook_that_reruns_to_its_values(name, tmp_path):
    (wf,) = resolve_workflows([name])
    out = tmp_path / "bench"
    workspace = out / "runs" / f"{name}--{notebook_rerun.POLICY}--0" / "workspace"
    workspace.mkdir(parents=True)
    run = _cli(workspace, "run", "--model", f"replay:{name}", "--json", "go", timeout=800)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["status"] == "done"

    exported = _cli(workspace, "notebook", "-o", str(tmp_path / "wf.ipynb"))
    assert exported.returncode == 0, exported.stderr
    nb = nbformat.read(tmp_path / "wf.ipynb", as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.simagent.simulator == wf.simulator

    (row,) = notebook_rerun.run([wf], out, "test", max_s=float("inf"))  # make run: 60 s
    assert row["ok"], row
    assert row["error"] is None and row["mismatched"] == []
    assert row["values"] >= 3  # the reports' numbers were found and checked
    section = notebook_rerun.report_section(out, [name])
    assert "1 of 1 bundled workflows' sessions exported to notebooks that re-ran" in section
    assert notebook_rerun.run([wf], out, "test") == [row]  # cached per commit
    # over make run's budget: listed, not re-run (decided before any kernel starts)
    (over,) = notebook_rerun.run([wf], out, "later", max_s=0.0)
    assert not over["ok"] and "over the 0 s budget" in over["skipped"]
    assert "0 of 0" in notebook_rerun.report_section(out, [name])
    assert f"- {name}: not re-run, its cells took" in notebook_rerun.report_section(out)


def _notebook(*sources: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for n, cell in enumerate(nb.cells, 1):
        cell.metadata["simagent"] = {"n": n}
    return nb


@pytest.mark.slow
def test_a_rerun_kernels_own_log_stays_off_the_terminal_unless_it_dies(tmp_path, capfd):
    """ipykernel warns about plain TCP on every start; ``make run`` re-runs 16 notebooks
    and printed that warning 16 times. The kernel's log is kept and shown only with the
    error of a kernel that died, where it says why."""
    done, _, error = rerun.execute(_notebook("print(6 * 7)"), tmp_path, timeout_s=120)
    assert error is None and done.cells[0].outputs[0]["text"] == "42\n"
    assert "without encryption" not in capfd.readouterr().err

    _, _, error = rerun.execute(_notebook(
        "import os, sys", "print('fatal: out of disk', file=sys.__stderr__, flush=True); "
        "os._exit(3)"), tmp_path, timeout_s=120)
    assert error is not None and error.startswith("a cell failed on re-run: DeadKernelError")
    assert "kernel: fatal: out of disk" in error
    assert "out of disk" not in capfd.readouterr().err
