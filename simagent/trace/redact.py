"""Keep secrets out of everything simagent writes: one redaction for every sink.

A secret is the *value* of an environment variable whose name looks like a credential
(``*_API_KEY``, ``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*`` ...), of a variable a config
names in ``api_key_env``, or of a config entry whose key looks like one (``api_key =
"..."``). Matching by value catches the key wherever it travels: a cell that prints
``os.environ[...]``, an error message, a model reply that repeats it.

Sinks and where they redact (``tests/test_data_safety.py`` and
``tests/test_secrets_at_rest.py`` grep all of them):

* the trace (``TraceLog.append``: the serialized payload);
* the conversation checkpoints (``trace/checkpoint_redaction.py``: the serializer, so
  every channel: the user's words, replies, tool arguments and results, subagents);
* every tool result, before the model or any context layer sees it
  (``agent/secrets.py``: ``ToolResultRedaction``, innermost in every agent);
* kernel output (``kernel/capture.py``): the raw ``outputs/NNNN.txt`` through
  :class:`StreamRedactor` (a key split across two output chunks is still caught) and,
  for a line with escape sequences, as it reads with them applied
  (``kernel/screen_redact.py``: a key split by a colour code), and the text the model
  gets; execution records ``outputs/NNNN.json`` (``kernel_api/outputs.write_record``) and
  figure sidecars;
* the attempt log (``trace/attempts.py``), memory notes, their file names and the
  ``MEMORY.md`` index (``agent/memory.py``);
* the ledger, task records, history offloads and capped results (``context/``);
* transcripts (``presentation/transcript.py``: the rendered document);
* the TUI's input history (``tui/history.py``: :class:`RedactingFileHistory`);
* ``simagent run``'s stderr activity lines (``headless.py``: :class:`RedactingWriter`,
  and ``one_line`` redacts before it cuts);
* bench records (``bench/workflow_runs.py``: each JSON line);
* an MCP server's stderr log ``mcp-NAME.log`` (``agent/mcp_transport.py``: ``ServerLog``,
  line by line).

Matching is by value, so what it cannot catch is a key transformed before it is
written: split over two lines or strings, encoded (base64, hex), reversed, spaced out,
or only partly printed (README, Secrets).

Config secrets are known once a config is loaded: :func:`register_config` (``simagent
run``, the bench and the TUI call it); the environment is read at each use, so a key set
after start-up is covered too. The kernel's own environment (an attached kernel's, or a
variable a cell set) is read from inside it when simagent starts or attaches to it and
after each cell, and its secret-named values registered (``kernel/env_secrets.py``).
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

#: What a credential's name looks like (case-insensitive): environment variables, config
#: keys, and the kernel's variables the state card shows by length only (the state probe
#: runs in the kernel, so it is sent this text).
SECRET_NAME_PATTERN = r"(API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|PRIVATE_KEY|AUTH)"
_SECRET_NAME = re.compile(SECRET_NAME_PATTERN, re.IGNORECASE)
#: Shorter values are too likely to collide with ordinary text ("true", "1", a port).
MIN_SECRET_LEN = 8

_lock = threading.Lock()
_registered: dict[str, str] = {}  # value -> label, from configs
_named_vars: set[str] = set()  # variables a config names as holding a key


@functools.lru_cache(maxsize=4096)  # asked for every variable on every secret_values()
def looks_secret(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def secret_values(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{value: NAME}`` for every credential-looking variable in ``environ``, every
    variable a loaded config names in ``api_key_env``, and registered config secrets."""
    env = os.environ if environ is None else environ
    found: dict[str, str] = {}
    with _lock:
        named = set(_named_vars)
        found.update(_registered)
    for name in env:  # a value is read (decoded) only for a secret-looking name
        if (looks_secret(name) or name in named) and (value := env.get(name)) \
                and len(value) >= MIN_SECRET_LEN:
            found.setdefault(value, name)
    return found


def register(values: Mapping[str, str] | Iterable[str], *, env_vars: Iterable[str] = ()) -> None:
    """Add secrets (``{value: label}`` or values) and names of variables holding one."""
    items = values.items() if isinstance(values, Mapping) else ((v, "secret") for v in values)
    with _lock:
        for value, label in items:
            if isinstance(value, str) and len(value) >= MIN_SECRET_LEN:
                _registered.setdefault(value, label)
        _named_vars.update(env_vars)


def register_config(config: Any) -> None:
    """The secrets a :class:`simagent.config.Config` holds or points to."""
    data = getattr(config, "data", config)
    values: dict[str, str] = {}
    env_vars: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                where = f"{path}.{key}" if path else str(key)
                if key == "api_key_env" and isinstance(value, str):
                    env_vars.append(value)
                elif isinstance(value, str) and looks_secret(str(key)):
                    values[value] = f"config:{where}"
                else:
                    walk(value, where)
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]")

    walk(data if isinstance(data, Mapping) else {}, "")
    register(values, env_vars=env_vars)


class Redactor:
    """Replaces secret values in text with ``[redacted:NAME]``.

    With no ``secrets`` it follows :func:`secret_values` (environment and registered
    config secrets, re-read when they change); JSON-escaped forms are covered too, as
    they appear inside a serialized payload.
    """

    def __init__(self, secrets: Mapping[str, str] | None = None) -> None:
        self._fixed = None if secrets is None else dict(secrets)
        self._key: Any = None
        self._forms: list[tuple[str, str]] = []
        self._refresh()

    def _refresh(self) -> list[tuple[str, str]]:
        if self._fixed is not None and self._key is not None:
            return self._forms  # a fixed table is built once
        table = self._fixed if self._fixed is not None else secret_values()
        if table != self._key:  # compared as dicts: no sort on every read
            key = dict(table)
            forms: dict[str, str] = {}
            for value, name in table.items():
                forms[value] = name
                forms[json.dumps(value)[1:-1]] = name
            self._forms = sorted(forms.items(), key=lambda kv: -len(kv[0]))  # longest first
            self._key = key
        return self._forms

    def __bool__(self) -> bool:
        return bool(self._refresh())

    def forms(self) -> list[tuple[str, str]]:
        """``(text, NAME)`` for every form of every secret now known, longest first."""
        return self._refresh()

    def prefixes_at_end(self, text: str) -> int:
        """Length of the longest tail of ``text`` that begins some secret (a proper
        prefix). Only tails that start with a secret's first character are tried, longest
        first: on the output path, where every chunk asks this."""
        best = 0
        for value, _ in self._forms:
            if not value:
                continue
            i = text.find(value[0], max(0, len(text) - len(value) + 1))
            while i != -1 and len(text) - i > best:
                if value.startswith(text[i:]):
                    best = len(text) - i
                    break
                i = text.find(value[0], i + 1)
        return best

    def __call__(self, text: str) -> str:
        for value, name in self._refresh():
            if value in text:
                text = text.replace(value, f"[redacted:{name}]")
        return text


_default = Redactor()


def redact(text: str) -> str:
    """The one redaction every sink applies (environment + registered secrets)."""
    return _default(text) if text else text


def redact_data(value: Any) -> Any:
    """``value`` (str, or dicts/lists/tuples of them) with every string redacted: for
    records written as JSON (attempts) and content blocks.

    The secrets are read once per call, not once per string: reading them walks the
    environment, and an execution record holds a dozen strings (it cost the kernel round
    trip ~1 ms, ``simagent bench kernel``)."""
    return _redact_with(_default.forms(), value)


def _redact_with(forms: list[tuple[str, str]], value: Any) -> Any:
    if isinstance(value, str):
        for secret, name in forms:
            if secret in value:
                value = value.replace(secret, f"[redacted:{name}]")
        return value
    if isinstance(value, Mapping):
        return {_redact_with(forms, k): _redact_with(forms, v) for k, v in value.items()}
    if isinstance(value, list | tuple):  # a tuple comes back a plain tuple
        items = [_redact_with(forms, v) for v in value]
        return items if isinstance(value, list) else tuple(items)
    return value


class RedactingWriter:
    """A text stream that redacts what is written to it (headless stderr: activity lines
    quote tool arguments). Whole strings only: callers write one line at a time."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(redact(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class StreamRedactor:
    """Redacts text that arrives in pieces: holds back a tail that could be the start
    of a secret until the next piece (or :meth:`flush`) decides it."""

    def __init__(self, redactor: Redactor | None = None) -> None:
        self.redactor = redactor or _default
        self._carry = ""

    def feed(self, text: str) -> str:
        if not self.redactor:
            out, self._carry = self._carry + text, ""
            return out
        text = self.redactor(self._carry + text)
        keep = self.redactor.prefixes_at_end(text)
        self._carry = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep] if keep else text

    def flush(self) -> str:
        out, self._carry = self._carry, ""
        return self.redactor(out) if out else out
