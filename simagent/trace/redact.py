"""Keep secrets out of the trace.

Any environment variable whose *name* looks like a credential (``*_API_KEY``, ``*TOKEN*``,
``*SECRET*``, ``*PASSWORD*`` ...) has its *value* replaced wherever it appears in a trace
payload, whether it reached the payload through a tool result, an error message or a
model reply. Matching by value catches the key even when a shell command prints it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping

_SECRET_NAME = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|PRIVATE_KEY|AUTH)",
                          re.IGNORECASE)
#: Shorter values are too likely to collide with ordinary text ("true", "1", a port).
MIN_SECRET_LEN = 8


def secret_values(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{value: NAME}`` for every credential-looking variable in ``environ``."""
    env = os.environ if environ is None else environ
    found: dict[str, str] = {}
    for name, value in env.items():
        if _SECRET_NAME.search(name) and value and len(value) >= MIN_SECRET_LEN:
            found.setdefault(value, name)
    return found


class Redactor:
    """Replaces secret values in serialized JSON text with ``[redacted:NAME]``."""

    def __init__(self, secrets: Mapping[str, str] | None = None) -> None:
        table = secret_values() if secrets is None else dict(secrets)
        # The JSON-escaped form is what appears inside a serialized payload.
        forms: dict[str, str] = {}
        for value, name in table.items():
            forms[value] = name
            forms[json.dumps(value)[1:-1]] = name
        self._forms = sorted(forms.items(), key=lambda kv: -len(kv[0]))  # longest first

    def __bool__(self) -> bool:
        return bool(self._forms)

    def __call__(self, text: str) -> str:
        for value, name in self._forms:
            if value in text:
                text = text.replace(value, f"[redacted:{name}]")
        return text
