"""Redact kernel output as a terminal shows it, not only as its bytes run.

The raw ``outputs/NNNN.txt`` keeps a cell's output with its escape sequences, and it is
read back to terminals and to other models (``cat``, MCP ``output`` and resources). A
key split by a colour code (``print("sk-ant-FAKE\\x1b[31mKEY...")``) is not in the bytes
as one piece, so matching the bytes (:class:`simagent.trace.redact.StreamRedactor`)
misses it, while a terminal, or anything that drops the sequences, shows it whole.

:class:`ScreenRedactor` adds a second look after the byte match: a line that holds
terminal sequences (escapes, ``\\r``, backspace) is read with its sequences dropped, as
a reader that ignores them would; when that shows a secret, the line is written as a
terminal would draw it (:func:`simagent.kernel.terminal.render_text`), redacted: its
colours are lost, its text is not. Everything else is written as it came.

Cheap on the hot path: a chunk with no sequences passes straight through, and one whose
text with sequences dropped holds no secret is checked in one regex pass; only then is it
looked at line by line. A line that holds sequences and has no newline yet is held back
(at most :data:`MAX_HELD_CHARS`, a progress bar redrawn with ``\\r`` for long) until its
end arrives. What this cannot see: a key put together across lines by cursor movement, or
by ``\\r`` overwriting part of another (README, Secrets).
"""

from __future__ import annotations

import re

from simagent.kernel.terminal import ESC_SEQ_RE, render_text
from simagent.trace.redact import Redactor, StreamRedactor

#: Longest unfinished line held back to be checked whole; a longer one is checked and
#: written in pieces of this size.
MAX_HELD_CHARS = 64 * 1024
#: What a terminal interprets rather than shows.
_SEQUENCE = re.compile(r"[\r\x08\x1b]")
#: Dropped to read a line the way a reader that ignores escapes does.
_DROPPED = re.compile(ESC_SEQ_RE.pattern + r"|[\r\x08\x1b]")


class ScreenRedactor:
    """Redacts raw output arriving in pieces: the byte match first (a key split across
    pieces), then the terminal's view of lines with sequences in them."""

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor
        self._bytes = StreamRedactor(redactor)
        self._held = ""

    def feed(self, text: str) -> str:
        text = self._bytes.feed(text)
        if not self.redactor:
            return text
        text, self._held = self._held + text, ""
        end = text.rfind("\n") + 1
        rest = text[end:]
        if rest and _SEQUENCE.search(rest) and len(rest) < MAX_HELD_CHARS:
            text, self._held = text[:end], rest
        return self._checked(text)

    def flush(self) -> str:
        text, self._held = self._held + self._bytes.flush(), ""
        return self._checked(text) if self.redactor else text

    def _checked(self, text: str) -> str:
        if not text or not _SEQUENCE.search(text):
            return text
        if not self._hides(_DROPPED.sub("", text)):
            return text
        lines = text.split("\n")
        for i, line in enumerate(lines):
            if _SEQUENCE.search(line) and self._hides(_DROPPED.sub("", line)):
                lines[i] = self.redactor(render_text(line))
        return "\n".join(lines)

    def _hides(self, text: str) -> bool:
        """Whether ``text`` holds a secret."""
        return any(value in text for value, _ in self.redactor.forms())
