"""The kernel boundary (kernel/port.py) and its in-memory stand-in (kernel/memory.py).

The stand-in is only worth having if the layers above cannot tell it from a kernel
process by what they read: the same cells give the same model text, status and records on
both transports (a real ipykernel here, so this file runs in the real-kernel half).
"""

from __future__ import annotations

import inspect
import io
import os
import re
import sys
import threading
import time
from pathlib import Path

import pytest

from simagent.kernel import Kernel, KernelPort, KernelStatus
from simagent.kernel.memory import SEAM_ENV, selected
from simagent.kernel.recoverable import LadderKernel
from simagent.kernel_api.outputs import record_name
from simagent.paths import SessionPaths

pytestmark = pytest.mark.real

CELLS = [
    "x = 21\nprint('hi')\nx * 2",
    "1/0",
    "import sys; print('to stderr', file=sys.stderr)",
    "def f(:\n    pass",
    "from IPython.display import Markdown, display\ndisplay(Markdown('**b**'))",
    "_out[1].text",
    "import numpy as np; np.arange(3)",
    "None",
    "for i in range(3): print(i)",
]
_FIGURE = re.compile(r"fig-[0-9a-f]+|/\S+/artifacts/")


def _run(transport: str, workspace: Path) -> tuple[list[tuple[str, int, str]], KernelStatus]:
    with Kernel(SessionPaths(workspace / "session"), cwd=workspace, transport=transport) as k:
        seen = [(r.status, r.execution_count, _FIGURE.sub("F", r.model_text()))
                for r in (k.execute(c, timeout=60) for c in CELLS)]
        plot = k.execute("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3]); plt.title('t')",
                         timeout=60)
        seen.append((plot.status, plot.execution_count, _FIGURE.sub("F", plot.model_text())))
        return seen, k.status()


def test_the_port_is_small_and_both_transports_are_one_kernel(tmp_path: Path) -> None:
    methods = [n for n, v in vars(KernelPort).items()
               if callable(v) and not n.startswith("_")]
    assert len(methods) <= 8, methods
    for transport in ("process", "memory"):
        kernel = Kernel(SessionPaths(tmp_path / transport), cwd=tmp_path, transport=transport)
        assert isinstance(kernel, KernelPort)
        for name in methods:  # same signature as the port promises
            assert list(inspect.signature(getattr(kernel, name)).parameters) == \
                [p for p in inspect.signature(getattr(KernelPort, name)).parameters
                 if p != "self"], name


def test_the_ladder_takes_the_port_and_four_members_more(tmp_path: Path) -> None:
    """The recovery ladder's view (kernel/recoverable.py) is the port plus a few members,
    not a bag of the supervisor's attributes; every transport's supervisor has them."""
    own = {n: v for n, v in vars(LadderKernel).items() if not n.startswith("_")}
    members = sorted({n for n, v in own.items() if callable(v)}
                     | set(LadderKernel.__annotations__))
    assert members == ["hold_for_replay", "replay_source", "respawn", "run_quiet"], members
    assert KernelPort in LadderKernel.__mro__
    for transport in ("process", "memory"):
        kernel = Kernel(SessionPaths(tmp_path / transport), cwd=tmp_path, transport=transport)
        assert isinstance(kernel, LadderKernel)
        for name in members:
            if callable(own.get(name)):
                assert list(inspect.signature(getattr(kernel, name)).parameters) == \
                    [p for p in inspect.signature(own[name]).parameters if p != "self"], name
        assert kernel.replay_source.paths.outputs == kernel.paths.outputs


@pytest.mark.slow
def test_same_cells_read_the_same_on_a_kernel_process_and_in_memory(tmp_path: Path) -> None:
    real, real_status = _run("process", tmp_path / "real")
    memory, memory_status = _run("memory", tmp_path / "memory")
    assert memory == real
    assert "Out[1]: 42" in real[0][2] and "ZeroDivisionError" in real[1][2]
    assert "line: 3 pts" in real[-1][2]  # the figure's data summary, on both
    for field in ("state", "alive", "owned", "executions", "generation", "lineage", "gone"):
        assert getattr(memory_status, field) == getattr(real_status, field), field
    assert real_status.pid and memory_status.pid is None


def test_records_and_raw_outputs_have_the_same_files(tmp_path: Path) -> None:
    for transport in ("process", "memory"):
        paths = SessionPaths(tmp_path / transport)
        with Kernel(paths, cwd=tmp_path, transport=transport) as k:
            k.execute("print('a')", timeout=60)
            k.execute("y = 1", timeout=60)
        assert (paths.outputs / record_name(1)).is_file()
        assert (paths.outputs / "0001.txt").read_text() == "a\n"


def test_in_memory_cells_run_in_the_workspace_and_leave_the_process_as_it_was(
        tmp_path: Path) -> None:
    before = (os.getcwd(), sys.stdout, sys.stderr, sys.modules["__main__"])
    with Kernel(SessionPaths(tmp_path / "s"), cwd=tmp_path, transport="memory") as k:
        r = k.execute("import os\nopen('made.txt', 'w').write('x')\nos.getcwd()", timeout=30)
        assert r.status == "ok" and str(tmp_path) in r.model_text()
        assert k.execute("import sys; sys.stdout.write('w'); 2", timeout=30).stdout == "w"
    assert (tmp_path / "made.txt").read_text() == "x"
    assert (os.getcwd(), sys.stdout, sys.stderr, sys.modules["__main__"]) == before


def test_two_in_memory_kernels_do_not_share_names(tmp_path: Path) -> None:
    with Kernel(SessionPaths(tmp_path / "a"), cwd=tmp_path, transport="memory") as a, \
            Kernel(SessionPaths(tmp_path / "b"), cwd=tmp_path, transport="memory") as b:
        a.execute("only_here = 1", timeout=30)
        assert "NameError" in b.execute("only_here", timeout=30).model_text()
        assert a.execute("only_here", timeout=30).model_text() == "Out[2]: 1"


def test_in_memory_interrupt_restart_and_kill(tmp_path: Path) -> None:
    with Kernel(SessionPaths(tmp_path / "s"), cwd=tmp_path, transport="memory") as k:
        k.execute("kept = 5", timeout=30)
        threading.Timer(0.5, k.interrupt).start()
        t0 = time.monotonic()
        r = k.execute("while True:\n    pass", timeout=60)
        assert r.status == "interrupted" and time.monotonic() - t0 < 30
        assert k.execute("kept", timeout=30).model_text() == "Out[3]: 5"  # state kept
        k.restart()
        assert "NameError" in k.execute("kept", timeout=30).model_text()
        assert k.status().generation == 2


def test_in_memory_timeout_interrupts_the_cell(tmp_path: Path) -> None:
    with Kernel(SessionPaths(tmp_path / "s"), cwd=tmp_path, transport="memory") as k:
        r = k.execute("n = 0\nwhile True:\n    n += 1", timeout=1)
        assert r.status == "timeout"
        assert k.execute("n > 0", timeout=30).model_text().endswith("True")  # state kept


def test_the_environment_selects_the_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SEAM_ENV, raising=False)
    assert not selected() and selected("memory") and not selected("process")
    monkeypatch.setenv(SEAM_ENV, "memory")
    assert selected() and not selected("process")


def test_a_stream_without_a_descriptor_says_so(tmp_path: Path) -> None:
    with Kernel(SessionPaths(tmp_path / "s"), cwd=tmp_path, transport="memory") as k:
        r = k.execute("import sys\ntry:\n    sys.stdout.fileno()\nexcept Exception as e:\n"
                      "    print(type(e).__name__)", timeout=30)
        assert r.stdout.strip() == io.UnsupportedOperation.__name__
