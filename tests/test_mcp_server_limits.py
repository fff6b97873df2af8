"""``simagent mcp``'s limits as a host meets them (issue 37, defect 14): a 20 MB output read
as a resource comes in pages that join back into the file, every reply holds the stated
cap with its marker, the marker states one count of the lines not shown, a bad argument
type is one line, a cell that raised is an error result, and the HTTP auth scheme is
read in any case.

The real CLI as a subprocess, driven by the MCP SDK's clients (stdio and streamable HTTP),
a real kernel behind it; every wait is bounded (the client's read timeout,
``anyio.fail_after``, subprocess timeouts).
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp_http import serving
from test_mcp_server import CALL_S, _stdio, _text

from simagent.context.thresholds import TOOL_CAP_CHARS
from simagent.kernel.cut_lines import parse_cut
from simagent.mcp_server import ops

#: 200,000 lines of about 100 bytes: 19.3 MB, past a 10 MB client read buffer.
_BIG = ("import sys\nfor i in range(0, 200_000, 1000):\n"
        "    sys.stdout.write(''.join(f'row {j} ' + 'x' * 90 + '\\n' for j in range(i, i + 1000)))")


def _page_text(text: str) -> str:
    """A page's text without the marker line and the line break added before it."""
    return text[: text.rindex("\n[page ")]


@pytest.mark.slow
def test_a_20_mb_output_comes_in_pages_and_every_reply_holds_the_cap(workspace: Path,
                                                                      tmp_path: Path) -> None:
    async def main() -> dict[str, Any]:
        got: dict[str, Any] = {}
        async with _stdio(workspace, tmp_path / "server.err") as s:
            got["big"] = _text(await s.call_tool("run_python", {"code": _BIG}))
            n = int(re.search(r"_out\[(\d+)\]", got["big"])[1])
            got["n"] = n
            got["slice"] = _text(await s.call_tool("output", {"n": n, "op": "slice",
                                                              "arg": "1:5000"}))
            first = (await s.read_resource(f"simagent://outputs/{n}")).contents[0].text
            got["first"] = first
            pages = int(re.search(r"\[page 1 of (\d+) ", first)[1])
            got["pages"] = [first] + [
                (await s.read_resource(f"simagent://outputs/{n}/pages/{p}")).contents[0].text
                for p in range(2, pages + 1)]
            try:
                await s.read_resource(f"simagent://outputs/{n}/pages/{pages + 1}")
            except Exception as exc:  # the SDK raises the server's error
                got["past the end"] = str(exc)
            got["after"] = _text(await s.call_tool("run_python", {"code": "print('alive')"}))
        return got

    got = anyio.run(main)
    raw = Path(re.search(r"full output: (\S+\.txt)", got["big"])[1])
    assert raw.stat().st_size > 19_000_000
    # the reply holds the cap with its marker, and states one count of what is not shown
    assert len(got["big"]) <= TOOL_CAP_CHARS, len(got["big"])
    cut = parse_cut(got["big"])
    assert cut is not None and cut.first == 1 and cut.total == 200_000
    assert "earlier lines" not in got["big"]
    # raw line L holds `row L-1`: the first line shown after the cut is line cut.last + 1
    assert f"\nrow {cut.last} {'x' * 90}\n" in got["big"]
    assert got["big"].endswith(f"\nrow 199999 {'x' * 90}")
    # an output reply cut at the cap holds it too
    assert len(got["slice"]) <= TOOL_CAP_CHARS and "\n[cut: " in got["slice"]
    # the resource: pages within the limit, each saying how to go on, joining into the file
    pages = got["pages"]
    assert len(got["first"]) <= ops.PAGE_BYTES + 400
    assert f"next: simagent://outputs/{got['n']}/pages/2" in got["first"]
    assert "output(n=" in got["first"] and "op='slice'" in got["first"]
    assert all(len(p.encode()) <= ops.PAGE_BYTES + 400 for p in pages)
    assert pages[-1].rstrip().endswith("the last page; page p is "
                                       f"simagent://outputs/{got['n']}/pages/p; or the output "
                                       f"tool: output(n={got['n']}, op='slice', "
                                       "arg='START:END') or op='grep']")
    assert "".join(_page_text(p) for p in pages) == raw.read_text()
    past = len(pages) + 1  # said once, without the SDK's doubled "Error creating resource"
    assert got["past the end"] == (f"simagent://outputs/{got['n']}/pages/{past}: no page "
                                   f"{past} of _out[{got['n']}]: it has {len(pages)} pages "
                                   f"(1..{len(pages)})")
    assert got["after"] == "alive"  # the session (and its kernel) went on


@pytest.mark.slow
def test_a_cell_that_raised_is_an_error_and_bad_types_are_one_line(workspace: Path,
                                                                   tmp_path: Path) -> None:
    async def main() -> list[types.CallToolResult]:
        async with _stdio(workspace, tmp_path / "server.err") as s:
            return [await s.call_tool(name, args) for name, args in [
                ("run_python", {"code": "x = 1\n1 / 0"}),
                ("run_python", {"code": "print(x)"}),
                ("run_python", {"code": "print(1)", "timeout_s": "soon"}),
                ("run_python", {"code": ["print(1)"]}),
                ("output", {"n": "first", "op": "head"}),
                ("output", {"op": "head"}),
                ("figure", {"n": 1.5})]]

    raised, fine, *bad = anyio.run(main)
    assert raised.isError
    assert _text(raised).startswith("Cell In[") and \
        _text(raised).endswith("ZeroDivisionError: division by zero")
    assert not fine.isError and _text(fine) == "1"
    assert [(r.isError, _text(r)) for r in bad] == [
        (True, "Error executing tool run_python: timeout_s must be a number, not 'soon'"),
        (True, "Error executing tool run_python: code must be a string, not ['print(1)']"),
        (True, "Error executing tool output: n must be an integer, not 'first'"),
        (True, "Error executing tool output: n is required: an integer"),
        (True, "Error executing tool figure: n must be a string or an integer, not 1.5")]


@pytest.mark.slow
def test_http_takes_the_bearer_scheme_in_any_case(workspace: Path, tmp_path: Path) -> None:
    token = "t0ken-for-the-test-5678"
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    accept = {"Accept": "application/json, text/event-stream"}
    with serving(workspace, tmp_path / "server.err", token) as url:
        async def main() -> dict[str, Any]:
            got: dict[str, Any] = {}
            got["basic"] = httpx.post(url, json=ping, timeout=10, headers={
                **accept, "Authorization": f"Basic {token}"})
            async with httpx.AsyncClient(headers={"Authorization": f"bearer {token}"},
                                         timeout=httpx.Timeout(30, read=CALL_S)) as http, \
                    streamable_http_client(url, http_client=http) as (read, write, _), \
                    ClientSession(read, write,
                                  read_timeout_seconds=timedelta(seconds=CALL_S)) as s:
                with anyio.fail_after(CALL_S):
                    await s.initialize()
                got["cell"] = await s.call_tool("run_python", {"code": "print(6 * 7)"})
            return got

        got = anyio.run(main)
    assert got["basic"].status_code == 401  # another scheme is still refused
    assert not got["cell"].isError and _text(got["cell"]) == "42"


def test_pages_join_into_the_file_on_lines_or_characters(tmp_path: Path) -> None:
    """Pure: pages of a file of lines start on line starts; one 3.6 MB line of multi-byte
    characters is split only between characters; each page is within PAGE_BYTES."""
    cases = {"lines": "".join(f"row {i} é✓ {'x' * (i % 300)}\n" for i in range(20_000)),
             "one line": "é✓😀" * 400_000, "small": "abc\n"}
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        first = ops.page_of(path, 3, 1)
        found = re.search(r"\[page 1 of (\d+) ", first)
        pages = [first] + [ops.page_of(path, 3, p) for p in range(2, int(found[1]) + 1)] \
            if found else [first]
        bodies = [_page_text(p) for p in pages] if found else pages
        assert "".join(bodies) == text, name
        assert all(len(b.encode()) <= ops.PAGE_BYTES for b in bodies), name
        if name == "lines":
            assert all(b.endswith("\n") for b in bodies)
    assert ops.page_of(tmp_path / "small", 3, 1) == "abc\n"  # one page: the file as is


def test_an_argument_error_names_each_argument_and_its_type() -> None:
    schema = {"properties": {"n": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                             "timeout_s": {"anyOf": [{"type": "number"}, {"type": "null"}]},
                             "code": {"type": "string"}}}
    errors = [{"type": "string_type", "loc": ("n", "str"), "input": 1.5},
              {"type": "int_from_float", "loc": ("n", "int"), "input": 1.5},
              {"type": "missing", "loc": ("code",), "input": {}},
              {"type": "float_parsing", "loc": ("timeout_s",), "input": "x" * 100}]
    assert ops.argument_error(errors, schema) == (
        "n must be a string or an integer, not 1.5; code is required: a string; "
        f"timeout_s must be a number, not '{'x' * 58}…")
