"""``_out[n]``: earlier executions' outputs as objects in the real kernel (issue 15, item 1).

The pure part (numbering, streaming, ``\\r`` redraws, context, records) is checked on files
written here; everything else runs in a real ipykernel started by simagent's supervisor.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from langchain_core.messages import ToolMessage

from simagent.context.placeholders import recovery_hint
from simagent.kernel import Kernel
from simagent.kernel_api.outputs import (
    Outputs,
    handle,
    number_of,
    raw_name,
    record_name,
    write_record,
)
from simagent.paths import SessionPaths

#: the kernel process is what these tests are about (make test-real)
pytestmark = pytest.mark.real

LOG = "".join(f"step {k:4d} residual={1.0 / (k + 1):.3e}\n" for k in range(3000)) \
    + "WARNING: dt reduced\n" + "final residual 3.3e-04\n"


def _folder(tmp_path: Path, texts: dict[int, str], running: int | None = None) -> Outputs:
    out = tmp_path / "outputs"
    out.mkdir()
    for n, text in texts.items():
        (out / raw_name(n)).write_text(text)
        if n != running:
            write_record(out, n, {"n": n, "code": f"cell {n}", "status": "ok", "elapsed_s": 1.5})
    return Outputs(out)


def test_records_number_lines_and_stream(tmp_path: Path) -> None:
    out = _folder(tmp_path, {1: "a\nb\n", 2: LOG, 3: "still printing"}, running=3)
    assert len(out) == 2 and out[-1].n == 2 and out[-2].n == 1  # the running cell is not -1
    log = out[2]
    assert [(x.number, x.text) for x in log.head(2)] == [(1, "step    0 residual=1.000e+00"),
                                                        (2, "step    1 residual=5.000e-01")]
    assert [(x.number, x.text) for x in log.tail(2)] == [(3001, "WARNING: dt reduced"),
                                                        (3002, "final residual 3.3e-04")]
    hits = log.grep(r"WARNING", context=1)
    assert [x.number for x in hits] == [3000, 3001, 3002]
    assert len(log.grep(r"residual", max_matches=5)) == 5
    assert log.grep("nothing like this") == [] and repr(log.grep("nothing")) == "(no lines)"
    assert log.code == "cell 2" and log.status == "ok" and log.elapsed == 1.5
    assert log.line_count() == 3002 == len(log.lines)
    text = repr(log)
    assert text.startswith("_out[2]: ok, ") and "final residual" in text and len(text) < 400
    assert out[3].status == "unknown" and out[3].running  # readable while it runs
    with pytest.raises(KeyError, match=r"_out\[9\]: no such execution \(executions: 1..2\)"):
        out[9]
    with pytest.raises(IndexError, match="only 2 earlier"):
        out[-3]


def test_progress_redraws_show_their_last_state(tmp_path: Path) -> None:
    bar = "".join(f"\rcases {k}/5" for k in range(6)) + "\ndone\n"
    out = _folder(tmp_path, {1: bar})
    assert [x.text for x in out[1].head(5)] == ["cases 5/5", "done"]
    assert out[1].tail(1)[0].number == 2 and out[1].grep("cases")[0].text == "cases 5/5"


def test_a_record_the_disk_refused_leaves_the_text_readable(tmp_path: Path) -> None:
    folder = tmp_path / "outputs"
    folder.mkdir()
    (folder / raw_name(1)).write_text("x = 1\n")
    (folder / "0001.json.tmp").mkdir()  # the write fails as on a full or read-only disk
    assert write_record(folder, 1, {"status": "ok"}) is False
    assert not (folder / record_name(1)).exists()
    assert Outputs(folder)[1].tail(1)[0].text == "x = 1"


def test_handles_come_from_raw_paths() -> None:
    assert number_of("/s/outputs/0012.txt") == 12 and handle(12) == "_out[12]"
    assert number_of("/s/large_tool_results/0012.txt") is None and number_of(None) is None


@pytest.fixture
def kernel(session_paths: SessionPaths, workspace: Path) -> Iterator[Kernel]:
    with Kernel(session_paths, cwd=workspace) as k:
        yield k


def test_out_in_the_kernel_survives_a_restart(kernel: Kernel) -> None:
    first = kernel.execute("for k in range(3000):\n    print(f'row {k} val={k * 1.5:.3e}')\n"
                           "print('final=42')")
    assert first.ok
    # the model-facing text names the handle next to the path, with the omitted lines
    assert re.search(r"not shown: _out\[1\]\.slice\(\d+, \d+\) or \.grep\(pattern\)",
                     first.model_text(cap=2000))
    kernel.execute("1/0")
    r = kernel.execute("print(_out[1].grep('final'), _out[-1].status)\n"
                       "print(_out[-1].error.splitlines()[-1]); print(_out[-2].code[:8])\n"
                       "print(len(_out))")
    assert r.stdout.splitlines() == ["   3001: final=42 error", "ZeroDivisionError: division "
                                     "by zero", "for k in", "2"]
    rec = json.loads((kernel.paths.outputs / record_name(2)).read_text())
    assert rec["status"] == "error" and rec["code"] == "1/0"
    kernel.restart()
    r = kernel.execute("print(_out[1].tail(1)[0].text, len(_out))\n%who")
    assert r.stdout.splitlines() == ["final=42 3", "Interactive namespace is empty."]


def test_a_record_file_is_made_while_its_cell_runs_and_renamed_when_it_ends(
        kernel: Kernel) -> None:
    # made while the cell runs (off the round trip: just after the request is sent, so the
    # cell waits for it, bounded), listed by no reader until it is whole
    r = kernel.execute(f"import os, time\nd = {str(kernel.paths.outputs)!r}\n"
                       "t = time.monotonic()\n"
                       "while not os.listdir(d) and time.monotonic() - t < 10:\n"
                       "    time.sleep(0.01)\n"
                       "print(sorted(os.listdir(d)), len(_out))")
    assert r.stdout == "['0001.json.tmp'] 0"
    assert sorted(p.name for p in kernel.paths.outputs.iterdir()) == ["0001.json", "0001.txt"]
    assert json.loads((kernel.paths.outputs / "0001.json").read_text())["status"] == "ok"


def test_figures_are_in_the_record(kernel: Kernel) -> None:
    fig = kernel.execute("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
    assert fig.ok and fig.displays
    r = kernel.execute("print(_out[-1].figures)")
    paths = json.loads(r.stdout.strip().replace("'", '"'))
    assert paths and all(Path(p).is_file() and p.endswith(".png") for p in paths)


def test_a_cleared_result_names_its_handle() -> None:
    msg = ToolMessage("...", tool_call_id="c1",
                      artifact={"raw_path": "/s/sessions/x/outputs/0007.txt"})
    hint = recovery_hint(msg, "run_python")
    assert hint == "full output: _out[7]"  # paging it is said once, in the system prompt
    assert "/s/sessions/x/outputs/0007.txt" not in hint  # the handle is the pointer
    other = ToolMessage("...", tool_call_id="c2", artifact={"raw_path": "/s/evicted/c2"})
    assert "_out" not in recovery_hint(other, "execute")


def test_a_kernel_started_by_name_gets_out_too(session_paths: SessionPaths,
                                                workspace: Path) -> None:
    """Another kernelspec may run where simagent is not installed: ``_out`` is sent as the
    module's own source, so the handles the markers name exist there as well."""
    with Kernel(session_paths, cwd=workspace, kernel_name="python3") as k:
        k.execute("print('hello from a named kernel')")
        r = k.execute("print(type(_out).__module__, _out[-1].tail(1)[0].text)")
        assert r.stdout.strip() == "simagent_outputs hello from a named kernel"
        k.restart()
        r = k.execute("print(len(_out))\n%who")
        assert r.stdout.splitlines() == ["2", "Interactive namespace is empty."]
