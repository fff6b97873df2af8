"""What ``simagent acp`` makes of a prompt's content blocks (pure; no process)."""

from __future__ import annotations

import base64

from acp import embedded_text_resource, image_block, resource_block, resource_link_block, text_block
from acp.schema import EnvVariable, HttpMcpServer, McpServerStdio, SseMcpServer

from simagent.acp.agent import AcpOptions
from simagent.acp.content import JUPYTER_NOTE, client_servers, prompt_text, said_to_person

GUIDANCE = (JUPYTER_NOTE + " (.ipynb), use the Jupyter notebook MCP tools (for example "
            "insert_cell). Do not write .ipynb files directly.")


def test_the_jupyterlab_note_is_not_the_persons_words(tmp_path):
    text, notes = prompt_text([text_block(GUIDANCE + "\n\nfit the decay curve")], tmp_path)
    assert text == "fit the decay curve"
    assert notes and "JupyterLab persona's system note" in notes[0]
    # only at the start: quoted later, it is the person's
    text, notes = prompt_text([text_block("why this?\n\n" + GUIDANCE)], tmp_path)
    assert GUIDANCE in text and not notes


def test_links_embedded_text_and_images_reach_the_model_as_words(tmp_path):
    png = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()
    blocks = [text_block("look at these"),
              resource_link_block("data.csv", "file:///home/me/run%201/data.csv",
                                  mime_type="text/csv"),
              resource_block(embedded_text_resource("file:///home/me/a.py", "x = 1\n")),
              image_block(png, "image/png")]
    text, notes = prompt_text(blocks, tmp_path / "attachments")
    assert "[attached file: /home/me/run 1/data.csv (text/csv)]" in text
    assert "[attached /home/me/a.py:]\n```\nx = 1\n\n```" in text
    saved = list((tmp_path / "attachments").iterdir())
    assert len(saved) == 1 and saved[0].suffix == ".png"
    assert saved[0].read_bytes().startswith(b"\x89PNG")
    assert f"[attached image, saved at {saved[0]}]" in text and not notes
    assert said_to_person(blocks) == [
        "(the image is saved in the session's folder and the model is given its path: it "
        "can read the file with code, it does not see the picture)"]
    assert said_to_person([text_block("hi")]) == []


def test_client_mcp_servers_become_config_entries_with_valid_names():
    servers = [McpServerStdio(name="Jupyter tools", command="/bin/srv", args=["-x"],
                              env=[EnvVariable(name="A", value="1")]),
               HttpMcpServer(type="http", name="Jupyter MCP Server",
                             url="http://localhost:3001/mcp", headers=[]),
               SseMcpServer(type="sse", name="old", url="http://x/sse", headers=[])]
    out, skipped = client_servers(servers, taken={"Jupyter-tools"})
    assert set(out) == {"Jupyter-tools-2", "Jupyter-MCP-Server"}
    stdio = out["Jupyter-tools-2"]
    assert (stdio.command, stdio.args, dict(stdio.env)) == ("/bin/srv", ("-x",), {"A": "1"})
    assert out["Jupyter-MCP-Server"].url == "http://localhost:3001/mcp"
    assert skipped == ["MCP server 'old': the sse transport is not supported (stdio and "
                       "http are)"]


def test_how_a_turn_ended_is_its_stop_reason():
    from simagent.acp.sessions import Host, Live  # the agent stack: this test only
    from simagent.agent.events import TurnResult

    host = Host(AcpOptions(), conn=None)
    live = Live(session=None, runner=None, resolved=None)

    def reason(**kw) -> str:
        return host._response(live, TurnResult(**kw), {}).stop_reason

    assert reason(status="done") == "end_turn"
    assert reason(status="error", error="provider 503") == "end_turn"  # said in the reply
    assert reason(status="cancelled") == "cancelled"
    assert reason(status="paused") == "cancelled"  # a permission the client cancelled
    assert reason(status="error", cost_ceiling={"scope": "turn"}) == "refusal"
    assert reason(status="error", error="GraphRecursionError: limit 25") == \
        "max_turn_requests"
    live.cancelled = True
    assert reason(status="done") == "cancelled"
