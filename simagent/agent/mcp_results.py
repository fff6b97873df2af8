"""What an MCP tool's result becomes for the model (issue 28, part 2).

A server answers with content blocks: text, images, audio, links, embedded resources.
The hub turns them into plain dict blocks once (:func:`blocks_of`); each agent build
then renders them for its model (:func:`for_model`): text joined, and an image either
sent as an image block (when the model takes images in tool results,
``simagent.models.image_support``) or named by the file it was saved to. Every image is
saved in the session's artifacts as ``fig-<sha256[:8]>.<ext>`` with a sidecar record, as
the kernel's figures are, so the person finds it beside them and ``view_figure`` opens
it; base64 is never pasted into the context as text.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from pathlib import Path
from typing import Any

from simagent.paths import private_dir, private_opener, write_private

#: File suffix per image type a server may send; others are saved as ``.bin``.
_SUFFIX = {"image/png": ".png", "image/jpeg": ".jpg", "image/gif": ".gif",
           "image/webp": ".webp", "image/svg+xml": ".svg"}
#: Image types the providers all accept in a tool result (others are only saved).
SENDABLE = ("image/png", "image/jpeg")


def blocks_of(content: Any) -> list[dict[str, Any]]:
    """An MCP ``CallToolResult.content`` list as dict blocks: ``text`` (text, or an
    embedded text resource), ``image`` (``base64``, ``mime_type``), or ``other`` (one line
    naming what it was: audio, a link, a binary resource)."""
    out: list[dict[str, Any]] = []
    for c in content or []:
        kind = getattr(c, "type", "")
        if kind == "text":
            out.append({"type": "text", "text": c.text})
        elif kind == "image":
            out.append({"type": "image", "base64": c.data, "mime_type": c.mimeType})
        elif kind == "resource" and hasattr(c.resource, "text"):
            out.append({"type": "text", "text": c.resource.text})
        elif kind == "resource" and str(c.resource.mimeType or "").startswith("image/"):
            out.append({"type": "image", "base64": c.resource.blob,
                        "mime_type": c.resource.mimeType})
        elif kind == "resource_link":
            out.append({"type": "other", "text": f"[link {c.mimeType or ''}: {c.uri}]"})
        else:
            mime = getattr(c, "mimeType", None) or getattr(
                getattr(c, "resource", None), "mimeType", None) or ""
            out.append({"type": "other", "text": f"[{kind or 'block'} {mime}: not shown]"})
    return out


def save_image(block: dict[str, Any], folder: Path, source: str) -> tuple[str, Path] | str:
    """Write an image block to ``folder`` once (named by its content hash, a sidecar
    ``.json`` saying where it came from): (figure id, path), or why it was not saved."""
    try:
        blob = base64.b64decode(str(block.get("base64") or ""), validate=True)
    except (binascii.Error, ValueError):
        return "its base64 data is not valid"
    if not blob:
        return "it was empty"
    fid = "fig-" + hashlib.sha256(blob).hexdigest()[:8]
    mime = str(block.get("mime_type") or "")
    path = folder / f"{fid}{_SUFFIX.get(mime, '.bin')}"
    try:
        private_dir(folder)
        if not path.exists():  # 0600, as the kernel's figures
            with open(path, "wb", opener=private_opener) as fh:
                fh.write(blob)
            write_private(path.with_suffix(".json"), json.dumps(
                {"source": source, "mime_type": mime, "bytes": len(blob)}))
    except OSError as exc:
        return f"it could not be saved ({exc.strerror or exc})"
    return fid, path


def for_model(blocks: list[dict[str, Any]], *, images: bool, why: str, folder: Path,
              source: str) -> str | list[dict[str, Any]]:
    """The tool result the model gets: a string, or text and image blocks when the
    model takes images and the server sent a PNG or JPEG. ``source`` (``server.tool``)
    and ``why`` (why images are not sent) go into the line that names a saved image."""
    parts: list[dict[str, Any]] = []
    for b in blocks:
        if b["type"] != "image":
            parts.append({"type": "text", "text": str(b.get("text", ""))})
            continue
        mime = str(b.get("mime_type") or "image")
        saved = save_image(b, folder, source)
        if isinstance(saved, str):
            parts.append({"type": "text", "text": f"[image {mime} from {source}: not "
                                                  f"shown, {saved}]"})
            continue
        fid, path = saved
        if images and mime in SENDABLE:
            parts.append({"type": "text", "text": f"[image {fid} {mime}: {path}]"})
            parts.append({"type": "image", "base64": b["base64"], "mime_type": mime})
            continue
        reason = why if not images else f"only PNG or JPEG images are sent, this is {mime}"
        parts.append({"type": "text", "text": f"[image {fid} {mime} from {source}, not "
                                              f"shown ({reason}): saved as {path}]"})
    if any(p["type"] == "image" for p in parts):
        return parts
    return "\n".join(p["text"] for p in parts)


def progress_line(done: float, total: float | None, message: str | None) -> str:
    """One progress notification as the card shows it: ``3/10 (30%) message``."""
    count = f"{done:g}/{total:g} ({100 * done / total:.0f}%)" if total else f"{done:g}"
    return f"{count} {message}".rstrip() if message else count


def text_of(blocks: list[dict[str, Any]]) -> str:
    """The text of blocks, for an error result (images are named, not decoded)."""
    return "\n".join(str(b.get("text") or f"[{b['type']} {b.get('mime_type') or ''}]")
                     for b in blocks)
