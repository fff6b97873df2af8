"""Pure pieces of the kernel layer: launcher flow control, caps, tracebacks."""

from __future__ import annotations

import base64
import hashlib
import threading
from pathlib import Path

import pytest

from simagent.kernel import launcher
from simagent.kernel.capture import Capture
from simagent.kernel.result import ExecResult, cap_bytes, compact_traceback

#: the kernel process is what these tests are about (make test-real)
pytestmark = pytest.mark.real


class FakeStream:
    """Counts flushes: the writer flushes before every wait for an ack (the client can
    only ack what was sent), so a flush is the moment a wait begins."""

    def __init__(self) -> None:
        self.flushes = 0
        self.flushed = threading.Event()

    def flush(self) -> None:
        self.flushes += 1
        self.flushed.set()


def write_ack(path: Path, n: int) -> None:
    with open(path, "r+b") as f:
        f.write(n.to_bytes(8, "little"))


@pytest.fixture
def flow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[launcher._Flow, Path]:
    path = tmp_path / "kernel.flow"
    path.write_bytes((0).to_bytes(8, "little"))
    monkeypatch.setattr(launcher, "FLOW_WINDOW_CHARS", 100)
    monkeypatch.setattr(launcher, "FLOW_STALL_S", 0.3)
    return launcher._Flow(str(path)), path


def test_flow_blocks_until_the_client_acknowledges(flow, monkeypatch) -> None:
    f, path = flow
    monkeypatch.setattr(launcher, "FLOW_STALL_S", 60.0)  # only the ack can end the wait
    stream = FakeStream()
    f.wrote(90, stream)
    assert stream.flushes == 0  # within the window: no wait, not even a flush
    acking = threading.Event()

    def client() -> None:  # acks once the writer waits (set first: the ack ends the wait)
        if stream.flushed.wait(60):
            acking.set()
            write_ack(path, 150)

    th = threading.Thread(target=client, daemon=True)
    th.start()
    f.wrote(100, stream)  # 190 written, window 100: must wait for the ack
    assert acking.is_set()  # it returned after the client acked, not before
    th.join(60)
    assert stream.flushes == 1 and f.written - f.ack_seen <= 100 and f.stalled_at_ack == -1


def test_flow_gives_up_on_an_absent_client_and_resumes_when_it_reads(flow) -> None:
    f, path = flow
    stream = FakeStream()
    f.wrote(500, stream)  # nobody acknowledges: returns after the stall time
    assert f.stalled_at_ack == 0
    waits = stream.flushes
    for _ in range(50):
        f.wrote(100, stream)  # stalled: no more waiting
    assert stream.flushes == waits  # no wait began (each begins with a flush)
    write_ack(path, 5000)  # the client reads again
    f.wrote(100, stream)
    assert f.ack_seen == 5000


def test_cap_bytes_cuts_on_a_character_boundary() -> None:
    text = "€" * 30_000  # 90,000 bytes
    out = cap_bytes(text, 64 * 1024)
    assert out.startswith("€" * 100) and "\ufffd" not in out
    assert "more bytes" in out and len(out.split("\n")[0].encode()) <= 64 * 1024


def test_compact_traceback_keeps_cells_and_the_raising_frames() -> None:
    frames = ["\x1b[31m-----\x1b[0m", "ValueError    Traceback (most recent call last)",
              "Cell In[3], line 2\n----> 2 run()"]
    frames += [f"File /lib/mod.py:{i}, in f{i}()\n-> {i} f{i + 1}()" for i in range(40)]
    frames += ["\x1b[31mValueError\x1b[0m: boom"]
    tb = compact_traceback(frames)
    assert "\x1b" not in tb and "Traceback" not in tb
    assert tb.startswith("Cell In[3]") and "... [38 library frames omitted] ..." in tb
    assert "f38()" in tb and "f39()" in tb and "f10()" not in tb
    assert tb.endswith("ValueError: boom")


def test_model_text_marks_truncation_and_never_drops_the_error(tmp_path: Path) -> None:
    cap = Capture(tmp_path / "0001.txt", tmp_path / "artifacts", "0001", cap=10_000)
    for i in range(5000):
        cap.handle("stream", {"name": "stdout", "text": f"row {i} " + "z" * 30 + "\n"})
    cap.handle("error", {"ename": "RuntimeError", "evalue": "diverged", "traceback": []})
    r = cap.result("error", 1.0)
    text = r.model_text()
    assert len(text) <= 10_500
    first = text.splitlines()[0]
    assert first.startswith("[output truncated:") and str(tmp_path / "0001.txt") in first
    assert "row 4999 " in text and text.endswith("RuntimeError: diverged")
    raw = (tmp_path / "0001.txt").read_text().splitlines()
    assert raw[0].startswith("row 0 ") and raw[4999].startswith("row 4999 ")
    assert raw[5000] == "RuntimeError: diverged" and len(raw) == 5001


def test_displays_images_saved_and_other_types_summarised(tmp_path: Path) -> None:
    png = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000003000000020806000000")
    cap = Capture(None, tmp_path / "artifacts", "0007")
    cap.handle("display_data", {"data": {"image/png": base64.b64encode(png).decode(),
                                         "text/plain": "<Figure size 3x2>"}})
    cap.handle("display_data", {"data": {"text/html": "<b>x</b>" * 100}})
    r = cap.result("ok", 0.1)
    img, html = r.displays
    fid = "fig-" + hashlib.sha256(png).hexdigest()[:8]  # stored under its content hash
    assert img.path == tmp_path / "artifacts" / f"{fid}.png" and img.path.read_bytes() == png
    assert img.text == f"[figure {fid} 3x2: {img.path}]"
    assert html.path is None and html.text.startswith("[display: text/html;")


def test_empty_result_says_so() -> None:
    assert ExecResult("ok").model_text() == "(no output)"
    assert ExecResult("died", notice="gone").model_text() == "[gone]"
