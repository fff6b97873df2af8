"""/notebook in JupyterLab's chat (simagent/jupyter/notebook_cells.py): the agent's cells
out of an exported session notebook, inserted below a cell of the person's, pure."""

from __future__ import annotations

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from simagent.jupyter.notebook_cells import agent_cells, insert_below


def exported() -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.cells = [
        new_markdown_cell("# simagent session s1"),
        new_code_cell("_out = Outputs('x')", metadata={"simagent": {"setup": True}}),
        new_code_cell("import pybamm", metadata={"simagent": {"n": 1, "warmup": True,
                                                               "session_id": "s1"}}),
        new_code_cell("t_half = 1.8734\nprint(t_half)", execution_count=2,
                      outputs=[nbformat.v4.new_output("stream", text="1.8734\n")],
                      metadata={"simagent": {"n": 2, "session_id": "s1"}}),
        new_code_cell("print(t_half)", execution_count=3,  # shown: the answer cites it
                      metadata={"simagent": {"n": 3, "session_id": "s1"},
                                "tags": ["simagent-display", "skip-execution"]}),
        new_markdown_cell("**Answer**"),
    ]
    return nb


def person() -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.cells = [new_code_cell("k = 0.37"), new_code_cell("plot(k)")]
    return nb


def test_agent_cells_are_the_sessions_code_with_outputs():
    cells = agent_cells(exported())
    assert [c["source"] for c in cells] == ["t_half = 1.8734\nprint(t_half)"]
    nb = exported()  # a failed cell later cells need is state: it goes in
    nb.cells.append(new_code_cell("r = fit()", metadata={
        "simagent": {"n": 4, "session_id": "s1"},
        "tags": ["simagent-failed", "raises-exception"]}))
    assert [c["source"] for c in agent_cells(nb)][-1] == "r = fit()"
    assert cells[0]["outputs"][0]["text"] == "1.8734\n" and cells[0]["execution_count"] == 2


def test_inserted_below_the_active_cell_once():
    nb = person()
    first = nb.cells[0].id
    assert insert_below(nb, agent_cells(exported()), first) == 1
    assert [c["source"].split("\n")[0] for c in nb.cells] == ["k = 0.37", "t_half = 1.8734",
                                                              "plot(k)"]
    assert len({c["id"] for c in nb.cells}) == 3
    nbformat.validate(nb)
    # /notebook again: nothing new to add
    assert insert_below(nb, agent_cells(exported()), first) == 0 and len(nb.cells) == 3


def test_no_active_cell_appends_and_old_notebooks_get_ids():
    nb = {"nbformat": 4, "nbformat_minor": 4, "metadata": {},
          "cells": [{"cell_type": "code", "source": "k = 1", "metadata": {},
                     "outputs": [], "execution_count": None}]}
    assert insert_below(nb, agent_cells(exported()), None) == 1
    assert nb["nbformat_minor"] == 5 and all(c.get("id") for c in nb["cells"])
    assert nb["cells"][-1]["source"].startswith("t_half")
    nbformat.validate(nbformat.from_dict(nb))
    # an id no cell has: the end too
    nb2 = person()
    insert_below(nb2, agent_cells(exported()), "nope")
    assert nb2.cells[-1]["source"].startswith("t_half")
