"""What the command line hands over, made safe to use and to explain.

Standard library only, like ``simagent.cli``: these run before any heavy import.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import BinaryIO

from simagent.exit_codes import CliError
from simagent.paths import state_home

#: ``simagent run -``: the prompt is standard input.
STDIN = "-"


def argv_text(text: str) -> str:
    """``text`` from the command line, as valid Unicode.

    Python hands over bytes that are not UTF-8 as lone surrogates, which no file, trace
    or provider can store. They become U+FFFD (what an editor shows for them), and one
    stderr line says so: the turn still runs on the words that did decode, which is what
    someone whose terminal sent one Latin-1 byte expects, and nothing is changed silently.
    """
    if not _has_surrogates(text):
        return text
    raw = os.fsencode(text)
    bad = sorted({f"\\x{b:02x}" for b in raw if b >= 0x80})
    fixed = raw.decode("utf-8", errors="replace")
    print(f"simagent: note: the prompt has bytes that are not UTF-8 ({', '.join(bad[:5])}); "
          "each is sent as \ufffd — set a UTF-8 locale to send such characters as typed",
          file=sys.stderr)
    return fixed


def read_prompt(words: list[str], prompt_file: str | None, stdin: BinaryIO | None
                ) -> tuple[str, str]:
    """The prompt and where it came from (``PROMPT`` words, ``--prompt-file``, or standard
    input: ``-``, or piped without a ``PROMPT``; ``stdin`` None: do not read it).

    A file or a pipe has no length limit; one argument has the OS's (128 KiB on Linux),
    so a long prompt goes this way. Its bytes are decoded as the words are
    (:func:`argv_text`): what is not UTF-8 becomes U+FFFD, and a line says so.
    """
    if prompt_file is not None:
        if words:
            raise CliError("give the prompt as PROMPT or as --prompt-file, not both")
        path = Path(prompt_file).expanduser()
        if not path.is_file():
            raise CliError(f"prompt file {path} "
                           f"{'is a folder' if path.is_dir() else 'does not exist'}")
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise CliError(f"cannot read prompt file {path}: {exc.strerror or exc}") from exc
        return argv_text(raw.decode("utf-8", "surrogateescape")), f"prompt file {path}"
    if words == [STDIN] or (not words and stdin is not None):
        raw = stdin.read() if stdin is not None else b""
        return argv_text(raw.decode("utf-8", "surrogateescape")), "standard input"
    return argv_text(" ".join(words)), "PROMPT"


def _has_surrogates(text: str) -> bool:
    return any("\udc80" <= ch <= "\udcff" for ch in text)


def undecodable_argument(values: dict[str, object], *, prose: tuple[str, ...] = ("prompt",)
                         ) -> str | None:
    """One line naming a command-line value (a path, a model, an id) whose bytes are not
    UTF-8, or None. Unlike the prompt, such a value cannot be repaired: a replaced byte
    would name another file, and the trace, checkpoints and providers all store UTF-8.
    ``prose`` names the values :func:`argv_text` repairs instead."""
    for key, value in values.items():
        if key in prose:
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and _has_surrogates(item):
                bad = ", ".join(sorted({f"\\x{b:02x}" for b in os.fsencode(item) if b >= 0x80}))
                shown = os.fsencode(item).decode("utf-8", errors="replace")
                return (f"{key.replace('_', ' ')} {shown!r} has bytes that are not UTF-8 "
                        f"({bad}); use a UTF-8 name (rename the file or folder)")
    return None


def unwritable(exc: OSError, workspace: str | os.PathLike[str] | None = None) -> str | None:
    """One line for a place simagent must write to but cannot (read-only file system,
    no permission, disk full), naming it and the way out; None for other errors. The way
    out depends on whose place it is: the state home, the ``workspace``, or a path the
    person named (``-o``, ``--out``).

    A configuration problem of the machine, not a bug: exit 2 (design.md §3).
    """
    if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC,
                         errno.EDQUOT) or not exc.filename:
        return None

    path = Path(exc.filename)
    home = state_home()
    why = exc.strerror or type(exc).__name__
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if path == home or home in path.parents or path in home.parents:  # or a folder above it
        fix = "free some space on its disk" if full else "make it writable"
        return (f"cannot write simagent's state folder {home} ({why}: {path}); "
                f"{fix}, or point SIMAGENT_HOME at a writable folder")
    ws = Path(workspace).resolve() if workspace is not None else None
    if full:
        fix = "free some space on its disk"
    elif ws is not None and (path == ws or ws in path.resolve().parents):
        fix = "the workspace must be writable: run simagent in a writable folder, or pass " \
              "--workspace DIR"
    else:
        fix = "choose a writable location"
    return f"cannot write {path} ({why}); {fix}"
