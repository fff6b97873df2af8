"""Terminal emulation for kernel output, bounded and fast.

Kernel output is written for a terminal: tqdm redraws a bar with ``\\r`` thousands of
times, nested bars move the cursor up with ``ESC[A``, logs are coloured with SGR codes.
Shown to a model verbatim that costs thousands of useless tokens, so we render what a
terminal would finally show.

pyte is a faithful emulator but runs at ~0.2 MB/s in pure Python, far too slow for a
simulator that prints 100 MB. So rendering happens in two stages:

1. :class:`TerminalBuffer` (incremental, per output chunk): a row/cursor model that
   interprets the sequences progress bars and logs actually use (``\\n``, ``\\r``,
   ``\\b``, cursor up/down/left/right/column, erase line/display, SGR, OSC). Chunks with
   none of those take a bulk path (``str.split`` at C speed); rows are bounded by count
   and characters, so memory stays flat however much is printed.
2. :func:`render` (once, at the end or for a live view): rows joined; if some rows hold
   sequences stage 1 does not interpret (absolute positioning, scroll regions...), pyte
   renders only the bounded tail that contains them.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate

# SGR (colours) never changes text; stripping it first lets most coloured logs stay on
# the bulk path.
SGR_RE = re.compile(r"\x1b\[[0-9;:]*m")
# Any escape sequence: CSI, OSC (BEL or ST terminated), or a two-byte ESC sequence.
ESC_SEQ_RE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[0-Z\\^-~])")
# Tokens the slow path walks over: control characters and escape sequences.
_TOKEN_RE = re.compile(
    r"(\r|\x08|\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[0-Z\\^-~]|\x1b)"
)
# An escape that is not a colour (cursor movement, erase...): needs the slow walk.
_NON_SGR_ESC = re.compile(r"\x1b(?!\[[0-9;:]*m)")
_CSI_RE = re.compile(r"\x1b\[([0-?]*)[ -/]*([@-~])")

#: How many tail rows pyte may see at most (it costs ~5 ms per 20 rows here).
PYTE_MAX_ROWS = 200
#: Longest escape sequence carried over to the next chunk.
_MAX_PENDING = 256
#: Pieces rendered at a time by the bulk path.
_BLOCK = 2048
#: Virtual screen height used to interpret absolute cursor positioning.
SCREEN_ROWS = 50


def collapse_cr(line: str) -> str:
    """Final state of one line after carriage returns: each segment overwrites from column 0."""
    if "\r" not in line:
        return line
    return _collapse_segs(line.split("\r"))


def _collapse_segs(segs: list[str]) -> str:
    last = segs[-1]
    if len(last) >= max(map(len, segs)):  # tqdm pads its redraws, so this is the usual case
        return last
    cur = segs[0]
    for s in segs[1:]:
        cur = s + cur[len(s) :]
    return cur


def _overwrite(row: str, col: int, text: str) -> str:
    n = len(row)
    if col >= n:
        return row + " " * (col - n) + text if col > n else row + text
    return row[:col] + text + row[col + len(text) :]


@dataclass
class TerminalStats:
    """What was dropped on the way, for the truncation marker."""

    rows_dropped: int = 0
    chars_in: int = 0


class TerminalBuffer:
    """Incremental, bounded terminal model for one output stream.

    ``max_chars`` bounds the kept text (the oldest rows are dropped first); it must be at
    least as large as the model-facing cap so that cap is filled from real rows.
    """

    def __init__(self, max_chars: int = 320 * 1024, max_rows: int = 20_000) -> None:
        self.max_chars = max_chars
        self.max_rows = max_rows
        self.rows: list[str] = [""]
        self.row = 0  # cursor row (index into rows)
        self.col = 0
        self.stats = TerminalStats()
        self._approx_chars = 0
        self._raw_escapes = False  # some row holds a sequence only pyte can interpret
        self._pending = ""  # an escape sequence cut by the chunk boundary

    # ------------------------------------------------------------------ feeding
    def feed(self, text: str) -> None:
        if not text:
            return
        self.stats.chars_in += len(text)
        if self._pending:
            text, self._pending = self._pending + text, ""
        has_esc = "\x1b" in text
        if has_esc:
            text = self._hold_back_partial_escape(text)
        if "\t" in text:
            text = text.expandtabs(8)  # approximate: tab stops from the chunk start
        # Only cursor movement, erasing and backspace need the slow walk; colours do not.
        plain = "\x08" not in text and not (has_esc and _NON_SGR_ESC.search(text))
        if not plain and has_esc:
            text = SGR_RE.sub("", text)
            has_esc = "\x1b" in text
        pieces = text.split("\n")
        first = pieces[0]
        if first:
            self._write(SGR_RE.sub("", first) if has_esc else first, plain)
        if len(pieces) > 1:
            if plain and self.row == len(self.rows) - 1:
                self._append_rows(pieces, has_esc)
            else:
                for piece in pieces[1:]:
                    self._newline()
                    if piece:
                        self._write(piece, "\x1b" not in piece and "\x08" not in piece)
        self._bound()

    def _append_rows(self, pieces: list[str], has_esc: bool) -> None:
        """Bulk path: each piece after the first becomes a new row.

        Renders blocks of pieces from the end backwards and stops once the bounds are
        filled; older pieces are counted as dropped without being looked at. Blocks keep
        the work in C (join, regex, split) rather than in a per-line Python loop.
        """
        blocks: list[list[str]] = []
        total = count = 0
        end = len(pieces)
        while end > 1 and total < self.max_chars and count < self.max_rows:
            start = max(1, end - _BLOCK)
            block = pieces[start:end]
            if has_esc:
                block = SGR_RE.sub("", "\n".join(block)).split("\n")
            block = [collapse_cr(p) if "\r" in p else p for p in block]
            blocks.append(block)
            total += sum(map(len, block))
            count += len(block)
            end = start
        kept = [row for block in reversed(blocks) for row in block]
        dropped = end - 1
        if dropped:  # everything older than the dropped pieces goes too
            self.stats.rows_dropped += dropped + len(self.rows)
            self.rows = kept
            self._approx_chars = total
        else:
            self.rows.extend(kept)
            self._approx_chars += total
        self.row = len(self.rows) - 1
        last = pieces[-1]
        if has_esc and "\x1b" in last:
            last = SGR_RE.sub("", last)
        self.col = len(last) - last.rfind("\r") - 1 if "\r" in last else len(last)

    def _hold_back_partial_escape(self, text: str) -> str:
        lo = max(0, len(text) - _MAX_PENDING)
        i = text.rfind("\x1b", lo)
        if i < 0:
            return text
        # a chunk may end inside an OSC's ESC-backslash terminator: hold the whole OSC
        j = text.rfind("\x1b]", lo, i)
        if j >= 0 and ESC_SEQ_RE.match(text, j) is None:
            i = j
        m = ESC_SEQ_RE.match(text, i)
        if m is None or m.end() > len(text):
            self._pending = text[i:]
            return text[:i]
        return text

    def _newline(self) -> None:
        # Kernel output uses bare '\n' (LNM semantics): next row, column 0.
        self.row += 1
        self.col = 0
        if self.row >= len(self.rows):
            self.rows.append("")
            self.row = len(self.rows) - 1

    def _write(self, piece: str, plain: bool) -> None:
        """Write one newline-free piece at the cursor."""
        if plain:
            segs = piece.split("\r")
            row = _overwrite(self.rows[self.row], self.col, segs[0])
            col = self.col + len(segs[0])
            if len(segs) > 1:
                tail = _collapse_segs(segs[1:])
                row = _overwrite(row, 0, tail) if len(tail) < len(row) else tail
                col = len(segs[-1])
            self.rows[self.row] = row
            self.col = col
            self._approx_chars += len(piece)
            return
        for tok in _TOKEN_RE.split(piece):
            if not tok:
                continue
            c0 = tok[0]
            if c0 == "\r":
                self.col = 0
            elif c0 == "\x08":
                self.col = max(0, self.col - 1)
            elif c0 == "\x1b":
                self._escape(tok)
            else:
                self.rows[self.row] = _overwrite(self.rows[self.row], self.col, tok)
                self.col += len(tok)
                self._approx_chars += len(tok)

    def _escape(self, seq: str) -> None:
        m = _CSI_RE.fullmatch(seq)
        if m is None:
            if seq.startswith("\x1b]") or seq == "\x1b":
                return  # OSC (titles, hyperlinks) and a lone ESC show nothing
            self._keep_raw(seq)
            return
        params, final = m.group(1), m.group(2)
        if params.startswith(("?", ">", "<", "=")):
            return  # private modes (cursor visibility, bracketed paste): no text effect
        nums = [int(p) if p.isdigit() else 0 for p in params.split(";")] if params else []
        n = nums[0] if nums else 0
        step = n or 1
        if final == "A" or final == "F":
            self.row = max(0, self.row - step)
            if final == "F":
                self.col = 0
        elif final == "B" or final == "E":
            col = self.col
            for _ in range(step):
                self._newline()
            if final == "B":
                self.col = col  # cursor down keeps the column
        elif final == "C":
            self.col += step
        elif final == "D":
            self.col = max(0, self.col - step)
        elif final == "G":
            self.col = max(0, step - 1)
        elif final == "K":
            row = self.rows[self.row]
            if n == 0:
                self.rows[self.row] = row[: self.col]
            elif n == 1:
                self.rows[self.row] = " " * min(self.col + 1, len(row)) + row[self.col + 1 :]
            else:
                self.rows[self.row] = ""
        elif final == "J":
            if n == 0:
                self.rows[self.row] = self.rows[self.row][: self.col]
                del self.rows[self.row + 1 :]
            elif n in (2, 3):
                self.rows, self.row, self.col = [""], 0, 0
                self._approx_chars = 0
            # other erase modes do nothing on a terminal (pyte raises on them)
        elif final in "Hf":
            r = (nums[0] if nums else 1) or 1
            c = (nums[1] if len(nums) > 1 else 1) or 1
            top = max(0, len(self.rows) - SCREEN_ROWS)
            target = top + r - 1
            while len(self.rows) <= target:
                self.rows.append("")
            self.row, self.col = target, c - 1
        else:
            self._keep_raw(seq)

    def _keep_raw(self, seq: str) -> None:
        """An escape we do not interpret: keep it inline for pyte to render at the end."""
        self.rows[self.row] = _overwrite(self.rows[self.row], self.col, seq)
        self.col += len(seq)
        self._raw_escapes = True

    def _bound(self) -> None:
        if len(self.rows) > self.max_rows:
            self._drop_head(len(self.rows) - self.max_rows)
        if self._approx_chars > 2 * self.max_chars:
            sizes = list(accumulate(map(len, reversed(self.rows))))
            n_keep = bisect_right(sizes, self.max_chars)
            keep_from = len(self.rows) - n_keep
            total = sizes[n_keep - 1] if n_keep else 0
            if keep_from == len(self.rows):  # one giant row: keep its tail
                row = self.rows[-1]
                cut = len(row) - self.max_chars
                self.rows[-1] = row[cut:]
                if self.row == len(self.rows) - 1:
                    self.col = max(0, self.col - cut)
                keep_from = len(self.rows) - 1
                total = len(self.rows[-1])
            self._drop_head(keep_from)
            self._approx_chars = total

    def _drop_head(self, n: int) -> None:
        if n <= 0:
            return
        del self.rows[:n]
        self.stats.rows_dropped += n
        self.row = max(0, self.row - n)
        if not self.rows:
            self.rows, self.row, self.col = [""], 0, 0

    def clear(self) -> None:
        """``clear_output``: the display starts afresh (the raw log keeps everything)."""
        self.rows, self.row, self.col = [""], 0, 0
        self._approx_chars = 0

    # ---------------------------------------------------------------- rendering
    def render(self, max_rows: int | None = None) -> str:
        """The text a terminal would show (optionally only the last ``max_rows`` rows)."""
        rows = self.rows if max_rows is None else self.rows[-max_rows:]
        if self._raw_escapes:
            rows = _render_raw_tail(rows)
        lines = [r.rstrip() for r in rows]
        while lines and not lines[-1]:
            lines.pop()
        return "\n".join(lines)


def _render_raw_tail(rows: list[str]) -> list[str]:
    """Let pyte interpret uncommon escape sequences, on a bounded tail only."""
    start = next((i for i, r in enumerate(rows) if "\x1b" in r), len(rows))
    if start == len(rows):
        return rows
    start = max(start, len(rows) - PYTE_MAX_ROWS)
    head = [ESC_SEQ_RE.sub("", r) for r in rows[:start]]
    return head + pyte_render(rows[start:])


def pyte_render(rows: list[str]) -> list[str]:
    import pyte  # small, but only needed for unusual output

    width = min(max((len(r) for r in rows), default=1), 1000) or 1
    screen = pyte.Screen(width, len(rows) + 1)
    screen.set_mode(pyte.modes.LNM)
    stream = pyte.Stream(screen)
    stream.feed("\n".join(rows))
    return list(screen.display[: len(rows)])


def render_text(text: str, **kw: int) -> str:
    """Render a complete string at once (convenience for tests, tracebacks, the TUI)."""
    if "\r" not in text and "\x1b" not in text and "\x08" not in text:
        lines = [ln.rstrip() for ln in text.expandtabs(8).split("\n")]
        while lines and not lines[-1]:
            lines.pop()
        return "\n".join(lines)
    buf = TerminalBuffer(**kw)
    buf.feed(text)
    return buf.render()
