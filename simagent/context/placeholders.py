"""What a cleared tool result becomes: a pointer saying where its content is (issue 31 §2).

A placeholder is sent on every later request, so it stays short; it names where the
content lives and the cheapest way to page it back (a kernel one-liner on ``_out[n]``,
``read_file`` on a path, or the call again), because re-reading a fact is part of what
clearing costs. It says how long the output is and which lines the result showed, so the
model can ask for just those (``_out[7].slice(926, 1002)``). A kernel output is named by
its handle alone: the handle is how the model pages it back, and its file's path (about
40 tokens; the system prompt gives the pattern) would be read again on every request.
How to page a handle (``.slice``, ``.grep``, ``.tail``, ``.code``) is said once, in the
system prompt (:data:`simagent.agent.prompts.GROUND_RULES`) and on the state card, not
in each placeholder: a session holds dozens of them, each read on every request (the
long form cost 61 tokens, this one 25).
Everything in it comes from the result itself (its text, whose cap marker names the cut,
and its artifact, which carries the line count), never from the disk now: it is the same
bytes on every request, as the prompt cache needs.
"""

from __future__ import annotations

import re

from langchain_core.messages import ToolMessage

from simagent.kernel.cut_lines import parse_cut
from simagent.kernel_api.outputs import handle, number_of

#: Paths a result may name for its full content (run_python's raw output, an eviction
#: file, a capped result).
_PATH_RE = re.compile(r"(?:full output: |saved in the filesystem at this path: |full result: )"
                      r"(\S+?)[\]\s;,)]")
_REREAD = {"read_file": "read the file again with `read_file` (same arguments)",
           "grep": "run `grep` again", "glob": "run `glob` again", "ls": "run `ls` again"}


def raw_path_of(msg: ToolMessage) -> str | None:
    """The file holding a result's full content: the kernel's raw output, or the path an
    eviction or a cap marker names."""
    artifact = msg.artifact if isinstance(msg.artifact, dict) else {}
    path = artifact.get("raw_path")
    if not path:
        found = _PATH_RE.search(msg.text + " ")
        path = found.group(1) if found else None
    return path or None


def execution_of(msg: ToolMessage) -> int | None:
    """The kernel execution ``n`` a result came from (its ``_out[n]``), if it names one."""
    return number_of(raw_path_of(msg))


def recovery_hint(msg: ToolMessage, tool_name: str | None) -> str:
    """How the model gets a cleared result back: where the output is, how long it is,
    which of its lines the result showed, and the cheapest call that pages lines back (a
    kernel one-liner for ``_out[n]``, ``read_file`` for a file); else re-running the call."""
    path = raw_path_of(msg)
    if not path:
        return _REREAD.get(tool_name or "", "re-run the call above if you need it")
    facts = line_facts(msg)
    if (n := number_of(path)) is not None:
        about = f" ({facts})" if facts else ""
        return f"full output: {handle(n)}{about}"
    about = f" ({facts})" if facts else ""
    return f"full output: {path}{about}; page it with `read_file` offset/limit"


def line_facts(msg: ToolMessage) -> str:
    """``1002 lines; shown 1-24, 926-1002``: the output's length and, when a cap cut
    it, the line ranges the result kept (what the model read, so what it may want back);
    "" when neither is known."""
    cut = parse_cut(msg.text)
    artifact = msg.artifact if isinstance(msg.artifact, dict) else {}
    total = cut.total if cut else artifact.get("lines")
    if not isinstance(total, int):
        return ""
    facts = f"{total} line{'s' * (total != 1)}"
    if cut and cut.shown:
        facts += "; shown " + ", ".join(f"{a}-{b}" if a < b else str(a)
                                            for a, b in cut.shown)
    return facts


def placeholder(msg: ToolMessage, tool_name: str | None) -> str:
    """The text a cleared result becomes (sent on every later request: keep it short)."""
    return f"[result cleared; {recovery_hint(msg, tool_name)}]"
