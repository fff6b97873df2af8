"""What a cleared tool result becomes: a pointer saying where its content is (issue 31 §2).

A placeholder is sent on every later request, so it stays short; it names where the
content lives and the cheapest way to page it back (a kernel one-liner on ``_out[n]``,
``read_file`` on a path, or the call again), because re-reading a fact is part of what
clearing costs.
"""

from __future__ import annotations

import re

from langchain_core.messages import ToolMessage

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
    """How the model gets a cleared result back: a path on disk, or re-running the call."""
    path = raw_path_of(msg)
    if path:
        if (n := number_of(path)) is not None:
            return (f"the full output is at {path}; query it in the kernel with "
                    f"`{handle(n)}.tail(k)`, `.grep(pattern)` or `.head(k)` "
                    f"(or page it with `read_file` offset/limit)")
        return f"the full output is at {path} (page it with `read_file` offset/limit)"
    return _REREAD.get(tool_name or "", "re-run the call above if you need it")


def placeholder(msg: ToolMessage, tool_name: str | None) -> str:
    return f"[result cleared to save context; {recovery_hint(msg, tool_name)}]"
