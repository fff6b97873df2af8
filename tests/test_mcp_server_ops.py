"""``simagent mcp``'s pure rules (``simagent.mcp_server.ops``): the ``output`` tool's text,
progress lines, figure numbers, resource confinement, ``--http``'s address, the bearer
check and approval over MCP. No kernel: an outputs folder written by hand (and the SDK's
client in memory for what ``initialize`` says)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
import pytest
from mcp.shared.memory import create_connected_server_and_client_session

from simagent import __version__
from simagent.kernel_api.outputs import raw_name, record_name
from simagent.mcp_server import ops, server
from simagent.mcp_server.ops import McpToolError
from simagent.session import Session


def _outputs(tmp_path: Path, *texts: str) -> Path:
    folder = tmp_path / "outputs"
    folder.mkdir()
    for n, text in enumerate(texts, 1):
        (folder / raw_name(n)).write_text(text, encoding="utf-8")
        (folder / record_name(n)).write_text(json.dumps({"n": n, "status": "ok"}))
    return folder


def test_output_ops_read_the_raw_file_with_line_numbers(tmp_path: Path) -> None:
    lines = "".join(f"row {i}\n" for i in range(1, 1001))
    folder = _outputs(tmp_path, "first\n", lines)
    head = ops.output_text(folder, 2, "head", 3, cap=None)
    assert head.splitlines()[0].startswith("_out[2] head 3 of 1,000 lines")
    assert str(folder / raw_name(2)) in head.splitlines()[0]
    assert head.splitlines()[1:] == ["      1: row 1", "      2: row 2", "      3: row 3"]
    assert ops.output_text(folder, -1, "tail", "2", None).splitlines()[1:] == \
        ["    999: row 999", "   1000: row 1000"]
    assert ops.output_text(folder, -2, "head", None, None).splitlines()[1:] == \
        ["      1: first"]  # negative n counts back; default 20 lines
    grep = ops.output_text(folder, 2, "grep", r"^row 50\d$", None)
    assert grep.splitlines()[0].startswith("_out[2] grep '^row 50\\\\d$': 10 line(s)")
    assert grep.splitlines()[1] == "    500: row 500"
    assert ops.output_text(folder, 2, "slice", "10:12", None).splitlines()[1:] == \
        ["     10: row 10", "     11: row 11", "     12: row 12"]
    assert ops.output_text(folder, 2, "grep", "nothing here", None).endswith("(no lines)")


@pytest.mark.parametrize(("n", "op", "arg", "says"), [
    (2, "sed", None, "op must be one of head, tail, grep, slice, not 'sed'"),
    (9, "head", None, "_out[9]: no such execution (executions: 1..2)"),
    (-5, "tail", None, "_out[-5]: only 2 earlier execution(s)"),
    (1, "grep", None, "grep needs a pattern"),
    (1, "grep", "(", "bad pattern '('"),
    (1, "head", "ten", "head takes a number of lines, not 'ten'"),
    (1, "tail", "-3", "positive number of lines"),
    (1, "slice", "5", "slice takes 'START:END'"),
    (1, "slice", "9:3", "START <= END"),
])
def test_output_refuses_bad_requests_with_one_clear_line(tmp_path: Path, n, op, arg,
                                                         says) -> None:
    folder = _outputs(tmp_path, "a\n", "b\n")
    with pytest.raises(McpToolError) as err:
        ops.output_text(folder, n, op, arg, None)
    assert says in str(err.value)


def test_output_text_is_capped_at_a_line_end_and_says_where_the_rest_is(tmp_path: Path) -> None:
    folder = _outputs(tmp_path, "".join(f"line {i} {'x' * 50}\n" for i in range(500)))
    text = ops.output_text(folder, 1, "head", 500, cap=2000)
    body, marker = text.rsplit("\n", 1)
    assert len(text) <= 2000 and body.endswith("x" * 50)  # whole lines; the marker fits too
    assert marker.startswith("[cut: ") and str(folder / raw_name(1)) in marker
    assert ops.cut_reply("short", 2000, "w") == "short"


def test_progress_line_is_what_a_terminal_shows_last() -> None:
    assert ops.progress_line(" 10%|#         | 1/10\r 20%|##        | 2/10\r") == \
        "20%|##        | 2/10"
    assert ops.progress_line("step 1\nstep 2\n\n") == "step 2"
    assert ops.progress_line("\x1b[31mred\x1b[0m\n") == "red"
    assert ops.progress_line("\n \r\n") == ""
    long = ops.progress_line("y" * 500)
    assert len(long) == ops.PROGRESS_CHARS and long.endswith("…")


def test_figure_numbers_count_from_one_and_back_from_minus_one() -> None:
    figs = [{"path": "a.png"}, {"path": "b.png"}, {"path": "c.png"}]
    assert ops.figure_key("fig-1a2b3c4d") == "fig-1a2b3c4d"
    assert ops.figure_key(" -1 ") == -1 and ops.figure_key(2) == 2
    assert ops.pick_figure(figs, 1)["path"] == "a.png"
    assert ops.pick_figure(figs, -1)["path"] == "c.png"
    assert ops.pick_figure(figs, -3)["path"] == "a.png"
    for bad, says in [(4, "out of range"), (-4, "out of range")]:
        with pytest.raises(McpToolError, match=says):
            ops.pick_figure(figs, bad)
    with pytest.raises(McpToolError, match="numbers start at 1"):
        ops.figure_key("0")
    with pytest.raises(McpToolError, match="no figure in this session yet"):
        ops.pick_figure([], 1)


def test_resources_read_only_files_of_the_session_folder(tmp_path: Path) -> None:
    folder = _outputs(tmp_path, "raw\n")
    (tmp_path / "secret.txt").write_text("not yours")
    os.symlink(tmp_path / "secret.txt", folder / "link.txt")
    assert ops.resource_file(folder, raw_name(1)) == (folder / raw_name(1)).resolve()
    for name in ("../secret.txt", str(tmp_path / "secret.txt"), "link.txt", ".",
                 "9999.txt", "~/x"):
        with pytest.raises(McpToolError, match="no resource"):
            ops.resource_file(folder, name)


@pytest.mark.parametrize(("text", "address"), [
    ("8765", ("127.0.0.1", 8765)), ("0.0.0.0:9000", ("0.0.0.0", 9000)),
    ("[::1]:8765", ("::1", 8765)), ("localhost:1", ("localhost", 1))])
def test_http_address_defaults_to_loopback(text: str, address: tuple[str, int]) -> None:
    assert ops.host_port(text) == address


@pytest.mark.parametrize("text", ["", "host:", ":80", "70000", "0", "a:b:c:80", "::1:80"])
def test_http_address_refuses_what_is_not_host_port(text: str) -> None:
    with pytest.raises(ValueError, match=r"--http takes \[HOST:\]PORT"):
        ops.host_port(text)


def test_bearer_check_needs_the_exact_token_under_the_scheme_in_any_case() -> None:
    for header in (b"Bearer s3cret-token", b"bearer s3cret-token", b"BEARER s3cret-token",
                   b"Bearer s3cret-token "):
        assert ops.bearer_ok(header, "s3cret-token")
    for header in (None, b"", b"Bearer s3cret-toke", b"Basic s3cret-token", b"s3cret-token",
                   b"Bearers3cret-token", b"Bearer s3cret-tokenx"):
        assert not ops.bearer_ok(header, "s3cret-token")
    assert not ops.bearer_ok(b"Bearer ", "")  # no token configured: nothing passes


def test_ask_mode_refuses_kernel_code_naming_the_flag(tmp_path: Path) -> None:
    for tool in ("run_python", "restore", "reset"):
        why = ops.refusal("ask", tool, tmp_path)
        assert why and why.startswith(f"{tool} refused") and "--approval workspace" in why
        assert ops.refusal("workspace", tool, tmp_path) is None
        assert ops.refusal("auto", tool, tmp_path) is None
    for tool in ("output", "state", "figure", "interrupt"):  # read or stop: never gated
        assert ops.refusal("ask", tool, tmp_path) is None
    assert set(ops.GATED_AS) | {"output", "state", "figure", "interrupt"} == set(ops.TOOLS)


def test_a_figure_file_is_labelled_by_its_bytes() -> None:
    png = bytes.fromhex("89504e470d0a1a0a") + b"\0" * 8
    assert ops.image_mime(png) == "image/png"
    assert ops.image_mime(b"\xff\xd8\xff\xe0" + b"\0" * 8) == "image/jpeg"
    assert ops.image_mime(b'<svg xmlns="http://www.w3.org/2000/svg"/>') == "image/svg+xml"
    assert ops.image_mime(b'<?xml version="1.0"?>\n<svg/>') == "image/svg+xml"
    assert ops.image_mime(b"GIF89a") == "application/octet-stream"


def test_run_python_description_reads_its_default_timeout_from_one_place(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "DEFAULT_RUN_TIMEOUT_S", 60.0)
    tools = {t.name: t.description for t in anyio.run(server.build_server(None).list_tools)}
    assert "Past `timeout_s` (default 60) the cell is interrupted" in tools["run_python"]


def test_initialize_names_simagents_own_version(workspace: Path) -> None:
    """A host's ``initialize`` reads ``serverInfo.version``: simagent's (the SDK put its
    own, ``mcp``'s, there). The SDK's client against the real server, in memory: the
    kernel starts at the first cell, so none starts here."""
    mcp = server.build_server(lambda: Session.create(workspace, approval="workspace"))

    async def hello() -> object:
        async with create_connected_server_and_client_session(mcp._mcp_server) as client:
            return (await client.initialize()).serverInfo

    info = anyio.run(hello)
    assert (info.name, info.version) == (ops.SERVER_NAME, __version__)
