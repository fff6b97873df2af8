"""``/notebook`` in a JupyterLab chat: the agent's cells, put into the person's notebook.

The cells are those ``simagent notebook`` writes for the session (the code a restart
would replay, with the outputs the session had: ``notebooks/export.py``); this module
only picks them out of that notebook and inserts them below a cell of another, pure on
nbformat JSON. A cell already there (the same session and execution number, kept in its
``simagent`` metadata) is not inserted twice, so ``/notebook`` again adds only the new.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterable, MutableMapping
from typing import Any

from simagent.notebooks.plan import SKIP_TAG, TAGS

#: nbformat 4.5 is where cells carry ids (the id below which cells go).
_IDS_SINCE = 5


def agent_cells(export: MutableMapping[str, Any]) -> list[dict[str, Any]]:
    """The session's code cells of an exported notebook, without the ``_out`` setup cell
    and the simulator's warm-up (the person's kernel has neither), and without a failed
    or display-only cell the export shows only because an answer's number cites it (the
    person's notebook gets the cells that build state)."""
    cells = []
    shown_only = {TAGS["failed"], TAGS["display"]}
    for cell in export.get("cells", []):
        meta = (cell.get("metadata") or {}).get("simagent") or {}
        tags = set((cell.get("metadata") or {}).get("tags") or ())
        if cell.get("cell_type") == "code" and "n" in meta and not meta.get("setup") \
                and not meta.get("warmup") and not (tags & shown_only and SKIP_TAG in tags):
            cells.append(copy.deepcopy(dict(cell)))
    return cells


def _key(cell: MutableMapping[str, Any]) -> tuple[Any, Any] | None:
    meta = (cell.get("metadata") or {}).get("simagent") or {}
    return (meta.get("session_id"), meta.get("n")) if "n" in meta else None


def insert_below(nb: MutableMapping[str, Any], cells: Iterable[dict[str, Any]],
                 cell_id: str | None) -> int:
    """Insert ``cells`` into notebook JSON ``nb`` below the cell whose id is ``cell_id``
    (at the end when it is None or not found), each with a fresh id; returns how many
    went in (those already in ``nb`` are skipped)."""
    present = {k for c in nb.get("cells", []) if (k := _key(c)) is not None}
    ids = {c.get("id") for c in nb.get("cells", [])}
    new = []
    for cell in cells:
        if _key(cell) in present:
            continue
        cell = dict(cell)
        cell["id"] = _fresh(ids)
        ids.add(cell["id"])
        new.append(cell)
    existing = nb.setdefault("cells", [])
    at = next((i + 1 for i, c in enumerate(existing) if cell_id and c.get("id") == cell_id),
              len(existing))
    existing[at:at] = new
    if nb.get("nbformat", 4) == 4 and nb.get("nbformat_minor", 0) < _IDS_SINCE:
        nb["nbformat_minor"] = _IDS_SINCE  # ids on every cell from here
        for c in existing:
            if not c.get("id"):
                c["id"] = _fresh(ids)
                ids.add(c["id"])
    return len(new)


def _fresh(taken: set[Any]) -> str:
    while (cid := uuid.uuid4().hex[:8]) in taken:
        pass
    return cid
