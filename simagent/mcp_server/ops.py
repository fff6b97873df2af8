"""The pure parts of ``simagent mcp``: names, argument checks, the ``output`` tool's text,
a raw output's resource pages, progress lines, approval over MCP, resource URIs and the
``--http`` address and its token.

Nothing here imports the MCP SDK or starts a kernel, so each rule is tested directly
(``tests/test_mcp_server_ops.py``); ``server.py`` is the thin shell around them.
"""

from __future__ import annotations

import hmac
import math
import re
from pathlib import Path
from typing import Any

from simagent.agent import confine
from simagent.agent.approval import waits
from simagent.agent.tools import RESET_KERNEL, RUN_PYTHON
from simagent.head_tail import head_and_tail
from simagent.kernel.result import strip_ansi
from simagent.kernel_api.outputs import GREP_MAX, Outputs, count_lines, handle, size_text

#: The server's name, as hosts show it.
SERVER_NAME = "simagent"
#: The ``model`` an MCP session's trace names (``simagent sessions``, transcripts): the
#: host's model is unknown to the server.
SESSION_MODEL = "mcp"
#: The server's tools (one home: registration, gating and the README read these).
TOOLS = ("run_python", "output", "state", "figure", "interrupt", "restore", "reset")
#: ``output`` operations and their default argument.
OUTPUT_OPS = {"head": 20, "tail": 20, "grep": None, "slice": None}
#: Each MCP tool that runs code, as the agent's approval policy knows it: ``restore``
#: replays recorded cells and ``reset`` restarts, which is kernel code like
#: ``reset_kernel``. The others only read or stop (never gated).
GATED_AS = {"run_python": RUN_PYTHON, "restore": RESET_KERNEL, "reset": RESET_KERNEL}
#: Environment variable holding the ``--http`` bearer token (else one is generated).
TOKEN_ENV = "SIMAGENT_MCP_TOKEN"
#: Where ``--http`` listens when only a port is given: this machine alone.
DEFAULT_HOST = "127.0.0.1"
#: Resource URI scheme and templates: a raw output's first page, its page ``page``, a figure.
OUTPUT_URI = "simagent://outputs/{n}"
OUTPUT_PAGE_URI = "simagent://outputs/{n}/pages/{page}"
FIGURE_URI = "simagent://figures/{figure_id}"
#: Longest progress message sent to the host.
PROGRESS_CHARS = 160
#: Bytes of a raw output one resource read returns at most (plus a one-line marker).
#: Under any client's message limit with room to spare (the TypeScript SDK's stdio
#: reader drops the session past 10 MB, and JSON escapes a control character as six
#: bytes), and about what a host can show a person or attach to a model's context.
PAGE_BYTES = 256 * 1024
#: How far back from a page's nominal start a line end is looked for, so pages begin on
#: whole lines; pages advance by the rest (``PAGE_BYTES - PAGE_BACK``).
PAGE_BACK = 32 * 1024


class McpToolError(Exception):
    """A call that cannot be done; the message is what the host's model reads."""


def refusal(mode: str, tool: str, workspace: Path) -> str | None:
    """Why ``tool`` is refused under approval ``mode``, or None when it may run.

    MCP has no person on simagent's side to ask: in ``ask`` mode every call the agent
    would hold for approval is refused instead, naming the flag that allows it (the host
    asks its own user before each tool call if it is set up to).
    """
    name = GATED_AS.get(tool)
    if name is None or not waits(mode, name, {}, workspace):
        return None
    return (f"{tool} refused: this server runs with --approval {mode}, which holds kernel "
            f"code for a person's approval, and no one can approve over MCP. Restart the "
            f"server with `simagent mcp --approval workspace` (kernel code runs unasked; "
            f"your MCP host may still ask you before each call) or `--approval auto`.")


def _count(arg: str | int | None, default: int, op: str) -> int:
    if arg is None or arg == "":
        return default
    try:
        k = int(arg)
    except (TypeError, ValueError):
        raise McpToolError(f"output: {op} takes a number of lines, not {arg!r}") from None
    if k < 0:
        raise McpToolError(f"output: {op} takes a positive number of lines, not {k}")
    return k


def _span(arg: str | int | None) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*[:,-]\s*(\d+)\s*", str(arg or ""))
    if not m or int(m[1]) < 1 or int(m[2]) < int(m[1]):
        raise McpToolError(f"output: slice takes 'START:END' (1-based line numbers, END "
                           f"included, START <= END), not {arg!r}")
    return int(m[1]), int(m[2])


def output_text(folder: Path, n: int, op: str, arg: str | int | None, cap: int | None) -> str:
    """``_out[n]``'s head / tail / grep / slice as text (what the ``output`` tool returns).

    Reads the raw file on disk, never the kernel, so it works while a cell runs and
    after the kernel died. Numbered lines; capped at ``cap`` chars like any result.
    """
    if op not in OUTPUT_OPS:
        raise McpToolError(f"output: op must be one of {', '.join(OUTPUT_OPS)}, not {op!r}")
    try:
        record = Outputs(folder)[int(n)]
    except (KeyError, IndexError) as exc:
        raise McpToolError(str(exc.args[0]) if exc.args else str(exc)) from None
    if op == "grep":
        if not arg:
            raise McpToolError("output: grep needs a pattern (a Python regular expression)")
        try:
            lines = record.grep(str(arg))
        except re.error as exc:
            raise McpToolError(f"output: bad pattern {arg!r}: {exc}") from None
        what = f"grep {str(arg)!r}: {len(lines)} line(s)" + \
            (f" (stops at {GREP_MAX} matches)" if len(lines) >= GREP_MAX else "")
    elif op == "slice":
        start, end = _span(arg)
        lines = record.slice(start, end)
        what = f"lines {start}-{end}"
    else:
        k = _count(arg, OUTPUT_OPS[op], op)  # type: ignore[arg-type]
        lines = record.head(k) if op == "head" else record.tail(k)
        what = f"{op} {k}"
    head = (f"{handle(record.n)} {what} of {record.line_count():,} lines "
            f"({size_text(record.size)}, {record.status}; raw: {record.path})")
    body = "\n".join(str(x) for x in lines) or "(no lines)"
    return cut_reply(f"{head}\n{body}", cap, str(record.path))


def cut_reply(text: str, cap: int | None, where: str) -> str:
    """``text`` cut to ``cap`` chars at a line end (the one capper, head only: a reply is
    read from the top), saying how much went and where it all is. The cap holds for the
    whole reply, marker included: the head gets what the longest marker leaves."""
    if not cap or len(text) <= cap:
        return text

    def marker(shown: int) -> str:
        return (f"\n[cut: {shown:,} of {len(text):,} chars shown; narrow the request "
                f"(fewer lines, a stricter pattern) or read {where}]")

    room = max(cap - len(marker(len(text))), 0)  # the shown count has at most its digits
    kept = head_and_tail(text, room, with_tail=False)[0].removesuffix("\n") if room else ""
    return kept + marker(len(kept))


def progress_line(text: str) -> str:
    """The line a terminal would show last for a chunk of streamed output: the final
    ``\\r`` redraw of the last non-empty line, colours stripped, cut short."""
    for line in reversed(strip_ansi(text).split("\n")):
        seg = next((s for s in reversed(line.split("\r")) if s.strip()), "")
        if seg.strip():
            seg = seg.strip()
            return seg if len(seg) <= PROGRESS_CHARS else seg[: PROGRESS_CHARS - 1] + "…"
    return ""


def figure_key(n: str | int) -> str | int:
    """``figure``'s argument: a ``fig-<hash>`` id, or a number (1 = the session's first
    figure, -1 the newest)."""
    if isinstance(n, int):
        key: str | int = n
    else:
        text = str(n).strip()
        key = int(text) if re.fullmatch(r"[+-]?\d+", text) else text
    if key == 0:
        raise McpToolError("figure: numbers start at 1 (the first figure); -1 is the newest")
    return key


def pick_figure(figures: list[dict], key: int) -> dict:
    """The ``key``-th figure (1-based; negative counts back) of the session's list."""
    if not figures:
        raise McpToolError("figure: no figure in this session yet")
    if not -len(figures) <= key <= len(figures):
        raise McpToolError(f"figure: {key} is out of range; this session has "
                           f"{len(figures)} figure(s): 1..{len(figures)} or -1..-{len(figures)}")
    return figures[key - 1 if key > 0 else key]


#: Image formats a figure file can be (the kernel saves PNG, JPEG and SVG displays), by
#: the bytes it starts with.
_IMAGE_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"))


def image_mime(blob: bytes) -> str:
    """The MIME type of a figure file, read from its bytes (a resource is labelled by
    what it is, not by the usual case)."""
    for magic, mime in _IMAGE_MAGIC:
        if blob.startswith(magic):
            return mime
    head = blob[:512].lstrip().lower()
    if head.startswith((b"<svg", b"<?xml")) and b"<svg" in blob[:4096].lower():
        return "image/svg+xml"
    return "application/octet-stream"


def resource_file(folder: Path, name: str) -> Path:
    """The file ``name`` in the session's ``folder`` (outputs or artifacts), refusing any
    name that resolves elsewhere (``..``, a link out): resources read nothing else."""
    root = Path(confine.resolve(str(folder), folder))
    try:
        path = confine.resolve(name, root)
    except OSError as exc:
        raise McpToolError(f"no resource {name!r}: {exc}") from None
    if not confine.within(path, root) or path == root or not path.is_file():
        raise McpToolError(f"no resource {name!r} in this session")
    return path


def host_port(text: str) -> tuple[str, int]:
    """``--http``'s ``[HOST:]PORT`` (``8765``, ``0.0.0.0:8765``, ``[::1]:8765``)."""
    m = re.fullmatch(r"(?:\[([^\]]+)\]:|([^:\[\]]+):)?(\d{1,5})", text.strip())
    if not m or not 0 < int(m[3]) < 65536:
        raise ValueError(f"--http takes [HOST:]PORT (e.g. 8765 or 127.0.0.1:8765), not {text!r}")
    return (m[1] or m[2] or DEFAULT_HOST), int(m[3])


def bearer_ok(header: bytes | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <token>``: the scheme in any
    case (RFC 7235 §2.1: auth schemes are case-insensitive; some clients send
    ``bearer``), the token compared in constant time."""
    scheme, _, credentials = (header or b"").partition(b" ")
    return bool(token) and scheme.lower() == b"bearer" and \
        hmac.compare_digest(credentials.strip(b" "), token.encode())


#: How an argument's JSON Schema type reads in an error.
_TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "a string",
               "boolean": "true or false", "array": "a list", "object": "an object"}


def expected_type(schema: dict[str, Any]) -> str:
    """``a string or an integer``: what an argument's JSON Schema accepts, in words
    (``null`` of an optional argument left out: leaving the argument out says that)."""
    kinds = [s.get("type") for s in schema.get("anyOf", [schema])]
    return " or ".join(_TYPE_WORDS.get(k, k) for k in kinds if k and k != "null") or "a value"


def argument_error(errors: list[dict[str, Any]], schema: dict[str, Any]) -> str:
    """One line for arguments the SDK's validation refused (pydantic's ``errors()``):
    each bad argument by name with the type it takes, from the tool's input ``schema``.
    The SDK's own text is several lines per argument and ends in a documentation URL,
    which the host's model would read for nothing."""
    props = schema.get("properties", {})
    said: list[str] = []
    for err in errors:
        name = str(err.get("loc", ("?",))[0])
        want = expected_type(props.get(name, {}))
        if err.get("type") == "missing":
            line = f"{name} is required: {want}"
        else:
            got = repr(err.get("input"))
            got = got if len(got) <= 60 else got[:59] + "…"
            line = f"{name} must be {want}, not {got}"
        if line not in said:  # a union reports each of its members' failures
            said.append(line)
    return "; ".join(said) or "bad arguments"


def page_of(path: Path, n: int, page: int) -> str:
    """Page ``page`` (1-based) of execution ``n``'s raw output file at ``path``.

    Why pages and not the whole file: a 20 MB output sent whole drops the session on a
    client with a message limit (the kernel with it). Pages are fixed URIs a host reads
    like any resource, each at most :data:`PAGE_BYTES` of the file, beginning on a line
    start when a line ends within :data:`PAGE_BACK` before it (else at a character
    start), so they join back into the file exactly. A file of more than one page gets,
    after its text and one added line break, a last line saying which page this is and
    how to read the rest: the next page's URI, or the ``output`` tool's ``slice``/``grep``
    for the lines themselves. Pages rather than a cap alone: a host reads a URI without a
    tool call or a model turn, so a person can still page through the whole output.
    """
    step = PAGE_BYTES - PAGE_BACK
    with open(path, "rb") as fh:
        size = fh.seek(0, 2)
        pages = max(1, math.ceil(size / step))
        if not 1 <= page <= pages:
            raise McpToolError(f"no page {page} of {handle(n)}: it has {pages} page"
                               f"{'s' * (pages > 1)} (1..{pages})")
        start, end = _page_start(fh, (page - 1) * step, size), _page_start(fh, page * step, size)
        fh.seek(start)
        text = fh.read(end - start).decode("utf-8", errors="replace")
    if pages == 1:
        return text
    go = f"next: {OUTPUT_PAGE_URI.format(n=n, page=page + 1)}" if page < pages else \
        "the last page"
    marker = (f"[page {page} of {pages} of {handle(n)} ({size_text(size)}, "
              f"{count_lines(path):,} lines; bytes {start:,}-{end:,}); {go}; page p is "
              f"{OUTPUT_PAGE_URI.format(n=n, page='p')}; or the output tool: "
              f"output(n={n}, op='slice', arg='START:END') or op='grep']")
    return f"{text}\n{marker}"  # always one added line break: the text is exact


def uri_number(text: str, what: str) -> int:
    """A number in a resource URI (``simagent://outputs/7/pages/2``), or one clear line."""
    if not re.fullmatch(r"-?\d+", text.strip()):
        raise McpToolError(f"{what} in the URI must be a whole number, not {text!r}")
    return int(text)


def _page_start(fh: Any, at: int, size: int) -> int:
    """Where the page nominally at byte ``at`` starts: after the last line end within
    :data:`PAGE_BACK` before it, else at the UTF-8 character start at or before it."""
    if at <= 0 or at >= size:
        return min(max(at, 0), size)
    back = max(0, at - PAGE_BACK + 1)
    fh.seek(back)
    window = fh.read(at - back)
    nl = window.rfind(b"\n")
    if nl >= 0:
        return back + nl + 1
    fh.seek(max(0, at - 3))
    lead = fh.read(min(3, at) + 1)  # the bytes up to ``at``, and the one at it
    pos = at
    while pos > max(at - 3, 0) and 0x80 <= lead[len(lead) - 1 - (at - pos)] < 0xC0:
        pos -= 1  # a continuation byte: the character starts before it
    return pos
