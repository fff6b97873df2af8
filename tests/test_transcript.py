"""Transcripts and session listing, built from real trace.sqlite files."""

from __future__ import annotations

import base64
import re
import struct
import zlib
from pathlib import Path

import pytest

from simagent.paths import SessionPaths, workspace_state_dir
from simagent.presentation.transcript import DISPLAY_CAP, render_html, render_markdown
from simagent.trace.log import Event, TraceLog
from simagent.trace.sessions import (
    SessionInfo,
    find_session,
    format_sessions_table,
    list_sessions,
)

CODE = "import numpy as np\nx = np.linspace(0, 1, 5)\nprint(x.sum())"
XSS = "<script>alert(1)</script>"


def tiny_png() -> bytes:
    """A valid 2x1 RGB PNG, built by hand."""
    def chunk(tag: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + tag + data
                + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))
    raw = b"\x00" + bytes([255, 0, 0, 0, 0, 255])
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def write_session(workspace: Path, sid: str, *, question: str = "Fit the model please",
                  big_output: bool = True) -> SessionPaths:
    """A realistic session: main agent, a subagent, a resume, approval, an error."""
    sp = SessionPaths.for_session(workspace, sid).ensure()
    png = tiny_png()
    (sp.artifacts / "plot.png").write_bytes(png)
    raw = sp.outputs / "exec-1.txt"
    output = "line\n" * 1200 if big_output else "2.5\n"
    raw.write_text(output)
    with TraceLog(sp.trace) as log:
        log.append("session_start", {"session_id": sid, "workspace": str(workspace),
                                     "simulator": "python", "model": "claude-x",
                                     "approval": "ask", "pid": 1})
        log.append("message_user", {"content": f"{question}\nsecond line", "turn": 1})
        log.append("model_usage", {"agent": "main", "model": "claude-x", "input_tokens": 1000,
                                   "output_tokens": 50, "cache_read": 800})
        log.append("message_reasoning", {"content": "I should run some code.", "agent": "main"})
        log.append("tool_call", {"id": "call_1", "name": "run_python", "args": {"code": CODE},
                                 "agent": "main"})
        log.append("kernel_exec", {"tool_call_id": "call_1", "code": CODE, "status": "ok",
                                   "elapsed_s": 1.25, "raw_path": str(raw),
                                   "execution_count": 1})
        log.append("tool_result", {"tool_call_id": "call_1", "name": "run_python",
                                   "content": output, "status": "success", "agent": "main"})
        log.append("artifact", {"path": "artifacts/plot.png", "mime": "image/png",
                                "tool_call_id": "call_1"})
        log.append("attempt", {"index": 1, "id": "a1", "rationale": "baseline",
                               "parameters": {"k": 2}, "metrics": {"rmse": 0.5},
                               "outcome": "improved"})
        log.append("subagent_start", {"name": "source-explorer", "description": "read code",
                                      "tool_call_id": "call_2"})
        log.append("tool_call", {"id": "call_3", "name": "read_file",
                                 "args": {"path": "src/model.py"}, "agent": "source-explorer"})
        log.append("tool_result", {"tool_call_id": "call_3", "name": "read_file",
                                   "content": "def model(): ...", "status": "success",
                                   "agent": "source-explorer"})
        log.append("model_usage", {"agent": "source-explorer", "model": "claude-small",
                                   "input_tokens": 300, "output_tokens": 20, "cache_read": 0})
        log.append("message_assistant", {"content": "The model is in src/model.py",
                                         "agent": "source-explorer"})
        log.append("subagent_end", {"name": "source-explorer", "tool_call_id": "call_2",
                                    "status": "success"})
        log.append("message_assistant", {"content": f"Done. **RMSE** is `0.5`. {XSS}",
                                         "agent": "main"})
        log.append("model_usage", {"agent": "main", "model": "claude-x", "input_tokens": 1200,
                                   "output_tokens": 70, "cache_read": 900})
        log.append("session_resume", {"session_id": sid, "model": "claude-x",
                                      "kernel_restarted": True, "pid": 2})
        log.append("message_user", {"content": "Now delete the outputs", "turn": 2})
        log.append("hitl_request", {"interrupt_id": "int-1", "action_requests": [
            {"name": "run_shell", "args": {"command": "rm -rf outputs"}}]})
        log.append("hitl_response", {"interrupt_id": "int-1", "decisions": [{"type": "reject"}]})
        log.append("error", {"message": "provider timeout", "where": "model"})
        log.append("session_end", {"session_id": sid, "reason": "user_exit"})
    return sp


def load(sp: SessionPaths) -> list[Event]:
    with TraceLog(sp.trace, readonly=True) as log:
        return log.events()


@pytest.fixture
def session(workspace: Path) -> SessionPaths:
    return write_session(workspace, "20240101-120000-abcd")


def test_markdown_sections_in_order(session: SessionPaths) -> None:
    md = render_markdown(load(session), session_dir=session.root)
    assert md.startswith("# Session 20240101-120000-abcd")
    marks = ["**simulator**: python", "## User (turn 1)", "> I should run some code.",
             "### Tool `run_python`", "Result:", "![artifact](artifacts/plot.png)",
             "### Attempts", "[source-explorer]", "## Assistant\n\nDone.",
             "Session resumed", "## User (turn 2)", "**Approval requested**",
             "**Approval decision** (int-1): reject", "**Error** in model: provider timeout",
             "Session ended (user_exit)", "## Usage"]
    positions = [md.index(m) for m in marks]
    assert positions == sorted(positions)
    assert "```python\n" + CODE + "\n```" in md
    assert "the kernel was restarted" in md
    assert "✓ status ok, 1.25 s" in md
    assert "| 1 | improved | baseline |" in md
    assert "`run_shell(" in md


def test_markdown_pairs_result_with_call_and_truncates(session: SessionPaths) -> None:
    md = render_markdown(load(session))
    card = md[md.index("### Tool `run_python`"):md.index("### Attempts")]
    assert "line\nline" in card  # the result sits inside the call's card
    raw = session.outputs / "exec-1.txt"
    full = len("line\n" * 1200)
    assert (f"({full - DISPLAY_CAP:,} more chars of this result; full output, 5.9 KB: {raw})"
            in card)
    assert md.count("def model(): ...") == 1
    sub = md[md.index("[source-explorer]"):md.index("## Assistant\n\nDone.")]
    assert "> ### Tool `read_file`" in sub and "> def model(): ..." in sub
    collapsed = render_markdown(load(session), expand_tools=False)
    assert "- tool `run_python` (✓ status ok, 1.25 s)" in collapsed
    assert CODE not in collapsed


def test_usage_totals(session: SessionPaths) -> None:
    md = render_markdown(load(session))
    assert "3 model calls; input 2500 tokens, output 140 tokens, cache read 1700 tokens." in md
    assert "| main | 2 | 2200 | 120 | 1700 |" in md
    assert "| source-explorer | 1 | 300 | 20 | 0 |" in md
    assert "| claude-small | 1 | 300 | 20 | 0 |" in md
    page = render_html(load(session))
    assert "3 model calls; input 2500 tokens, output 140 tokens" in page
    assert "<td>main</td><td>2</td><td>2200</td><td>120</td><td>1700</td>" in page


def test_html_embeds_png_and_escapes(session: SessionPaths) -> None:
    page = render_html(load(session), session_dir=session.root)
    assert '<meta charset="utf-8">' in page
    assert "<title>20240101-120000-abcd</title>" in page
    found = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert found and base64.b64decode(found.group(1)) == tiny_png()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script" not in page.lower()
    assert "<b>RMSE</b>" in page and "<code>0.5</code>" in page
    assert "<details><summary" in page and "I should run some code." in page
    assert '<div class="sub"><div class="label">source-explorer</div>' in page
    assert html_order(page, ["Session resumed", "Approval requested", "provider timeout"])
    assert str(session.outputs / "exec-1.txt") in page
    linked = render_html(load(session), session_dir=session.root, embed_images=False)
    assert "data:image/png" not in linked and "plot.png</a>" in linked


def html_order(page: str, marks: list[str]) -> bool:
    positions = [page.index(m) for m in marks]
    return positions == sorted(positions)


def test_hostile_payloads_everywhere_are_escaped(tmp_path: Path) -> None:
    events = [Event(1, "t", "session_start", {"session_id": XSS, "model": XSS}),
              Event(2, "t", "message_user", {"content": XSS}),
              Event(3, "t", "message_assistant", {"content": f"# {XSS}\n- {XSS}\n```\n{XSS}\n```",
                                                  "agent": XSS}),
              Event(4, "t", "tool_call", {"id": "c", "name": XSS, "args": {"a": XSS}}),
              Event(5, "t", "tool_result", {"tool_call_id": "c", "content": XSS}),
              Event(6, "t", "artifact", {"path": "javascript:alert(1)<script>"}),
              Event(7, "t", "error", {"message": XSS, "where": XSS}),
              Event(8, "t", "attempt", {"rationale": XSS})]
    page = render_html(events, session_dir=tmp_path)
    assert "<script" not in page.lower()
    assert 'href="javascript' not in page


def test_odd_payloads_and_unknown_kinds_do_not_raise(tmp_path: Path) -> None:
    events = [Event(1, "t", "mystery_kind", {"x": 1}),
              Event(2, "t", "session_start", []),  # type: ignore[arg-type]
              Event(3, "t", "message_user", {"content": None, "turn": {"n": 1}}),
              Event(4, "t", "tool_call", {"id": ["unhashable"], "name": None, "args": "str"}),
              Event(5, "t", "tool_result", {"tool_call_id": {"d": 1}, "content": [{"a": 1}]}),
              Event(6, "t", "kernel_exec", {"tool_call_id": "nope", "code": 5}),
              Event(7, "t", "artifact", {"path": None}),
              Event(8, "t", "artifact", {"path": "missing.png"}),
              Event(9, "t", "model_usage", {"input_tokens": "many", "output_tokens": None}),
              Event(10, "t", "hitl_request", {"action_requests": "rm"}),
              Event(11, "t", "hitl_response", {"decisions": None}),
              Event(12, "t", "context_clear", {"cleared": 3, "tokens_freed": 1200}),
              Event(13, "t", "watchdog_alert", {"tool": "run_python", "repeats": 4}),
              Event(14, "t", "recovery", {"reason": "kernel died", "attempt": 1}),
              Event(15, "t", "model_switch", {"from_model": "a", "to_model": "b"}),
              Event(16, "t", "attempt", {"index": None, "parameters": "x|y"}),
              Event(17, "t", "message_assistant", "not a dict")]  # type: ignore[arg-type]
    md = render_markdown(events, session_dir=tmp_path)
    page = render_html(events, session_dir=tmp_path)
    assert "mystery" not in md and "mystery" not in page
    assert "*context_clear: cleared=3, tokens_freed=1200*" in md
    assert "Model switched: a → b" in md and "Recovery: kernel died" in md
    assert "1 model calls; input 0 tokens" in md
    assert "missing.png" in page
    assert render_markdown([]).startswith("# Session session")
    assert "<title>session</title>" in render_html([])


def test_list_sessions_newest_first(workspace: Path) -> None:
    write_session(workspace, "20240101-120000-abcd", question="Fit the model please")
    newer = write_session(workspace, "20240102-090000-beef", question="x" * 100,
                          big_output=False)
    with TraceLog(newer.trace) as log:
        log.append("message_user", {"content": "third", "turn": 3})
    infos = list_sessions(workspace)
    assert [i.id for i in infos] == ["20240102-090000-beef", "20240101-120000-abcd"]
    new, old = infos
    assert isinstance(new, SessionInfo) and new.path == newer.root
    assert old.title == "Fit the model please"
    assert len(new.title) <= 60 and new.title.startswith("xxx")
    assert (new.turns, old.turns) == (3, 2)
    assert old.tool_calls == 2
    assert (old.input_tokens, old.output_tokens) == (2500, 140)
    assert old.model == "claude-x" and old.simulator == "python"
    assert old.started and old.last_activity and old.started <= old.last_activity
    table = format_sessions_table(infos)
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["id", "started", "turns", "tools"]
    assert lines[1].startswith("20240102-090000-beef") and "Fit the model please" in lines[2]
    assert "2.5k/140" in lines[2]
    assert format_sessions_table([]) == "(no sessions)"


def test_find_session(workspace: Path) -> None:
    with pytest.raises(LookupError, match="no sessions"):
        find_session(workspace, None)
    a = write_session(workspace, "20240101-120000-abcd")
    b = write_session(workspace, "20240101-130000-abce")
    c = write_session(workspace, "20240102-090000-beef")
    assert find_session(workspace, "20240102") == c.root
    assert find_session(workspace, "20240101-12") == a.root
    assert find_session(workspace, None) == c.root  # newest without a marker
    with pytest.raises(LookupError) as err:
        find_session(workspace, "20240101")
    message = str(err.value)
    assert "ambiguous" in message and a.root.name in message and b.root.name in message
    assert "\n" not in message
    with pytest.raises(LookupError, match="no session matches"):
        find_session(workspace, "1999")
    (workspace_state_dir(workspace) / "last-session").write_text(b.root.name + "\n")
    assert find_session(workspace, None) == b.root


def test_corrupt_trace_is_listed_as_unreadable(workspace: Path) -> None:
    good = write_session(workspace, "20240101-120000-abcd")
    bad = SessionPaths.for_session(workspace, "20240103-000000-dead").ensure()
    bad.trace.write_bytes(b"this is not a database at all" * 100)
    infos = list_sessions(workspace)
    assert [i.id for i in infos] == [bad.root.name, good.root.name]
    assert infos[0].title.startswith("(unreadable trace: ")
    assert infos[1].title == "Fit the model please"
    assert "unreadable trace" in format_sessions_table(infos)


def test_an_answers_numbers_link_to_the_cell_that_printed_them(tmp_path: Path):
    """Each turn's final answer: a footnote after each number, linked to the anchor its
    cell's card carries; an unsourced number marked [?], said once under Sources."""
    sp = SessionPaths.for_session(tmp_path, "s-num").ensure()
    raw = sp.outputs / "0003.txt"
    raw.write_text("k_fit = 0.31647\ntau_ms = 2.6753\n")
    code = "print('k_fit =', 0.31647)\nprint('tau_ms =', 2.6753)"
    with TraceLog(sp.trace) as log:
        log.append("message_user", {"content": "fit it", "turn": 1})
        log.append("message_assistant", {"content": "Fitting 2.0 first.", "agent": "main"})
        log.append("tool_call", {"id": "c1", "name": "run_python", "args": {"code": code}})
        log.append("kernel_exec", {"tool_call_id": "c1", "code": code, "status": "ok",
                                   "raw_path": str(raw), "execution_count": 2})
        log.append("tool_result", {"tool_call_id": "c1", "name": "run_python",
                                   "content": raw.read_text(), "status": "success"})
        log.append("message_assistant", {"content": "k is 0.316, tau 2.68, 2.36 apart; "
                                                    "R0 is 3.9.", "agent": "main"})
        events = log.events()
    md = render_markdown(events, session_dir=sp.root)
    assert "Fitting 2.0 first." in md  # not the turn's final answer: as written
    assert ("k is 0.316[[1]](#cell-3), tau 2.68[[2]](#cell-3), 2.36[3] apart; "
            "R0 is 3.9[?].") in md
    assert '### Tool `run_python` (✓ status ok) · cell 3<a id="cell-3"></a>' in md
    sources = md[md.index("**Sources**"):]
    assert "- [1] [cell 3, output line 1](#cell-3): `k_fit = 0.31647`" in sources
    assert "- [3] = [2] - [1] (difference)" in sources
    assert sources.count("[?]") == 1
    page = render_html(events, session_dir=sp.root)
    assert '<div class="card tool" id="cell-3">' in page
    assert 'k is 0.316<sup><a href="#cell-3">[1]</a></sup>' in page
    assert "2.36<sup>[3]</sup> apart; R0 is 3.9[?]." in page
    assert '<a href="#cell-3">cell 3, output line 2</a>: <code>tau_ms = 2.6753</code>' in page
    assert "\ue000" not in page
