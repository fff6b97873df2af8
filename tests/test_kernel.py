"""The kernel supervisor on a real ipykernel: capture, caps, interrupts, deaths, launcher."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import joined, run_until_output

from simagent.kernel import Kernel, OutputEvent
from simagent.kernel.replay import ReplayBudget
from simagent.kernel.result import MODEL_TEXT_CAP
from simagent.paths import SessionPaths

#: the kernel process is what these tests are about (make test-real)
pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    """One kernel for the tests that leave it healthy (start-up costs ~0.7 s)."""
    root = tmp_path_factory.mktemp("shared")
    ws = root / "ws"
    ws.mkdir()
    with Kernel(SessionPaths(root / "session"), cwd=ws) as k:
        yield k


@pytest.fixture
def kernel(session_paths: SessionPaths, workspace: Path) -> Iterator[Kernel]:
    """A private kernel for tests that kill, restart or wedge it. Replay is off, so a
    restart loses state (test_kernel_recovery.py covers the replay)."""
    with Kernel(session_paths, cwd=workspace, interrupt_grace_s=1.5,
                replay=ReplayBudget(enabled=False)) as k:
        yield k


def test_streams_value_and_their_order(shared: Kernel) -> None:
    events: list[OutputEvent] = []
    r = shared.execute(
        "import sys\nprint('out1')\nprint('err1', file=sys.stderr)\nprint('out2')\n"
        "sys.stderr.write('err2\\n')\n6 * 7", on_output=events.append)
    assert r.status == "ok"
    assert (r.stdout, r.stderr, r.value) == ("out1\nout2", "err1\nerr2", "42")
    text = r.model_text()
    assert text.index("out2") < text.index("[stderr]") < text.index("err2") < text.index("42")
    assert "".join(e.text for e in events if e.kind == "stdout") == "out1\nout2\n"
    assert r.raw_path is not None and "out1" in r.raw_path.read_text()


def test_errors_have_compact_colourless_tracebacks(shared: Kernel, tmp_path: Path) -> None:
    (Path(shared.cwd) / "deeplib.py").write_text(
        "".join(f"def f{i}(x):\n    return f{i + 1}(x)\n" for i in range(30))
        + "def f30(x):\n    raise ValueError(f'bad value {x}')\n")
    r = shared.execute("import deeplib\ny = 1\ndeeplib.f0(y)")
    assert r.status == "error" and r.error is not None
    assert (r.error.ename, r.error.evalue) == ("ValueError", "bad value 1")
    tb = r.error.traceback
    assert "\x1b" not in tb
    assert "Cell In[" in tb and "deeplib.f0(y)" in tb
    assert "library frames omitted" in tb and "raise ValueError" in tb
    assert tb.count("deeplib.py") <= 3
    assert r.model_text().rstrip().endswith("ValueError: bad value 1")


def test_figures_become_png_artifacts(shared: Kernel) -> None:
    r = shared.execute(
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3]); plt.show()\nplt.figure(); plt.bar([1], [2]); plt.show()")
    assert r.status == "ok"
    paths = [d.path for d in r.displays]
    assert len(paths) == 2 and len(set(paths)) == 2
    for p in paths:
        assert p is not None and p.parent == shared.paths.artifacts
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert str(p) in r.model_text()


def test_real_tqdm_collapses_in_the_kernel(shared: Kernel) -> None:
    pytest.importorskip("tqdm")
    r = shared.execute(
        "from tqdm import tqdm\n"
        "for i in tqdm(range(3), desc='outer', mininterval=0):\n"
        "    for j in tqdm(range(300), desc='inner', leave=False, mininterval=0):\n"
        "        pass\n"
        "    tqdm.write(f'epoch {i}')\n"
        "for k in tqdm(range(5000), desc='single', mininterval=0):\n"
        "    pass\n"
        "print('finished')")
    assert r.status == "ok"
    bars = r.stderr.splitlines()
    assert [b.split("|")[0] for b in bars] == ["outer: 100%", "single: 100%"]
    assert "5000/5000" in bars[1]
    assert r.stdout == "epoch 0\nepoch 1\nepoch 2\nfinished"
    assert r.raw_path is not None and r.raw_path.read_bytes().count(b"\r") > 1000


@pytest.mark.slow
def test_50mb_of_output_stays_bounded_and_the_raw_file_is_complete(shared: Kernel) -> None:
    n = 500_000  # 500k lines of 100 chars + newline = 50.5 MB
    r = shared.execute(
        "import sys\nblock = ''.join(f'line {i:09d} ' + 'x' * 85 + '\\n' for i in range(10_000))\n"
        f"for b in range({n} // 10_000):\n"
        "    sys.stdout.write(block.replace('line ', f'b{b:03d} '))\n"
        "print('THE END')")
    assert r.status == "ok"
    assert r.raw_path is not None
    assert r.raw_path.stat().st_size == n * 101 + len("THE END\n")
    with open(r.raw_path) as f:
        assert f.readline().startswith("b000 000000000 ")
    text = r.model_text()
    assert len(text) <= MODEL_TEXT_CAP + 500
    assert text.startswith("[output truncated:") and str(r.raw_path) in text.splitlines()[0]
    assert text.endswith("THE END")
    assert r.rows_dropped > 400_000


def test_interrupt_keeps_state(kernel: Kernel) -> None:
    assert kernel.execute("x = 41").ok
    for code in ("import time\nprint('started', flush=True)\ntime.sleep(60)",
                 "print('started', flush=True)\nwhile True:\n    pass"):
        th, box = run_until_output(kernel, code, "started")
        kernel.interrupt()
        r = joined(th, box)
        assert r.status == "interrupted" and not r.state_lost
        assert "state is kept" in r.notice
    assert kernel.execute("x + 1").value == "42"


def test_timeout_interrupts_and_keeps_state(kernel: Kernel) -> None:
    kernel.execute("y = 'kept'")
    r = kernel.execute("import time\ntime.sleep(60)", timeout=1)
    assert r.status == "timeout" and "timeout" in r.notice and not r.state_lost
    assert kernel.execute("y").value == "'kept'"


def test_cell_ignoring_sigint_is_restarted_after_the_grace(kernel: Kernel) -> None:
    kernel.execute("z = 1")
    th, box = run_until_output(
        kernel, "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                "print('ignoring', flush=True)\ntime.sleep(120)", "ignoring")
    kernel.interrupt()
    r = joined(th, box)
    assert r.status == "interrupted" and r.state_lost and "restarted" in r.notice
    after = kernel.execute("'z' in dir()")
    assert after.ok and after.value == "False"


def test_cell_ignoring_sigint_while_printing_is_restarted_too(kernel: Kernel) -> None:
    th, box = run_until_output(
        kernel, "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                "while True:\n    print('tick', flush=True)\n    time.sleep(0.02)", "tick")
    kernel.interrupt()
    r = joined(th, box)
    # no earlier cell defined state, so the restart lost nothing
    assert r.status == "interrupted" and not r.state_lost and "restarted" in r.notice
    assert r.stdout.startswith("tick")
    assert kernel.execute("1 + 1").value == "2"


def test_os_exit_is_reported_as_died_then_the_next_execute_works(kernel: Kernel) -> None:
    kernel.execute("w = 5")
    r = kernel.execute("import os\nos._exit(1)")
    assert r.status == "died" and r.state_lost
    assert "exited with code 1" in r.notice and str(kernel.paths.kernel_log) in r.notice
    assert kernel.state == "dead"
    nxt = kernel.execute("1 + 1")
    assert nxt.ok and nxt.value == "2"
    assert nxt.state_lost and "restarted" in nxt.notice
    assert kernel.execute("'w' in dir()").value == "False"


def test_segfault_names_the_signal_and_leaves_a_native_trace(kernel: Kernel) -> None:
    r = kernel.execute("import ctypes\nctypes.string_at(0)")
    assert r.status == "died" and "SIGSEGV" in r.notice
    assert "Fatal Python error" in kernel.paths.kernel_log.read_text(errors="replace")
    assert kernel.execute("2 + 2").value == "4"


def test_sigkill_like_the_oom_killer_is_reported(kernel: Kernel) -> None:
    r = kernel.execute("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    assert r.status == "died" and "SIGKILL" in r.notice and "out-of-memory" in r.notice
    assert kernel.execute("3 + 3").value == "6"


def test_input_fails_fast_with_a_clear_message(shared: Kernel) -> None:
    r = shared.execute("name = input('your name? ')", timeout=30)
    assert r.status == "error" and r.error is not None
    assert r.error.ename == "StdinNotImplementedError"
    assert "input() and getpass() are unavailable" in r.model_text()


def test_c_level_output_is_captured_even_without_newline(shared: Kernel) -> None:
    r = shared.execute(
        "import os, ctypes\nos.write(1, b'from os.write\\n')\n"
        "os.write(2, b'to fd 2\\n')\nctypes.CDLL(None).printf(b'printf tail')")
    assert r.ok
    assert r.stdout == "from os.write\nprintf tail"
    assert r.stderr == "to fd 2"


def test_multibyte_character_split_across_reads(shared: Kernel) -> None:
    r = shared.execute(
        "import os, time\ndata = 'energy \\u20ac \\u2588 done\\n'.encode()\n"
        "for i in range(len(data)):\n    os.write(1, data[i:i + 1])\n    time.sleep(0.005)")
    assert r.ok
    assert r.stdout == "energy € █ done"
    assert "\ufffd" not in r.stdout


def test_c_level_output_at_the_very_end_belongs_to_its_cell(shared: Kernel) -> None:
    # more than a pipe holds, its last piece written as the cell ends: all in this cell
    r = shared.execute("import os\nfor i in range(5):\n    os.write(1, str(i).encode() * 100_000)\n"
                       "_ = os.write(1, b'|end')")
    assert r.ok and r.raw_path is not None
    assert r.raw_path.read_text() == "".join(str(i) * 100_000 for i in range(5)) + "|end"
    for i in range(20):  # none runs late into the next cell
        r = shared.execute(f"import os\nos.write(1, b'c{i}')\n_ = os.write(2, b'e{i}')")
        assert (r.stdout, r.stderr) == (f"c{i}", f"e{i}")


def test_cwd_is_the_workspace_and_stderr_goes_to_the_log(kernel: Kernel, workspace: Path) -> None:
    assert kernel.execute("import os\nos.getcwd()").value == repr(str(workspace))
    assert "IPKernelApp" in kernel.paths.kernel_log.read_text()


def test_streaming_callback_sees_output_while_the_cell_runs(shared: Kernel) -> None:
    states: list[str] = []

    def on_output(ev: OutputEvent) -> None:
        if ev.kind == "stdout":
            states.append(shared.state)

    r = shared.execute("import time\nprint('start', flush=True)\ntime.sleep(1.0)\nprint('end')",
                       on_output=on_output)
    assert r.stdout == "start\nend"
    assert states[0] == "busy"


def test_clear_output_and_display_updates(shared: Kernel) -> None:
    r = shared.execute(
        "from IPython.display import clear_output, display\nprint('old')\nclear_output()\n"
        "print('new')\nh = display('first', display_id=True)\nh.update('second')")
    assert r.stdout == "new"
    assert [d.text for d in r.displays] == ["'second'"]


def test_raw_output_numbering_survives_a_new_kernel(session_paths: SessionPaths,
                                                    workspace: Path) -> None:
    with Kernel(session_paths, cwd=workspace) as k:
        first = k.execute("print('a')").raw_path
    with Kernel(session_paths, cwd=workspace) as k:
        second = k.execute("print('b')").raw_path
    assert first is not None and second is not None and first != second
    assert first.read_text() == "a\n" and second.read_text() == "b\n"


def test_any_installed_kernel_can_be_named(session_paths: SessionPaths, workspace: Path) -> None:
    with Kernel(session_paths, cwd=workspace, kernel_name="python3") as k:
        r = k.execute("import sys\nprint('hi')\n3 * 3")
    assert (r.status, r.stdout, r.value) == ("ok", "hi", "9")


def test_unknown_kernel_name_is_a_clear_start_error(session_paths: SessionPaths) -> None:
    from simagent.kernel import KernelStartError

    k = Kernel(session_paths, kernel_name="no-such-kernel-xyz")
    with pytest.raises(KernelStartError, match="no-such-kernel-xyz"):
        k.start()
    k.shutdown()
