"""What one execution produced, and the text the model sees of it (design.md §6).

Caps live here and nowhere else: the model-facing text is tail-capped (the end of a
run is where results and errors are), values and errors are capped at 64 KiB, and the
marker always says how much was dropped and where the full raw output is on disk, and
which of its lines were left out when the raw file shows that for sure (``cut_lines``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from simagent.head_tail import head_and_tail
from simagent.kernel.cut_lines import Cut, cut_note, kernel_slice, locate_cut
from simagent.kernel.terminal import ESC_SEQ_RE
from simagent.kernel_api.outputs import handle, number_of

#: ``not_run``: the cell never ran (``simagent.outcomes.NOT_RUN``: no result).
Status = Literal["ok", "error", "interrupted", "died", "timeout", "not_run"]

#: Model-facing text of one execution (streams + value + displays + error), in characters.
MODEL_TEXT_CAP = 256 * 1024
#: Result value (text/plain) and error text, in bytes of UTF-8.
VALUE_CAP = 64 * 1024
#: Frames kept from the end of a library traceback (where the error was raised).
TRACEBACK_TAIL_FRAMES = 2
#: Lines kept per traceback frame (header + source context).
TRACEBACK_FRAME_LINES = 8
#: The whole model-facing text of a cell that ran and showed nothing.
NO_OUTPUT = "(no output)"


def cap_bytes(text: str, cap: int = VALUE_CAP) -> str:
    """Cut ``text`` to ``cap`` UTF-8 bytes at a character boundary, saying how much went."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= cap:
        return text
    kept = data[:cap].decode("utf-8", "ignore")
    return f"{kept}\n… (truncated; {len(data) - len(kept.encode())} more bytes)"


def strip_ansi(text: str) -> str:
    return ESC_SEQ_RE.sub("", text)


def compact_traceback(frames: list[str]) -> str:
    """A short, colourless traceback from IPython's frame list.

    Keeps every frame of user code (``Cell In[..]`` or files under the workspace are not
    distinguishable here, so cells) and the last few library frames, where the error was
    raised; the middle of a deep library stack is replaced by a count. The final
    ``Name: message`` line is always kept.
    """
    plain = [strip_ansi(f).rstrip("\n") for f in frames]
    if plain and set(plain[0].strip()) <= {"-"}:
        plain = plain[1:]  # the dashed rule IPython draws
    if plain and plain[0].rstrip().endswith("Traceback (most recent call last)"):
        plain = plain[1:]
    if not plain:
        return ""
    *body, last = plain
    kept: list[str] = []
    omitted = 0
    for i, frame in enumerate(body):
        is_cell = frame.lstrip().startswith(("Cell In[", "File <ipython-input", "Input In ["))
        near_end = i >= len(body) - TRACEBACK_TAIL_FRAMES
        if is_cell or near_end:
            if omitted:
                kept.append(f"... [{omitted} library frame{'s' * (omitted > 1)} omitted] ...")
                omitted = 0
            lines = frame.split("\n")
            if len(lines) > TRACEBACK_FRAME_LINES:
                # keep the header and the lines around the arrow that marks the failing line
                arrow = next((j for j, ln in enumerate(lines)
                              if ln.lstrip().startswith(("---->", "->"))), -1)
                lo = max(1, arrow - 2) if arrow > 0 else 1
                lines = [lines[0], *lines[lo : lo + TRACEBACK_FRAME_LINES - 1]]
            kept.append("\n".join(lines))
        else:
            omitted += 1
    kept.append(last)
    return cap_bytes("\n".join(kept))


@dataclass
class ErrorInfo:
    ename: str
    evalue: str
    traceback: str  # compact, colourless

    def text(self) -> str:
        head = f"{self.ename}: {self.evalue}" if self.evalue else self.ename
        if self.traceback and head not in self.traceback:
            return f"{self.traceback}\n{head}"
        return self.traceback or head


@dataclass
class Display:
    """One rich output: images are saved to disk, other types summarised."""

    mime: str
    text: str  # model-facing one-liner or text/plain
    path: Path | None = None
    display_id: str | None = None
    #: Images: the content-hash id (``fig-<hex>``); True when an earlier execution showed it.
    figure_id: str | None = None
    duplicate: bool = False
    title: str | None = None


@dataclass
class ExecResult:
    status: Status
    stdout: str = ""
    stderr: str = ""
    value: str | None = None
    error: ErrorInfo | None = None
    displays: list[Display] = field(default_factory=list)
    raw_path: Path | None = None
    execution_count: int | None = None
    elapsed_s: float = 0.0
    #: Something the model must know beyond the output (interrupt, restart, lost state).
    notice: str = ""
    #: True when kernel state (variables, imports) was lost during or before this run
    #: and a restart's replay did not bring all of it back.
    state_lost: bool = False
    #: Stream characters received from the kernel and rendered rows dropped from the head.
    raw_chars: int = 0
    rows_dropped: int = 0
    cap: int = MODEL_TEXT_CAP
    #: Notices for the person only (``HUMAN_MIME`` displays); never in ``model_text``.
    human: list[str] = field(default_factory=list)
    #: The recovery ladder, when it ran for this execution (``ladder.Recovery.to_dict``:
    #: trigger, steps, seconds, replayed, skipped, state_restored ...); ``notice`` says
    #: the same in words.
    recovery: dict[str, Any] | None = None
    #: True when the cell's end was inferred from its reply because its iopub idle status
    #: never came (``kernel.cell_end``): output sent at its very end may be missing.
    output_maybe_incomplete: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def model_text(self, cap: int | None = None,
                   digest: Callable[[int], tuple[str, str, int] | None] | None = None) -> str:
        """The text a model sees: streams, value, displays, error, notice; capped.

        Value, displays, error and notice are always kept whole (errors teach). Streams
        over the budget keep their head (setup, parameters) and their longer tail
        (results) around a marker naming the raw output file (the cut is
        ``simagent.head_tail``'s); when capture already dropped the head of a huge output,
        only the tail is left to show. ``digest``
        (``simagent.kernel.digesters.output_digester``) is asked, only then, for a digest of
        the whole raw output in at most half the budget: (digester, text, lines read) or
        None; it goes after the marker, head and tail share what is left.
        """
        cap = cap or self.cap
        tail_parts: list[str] = []
        if self.value is not None:
            tail_parts.append(f"Out[{self.execution_count}]: {self.value}"
                              if self.execution_count else self.value)
        tail_parts.extend(d.text for d in self.displays)
        if self.error is not None:
            tail_parts.append(self.error.text())
        if self.notice:
            tail_parts.append(f"[{self.notice}]")
        tail = "\n".join(tail_parts)

        streams = self.stdout
        if self.stderr:
            err = f"[stderr]\n{self.stderr}"
            streams = f"{streams}\n{err}" if streams else err
        # the streams' room: the cap less the whole tail and the newline joining them
        room = max(cap - len(tail) - bool(tail), cap // 4)
        if self.rows_dropped > 0 or len(streams) > room:
            streams = self._cut_streams(streams, room, cap, digest)
        text = "\n".join(p for p in (streams, tail) if p)
        if not text:
            return NO_OUTPUT if self.status == "ok" else f"[{self.status}]"
        return text

    def _cut_streams(self, streams: str, room: int, cap: int,
                     digest: Callable[[int], tuple[str, str, int] | None] | None) -> str:
        """Head, marker, digest and tail of ``streams`` in at most ``room`` chars, the
        marker included: the cap is what the caller is told, so it holds for the whole
        text. The marker's length depends on what it counts, so the shown part shrinks
        by any overshoot and is cut again (twice at most in practice)."""
        block = ""
        made = digest(room // 2) if digest is not None else None
        if made:
            name, text, lines = made
            block = (f"[digest of {lines:,} lines by the {name} digester: tables collapsed "
                     f"to statistics, warnings, errors and final lines verbatim]\n{text}\n"
                     f"[end of digest; the output's end follows]\n")
        budget = max(room - len(block), cap // 8)
        while True:
            head, kept = head_and_tail(streams, budget, with_head=self.rows_dropped == 0)
            hidden = self.rows_dropped + streams.count("\n", len(head),
                                                       len(streams) - len(kept))
            marker = self.truncation_marker(len(head) + len(kept),
                                            self._cut(streams, head, kept), hidden)
            text = f"{head}{marker}\n{block}{kept}" if head else f"{marker}\n{block}{kept}"
            over = len(text) - room
            if over <= 0 or budget <= 1:  # (a budget of 0 would keep the whole tail)
                return text
            budget = max(budget - over, 1)

    def _cut(self, streams: str, head: str, tail: str) -> Cut | None:
        """The raw lines the cut left out, when the raw file shows them as the model's
        head and tail (stderr interleaves there, so only stdout-only output is tried)."""
        if self.stderr or number_of(self.raw_path) is None:
            return None
        whole = len(tail) == len(streams) or streams[-len(tail) - 1] == "\n"
        return locate_cut(self.raw_path, head, tail, tail_whole=whole)  # type: ignore[arg-type]

    def truncation_marker(self, shown_chars: int, cut: Cut | None = None,
                          hidden_rows: int | None = None) -> str:
        """The marker between head and tail. One count of what is not shown: the raw
        lines a ``cut`` names when it is known, else ``hidden_rows`` (rows as rendered,
        those capture dropped included) when the head was dropped."""
        where = f"full output: {self.raw_path}" if self.raw_path else "full output not kept"

        if (n := number_of(self.raw_path)) is not None:
            where += (f"; {cut_note(cut, kernel_slice(n, cut))} or .grep(pattern)" if cut
                      else f"; in the kernel: {handle(n)}.tail(k) / .grep(pattern)")
        if self.rows_dropped == 0:
            return (f"[output truncated: {_size(shown_chars)} of {_size(self.raw_chars)} "
                    f"printed are shown (head and tail); {where}]")
        rows = self.rows_dropped if hidden_rows is None else hidden_rows
        earlier = "" if cut else f"; {rows:,} earlier lines not shown"
        return (f"[output truncated: showing the last {_size(shown_chars)} of "
                f"{_size(self.raw_chars)} printed{earlier}; {where}]")


def _size(n: int) -> str:
    for unit, k in (("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{n} chars"


_PNG_SIZE = re.compile(rb"\x89PNG\r\n\x1a\n....IHDR(....)(....)", re.S)


def png_size(data: bytes) -> tuple[int, int] | None:
    m = _PNG_SIZE.match(data[:32])
    if not m:
        return None
    return int.from_bytes(m.group(1), "big"), int.from_bytes(m.group(2), "big")
