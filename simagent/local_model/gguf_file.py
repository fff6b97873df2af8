"""What a GGUF file says about itself, read before a server is started for it.

A missing file, a file that is not GGUF, or one cut short must fail with one line before
any process exists; the window the model was trained for bounds the window simagent may
ask of it. The ``gguf`` package (from the ``local`` extra) reads the header.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from simagent.exit_codes import USAGE
from simagent.models import ModelError

MAGIC = b"GGUF"


@dataclass(frozen=True)
class GgufInfo:
    path: Path
    architecture: str
    name: str
    #: The context the model was trained for (``<arch>.context_length``); None if unsaid.
    trained_window: int | None
    has_chat_template: bool


def inspect_gguf(path: Path) -> GgufInfo:
    """Read ``path``'s header; ``ModelError`` (usage) when it is missing or not a model."""
    if path.is_dir():
        raise ModelError(f"{path} is a folder, not a GGUF model file", code=USAGE)
    if not path.is_file():
        raise ModelError(f"local model file not found: {path}", code=USAGE)
    try:
        with path.open("rb") as fh:
            head = fh.read(4)
    except OSError as exc:  # unreadable (permissions), or gone since
        raise ModelError(f"cannot read {path}: {exc.strerror or exc}", code=USAGE) from exc
    if head != MAGIC:
        raise ModelError(f"{path} is not a GGUF model file (it does not start with "
                         "'GGUF')", code=USAGE)
    try:
        from gguf import GGUFReader  # the local extra

        reader = GGUFReader(str(path))
        fields = reader.fields

        def value(key: str) -> object:
            field = fields.get(key)
            return field.contents() if field is not None else None

        arch = str(value("general.architecture") or "")
        trained = value(f"{arch}.context_length")
        return GgufInfo(path, arch, str(value("general.name") or path.stem),
                        int(trained) if isinstance(trained, int) and trained > 0 else None,
                        "tokenizer.chat_template" in fields)
    except ImportError as exc:
        raise ModelError("local: models need the local extra: pip install 'simagent[local]'"
                         ) from exc
    except Exception as exc:  # numpy / struct errors of a truncated or damaged file
        reason = " ".join(str(exc).split())[:160] or type(exc).__name__
        raise ModelError(f"{path} is a damaged GGUF model file ({reason})", code=USAGE) from exc
