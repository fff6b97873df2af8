"""A session as a notebook (issue 24 part 1): the plan's rules on plain records, the
outputs on real PNGs, and the command as a person runs it on real sessions (scripted
model, real kernel, real trace), re-executed with nbclient."""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import cli_fork
import nbformat
import pytest

from simagent.notebooks import plan as nbplan
from simagent.notebooks.export import STREAM_CAP, notebook, outputs
from simagent.notebooks.rerun import compare, execute, same
from simagent.presentation.footnotes import cited_cells, turn_answers
from simagent.trace.log import Event

SIMAGENT = [sys.executable, "-m", "simagent"]


# ------------------------------------------------------------------ pure: the plan
def _session(cells: list[tuple], outputs_dir: str = "/s/outputs") -> tuple[list, list]:
    """Events and records of cells ``(n, code, status[, lineage[, effects]])``."""
    events = [Event(0, "t", "session_start", {"workspace": "/ws", "simulator": "python"})]
    records = []
    for i, (n, code, status, *rest) in enumerate(cells):
        lineage = rest[0] if rest else 1
        effects = rest[1] if len(rest) > 1 else []
        cid = f"c{n}"
        events += [Event(0, "t", "tool_call", {"id": cid, "name": "run_python",
                                               "args": {"code": code}, "agent": "main"}),
                   Event(0, "t", "kernel_exec", {"tool_call_id": cid, "code": code,
                                                 "status": status,
                                                 "raw_path": f"{outputs_dir}/{n:04d}.txt"}),
                   Event(0, "t", "tool_result", {"tool_call_id": cid, "content": f"out {n}"})]
        records.append({"n": n, "code": code, "status": status, "elapsed_s": 0.1 * i,
                        "lineage": lineage, "effects": effects,
                        "error": "ZeroDivisionError: division by zero"
                        if status == "error" else None})
    return events, records


def test_plan_keeps_the_cells_that_define_state_and_tags_the_rest_with_all():
    events, records = _session([(1, "x = 1", "ok"), (2, "w = 2\n1/0", "error"),
                                (3, "print(x)", "ok"), (4, "z = x + 1", "ok")])
    pl = nbplan.plan(events, records, "S")
    assert [c.n for c in pl.code] == [1, 4] and pl.concerns == []
    every = nbplan.plan(events, records, "S", all_cells=True)
    assert [(c.n, c.kind) for c in every.code] == [(1, "kept"), (2, "failed"),
                                                   (3, "display"), (4, "kept")]
    for ev in events:  # a cell that printed nothing has no raw output file
        if ev.kind == "kernel_exec" and ev.payload["code"] == "z = x + 1":
            ev.payload["raw_path"] = None
    assert [c.n for c in nbplan.plan(events, records, "S").code] == [1, 4]
    tags = {c.n: c.tags for c in every.code}
    assert tags[2] == ["simagent-failed", "skip-execution"]
    assert tags[3] == ["simagent-display", "skip-execution"] and tags[1] == []


def test_a_failed_cell_that_later_cells_use_is_kept_expecting_its_error():
    """An error part-way through a cell leaves what it defined before the error; a later
    cell that uses it needs the failed cell, and the export says so."""
    events, records = _session([(1, "import math", "ok"), (2, "low = 3\n1/0", "error"),
                                (3, "high = low * 2", "ok"), (4, "wide = 1\n1/0", "error"),
                                (5, "wide = 2\nprint(wide)", "ok")])
    pl = nbplan.plan(events, records, "S")
    # cell 5 defines `wide` itself before using it: failed cell 4 is not needed
    assert [(c.n, c.kind) for c in pl.code] == [(1, "kept"), (2, "needed"), (3, "kept"),
                                                (5, "kept")]
    assert pl.code[1].tags == ["simagent-failed", "raises-exception"]
    (line,) = pl.concerns
    assert "cell [3]" in line and "`low`" in line and "cell [2]" in line and "failed" in line
    # a failed cell that changed an object a kept cell made, before its error
    events, records = _session([(1, "params = {}", "ok"), (2, "params['Ni'] = 3.5\n1/0",
                                                           "error"),
                                (3, "a = params['Ni'] * 2", "ok")])
    assert [c.kind for c in nbplan.plan(events, records, "S").code] == ["kept", "needed",
                                                                        "kept"]
    # ... or called a function of an earlier cell, which may change anything; a failed
    # cell that only read a name changed nothing and stays out
    events, records = _session([
        (1, "state = {}\ndef bump():\n    state['k'] = 1", "ok"),
        (2, "bump()\n1/0", "error"), (3, "half = len(state) / 0", "error"),
        (4, "v = state['k']", "ok")])
    pl = nbplan.plan(events, records, "S")
    assert [(c.n, c.kind) for c in pl.code] == [(1, "kept"), (2, "needed"), (4, "kept")]
    assert "it calls bump" in pl.concerns[0]


def test_cells_before_a_reset_go_under_their_own_heading_or_are_left_out():
    events, records = _session([(1, "a = 1", "ok", 1), (2, "b = 2", "ok", 1),
                                (3, "c = 3", "ok", 2), (4, "d = a + c", "ok", 2)])
    pl = nbplan.plan(events, records, "S")
    shape = [i if isinstance(i, str) else (i.n, i.kind) for i in pl.items
             if not isinstance(i, nbplan.Text)]
    assert shape == ["Before a /reset (these cells are not re-run)", (1, "earlier"),
                     (2, "earlier"), "After the /reset", (3, "kept"), (4, "kept")]
    assert pl.code[0].tags == ["simagent-before-reset", "skip-execution"]
    assert any("`a`" in c and "cell [1]" in c and "not re-run" in c for c in pl.concerns)
    left = nbplan.plan(events, records, "S", earlier=False)
    assert [i.n for i in left.items if isinstance(i, nbplan.Code)] == [3, 4]
    assert not [i for i in left.items if isinstance(i, str)]


def test_concerns_name_input_the_out_handle_and_files_deleted():
    delete = [{"kind": "delete", "path": "/ws/data.csv"},
              {"kind": "delete", "path": "/tmp/dask-scratch-space/worker-1.dirlock"}]
    events, records = _session([
        (1, "raw = open('data.csv').read()", "ok"),
        (2, "name = input('who? ')", "ok"),
        (3, "prev = _out[1].text", "ok"),
        (4, "import os\nos.remove('data.csv')", "ok", 1, delete)])
    pl = nbplan.plan(events, records, "S", base="/ws")
    text = "\n".join(pl.concerns)
    assert [c.n for c in pl.code] == [1, 2, 3, 4]  # a delete is kept, and named
    assert "cell [1]" in text and "data.csv, which cell [4] deleted later" in text
    assert "cell [2]" in text and "input()" in text
    assert "cell [3]" in text and "`_out`" in text
    assert "cell [4]" in text and "deletes data.csv, which no exported cell creates" in text
    assert "dask" not in text  # a library's own temp file, not named by the cell
    assert pl.code[3].effects == ("deletes /ws/data.csv",
                                  "deletes /tmp/dask-scratch-space/worker-1.dirlock")
    # `_out` reads the session's saved outputs, set up by the notebook's first code cell
    nb = notebook(pl)
    setup = next(c for c in nb.cells if c.cell_type == "code")
    assert setup.metadata["tags"] == ["simagent-setup"]
    assert "_out = Outputs('/s/outputs')" in setup.source


def test_markdown_holds_requests_answers_and_key_value_tables():
    events, records = _session([(1, "x = 1", "ok")])
    events = [events[0], Event(0, "t", "message_user", {"content": "fit it", "turn": 1}),
              *events[1:],
              Event(0, "t", "message_assistant", {"content": "thinking", "agent": "main"}),
              Event(0, "t", "subagent_end", {"name": "run-analyst", "report": {
                  "answer": "digested", "key_values": [
                      {"name": "capacity", "value": "2.30316", "unit": "A.h"}]}}),
              Event(0, "t", "message_assistant", {"content": "Done: x is 1", "agent": "main"})]
    nb = notebook(nbplan.plan(events, records, "S"))
    md = [c.source for c in nb.cells if c.cell_type == "markdown"]
    assert "> fit it" in md[1] and "run-analyst" in md[2]
    assert "| capacity | 2.30316 | A.h |" in md[2]
    assert md[-1].endswith("Done: x is 1") and not any("thinking" in m for m in md)
    nbformat.validate(nb)


# ----------------------------------------------------------------- pure: the outputs
def _code(text: str, status: str = "ok", **kw) -> nbplan.Code:
    return nbplan.Code(n=7, code="x", kind="kept", status=status, text=text, **kw)


def test_outputs_split_the_model_text_into_stream_value_error_and_figures(tmp_path):
    png = tmp_path / "fig.png"
    png.write_bytes(base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQV"
                                     "R4nGNgAAAAAgAB4iG8MwAAAABJRU5ErkJggg=="))
    outs = outputs(_code("hello\n[stderr]\nwarn\nOut[3]: 42\n[figure fig-1 1x1: f.png]\n"
                         "  axes 1", figures=(str(png),)))
    assert [o.output_type for o in outs] == ["stream", "stream", "execute_result",
                                             "display_data"]
    assert outs[0].text == "hello\n" and outs[1].name == "stderr"
    assert outs[2].data["text/plain"] == "42" and outs[2].execution_count == 7
    assert outs[3].data["image/png"] == base64.b64encode(png.read_bytes()).decode()
    assert outs[3].data["text/plain"].startswith("[figure fig-1 1x1")
    err = "Traceback:\n  line 1\nZeroDivisionError: division by zero"
    outs = outputs(_code("partial\n" + err, "error", error=err))
    assert outs[0].text == "partial\n" and outs[-1].ename == "ZeroDivisionError"
    assert outs[-1].evalue == "division by zero"


def test_long_stream_text_is_capped_with_a_note_naming_the_raw_file():
    text = "".join(f"line {i}\n" for i in range(20_000))
    (out,) = outputs(_code(text, raw_path="/s/outputs/0007.txt"))
    assert len(out.text) < STREAM_CAP + 300
    assert "the full output is /s/outputs/0007.txt" in out.text
    assert out.text.startswith("line 0\n") and out.text.rstrip().endswith("line 19999")


def test_compare_checks_numbers_to_the_digits_shown():
    assert same("2.30316", "2.303164") and not same("2.30316", "2.30318")
    assert same("5.605e-13", "5.6054e-13") and not same("1637", "1638")

    def nb(text: str) -> nbformat.NotebookNode:
        cell = nbformat.v4.new_code_cell("x", outputs=[nbformat.v4.new_output(
            "stream", name="stdout", text=text)])
        return nbformat.v4.new_notebook(cells=[cell])

    before = nb("took 0.019 s\nQ_end_Ah=2.30316 t=552.76\n")
    kvs = [{"name": "Q", "value": "2.30316"}, {"name": "t", "value": 552.76},
           {"name": "label", "value": "none"}]
    ok = compare(before, nb("took 0.031 s\nQ_end_Ah=2.30316 t=552.76\n"), kvs)
    assert [(c.name, c.ok) for c in ok] == [("Q", True), ("t", True)]
    bad = compare(before, nb("took 0.031 s\nQ_end_Ah=2.40000 t=552.76\n"), kvs)
    assert (bad[0].name, bad[0].ok, bad[0].got) == ("Q", False, "2.40000")


# --------------------------------------------------------- the command, real sessions
def _cli(workspace: Path, *args: str, env: dict | None = None, timeout: float = 240
         ) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "SIMAGENT_MODEL"} | (env or {})
    return cli_fork.run([*SIMAGENT, *args], cwd=workspace, env=full, text=True,
                        capture_output=True, timeout=timeout)


def _script(path: Path, steps: list[dict]) -> str:
    path.write_text(json.dumps(steps))
    return f"scripted:{path}"


def _events(state_dir: Path, kind: str) -> list[dict]:
    db = sqlite3.connect(state_dir / "trace.sqlite")
    try:
        return [json.loads(p) for (p,) in db.execute(
            "SELECT payload FROM events WHERE kind = ? ORDER BY id", (kind,))]
    finally:
        db.close()


FIGURE = ("import matplotlib.pyplot as plt\n"
          "fig, ax = plt.subplots()\nax.plot([1, 2, 3], [2, 4, 8])\nplt.show()")


@pytest.fixture(scope="module")
def scripted_session(tmp_path_factory) -> tuple[Path, dict, dict]:
    """One real session (a state cell, a failing cell, a display cell, a figure) and the
    environment its state folder is found with (the module's own SIMAGENT_HOME)."""
    root = tmp_path_factory.mktemp("nbsession")
    workspace = root / "workspace"
    workspace.mkdir()
    env = {"SIMAGENT_HOME": str(root / "home")}
    model = _script(root / "s.json", [
        {"tool": "run_python", "args": {"code": "total = sum(range(10))\n"
                                                "print('total', total)"}},
        {"tool": "run_python", "args": {"code": "half = total / 0"}},
        # labelled as the first cell's line is: both show "total 45", the latest is the
        # source. A bare "45" here was the source or not by how many numbers near 45 the
        # session's paths held (hex ids such as f46a in a figure's path): chance, not order
        {"tool": "run_python", "args": {"code": "print('total', total)"}},
        {"tool": "run_python", "args": {"code": FIGURE}},
        {"tool": "run_python", "args": {"code": "doubled = total * 2\ndoubled"}},
        {"final": "The total is 45."}])
    proc = _cli(workspace, "run", "--model", model, "--json", "add up 0..9", env=env)
    assert proc.returncode == 0, proc.stderr
    return workspace, json.loads(proc.stdout), env


@pytest.mark.slow
def test_notebook_command_writes_a_notebook_that_reruns(scripted_session, tmp_path):
    workspace, run, env = scripted_session
    proc = _cli(workspace, "notebook", "-o", str(tmp_path / "s.ipynb"), env=env)
    assert proc.returncode == 0, proc.stderr
    # three cells and the simulator's warm-up (its imports are state too)
    assert proc.stderr.startswith(f"notebook written: {tmp_path / 's.ipynb'} (4 code cells")
    nb = nbformat.read(tmp_path / "s.ipynb", as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"
            and not c.metadata["simagent"].get("warmup")]  # the simulator's warm-up cell
    assert [c.source for c in code] == ["total = sum(range(10))\nprint('total', total)",
                                        "print('total', total)", FIGURE,
                                        "doubled = total * 2\ndoubled"]
    # the display cell printed the answer's 45 last: shown for its footnote, skipped by a re-run
    assert code[1].metadata["tags"] == ["simagent-display", "skip-execution"]
    assert code[0].outputs[0].text == "total 45\n"
    assert any("image/png" in o.get("data", {}) for o in code[2].outputs)
    assert code[3].outputs[0].data["text/plain"] == "90"
    meta = code[0].metadata["simagent"]
    assert meta["session_id"] == run["session_id"] and meta["n"] == code[0].execution_count
    assert nb.metadata.kernelspec.name == "python3"
    md = [c.source for c in nb.cells if c.cell_type == "markdown"]
    assert "> add up 0..9" in md[1]
    assert f"The total is 45[[1]](#cell-{code[1].execution_count})." in md[-1]
    done, _, error = execute(nb, tmp_path)
    assert error is None
    last = next(c for c in done.cells if c.source == "doubled = total * 2\ndoubled")
    assert last.outputs[0].data["text/plain"] == "90"  # ran again, not the old output
    # recorded: `sessions` shows it, the HTML transcript links it
    (event,) = _events(Path(run["state_dir"]), "notebook_written")
    assert event["path"] == str(tmp_path / "s.ipynb") and event["cells"] == 4
    listing = _cli(workspace, "sessions", env=env)
    assert listing.stdout.splitlines()[0].split()[6] == "notebook"  # after tokens in/out
    assert " yes " in listing.stdout.splitlines()[1]
    page = _cli(workspace, "transcript", "-o", str(tmp_path / "t.html"), env=env)
    assert page.returncode == 0
    assert f'href="{(tmp_path / "s.ipynb").as_uri()}"' in (tmp_path / "t.html").read_text()


@pytest.mark.slow
def test_all_writes_failed_and_display_cells_tagged_and_nbclient_skips_them(
        scripted_session, tmp_path):
    workspace, run, env = scripted_session
    proc = _cli(workspace, "notebook", run["session_id"][:12], "--all",
                "-o", str(tmp_path / "all.ipynb"), env=env)
    assert proc.returncode == 0, proc.stderr
    nb = nbformat.read(tmp_path / "all.ipynb", as_version=4)
    tags = {c.source: c.metadata.get("tags", []) for c in nb.cells if c.cell_type == "code"}
    assert tags["half = total / 0"] == ["simagent-failed", "skip-execution"]
    assert tags["print('total', total)"] == ["simagent-display", "skip-execution"]
    failed = next(c for c in nb.cells if c.source == "half = total / 0")
    assert failed.outputs[-1].ename == "ZeroDivisionError"
    done, _, error = execute(nb, tmp_path)  # would stop on the failed cell if run
    assert error is None
    assert next(c for c in done.cells if c.source == "half = total / 0").outputs[-1].ename \
        == "ZeroDivisionError"  # skipped: the session's outputs kept


@pytest.mark.slow
def test_default_path_is_the_session_id_in_the_workspace(scripted_session):
    workspace, run, env = scripted_session
    proc = _cli(workspace, "notebook", env=env)
    assert proc.returncode == 0, proc.stderr
    path = workspace / f"{run['session_id']}.ipynb"
    nbformat.validate(nbformat.read(path, as_version=4))
    path.unlink()


@pytest.mark.slow
def test_bad_input_is_one_line_and_writes_nothing(scripted_session, tmp_path):
    workspace, run, env = scripted_session
    before = len(_events(Path(run["state_dir"]), "notebook_written"))
    for args, says in [(("nope",), "no session matches 'nope'"),
                       (("-o", str(tmp_path / "missing" / "x.ipynb")), "does not exist"),
                       (("-o", str(tmp_path)), "is a folder"),
                       (("-o", "/proc/x.ipynb"), "cannot write /proc/x.ipynb")]:
        proc = _cli(workspace, "notebook", *args, env=env)
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and says in proc.stderr
    assert not list(tmp_path.rglob("*.ipynb")) and not list(workspace.glob("*.ipynb"))
    assert len(_events(Path(run["state_dir"]), "notebook_written")) == before


@pytest.mark.slow
def test_a_session_with_no_code_gets_one_line_and_no_file(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    model = _script(tmp_path / "s.json", [{"final": "hello"}])
    assert _cli(workspace, "run", "--model", model, "hi").returncode == 0
    proc = _cli(workspace, "notebook")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "ran no code that defines state" in proc.stderr
    assert not list(workspace.glob("*.ipynb"))


@pytest.mark.slow
def test_run_notebook_writes_after_the_turn_and_checks_the_path_first(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    model = _script(tmp_path / "s.json", [
        {"tool": "run_python", "args": {"code": "k = 3 ** 4\nprint(k)"}}, {"final": "81"}])
    bad = _cli(workspace, "run", "--model", model, "--notebook",
               str(tmp_path / "no" / "x.ipynb"), "go")
    assert bad.returncode == 2 and "does not exist" in bad.stderr
    from simagent.trace.sessions import list_sessions

    assert list_sessions(workspace) == []  # nothing ran
    proc = _cli(workspace, "run", "--model", model, "--notebook", "out.ipynb", "go")
    assert proc.returncode == 0, proc.stderr
    assert f"notebook written: {workspace / 'out.ipynb'} (2 code cells" in proc.stderr
    nb = nbformat.read(workspace / "out.ipynb", as_version=4)
    assert [c.source for c in nb.cells if c.cell_type == "code"
            and not c.metadata["simagent"].get("warmup")] == ["k = 3 ** 4\nprint(k)"]
    assert list_sessions(workspace)[0].notebook == str(workspace / "out.ipynb")


@pytest.mark.slow
def test_secrets_from_the_environment_never_reach_the_notebook(tmp_path):
    """One secret is in the environment while the session runs (the trace redacts it),
    one only when the notebook is written: neither appears in the file."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    during, later = "sk-live-Q8w7e6r5t4y3u2i1", "tok-ZYXW98765432abcd"
    code = ("import os\nkey = os.environ['DEMO_API_KEY']\n"
            "label = 'tok-' + 'ZYXW98765432abcd'\nprint(key, label)")
    model = _script(tmp_path / "s.json", [{"tool": "run_python", "args": {"code": code}},
                                          {"final": "printed"}])
    assert _cli(workspace, "run", "--model", model, "go",
                env={"DEMO_API_KEY": during}).returncode == 0
    proc = _cli(workspace, "notebook", "-o", "nb.ipynb",
                env={"DEMO_API_KEY": during, "LATER_TOKEN": later})
    assert proc.returncode == 0, proc.stderr
    text = (workspace / "nb.ipynb").read_text()
    assert during not in text and later not in text
    assert "[redacted:DEMO_API_KEY]" in text and "[redacted:LATER_TOKEN]" in text


@pytest.mark.slow
def test_tui_notebook_command_writes_the_session(workspace, tmp_path):
    from test_tui_app import drive

    model = _script(tmp_path / "s.json", [
        {"tool": "run_python", "args": {"code": "side = 7\nprint(side * side)"}},
        {"final": "49"}])
    target = tmp_path / "tui.ipynb"

    async def scenario(d) -> None:
        await d.type("square seven")
        await d.enter()
        await d.idle()
        await d.type(f"/notebook {target}")
        await d.enter()
        await d.expect(lambda: "notebook written" in d.text(), timeout=60)

    drive(workspace, scenario, model=model)
    nb = nbformat.read(target, as_version=4)
    nbformat.validate(nb)
    assert "side = 7\nprint(side * side)" in [c.source for c in nb.cells]


def test_an_answers_numbers_link_to_their_cells_which_are_shown_with_an_anchor(tmp_path):
    """The answer cell's footnotes link to an anchor set just above each cited cell; a
    display-only cell that printed a cited number is shown (tagged, skipped by a
    re-run), so the link lands; the numbers ride in the cell's metadata."""
    (tmp_path / "0001.txt").write_text("k_fit = 0.31647\n")
    (tmp_path / "0002.txt").write_text("tau_ms = 2.6753\n")
    events, records = _session([(1, "k = 0.31647\nprint('k_fit =', k)", "ok"),
                                (2, "print('tau_ms =', 2.6753)", "ok")], str(tmp_path))
    events = [Event(i, "t", e.kind, e.payload) for i, e in enumerate(
        [events[0], Event(0, "t", "message_user", {"content": "fit it", "turn": 1}),
         *events[1:], Event(0, "t", "message_assistant", {
             "content": "k is 0.316, tau 2.68, 2.36 apart; R0 is 3.9.", "agent": "main"})])]
    numbers = turn_answers(events)
    assert cited_cells(numbers) == {1, 2}
    pl = nbplan.plan(events, records, "S", cited=cited_cells(numbers))
    pl.numbers = numbers
    nb = notebook(pl)
    kinds = [(c.cell_type, c.source.splitlines()[0]) for c in nb.cells][-5:]
    assert kinds == [("markdown", '#### <a id="cell-1"></a>Cell 1'),
                     ("code", "k = 0.31647"),
                     ("markdown", '#### <a id="cell-2"></a>Cell 2'),
                     ("code", "print('tau_ms =', 2.6753)"),
                     ("markdown", "**Answer**")]
    assert nb.cells[-2].metadata["tags"] == ["simagent-display", "skip-execution"]
    answer = nb.cells[-1]
    assert ("k is 0.316[[1]](#cell-1), tau 2.68[[2]](#cell-2), 2.36[3] apart; R0 is 3.9[?]."
            in answer.source)
    assert "- [1] [cell 1, output line 1](#cell-1): `k_fit = 0.31647`" in answer.source
    assert "- [3] = [2] - [1] (difference)" in answer.source
    assert [n["status"] for n in answer.metadata["simagent"]["numbers"]] == [
        "sourced", "sourced", "derived", "unsourced"]
    nbformat.validate(nb)
