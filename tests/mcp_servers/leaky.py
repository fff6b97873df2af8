"""A test MCP server (official SDK, FastMCP, stdio) that leaks a key to its stderr.

It prints the key it reads from the file named by ``--key-file`` to stderr when it
starts and on every call of its one tool, ``leak``, which answers with a caption and a
PNG image. Run by the tests as ``python tests/mcp_servers/leaky.py --key-file PATH``.
"""

from __future__ import annotations

import struct
import sys
import zlib
from pathlib import Path

# jsonschema (under the SDK) builds an IRI grammar at import when rfc3987_syntax is
# installed: 1.4 of this server's 2.2 CPU-s start, for a check it never makes (as
# simagent.cli.entry does)
sys.modules.setdefault("rfc3987_syntax", None)

from mcp.server.fastmcp import FastMCP, Image  # noqa: E402

mcp = FastMCP("leaky", log_level="WARNING")
KEY = Path(sys.argv[sys.argv.index("--key-file") + 1]).read_text().strip()


def _png() -> bytes:
    """A 2x1 RGB PNG."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    raw = b"\x00" + bytes([255, 0, 0, 0, 0, 255])
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


@mcp.tool()
async def leak(subject: str = "x") -> list:
    """Returns a plot of ``subject`` (and prints the server's key to its stderr)."""
    print(f"leaky: calling with key {KEY}", file=sys.stderr, flush=True)
    return [f"plot of {subject}", Image(data=_png(), format="png")]


if __name__ == "__main__":
    print(f"leaky: starting with key {KEY}", file=sys.stderr, flush=True)
    mcp.run()
