"""What a cleared result becomes (issue 31 §2): the pure renderer in
``context/placeholders.py``. A placeholder names where the output is, how many lines it
has and which of them the result showed; how to page a kernel handle back is said once,
in the system prompt, and a file's placeholder names ``read_file``;
``tests/test_cut_lines.py`` checks on a real kernel that the ranges are the true ones."""

from __future__ import annotations

from langchain_core.messages import ToolMessage

from simagent.context import placeholders as ph
from simagent.context.capping import cap_text
from simagent.context.counting import count_text
from simagent.kernel.cut_lines import Cut, cut_note, kernel_slice

RAW = "/s/outputs/0007.txt"
#: The placeholder of a kernel output before issue 31 §2, for the token comparison.
OLD = (f"[result cleared to save context; the full output is at {RAW}; query it in the "
       "kernel with `_out[7].tail(k)`, `.grep(pattern)` or `.head(k)` (or page it with "
       "`read_file` offset/limit)]")


def result(cid: str, text: str = "out", **kw) -> ToolMessage:
    return ToolMessage(text, tool_call_id=cid, **kw)


def kernel_marker(cut: Cut) -> str:
    return (f"step 1\n[output truncated: 2.9 KB of 29.3 KB printed are shown (head and "
            f"tail); full output: {RAW}; {cut_note(cut, kernel_slice(7, cut))} or "
            f".grep(pattern)]\nfinal 3.2")


def test_raw_path_from_the_artifact_or_the_markers():
    assert ph.raw_path_of(result("a", artifact={"raw_path": RAW})) == RAW
    assert ph.raw_path_of(result("a", "x [full output: /p/outputs/0003.txt]")) == \
        "/p/outputs/0003.txt"
    assert ph.raw_path_of(result("a", "see full result: /tmp/r.txt")) == "/tmp/r.txt"
    assert ph.raw_path_of(result("a", "saved in the filesystem at this path: /l/x.txt, ok")) \
        == "/l/x.txt"
    assert ph.raw_path_of(result("a", "nothing here")) is None
    assert ph.raw_path_of(result("a", "x", artifact={"raw_path": ""})) is None
    assert ph.raw_path_of(result("a", "x", artifact="not a dict")) is None
    assert ph.execution_of(result("a", artifact={"raw_path": RAW})) == 7
    assert ph.execution_of(result("a", "see full result: /tmp/r.txt")) is None


def test_a_kernel_output_names_its_handle_and_length():
    whole = result("a", "12 lines", artifact={"raw_path": RAW, "lines": 12})
    assert ph.recovery_hint(whole, "run_python") == "full output: _out[7] (12 lines)"
    one = result("a", "x", artifact={"raw_path": RAW, "lines": 1})
    assert ph.recovery_hint(one, "run_python") == "full output: _out[7] (1 line)"
    older = result("a", "x", artifact={"raw_path": RAW})  # a result from before the count
    assert ph.recovery_hint(older, "run_python") == "full output: _out[7]"
    # the handle is the pointer: the file's path is left out
    assert RAW not in ph.recovery_hint(whole, "run_python")


def test_a_cut_kernel_output_says_which_lines_it_showed():
    cut = Cut(25, 925, 1002)
    msg = result("a", kernel_marker(cut), artifact={"raw_path": RAW, "lines": 1002})
    assert ph.line_facts(msg) == "1002 lines; shown 1-24, 926-1002"
    assert ph.placeholder(msg, "run_python") == (
        "[result cleared; full output: _out[7] (1002 lines; shown 1-24, 926-1002)]")
    tail_only = result("a", kernel_marker(Cut(1, 990, 1002)), artifact={"raw_path": RAW})
    assert ph.line_facts(tail_only) == "1002 lines; shown 991-1002"
    last_line = result("a", kernel_marker(Cut(1, 1001, 1002)), artifact={"raw_path": RAW})
    assert ph.line_facts(last_line) == "1002 lines; shown 1002"


def test_a_capped_file_result_names_its_length_shown_lines_and_read_file():
    text = "".join(f"row {i}\n" for i in range(1000))
    msg = result("a", cap_text(text, 2_000, "/w/large_tool_results/a.full.txt"))
    hint = ph.recovery_hint(msg, "grep")
    assert hint.startswith("full output: /w/large_tool_results/a.full.txt (1000 "
                           "lines; shown 1-")
    assert hint.endswith("); page it with `read_file` offset/limit")
    assert ph.recovery_hint(result("a", "full result: /tmp/r.txt "), "grep") == \
        "full output: /tmp/r.txt; page it with `read_file` offset/limit"


def test_results_without_a_file_say_how_to_get_them_again():
    assert ph.recovery_hint(result("a"), "read_file") == \
        "read the file again with `read_file` (same arguments)"
    assert ph.recovery_hint(result("a"), "glob") == "run `glob` again"
    assert ph.recovery_hint(result("a"), None) == "re-run the call above if you need it"
    assert ph.recovery_hint(result("a"), "other") == "re-run the call above if you need it"
    assert ph.placeholder(result("a"), "ls") == \
        "[result cleared; run `ls` again]"


def test_a_kernel_placeholder_costs_what_its_handle_costs_not_its_path():
    """A session's outputs sit deep in the state home; naming the file cost about 40
    tokens on every later request. Named by its handle, a placeholder costs the same
    whatever the path."""
    deep = ("/root/.local/share/simagent/workspaces/1c92fd37c87c/sessions/"
            "20261126-165616-11e4/outputs/0007.txt")
    short, long = (ph.placeholder(result("a", "x", artifact={"raw_path": p, "lines": 12}),
                                  "run_python") for p in (RAW, deep))
    assert short == long and count_text(long) < 20
    before = OLD.replace(RAW, deep)  # the old wording with a real session's path
    assert count_text(before) - count_text(long) >= 70


def test_a_placeholder_grows_by_a_few_tokens_at_most():
    """Sent on every later request: the line facts must cost little. A whole output's
    placeholder is shorter than the oldest wording by half; a cut one's adds its shown
    ranges and stays shorter still."""
    whole = ph.placeholder(result("a", "x", artifact={"raw_path": RAW, "lines": 12}),
                           "run_python")
    cut = ph.placeholder(result("a", kernel_marker(Cut(25, 925, 1002)),
                                artifact={"raw_path": RAW}), "run_python")
    assert count_text(whole) <= count_text(OLD) // 2
    assert count_text(cut) <= count_text(whole) + 14 < count_text(OLD)


def test_the_system_prompt_says_once_how_to_page_a_handle():
    """Placeholders name only the handle; the ground rules every request carries say how
    a handle is paged back and where a cell's code is."""
    from simagent.agent.prompts import GROUND_RULES

    rule = " ".join(GROUND_RULES.split())
    for call in ("`_out[n].slice(first, last)`", "`.grep(pattern)`", "`.tail(k)`",
                 "`_out[n].code`"):
        assert call in rule
