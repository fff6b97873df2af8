"""The session's investigation log: ``record_attempt``'s entries, one JSON line each in
``attempts.jsonl``. It survives resume and is never cleared from the model's context, so it
lives with the other append-only session records (private, secrets redacted).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from simagent.jsonl import append_jsonl, read_jsonl
from simagent.paths import private_opener
from simagent.trace.redact import redact_data


class AttemptLog:
    """The session's attempts (``attempts.jsonl``), oldest first."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def all(self) -> list[dict[str, Any]]:
        return read_jsonl(self.path)

    def add(self, **fields: Any) -> dict[str, Any]:
        record = {"index": len(self.all()) + 1, "id": uuid.uuid4().hex[:12],
                  "ts": time.strftime("%Y-%m-%dT%H:%M:%S"), **redact_data(fields)}
        append_jsonl(self.path, json.dumps(record, default=str), opener=private_opener)
        return record
