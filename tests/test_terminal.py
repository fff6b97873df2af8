"""The pure terminal renderer: exactness against pyte, chunking invariance, bounds."""

from __future__ import annotations

import io

import pyte
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simagent.kernel.terminal import TerminalBuffer, collapse_cr, render_text


def pyte_full(text: str, cols: int = 300) -> str:
    """Reference rendering: a screen tall and wide enough never to scroll or wrap."""
    rows = text.count("\n") + text.count("\x1b[") + 10  # any CSI may move the cursor down
    screen = pyte.Screen(cols, rows)
    screen.set_mode(pyte.modes.LNM)
    pyte.Stream(screen).feed(text)
    lines = [ln.rstrip() for ln in screen.display]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def feed_chunks(text: str, cuts: list[int], **kw: int) -> str:
    buf = TerminalBuffer(**kw)
    prev = 0
    for c in [*sorted(set(cuts)), len(text)]:
        buf.feed(text[prev:c])
        prev = c
    return buf.render()


TOKENS = st.sampled_from(
    ["a", "b", "xyz", "  ", "\r", "\n", "\x08", "\x1b[A", "\x1b[B", "\x1b[K", "\x1b[2K",
     "\x1b[32m", "\x1b[0m", "\x1b[1;31m", "\x1b[3D", "\x1b[2C", "\x1b[5G", "€", "█"]
)
TEXTS = st.lists(TOKENS, max_size=60).map("".join)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(TEXTS)
def test_matches_pyte(text: str) -> None:
    assert render_text(text) == pyte_full(text)


@settings(max_examples=400, deadline=None)
@given(TEXTS, st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_chunking_does_not_change_the_rendering(text: str, cuts: list[int]) -> None:
    cuts = [c for c in cuts if c <= len(text)]
    assert feed_chunks(text, cuts) == render_text(text)


@given(st.lists(st.sampled_from(["ab", "c", "", "xyzw"]), min_size=1, max_size=8))
def test_collapse_cr_is_terminal_overwrite(segs: list[str]) -> None:
    line = "\r".join(segs)
    assert collapse_cr(line) == pyte_full(line)


@pytest.mark.slow
def test_real_tqdm_single_and_nested_bars_collapse_exactly() -> None:
    tqdm = pytest.importorskip("tqdm").tqdm
    f = io.StringIO()
    print("starting", file=f)
    for _ in tqdm(range(2000), file=f, mininterval=0):
        pass
    for i in tqdm(range(4), file=f, mininterval=0, desc="outer"):
        for _ in tqdm(range(100), file=f, mininterval=0, desc="inner", leave=False):
            pass
        tqdm.write(f"epoch {i} loss=0.{i}", file=f)
    print("done", file=f)
    raw = f.getvalue()
    for chunk in (len(raw), 4093, 333, 7):
        assert feed_chunks(raw, list(range(chunk, len(raw), chunk))) == pyte_full(raw)
    lines = render_text(raw).splitlines()
    assert lines[0] == "starting"
    assert lines[1].startswith("100%|") and "2000/2000" in lines[1]
    epochs = [ln for ln in lines if ln.startswith("epoch")]
    assert epochs == [f"epoch {i} loss=0.{i}" for i in range(4)]
    assert not any("inner" in ln for ln in lines)  # leave=False bars are erased
    assert lines[-2].startswith("outer: 100%") and lines[-1] == "done"
    assert len(raw) > 50 * len(render_text(raw))


def test_colours_are_stripped_and_plain_text_is_untouched() -> None:
    assert render_text("\x1b[32mINFO\x1b[0m ok\n") == "INFO ok"
    plain = "line 1\nline 2   \n\n"
    assert render_text(plain) == "line 1\nline 2"


def test_rows_and_characters_stay_bounded() -> None:
    buf = TerminalBuffer(max_chars=10_000, max_rows=500)
    for i in range(2000):
        buf.feed("".join(f"row {i}-{j} " + "x" * 40 + "\n" for j in range(50)))
    assert len(buf.rows) <= 500
    assert sum(map(len, buf.rows)) <= 2 * 10_000 + 100
    assert buf.stats.rows_dropped >= 2000 * 50 - 500
    assert buf.render().splitlines()[-1].startswith("row 1999-49 ")


def test_one_giant_line_keeps_its_tail() -> None:
    buf = TerminalBuffer(max_chars=1000)
    for i in range(100):
        buf.feed(f"[{i:03d}]" + "y" * 95)
    out = buf.render()
    assert len(out) <= 2000 and out.endswith("[099]" + "y" * 95)


def test_uncommon_sequences_fall_back_to_pyte_on_the_tail() -> None:
    # save/restore cursor (DECSC/DECRC) is not interpreted by the fast layer
    text = "head\n" + "hello\x1b7XX\x1b8YY\n"
    assert render_text(text) == pyte_full(text) == "head\nhelloYY"


def test_clear_starts_the_view_afresh() -> None:
    buf = TerminalBuffer()
    buf.feed("old\n")
    buf.clear()
    buf.feed("new\n")
    assert buf.render() == "new"
