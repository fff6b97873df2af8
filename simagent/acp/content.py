"""What ``simagent acp`` makes of what a client sends beside its protocol (pure): a
prompt's content blocks as the model's prompt, and the client's MCP servers as
``[mcp.servers]`` entries."""

from __future__ import annotations

import base64
import mimetypes
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from simagent.config import McpServer

#: How JupyterLab's persona (jupyter-ai-acp-client's ``BaseAcpPersona``) starts the first
#: prompt of each session: guidance for its own tools, not the person's words.
JUPYTER_NOTE = "System note: When creating or editing Jupyter notebooks"


def client_servers(servers: list[Any] | None, taken: set[str]) -> tuple[dict[str, McpServer],
                                                                         list[str]]:
    """The client's ``mcpServers`` as ``[mcp.servers]`` entries (stdio and HTTP), and one
    line for each that cannot be used (SSE, ACP transport). Names become tool-name
    prefixes, so they are reduced to what ``[mcp.servers.NAME]`` accepts."""
    out: dict[str, McpServer] = {}
    skipped: list[str] = []
    for server in servers or ():
        raw = str(getattr(server, "name", "") or "client")
        name = re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9_-]+", "-", raw)).strip("-_")[:32] \
            or "client"
        while name in taken or name in out:
            name = f"{name[:29]}-{len(out) + 2}"
        kind = getattr(server, "type", None)
        if getattr(server, "command", None) and kind in (None, "stdio"):
            env = {e.name: e.value for e in getattr(server, "env", None) or ()}
            out[name] = McpServer(name, command=server.command,
                                  args=tuple(server.args or ()), env=env)
        elif kind == "http":
            headers = {h.name: h.value for h in server.headers or ()}
            out[name] = McpServer(name, url=server.url, headers=headers)
        else:
            skipped.append(f"MCP server {raw!r}: the {kind} transport is not supported "
                           "(stdio and http are)")
    return out, skipped


def _path_of(uri: str) -> str:
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme == "file" else uri


def prompt_text(blocks: list[Any], attach_dir: Path) -> tuple[str, list[str]]:
    """The model's prompt from ACP content blocks, and lines for the trace/stderr.

    Text as it is; a resource link names the file (the model reads it with its tools);
    embedded text is quoted with its address; an image is saved under ``attach_dir`` and
    named by its path (the model reads files; it is not sent as image content); audio is
    said to be unsupported. The JupyterLab system note at the start is dropped.
    """
    parts: list[str] = []
    notes: list[str] = []
    for i, block in enumerate(blocks):
        kind = getattr(block, "type", None)
        if kind == "text":
            text = block.text
            if not parts and text.startswith(JUPYTER_NOTE):
                note, sep, rest = text.partition("\n\n")
                text = rest if sep else ""
                notes.append(f"the JupyterLab persona's system note ({len(note)} chars) "
                             "at the prompt's start was set aside: not the person's words")
            if text.strip():
                parts.append(text)
        elif kind == "resource_link":
            mime = f" ({block.mime_type})" if block.mime_type else ""
            parts.append(f"[attached file: {_path_of(block.uri)}{mime}]")
        elif kind == "resource":
            res = block.resource
            if getattr(res, "text", None) is not None:
                parts.append(f"[attached {_path_of(res.uri)}:]\n```\n{res.text}\n```")
            else:
                parts.append(f"[attached {_path_of(res.uri)}: binary content, not read]")
        elif kind == "image":
            ext = mimetypes.guess_extension(block.mime_type or "") or ".bin"
            attach_dir.mkdir(parents=True, exist_ok=True)
            path = attach_dir / f"image-{int(time.time() * 1000)}-{i}{ext}"
            path.write_bytes(base64.b64decode(block.data))
            parts.append(f"[attached image, saved at {path}]")
        else:
            parts.append(f"[a {kind} attachment was sent; simagent cannot read it]")
            notes.append(f"{kind} content is not supported")
    return "\n\n".join(parts), notes


def said_to_person(blocks: list[Any]) -> list[str]:
    """What the person is told of their attachments before the reply: an image reaches
    the model as a file path, not as a picture; audio does not reach it at all."""
    kinds = {getattr(b, "type", None) for b in blocks}
    lines = []
    if "image" in kinds:
        lines.append("(the image is saved in the session's folder and the model is given "
                     "its path: it can read the file with code, it does not see the picture)")
    lines += [f"(a {k} attachment cannot be read by simagent)" for k in sorted(
        k for k in kinds - {"text", "resource_link", "resource", "image"} if k)]
    return lines
