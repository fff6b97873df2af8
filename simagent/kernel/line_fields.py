"""One output line read as fields (pure): the numbers in it, the shape its table rows
share, the labels of its numeric columns, and whether it reads as text or as a header.
The digester (``kernel/digest.py``) groups lines into families by these.
"""

from __future__ import annotations

import re

#: A number that is a field of its own: after a delimiter, not inside a word
#: (``DFN-1C`` and ``Cu2O`` are text), not the hour of a ``12:00:05`` clock.
NUM_RE = re.compile(r"(?:(?<=^)|(?<=[\s=(\[{,;|<>/]))[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
                    r"(?![\w.]*:\d)")
_DIGITS = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_SPACE = re.compile(r"\s+")
_REPEAT = re.compile(r"(.{1,24}?)\1{2,}")
_FOLDED: dict[str, str] = {}
_LABEL_EQ = re.compile(r"([A-Za-z_][\w.]*(?:\s?\[[^\]\d]*\])?)\s*=\s*([\[(]?)\s*$")
_LABEL_COLON = re.compile(r"([A-Za-z_][\w.]*(?:\s?\[[^\]\d]*\])?)\s*:\s*([\[(]?)\s*$")
_LABEL_WORD = re.compile(r"([A-Za-z_][\w.]*)\s+$")
_HEADER_FIELD = re.compile(r"\S+(?: \S+)*")


def split_numbers(line: str) -> tuple[str, list[tuple[str, float]], list[tuple[int, int]]]:
    """(shape, numeric fields as (text, value), their spans) of one line.

    The shape is the line with every number (and every other digit run) masked and
    whitespace removed, so rows of one table share it whatever their widths and signs;
    a run of one unit (``#ms:#K`` x 9, a vector's ``#`` x 20) is one shape, any length.
    """
    found = list(NUM_RE.finditer(line))
    flat = _SPACE.sub("", _DIGITS.sub("#", line))
    shape = _FOLDED.get(flat)
    if shape is None:  # folding repeats is the slow part; rows of a table share it
        if len(_FOLDED) > 4096:
            _FOLDED.clear()
        shape = _FOLDED[flat] = _REPEAT.sub(r"\1*", flat)
    return shape, [(m.group(), float(m.group())) for m in found], [m.span() for m in found]


def column_labels(line: str, spans: list[tuple[int, int]], header: str = "",
                  names: tuple[str, ...] = ()) -> list[str]:
    """Names of a row's numeric fields: given names, then ``name=`` labels (and
    ``name=[a b]`` vectors as ``name[i]``), then the header field above the column,
    then ``name:`` or a preceding word, else the column's position."""
    fields = [(m.start(), m.end(), m.group()) for m in _HEADER_FIELD.finditer(header)]
    labels: list[str] = []
    group, index, prev = "", 0, 0
    for k, (start, end) in enumerate(spans):
        gap, prev = line[prev:start], end
        if k < len(names):
            labels.append(names[k])
        elif group and not re.search(r"[\])}A-Za-z=]", gap):  # the next vector element
            index += 1
            labels.append(f"{group}[{index}]")
        elif (m := _LABEL_EQ.search(gap)) or (not (head := _header_over(fields, start, end)) \
                and (m := _LABEL_COLON.search(gap) or _LABEL_WORD.search(gap))):
            opens = m.lastindex == 2 and m.group(2)
            group, index = (m.group(1), 0) if opens else ("", 0)
            labels.append(f"{group}[0]" if opens else m.group(1))
        else:
            group = ""
            labels.append(head or f"#{k + 1}")
    return labels


def _header_over(fields: list[tuple[int, int, str]], start: int, end: int) -> str:
    """The header field above a column: overlapping it, else one edge within 4 chars."""
    over = [t for fs, fe, t in fields if fs < end and start < fe]
    near = [t for fs, fe, t in fields if min(abs(fe - end), abs(fs - start)) <= 4]
    return (over or near or [""])[0]


def clip(text: str, width: int) -> str:
    """``text`` in at most ``width`` chars, its end kept: a row's last fields and a
    warning appended to a row are as telling as its start."""
    if len(text) <= width:
        return text
    tail = max(width // 3, 1)
    return f"{text[: width - tail - 3]} … {text[-tail:]}"


def wordy(line: str) -> bool:
    """Text rather than a table row: numbers are at most a third of its fields (an
    indented table under a warning is not the warning's continuation)."""
    return 3 * len(NUM_RE.findall(line)) <= len(line.split())


def looks_like_header(line: str) -> bool:
    words = re.findall(r"[A-Za-z_][\w/\[\]().*-]*", line)
    return len(words) >= 2 and not NUM_RE.search(re.sub(r"\[[^\]]*\]|\([^)]*\)", "", line))
