"""One head-and-tail cut (issue 25): kernel output and every other tool's result keep the
same head share and cut at line boundaries the same way."""

from __future__ import annotations

from langchain_core.messages import ToolMessage

from simagent.context.capping import cap_text, cap_tool_message
from simagent.head_tail import HEAD_SHARE, head_and_tail
from simagent.kernel.result import ExecResult

TEXT = "setup a=1\n" + "".join(f"row {i:05d} value {i * 0.5:.3f}\n" for i in range(5_000)) \
    + "result: 42\n"


def test_head_gets_its_share_and_both_parts_are_whole_lines() -> None:
    head, tail = head_and_tail(TEXT, 4_000)
    assert head.startswith("setup a=1\n") and tail.endswith("result: 42\n")
    assert int(4_000 * HEAD_SHARE) // 2 < len(head) <= int(4_000 * HEAD_SHARE)
    assert head.endswith("\n") and TEXT[len(TEXT) - len(tail) - 1] == "\n"
    assert len(head) + len(tail) <= 4_000
    assert head_and_tail(TEXT, 4_000, with_head=False)[0] == ""


def test_run_python_text_and_a_capped_tool_result_keep_the_same_head_and_tail() -> None:
    budget = 4_000
    head, tail = head_and_tail(TEXT, budget)
    kernel = ExecResult(status="ok", stdout=TEXT, raw_chars=len(TEXT), cap=budget)
    shown = kernel.model_text(budget)
    # the kernel's cap holds for its marker too, so its cut is the same cut at the
    # budget its marker leaves
    assert len(shown) <= budget
    assert any(shown.startswith(h) and shown.endswith(t)
               for h, t in (head_and_tail(TEXT, b) for b in range(budget // 2, budget)))
    capped = cap_text(TEXT, budget, "/tmp/full.txt")
    assert capped.startswith(head) and capped.endswith(tail)


def test_only_tools_that_cap_themselves_pass_the_context_cap_uncut() -> None:
    for name, cut in (("run_python", False), ("read_file", True)):
        msg = ToolMessage(TEXT, tool_call_id="c1", name=name, artifact={"raw_path": None})
        out = cap_tool_message(msg, 2_000, None)
        assert (len(out.text) < len(TEXT)) is cut


def test_head_only_gets_the_whole_budget_and_ends_on_a_line() -> None:
    head, tail = head_and_tail(TEXT, 4_000, with_tail=False)
    assert tail == "" and head.startswith("setup a=1\n") and head.endswith("\n")
    assert 2_000 < len(head) <= 4_000 and TEXT.startswith(head)
