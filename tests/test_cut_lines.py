"""A cut result names the lines it left out, and paging them back returns exactly those
(issue 31 §2): the pure cut arithmetic, the raw-file search, and a real ipykernel whose
``_out[n].slice`` is asked for the range the marker names."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from simagent.context.capping import cap_text
from simagent.head_tail import head_and_tail
from simagent.kernel import Kernel
from simagent.kernel.cut_lines import MAX_END_BYTES, Cut, locate_cut, parse_cut, text_cut
from simagent.kernel.terminal import render_text
from simagent.paths import SessionPaths

LOG = "".join(f"step {k:4d} residual={1.0 / (k + 1):.4e}\n" for k in range(1000))


def _rows(text: str) -> list[str]:
    rows = text.split("\n")
    return rows[:-1] if rows and rows[-1] == "" else rows


@pytest.mark.parametrize("text", [
    LOG,
    LOG.rstrip("\n"),  # no final newline
    "x" * 3000 + "\n" + LOG + "y" * 3000,  # head and tail both cut inside a line
])
def test_a_text_cut_names_exactly_the_lines_left_out(text: str) -> None:
    head, tail = head_and_tail(text, 2_000)
    cut = text_cut(text, head, tail)
    lines = _rows(text)
    assert cut is not None and cut.total == len(lines)
    *whole_head, part_head = head.split("\n")  # part_head: "" or the start of a line
    assert whole_head == lines[: cut.first - 1]
    assert lines[cut.first - 1].startswith(part_head)
    tails = _rows(tail)
    if text[len(text) - len(tail) - 1] == "\n":  # the tail starts on a whole line
        assert tails == lines[cut.last:]
    else:  # its first row is the end of the cut's last line
        assert lines[cut.last - 1].endswith(tails[0]) and tails[1:] == lines[cut.last:]
    assert cut.shown == [(a, b) for a, b in ((1, cut.first - 1), (cut.last + 1, cut.total))
                         if a <= b]


def test_a_text_that_fits_has_no_cut() -> None:
    assert text_cut("a\nb\n", "a\nb\n", "") is None
    assert text_cut("", "", "") is None


def test_a_capped_result_names_the_read_file_page_of_its_omitted_lines() -> None:
    out = cap_text(LOG, 2_000, "/tmp/full.txt")
    found = re.search(r"lines (\d+)-(\d+) of 1000 not shown: read_file offset=(\d+), "
                      r"limit=(\d+)", out)
    assert found, out
    first, last, offset, limit = map(int, found.groups())
    assert (offset, limit) == (first - 1, last - first + 1)
    head, tail = out.split("\n[... ")[0], out.split(" ...]\n")[1]
    paged = _rows(LOG)[offset: offset + limit]  # what read_file offset/limit returns
    assert _rows(head) + paged + _rows(tail) == _rows(LOG)
    assert parse_cut(out) == Cut(first, last, 1000)
    unsaved = cap_text(LOG, 2_000, "(not saved)")
    assert "read_file with offset/limit" in unsaved and parse_cut(unsaved) is None


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "0003.txt"
    path.write_text(text)
    return path


def test_the_raw_file_search_matches_rendered_rows(tmp_path: Path) -> None:
    text = ("bar 10%\rbar 100%\n" + "".join(f"\x1b[32mrow {i}\x1b[0m\tok \n"
                                          for i in range(200)) + "Out[3]: 42\n")
    raw = _write(tmp_path, text)
    rows = render_text(text).split("\n")  # what the model is shown, rendered for real
    assert rows[0] == "bar 100%" and rows[1].startswith("row 0 ")
    head, tail = "\n".join(rows[:21]) + "\n", "\n".join(rows[181:201]) + "\n"
    assert locate_cut(raw, head, tail, tail_whole=True) == Cut(22, 181, 202)


def test_the_raw_file_search_answers_none_unless_it_is_sure(tmp_path: Path) -> None:
    raw = _write(tmp_path, "".join(f"row {i}\n" for i in range(100)))
    rows = [f"row {i}" for i in range(100)]
    head, tail = "\n".join(rows[:10]) + "\n", "\n".join(rows[90:]) + "\n"
    assert locate_cut(raw, head, tail, tail_whole=True) == Cut(11, 90, 100)
    # something else printed first (stderr, a display): the head is not line 1
    assert locate_cut(raw, "preamble\n" + head, tail, tail_whole=True) is None
    # a tail row the file does not have
    assert locate_cut(raw, head, tail.replace("row 95", "row 95!"), tail_whole=True) is None
    assert locate_cut(tmp_path / "missing.txt", head, tail, tail_whole=True) is None
    # a tail cut inside its first row: that row is part of the cut
    assert locate_cut(raw, head, "w 89\n" + tail, tail_whole=False) == Cut(11, 90, 100)


def test_the_latest_place_the_tail_matches_wins(tmp_path: Path) -> None:
    block = "".join(f"iter {i}\n" for i in range(5))
    raw = _write(tmp_path, "start\n" + block * 4)
    assert locate_cut(raw, "start\n", block, tail_whole=True) == Cut(2, 16, 21)


def test_the_tail_is_searched_from_the_end_within_a_bound(tmp_path: Path) -> None:
    rows = [f"row {i}" for i in range(100)]
    head, tail = "\n".join(rows[:10]) + "\n", "\n".join(rows[90:]) + "\n"
    after = "".join(f"display {i} " + "d" * 80 + "\n" for i in range(15_000))  # ~1.4 MB
    raw = _write(tmp_path, "\n".join(rows) + "\n" + after)
    assert locate_cut(raw, head, tail, tail_whole=True) == Cut(11, 90, 15_100)
    raw.write_text("\n".join(rows) + "\n" + after * 4)  # past MAX_END_BYTES: not searched
    assert len(after * 4) > MAX_END_BYTES
    assert locate_cut(raw, head, tail, tail_whole=True) is None


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    root = tmp_path_factory.mktemp("cut")
    (root / "ws").mkdir()
    with Kernel(SessionPaths(root / "session"), cwd=root / "ws") as k:
        yield k


def _paged(kernel: Kernel, call: str) -> list[str]:
    r = kernel.execute(f"for x in {call}: print(x.text)")
    assert r.ok, r.model_text()
    return _rows(r.stdout + "\n")


def test_the_slice_a_kernel_marker_names_returns_exactly_the_omitted_lines(
        kernel: Kernel) -> None:
    printed = [f"step {k:4d} residual={1.0 / (k + 1):.4e}" for k in range(1000)]
    r = kernel.execute("for k in range(1000):\n"
                       "    print(f'step {k:4d} residual={1.0 / (k + 1):.4e}')\n"
                       "print('\\x1b[1mdone\\x1b[0m')\n42")
    text = r.model_text(3_000)
    found = re.search(r"lines (\d+)-(\d+) of (\d+) not shown: (_out\[\d+\]\.slice\(\d+, \d+\))",
                      text)
    assert found, text[:600]
    assert int(found.group(3)) == 1002  # the steps, "done" and the value's line
    at = text.index("[output truncated:")
    head, rest = text[:at], text[text.index("]\n", at) + 2:]
    middle = _paged(kernel, found.group(4))
    assert len(middle) == int(found.group(2)) - int(found.group(1)) + 1
    assert _rows(head) + middle + _rows(rest) == \
        [*printed, "done", f"Out[{r.execution_count}]: 42"]


@pytest.mark.slow
def test_output_the_search_cannot_place_keeps_the_old_marker(kernel: Kernel) -> None:
    r = kernel.execute("import sys\nfor k in range(600):\n    print('out', k)\n"
                       "    print('err', k, file=sys.stderr)")
    text = r.model_text(3_000)
    assert "not shown" not in text and ".tail(k) / .grep(pattern)" in text
