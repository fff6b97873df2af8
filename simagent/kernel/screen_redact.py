"""Redact kernel output as it reads once its escape sequences are applied, not only as
its bytes run.

The raw ``outputs/NNNN.txt`` keeps a cell's output with its escape sequences, and it is
read back to terminals and to other models (``cat``, MCP ``output`` and resources). A
key split by a colour code (``print("sk-ant-FAKE\\x1b[31mKEY...")``) is not in the bytes
as one piece, so matching the bytes (:class:`simagent.trace.redact.StreamRedactor`)
misses it, while a terminal, or anything that strips the sequences, shows it whole.

:class:`ScreenRedactor` adds a second look after the byte match: a line that holds
escape sequences is read with them dropped; when that shows a secret, the line is
written as a terminal would draw it (:func:`simagent.kernel.terminal.render_text`),
redacted: its colours are lost, its text is not. Everything else is written as it came.

Cheap on the hot path: a chunk with no escape passes straight through; one with escapes
is first tested for the start of a secret (:func:`starts`, a few ``in`` tests), and
only then are its sequences dropped and matched, and its lines looked at one by one. A
line with an escape and no newline yet is held back (at most :data:`MAX_HELD_CHARS`)
until its end arrives. What this cannot see: a key put together on screen by carriage
returns, backspaces or cursor movement overwriting other text (README, Secrets).
"""

from __future__ import annotations

from collections.abc import Sequence

from simagent.kernel.terminal import ESC_SEQ_RE, render_text
from simagent.trace.redact import Redactor, StreamRedactor

#: Longest unfinished line held back to be checked whole; a longer one is checked and
#: written in pieces of this size.
MAX_HELD_CHARS = 64 * 1024
#: How many leading characters of a secret :func:`_could_hold` looks for.
_HEAD = 2


def starts(forms: Sequence[tuple[str, str]]) -> frozenset[str]:
    """How the first piece of a secret split by escape sequences shows in the raw text:
    its first :data:`_HEAD` characters, or fewer right before an escape. Raw text that
    holds none of these holds no split secret: a test several times cheaper than
    dropping the sequences (coloured logs are all escapes)."""
    out = set()
    for value, _ in forms:
        head = value[:_HEAD]
        out.add(head)
        out.update(head[:k] + "\x1b" for k in range(1, len(head)))
    return frozenset(out)


class ScreenRedactor:
    """Redacts raw output arriving in pieces: the byte match first (a key split across
    pieces), then lines whose escape sequences, dropped, show a secret."""

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor
        self._bytes = StreamRedactor(redactor)
        self._held = ""
        self._starts: tuple[object, frozenset[str]] = (None, frozenset())

    def feed(self, text: str) -> str:
        text = self._bytes.feed(text)
        if not self.redactor:
            return text
        text, self._held = self._held + text, ""
        end = text.rfind("\n") + 1
        rest = text[end:]
        if "\x1b" in rest and len(rest) < MAX_HELD_CHARS:
            text, self._held = text[:end], rest
        return self._checked(text)

    def flush(self) -> str:
        text, self._held = self._held + self._bytes.flush(), ""
        return self._checked(text) if self.redactor else text

    def _checked(self, text: str) -> str:
        if "\x1b" not in text:
            return text
        forms = self.redactor.forms()
        if self._starts[0] is not forms:  # the secrets changed (or first use)
            self._starts = (forms, starts(forms))
        if not any(s in text for s in self._starts[1]) or \
                not _holds(ESC_SEQ_RE.sub("", text), forms):
            return text
        lines = text.split("\n")
        for i, line in enumerate(lines):
            if "\x1b" in line and _holds(ESC_SEQ_RE.sub("", line), forms):
                lines[i] = self.redactor(render_text(line))
        return "\n".join(lines)


def _holds(text: str, forms: Sequence[tuple[str, str]]) -> bool:
    """Whether ``text`` holds a secret."""
    return any(value in text for value, _ in forms)
