"""The ruler: real BPE token counts, offline, chosen per model family (one home).

Every token figure simagent shows or acts on (thresholds, ``/context``, the status bar,
the scripted model's usage, the bench) is counted here. chars/4 is not a ruler for kernel
output: numbers, scientific notation and tables tokenize about twice as densely as prose,
so a window measured that way is in effect twice as large as the provider's.

Why tiktoken with shipped encoding files: tiktoken is OpenAI's reference tokenizer (Rust,
fast, already installed through langchain-openai), but it downloads its ``.tiktoken``
rank files on first use, which no machine here can do. The two files we need ship in
``encodings/`` (gzip, 2.4 MB) and are checked against the sha256 that tiktoken itself
expects before use; the pattern and special tokens still come from ``tiktoken_ext``, so
the encodings are exactly tiktoken's. Nothing here touches the network.

Model families: ``cl100k_base`` for the GPT-4 / GPT-3.5 generation, ``o200k_base`` for
every later OpenAI model and as the proxy for all other providers (Anthropic, Google and
local models tokenize differently; the calibration in ``counting.calibrate`` learns each
session's correction from the usage the provider reports). ``approx`` is langchain's
chars/4, kept for peers' behaviour (the bench's ``stock`` policy decides with it, as
deepagents does) and for before/after comparisons.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import logging
import re
import threading
import types
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENCODINGS_DIR = Path(__file__).with_name("encodings")
#: Encodings simagent can count with; each ships as ``encodings/<name>.tiktoken.gz``.
REAL_ENCODINGS = ("o200k_base", "cl100k_base")
APPROX = "approx"
RULERS = (*REAL_ENCODINGS, APPROX)
DEFAULT_ENCODING = "o200k_base"
#: Model ids counted with cl100k (matched against the part after ``provider:``).
CL100K_MODELS = re.compile(r"^(gpt-4(?!o|\.\d)(-\d+k)?(-\d{4}.*|-turbo.*|-preview)?|"
                           r"gpt-3\.5.*|text-embedding-(3|ada).*)$")
#: Texts whose counts are remembered (by length and hash: a long session's history is
#: counted once, not on every call). ~100 bytes an entry.
CACHE_ENTRIES = 50_000
#: Below this many characters a text goes to a plain dict instead (no lock, no LRU order):
#: roles, call ids and tool names recur on every message of every request, and encoding
#: them each time was a tenth of a long replay's counting time.
CACHE_MIN_CHARS = 64
#: Short texts remembered; the dict is emptied when full (they are cheap to count again).
SHORT_ENTRIES = 20_000


def encoding_for_model(model_id: str | None) -> str:
    """The encoding that counts ``model_id``'s tokens (o200k for anything unknown)."""
    name = (model_id or "").split(":", 1)[-1].split("@", 1)[0].strip().lower()
    return "cl100k_base" if CL100K_MODELS.match(name) else DEFAULT_ENCODING


class EncodingFileError(RuntimeError):
    """A shipped encoding file is missing or not the one tiktoken expects."""


_LOCK = threading.Lock()
_ENCODINGS: dict[str, Any] = {}


def _shipped_ranks(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
    """Stands in for tiktoken's downloader: the shipped file named like the URL's."""
    name = url.rsplit("/", 1)[-1]
    path = ENCODINGS_DIR / f"{name}.gz"
    try:
        data = gzip.decompress(path.read_bytes())
    except OSError as exc:
        raise EncodingFileError(f"simagent's encoding file {path} is missing or unreadable "
                                f"({exc}); reinstall simagent") from exc
    if expected_hash and hashlib.sha256(data).hexdigest() != expected_hash:
        raise EncodingFileError(f"{path} is not tiktoken's {name} (sha256 mismatch); "
                                "reinstall simagent")
    ranks = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def encoding(name: str = DEFAULT_ENCODING) -> Any:
    """tiktoken's ``Encoding`` for ``name``, built from the shipped file (loaded once)."""
    if name not in REAL_ENCODINGS:
        raise ValueError(f"unknown encoding {name!r} (known: {', '.join(REAL_ENCODINGS)})")
    enc = _ENCODINGS.get(name)
    if enc is not None:
        return enc
    with _LOCK:
        if name not in _ENCODINGS:
            import tiktoken  # heavy: loads with the first real count, not with this module
            from tiktoken_ext import openai_public  # with tiktoken, as above

            # tiktoken's own constructor, run with the shipped-file loader in its globals
            # (a copy: patching the module would race other threads that load encodings)
            ctor = getattr(openai_public, name)
            local = types.FunctionType(ctor.__code__, {**vars(openai_public),
                                                       "load_tiktoken_bpe": _shipped_ranks})
            _ENCODINGS[name] = tiktoken.Encoding(**local())
    return _ENCODINGS[name]


@dataclass(frozen=True)
class Ruler:
    """Counts tokens of text with one encoding; counts are cached per text content."""

    name: str

    @property
    def real(self) -> bool:
        return self.name != APPROX

    def count(self, text: str) -> int:
        """Tokens of ``text``. If the encoding cannot load (a broken install), chars/4
        with one warning: a count must never cost a model call; ``doctor`` names it."""
        if not text:
            return 0
        if not self.real or self.name in _BROKEN:
            return -(-len(text) // 4)
        short = len(text) < CACHE_MIN_CHARS
        if short:  # a hit means the encoding loaded before
            hit = _SHORT.get((self.name, text))
            if hit is not None:
                return hit
        else:
            key = (self.name, len(text), hash(text))
            with _CACHE_LOCK:
                hit = _CACHE.get(key)
                if hit is not None:
                    _CACHE.move_to_end(key)
                    return hit
        try:
            encoding(self.name)
        except EncodingFileError as exc:
            _broken(self.name, exc)
            return -(-len(text) // 4)
        n = len(_encode(self.name, text))
        if short:
            if len(_SHORT) >= SHORT_ENTRIES:
                _SHORT.clear()
            _SHORT[(self.name, text)] = n
            return n
        with _CACHE_LOCK:
            _CACHE[key] = n
            if len(_CACHE) > CACHE_ENTRIES:
                _CACHE.popitem(last=False)
        return n


_BROKEN: dict[str, str] = {}  # encodings that failed to load, with the reason


def _broken(name: str, exc: Exception) -> None:
    with _LOCK:
        first = name not in _BROKEN
        _BROKEN[name] = str(exc)
    if first:
        logging.getLogger("simagent").warning("counting with chars/4: %s", exc)


def broken_encodings() -> dict[str, str]:
    """Encodings that failed to load in this process (name -> reason)."""
    return dict(_BROKEN)


def _encode(name: str, text: str) -> list[int]:
    # special-token text in a tool output is ordinary text to a provider
    return encoding(name).encode(text, disallowed_special=())


_CACHE: OrderedDict[tuple[str, int, int], int] = OrderedDict()
_CACHE_LOCK = threading.Lock()
#: (encoding, short text) -> tokens; dict reads and writes are atomic, so no lock
_SHORT: dict[tuple[str, str], int] = {}


def clear_cache() -> None:
    """Forget cached counts (the bench measures uncached counting cost with it)."""
    with _CACHE_LOCK:
        _CACHE.clear()
        _SHORT.clear()


def resolve_ruler(model_id: str | None, choice: str = "auto") -> Ruler:
    """``auto``: by model family; otherwise the named encoding or ``approx``."""
    if choice == "auto":
        return Ruler(encoding_for_model(model_id))
    if choice not in RULERS:
        raise ValueError(f"unknown tokenizer {choice!r} (known: auto, {', '.join(RULERS)})")
    return Ruler(choice)


_ACTIVE: ContextVar[Ruler | None] = ContextVar("simagent_ruler", default=None)


def active_ruler() -> Ruler:
    """The ruler of the agent whose context is being measured (default: o200k)."""
    return _ACTIVE.get() or Ruler(DEFAULT_ENCODING)


@contextmanager
def using(ruler: Ruler) -> Iterator[Ruler]:
    """Count with ``ruler`` inside the block (a context layer measuring for its model)."""
    token = _ACTIVE.set(ruler)
    try:
        yield ruler
    finally:
        _ACTIVE.reset(token)
