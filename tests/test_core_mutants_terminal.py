"""The terminal collapse (``kernel/terminal.py``) on every sequence it interprets, checked
against pyte (an independent, faithful emulator): the cases mutation testing showed the
property tests' alphabet never reached (cursor next/previous line, erase modes, absolute
positioning, private modes, OSC, multi-digit and zero parameters)."""

from __future__ import annotations

import pytest
from test_terminal import pyte_full

from simagent.kernel.terminal import TerminalBuffer, render_text

E = "\x1b["
CASES = [
    "one\ntwo\nthree" + E + "2Fx",          # previous line, column 0
    "one\ntwo\nthree" + E + "Fx",
    "one\ntwo" + E + "Ax" + E + "0Ay",      # a zero count moves one
    "ab\ncd" + E + "A" + E + "Ez",          # next line, column 0
    "abc" + E + "2Ez",
    "abcdef" + E + "Bz",                    # down keeps the column
    "abcdef" + E + "3Bz",
    "abcdef" + E + "12Dz",                  # left stops at 0
    "abcdef\r" + E + "10Cz",
    "abcdef" + E + "3Gz" + E + "0Gy",
    "abcdef" + E + "3D" + E + "1K",         # erase to the left, cursor included
    "abcdef" + E + "3D" + E + "0K",
    "abcdef" + E + "3D" + E + "K",
    "abcdef" + E + "10D" + E + "1Kz",
    "abc\ndef\nghi" + E + "A" + E + "2D" + E + "J",   # erase below
    "abc\ndef\nghi" + E + "A" + E + "2D" + E + "0J",
    "abc\ndef\nghi" + E + "Hz",             # home
    "abc\ndef\nghi" + E + "2;2Hz",
    "abc\ndef\nghi" + E + "3;1fz",
    "abc" + E + "5;4Hz",                    # below the last row: rows are added
    "abc" + E + ";3Hz",
    "abc" + E + "?25lde" + E + "?25h",      # private modes show nothing
    "a\x1b]0;title\x07b\x1b]8;;http://x\x1b\\c",  # OSC: titles, hyperlinks
    "ab\x1b",
    "12345\x08\x08\x08x",
    "progress 10%\rprogress 100%\n",
    E + "31;1mred" + E + "0m plain",
    "\x1b]0;title\x1b\\x",                  # an OSC opening the chunk
    "ab\tc\rx",                             # tabs before a carriage return
    "a\nbcdef\rxyZ",                         # the column after a bulk row with CR
    "a\n" + E + "31mbcdef" + E + "0m\rxyZ",
    "abc" + E + "3D" + E + "3Cd",               # writing exactly at the row's end
    E + "2Cx",                              # past it: spaces fill
    "abcdef\rxy", "ab\rwxyz", "ab\rcd",
]


@pytest.mark.parametrize("text", CASES)
def test_matches_pyte_on_each_interpreted_sequence(text):
    assert render_text(text) == pyte_full(text)


def test_clearing_the_screen_starts_the_view_afresh():
    """The one deliberate difference from a terminal: ``ESC[2J``/``ESC[3J`` (what
    ``clear_output`` and ``cls`` send) also home the cursor, so the output after a clear
    is not shifted by where the cursor was."""
    assert render_text("abc\ndef" + E + "2Jz") == "z"
    assert render_text("abc\ndef" + E + "3Jxy\nq") == "xy\nq"
    # an erase mode no terminal defines does nothing (pyte itself raises on it)
    assert render_text("abc\ndef" + E + "5Jz") == "abc\ndefz"


# tabs expand from each chunk's start (a documented approximation): not chunk-invariant
@pytest.mark.parametrize("text", [*(c for c in CASES if "\t" not in c),
                                  "abc\ndef" + E + "2Jz"])
def test_each_sequence_survives_any_chunking(text):
    for cut in range(1, len(text)):
        buf = TerminalBuffer()
        buf.feed(text[:cut])
        buf.feed(text[cut:])
        assert buf.render() == render_text(text), cut


def test_collapse_cr_keeps_spaces_as_text():
    from simagent.kernel.terminal import collapse_cr

    assert collapse_cr("ab cd\rx") == "xb cd"
    assert collapse_cr("a\tb\rc") == "c\tb"


def test_dropping_one_row_over_the_limit():
    buf = TerminalBuffer(max_rows=3)
    buf.feed("r1\nr2\nr3")
    assert buf.stats.rows_dropped == 0 and buf.render() == "r1\nr2\nr3"
    buf.feed("\nr4")
    assert buf.stats.rows_dropped == 1 and buf.render() == "r2\nr3\nr4"
    buf.feed(E + "2Ax")  # the cursor row moved with the drop: two up is r2's row, col 2
    assert buf.render() == "r2x\nr3\nr4"
    slow = TerminalBuffer(max_rows=2)
    slow.feed("a\x08b\nc\x08d\ne\x08f")  # the slow path drops rows the same way
    assert slow.render() == "d\nf" and slow.stats.rows_dropped == 1


def test_dropping_every_row_leaves_an_empty_line_at_the_origin():
    buf = TerminalBuffer(max_chars=4)
    buf.feed("x" * 40)  # one giant row: its tail is kept
    assert buf.render() == "x" * 4
    buf.rows, buf.row, buf.col = ["a", "b"], 1, 1
    buf._drop_head(2)
    assert (buf.rows, buf.row, buf.col) == ([""], 0, 0)
    buf.feed("z")
    assert buf.render() == "z"
    buf._drop_head(0)
    assert buf.render() == "z" and buf.stats.rows_dropped >= 2


def test_uncommon_escapes_render_on_the_tail_and_are_stripped_from_the_head():
    from simagent.kernel.terminal import PYTE_MAX_ROWS

    buf = TerminalBuffer()
    buf.feed("a" + E + "5Sb\n" + "".join(f"line {i}\n" for i in range(PYTE_MAX_ROWS + 50)))
    first = buf.render().split("\n")[0]
    assert first == "ab"  # beyond pyte's tail: the unknown sequence is dropped
    buf.clear()
    buf.feed("fresh")
    assert buf.render() == "fresh"  # nothing raw is left: no pyte pass at all
    near = TerminalBuffer()
    near.feed("ab" + E + "3Scd\nnext")
    assert near.render() == pyte_full("ab" + E + "3Scd\nnext")


def test_the_bulk_path_drops_old_rows_by_count_and_keeps_the_newest():
    lines = [f"l{i}" for i in range(5000)]
    for text in ("\n".join(lines), "\n".join(f"{E}31m{x}{E}0m" for x in lines),
                 "\n".join(f"zz\r{x}" for x in lines)):
        buf = TerminalBuffer(max_rows=5)
        buf.feed(text)
        assert buf.render() == "\n".join(lines[-5:])
        assert buf.stats.rows_dropped == 4995
        assert buf.stats.chars_in == len(text)
        buf.feed("\nmore")
        assert buf.render().split("\n") == [*lines[-4:], "more"]
        assert buf.stats.chars_in == len(text) + 5


def test_the_bulk_path_keeps_a_bounded_tail_of_characters():
    text = "\n".join(f"line {i}" for i in range(5000))
    buf = TerminalBuffer(max_chars=100)
    buf.feed(text)
    shown = buf.render()
    assert text.endswith(shown) and shown.endswith("line 4999")
    assert 90 <= len(shown) <= 2 * 100 + 20
    small = TerminalBuffer(max_chars=100)
    for i in range(0, 5000, 7):  # many small chunks: the same bound
        small.feed("".join(f"line {j}\n" for j in range(i, min(i + 7, 5000))))
    assert text.endswith(small.render()) and len(small.render()) <= 2 * 100 + 20
