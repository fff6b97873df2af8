"""Text shaping for the terminal UI: sanitising, wrapping and clipping by display cells.

Everything here is pure (strings in, lines out) so hostile text is tested without a
terminal. The UI never interprets what the model or the kernel prints: escape sequences
and control characters are removed, markup-like strings stay literal (fragments are
plain text, never parsed), and every line is wrapped to the window's width in cells
(wide CJK characters count double), so a 10-column terminal or a 100 kB line cannot
break the layout. Markdown is :mod:`simagent.tui.markdown`'s.
"""

from __future__ import annotations

import re
from functools import lru_cache

from prompt_toolkit.utils import get_cwidth

from simagent.kernel.terminal import ESC_SEQ_RE

#: Control characters other than newline and tab (tab becomes spaces).
#: Bidirectional overrides and isolates are removed too: they could make a diff or a
#: command awaiting approval display in an order other than the one that runs.
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b\u200e\u200f\u2028\u2029"
                         r"\u202a-\u202e\u2066-\u2069\ufeff]")
#: Longest line the UI wraps; beyond it the rest is dropped with a marker (bounded work).
MAX_LINE_CHARS = 4_000

Fragment = tuple[str, str]
Line = list[Fragment]


def sanitize(text: str) -> str:
    """Printable text: escape sequences and control characters removed, tabs expanded.

    A lone ``\\r`` (progress redraw in text that did not come through the live terminal
    buffer) keeps only what follows it on that line, as a terminal would show.
    """
    if not text:
        return ""
    text = ESC_SEQ_RE.sub("", text).replace("\r\n", "\n")
    if "\r" in text:
        text = "\n".join(part.rsplit("\r", 1)[-1] for part in text.split("\n"))
    return _CONTROL_RE.sub("", text.replace("\t", "    "))


@lru_cache(maxsize=4096)
def _cw(ch: str) -> int:
    return max(0, get_cwidth(ch))


def cells(text: str) -> int:
    """Display width of ``text`` in terminal cells."""
    return sum(_cw(c) for c in text)


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` cells, with ``…`` when something was cut."""
    if width <= 0:
        return ""
    if cells(text) <= width:
        return text
    out, used = [], 0
    for ch in text:
        w = _cw(ch)
        if used + w > width - 1:
            break
        out.append(ch)
        used += w
    return "".join(out) + "…"


def wrap(line: str, width: int) -> list[str]:
    """One logical line as rows of at most ``width`` cells, breaking at spaces if possible."""
    width = max(1, width)
    if len(line) > MAX_LINE_CHARS:
        line = line[:MAX_LINE_CHARS] + f" … ({len(line) - MAX_LINE_CHARS:,} more chars)"
    if len(line) <= width and cells(line) <= width:
        return [line]
    rows: list[str] = []
    row: list[str] = []
    used = 0
    last_space = -1
    for ch in line:
        w = _cw(ch)
        if w > width:  # a wide character in a one-cell column
            ch, w = "?", 1
        if used + w > width and row:
            if 0 < last_space < len(row) - 1 and ch != " ":
                head, tail = row[:last_space + 1], row[last_space + 1:]
                rows.append("".join(head).rstrip())
                row, used = tail, sum(_cw(c) for c in tail)
            else:
                rows.append("".join(row).rstrip() if ch == " " else "".join(row))
                row, used = [], 0
            last_space = -1
            if ch == " " and not row:
                continue
        row.append(ch)
        used += w
        if ch == " ":
            last_space = len(row) - 1
    if row or not rows:
        rows.append("".join(row))
    return rows


def wrap_fragments(frags: Line, width: int, indent: str = "") -> list[Line]:
    """Styled fragments as rows of at most ``width`` cells, broken at the row's last space
    (a word longer than a row is cut); continuation rows start with ``indent``."""
    width = max(1, width)
    lead = [("", c, _cw(c)) for c in indent] if 0 < cells(indent) < width else []
    rows: list[list[tuple[str, str, int]]] = []
    row: list[tuple[str, str, int]] = []
    used, space = 0, -1

    def start(carry: list[tuple[str, str, int]], w: int) -> None:
        """A new row holding ``carry`` and room for a ``w``-cell character: indented
        where that fits, else without the indent, else ``carry`` gets a row of its own."""
        nonlocal row, used, space
        need = sum(c[2] for c in carry) + w
        if need > width:
            rows.append([*lead, *carry] if cells(indent) + need - w <= width and lead
                        else carry)
            carry, need = [], w
        row = [*lead, *carry] if lead and cells(indent) + need <= width else list(carry)
        used = sum(c[2] for c in row)
        space = max((k for k, c in enumerate(row) if c[1] == " " and k >= len(lead)),
                    default=-1)

    for style, text in frags:
        for ch in text:
            w = _cw(ch)
            if w > width:  # a wide character in a one-cell column
                ch, w = "?", 1
            if ch == " " and rows and len(row) == len(lead) and row == lead:
                continue  # spaces at a break are dropped, not carried to the next row
            if used + w > width and used > 0:
                floor = len(lead) if rows else 0  # never break inside the indent
                if ch == " ":  # the break falls on this space
                    rows.append(row)
                    start([], 0)
                    continue
                if space > floor:
                    rows.append(row[:space])
                    start(row[space + 1:], w)
                else:
                    rows.append(row)
                    start([], w)
            row.append((style, ch, w))
            used += w
            if ch == " ":
                space = len(row) - 1
    rows.append(row)
    return [_group(r) for r in rows]


def _group(chars: list[tuple[str, str, int]]) -> Line:
    out: Line = []
    for style, ch, _ in chars:
        if out and out[-1][0] == style:
            out[-1] = (style, out[-1][1] + ch)
        else:
            out.append((style, ch))
    return out


def clip_fragments(frags: Line, width: int) -> Line:
    """Styled fragments cut to ``width`` cells in all (``…`` marks the cut)."""
    out: Line = []
    used = 0
    for style, text in frags:
        room = width - used
        if room <= 0:
            break
        piece = clip(text, room)
        out.append((style, piece))
        used += cells(piece)
        if piece != text:
            break
    return out
