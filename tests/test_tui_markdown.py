"""Assistant markdown in the TUI: wrapped at word boundaries, tables drawn as tables.

Pure tests render through the same path the app uses (``render_conversation`` over an
``AssistantEntry``) at 60, 100 and 160 columns; the tmux test reads the real terminal.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import sys
import time
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simagent.tui.entries import AssistantEntry, UserEntry
from simagent.tui.markdown import markdown_rows
from simagent.tui.render import render_conversation
from simagent.tui.text import cells, wrap_fragments

WIDTHS = [60, 100, 160]

PARAGRAPH = (
    "The decay constant tau from the 1/e crossing of the normalised trace is 2.675 ms, "
    "which agrees with the exponential fit within its uncertainty; the residuals show no "
    "structure beyond the sampling noise, so a second exponential component is not "
    "supported by these data. Internationalisation-style hyphenated-words and "
    "supercalifragilistic vocabulary must stay whole on every row, whatever the width of "
    "the terminal the person happens to be using today."
)
TABLE = (
    "| quantity | value | unit |\n"
    "|---|---:|---|\n"
    "| tau | 2.675 | ms |\n"
    "| amplitude | 1.0 | V |\n"
    "| offset | -0.0031 | V |"
)
MESSAGE = f"## Fit result\n\n{PARAGRAPH}\n\n{TABLE}\n\nThat is all."


def text_rows(rows) -> list[str]:
    return ["".join(t for _, t in row) for row in rows]


def paragraph_rows(lines: list[str]) -> list[str]:
    """The rows of the rendered paragraph (from its first word to its last)."""
    start = next(i for i, r in enumerate(lines) if r.strip().startswith("The decay"))
    end = next(i for i, r in enumerate(lines) if r.rstrip().endswith("using today."))
    return lines[start:end + 1]


@pytest.mark.parametrize("width", WIDTHS)
def test_paragraphs_wrap_at_word_boundaries(width):
    lines = text_rows(render_conversation([AssistantEntry(MESSAGE)], width, False, 0.0))
    assert all(cells(r) <= width for r in lines)
    para = paragraph_rows(lines)
    assert len(para) > 1, "the paragraph must actually wrap at this width"
    # every row break falls on whitespace of the source: the words come back whole
    assert " ".join(para).split() == PARAGRAPH.split()
    # and rows are filled: the next row's first word would not have fitted
    for row, nxt in itertools.pairwise(para):  # rows carry the entry's 2-cell indent
        assert cells(row.rstrip()) + 1 + cells(nxt.split()[0]) > width, (row, nxt)


@pytest.mark.parametrize("width", WIDTHS)
def test_a_table_renders_with_aligned_columns(width):
    lines = text_rows(markdown_rows(MESSAGE, width))
    assert "Fit result" in lines[0] and "#" not in lines[0]
    assert not any("|" in r for r in lines), "raw |---| table rows are shown"
    head = next(r for r in lines if "quantity" in r)
    rule = lines[lines.index(head) + 1]
    assert set(rule.strip()) == {"─"}
    body = [next(r for r in lines if r.lstrip().startswith(name))
            for name in ("tau", "amplitude", "offset")]
    # left-aligned columns start together; the ---: column ends together
    assert len({r.index(w) for r, w in zip([head, *body], ["unit", "ms", "V", "V"],
                                          strict=True)}) == 1
    ends = {r.index(w) + len(w) for r, w in zip([head, *body],
                                               ["value", "2.675", "1.0", "-0.0031"],
                                               strict=True)}
    assert len(ends) == 1


def test_lists_code_emphasis_and_quotes():
    text = ("Steps:\n\n- first **bold** step\n- second *slanted* step\n  1. nested one\n"
            "  2. nested two\n\n```python\nx = 1  # keep    spacing\n```\n\n> quoted\n\n"
            "Use `np.argmin` here.")
    rows = markdown_rows(text, 60)
    lines = text_rows(rows)
    assert any(r.strip() == "• first bold step" for r in lines)
    assert any(r.strip() == "1. nested one" for r in lines)
    assert any(r.strip() == "2. nested two" for r in lines)
    assert "│ x = 1  # keep    spacing" in lines  # code keeps its spacing, behind a gutter
    assert any("quoted" in r and "▌" in r for r in lines)
    assert "Use np.argmin here." in lines
    assert not any(m in r for r in lines for m in ("**", "```", "`"))
    frags = [frag for row in rows for frag in row]
    assert any("bold" in s.split() and t == "bold" for s, t in frags)
    assert any("italic" in s.split() and t == "slanted" for s, t in frags)


def test_html_and_markup_stay_literal_and_no_escapes_leak():
    text = "Compare <tau> with <b>x</b> and [red]y[/red] :smile:\n\n\x1b[31mred\x1b[0m"
    lines = text_rows(markdown_rows(text, 80))
    assert "Compare <tau> with <b>x</b> and [red]y[/red] :smile:" in lines
    assert "red" in lines
    assert not any("\x1b" in r for r in lines)


STREAMED = ("see [the link][r] first\n\n" + MESSAGE + "\n\npara one\nstill one\n---\n\n"
            "> quote\nlazy line\n\n1. one\n\n2. two\n\n3. three\n\n- a\n\n- b\n"
            "  more b\n\n```py\nx = 1\n\ny = 2\n```\n\n| h | i |\n|---|---|\n| 1 | 2 |\n\n"
            "1. one\n2. two\n\nend [link][r] here\n\n[r]: https://example.org\n\nafter")


def shape(blocks) -> list[tuple]:
    def tok(t):
        return (t.type, t.tag, t.content, t.info, t.markup, dict(t.attrs),
                [tok(c) for c in t.children or []])
    return [(b.line, b.source, [tok(t) for t in b.tokens]) for b in blocks]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=60), min_size=1, max_size=40))
def test_streaming_reuses_earlier_blocks_and_equals_one_parse(steps):
    """Chunked like a model's stream, the reused parse ends where one whole parse does."""
    from simagent.tui.markdown import _blocks_streaming, blocks

    seen, i = "", 0
    for step in steps * 20:
        if i >= len(STREAMED):
            break
        seen, i = STREAMED[:i + step], i + step
        assert shape(_blocks_streaming(seen)) == shape(blocks(seen)), seen


@pytest.mark.parametrize("width", WIDTHS)
def test_the_persons_own_message_wraps_at_word_boundaries(width):
    lines = text_rows(render_conversation([UserEntry(PARAGRAPH)], width, False, 0.0))
    assert len(lines) > 1 and all(cells(r) <= width for r in lines)
    assert lines[0].startswith("› ") and all(r.startswith("  ") for r in lines[1:])
    assert " ".join(r[2:] for r in lines).split() == PARAGRAPH.split()


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab  宽-")), max_size=120),
       st.integers(min_value=1, max_value=30), st.sampled_from(["", "  ", "    "]))
def test_wrapped_fragments_fit_and_keep_every_visible_character(text, width, indent):
    rows = wrap_fragments([("class:mark", "› "), ("class:user", text)], width, indent)
    lines = text_rows(rows)
    assert all(cells(r) <= width for r in lines), lines
    visible = "".join(c for c in "› " + text if c != " ")
    kept = "".join(r[len(indent):] if i and r.startswith(indent) else r
                   for i, r in enumerate(lines)).replace(" ", "")
    assert kept == visible.replace("宽", "宽" if width > 1 else "?")


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab |-*`#>\n宽1.:<")), max_size=200),
       st.integers(min_value=1, max_value=50))
def test_rows_never_exceed_the_width(text, width):
    for row in text_rows(markdown_rows(text, width)):
        assert cells(row) <= width, (text, width, row)


# --------------------------------------------------------------- the real terminal
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_tmux_pane_shows_whole_words_and_a_table(workspace, tmp_path, _state_home):
    """``simagent`` in a 100-column tmux pane: what a person's terminal shows."""
    width = 100
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps([{"final": MESSAGE}]))
    socket = f"simagent-md-{uuid.uuid4().hex[:8]}"

    def tmux(*args: str) -> str:
        return subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True,
                              timeout=20).stdout

    cmd = (f"cd {workspace} && env -u SIMAGENT_MODEL SIMAGENT_HOME={_state_home} "
           f"TERM=xterm-256color {sys.executable} -m simagent --model scripted:{steps}; "
           "sleep 30")
    tmux("new-session", "-d", "-s", "md", "-x", str(width), "-y", "45", cmd)
    try:
        def wait_for(check, timeout: float = 90.0) -> str:
            end = time.monotonic() + timeout
            while time.monotonic() < end:
                screen = tmux("capture-pane", "-p", "-t", "md")
                if check(screen):
                    return screen
                time.sleep(0.1)
            raise AssertionError(f"timed out; the pane shows:\n{screen}")

        wait_for(lambda s: "kernel idle" in s and "›" in s)
        tmux("send-keys", "-t", "md", "-l", "fit it")
        time.sleep(0.2)
        tmux("send-keys", "-t", "md", "Enter")
        screen = wait_for(lambda s: "That is all." in s and "using today." in s)
    finally:
        tmux("kill-server")
    lines = screen.split("\n")
    para = paragraph_rows(lines)
    assert len(para) > 1
    # a final answer's numbers carry their provenance markers (presentation/footnotes: the
    # script's 2.675 ms is printed by no cell, so [?]); the words are what is checked here
    shown = re.sub(r"\[\?\]|[⁰¹²³⁴⁵⁶⁷⁸⁹]+", "", " ".join(para))
    assert shown.split() == PARAGRAPH.split(), "\n".join(para)
    assert not any("|---" in r or r.strip().startswith("|") for r in lines), screen
    head = next(r for r in lines if "quantity" in r)
    assert set(lines[lines.index(head) + 1].strip()) == {"─"}
    tau = next(r for r in lines if r.strip().startswith("tau"))
    assert tau.index("ms") == head.index("unit")
