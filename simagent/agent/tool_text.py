"""Slim tool descriptions: the one home for the model-facing text of deepagents' tools.

Tool schemas ride along with every request, and deepagents' stock descriptions (written
for a coding agent: emoji policy, regex advice, glob edge cases, five paragraphs on
subagents) were 17 % of everything simagent sent on the bench. Each text here keeps what
the tool's behaviour depends on (absolute paths; ``read_file`` pages with ``offset`` /
``limit`` and evicted results are paged the same way; ``grep`` is literal and has three
output modes; ``edit_file`` needs a unique exact match; ``task`` takes every detail in
``description`` and several run in parallel) and drops the rest, including parameter
descriptions that repeat the tool's.

:class:`SlimToolsMiddleware` swaps them in on the request only: the model sees a copy of
each tool with the slim text and the same name and argument types, while the tool node
runs the originals. Every other tool's description loses its docstring indentation.
deepagents' ``task`` description lists the subagents, which are ours; that list is kept
verbatim and only the usage notes around it are replaced.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool

#: Descriptions by tool name (deepagents' filesystem tools and ``task``; ours are their
#: docstrings in ``agent/tools.py``).
DESCRIPTIONS: dict[str, str] = {
    "ls": "List a directory (absolute path).",
    "read_file": (
        "Read a file (absolute path): 100 lines from the start unless you pass `offset` "
        "(first line, 0-indexed) and `limit` (line count). Page through long files and "
        "saved outputs this way instead of reading them whole. A `@@ ... @@` status header "
        "precedes the lines; never copy it into an edit. A result too large for a message "
        "is saved to a file whose path the message gives: page that file the same way. "
        "Images and PDFs come back as content (pass `file_path` only). Read several files "
        "in one reply when useful."),
    "write_file": ("Create a file or replace its whole content (absolute path). To change "
                   "part of an existing file use `edit_file`."),
    "edit_file": (
        "Replace exact text in a file you have read (absolute path). `old_string` must "
        "match verbatim, indentation included and read header excluded, and be unique "
        "unless `replace_all` is true."),
    "delete": "Delete a file, or a directory with everything in it (absolute path). "
              "Cannot be undone.",
    "glob": (
        "Find files by name pattern; returns absolute paths. `*` within a name, `**` "
        "across folders, `?`, `[abc]`, `{a,b}`. Without `/` a pattern matches names at any "
        "depth (`*.py`); with `/` it matches paths below `path` (`src/**/*.py`). Dot-"
        "folders are searched only when the pattern names them (`.github/**/*.yml`)."),
    "grep": (
        "Search files for a LITERAL string, not a regex (`a|b` finds the text `a|b`; run "
        "one grep per alternative). `output_mode`: 'files_with_matches' (default: paths), "
        "'content' (matching lines with line numbers) or 'count'. Narrow with `path` (a "
        "folder or file) and `glob` (a file-name filter such as '*.py')."),
    "execute": (
        "Run a shell command; returns stdout and stderr with the exit code (long output "
        "is cut). Use absolute paths and chain with `&&`, not newlines. Search with the "
        "`grep`/`glob` tools and read with `read_file`, not find, grep or cat."),
}

#: Parameter descriptions by tool; None drops a parameter's description (the tool's
#: text already says it), a parameter not listed keeps deepagents' own.
PARAMETERS: dict[str, dict[str, str | None]] = {
    "ls": {"path": None},
    "read_file": {"file_path": None, "offset": None, "limit": None},
    "write_file": {"file_path": None, "content": "The whole new content."},
    "edit_file": {"file_path": None, "old_string": None, "new_string": None,
                  "replace_all": None},
    "delete": {"file_path": None},
    "glob": {"pattern": None, "path": "Folder to search from (default: the root)."},
    "grep": {"pattern": None, "path": "Default: the working directory.", "glob": None,
             "output_mode": None, "max_count": "Cap on matches returned."},
    "execute": {"command": None, "timeout": "Seconds (default: the backend's)."},
    "task": {"description": "The whole task, with every detail the agent needs and what "
                            "it must return.",
             "subagent_type": "One of the agents listed above."},
}

#: ``task``: deepagents' list of agents goes between these two.
TASK_HEAD = ("Delegate a self-contained task to a subagent with its own context window; it "
             "returns one report. Agents (`subagent_type`):")
TASK_TAIL = ("The agent sees only `description`: give it every detail and say exactly what "
             "to return. Independent tasks run in parallel when you make several calls in "
             "one reply. The report is not shown to the user: relay what matters.")
#: Where deepagents 0.7's ``task`` description starts and ends its agent list.
_TASK_LIST_START = "Available agent types and the tools they have access to:\n"
_TASK_LIST_END = "\n\nSpecify subagent_type"


def task_description(stock: str) -> str:
    """``task``'s slim text around deepagents' agent list; ``stock`` unchanged when the
    list cannot be found (another deepagents version)."""
    start = stock.find(_TASK_LIST_START)
    end = stock.find(_TASK_LIST_END, start + 1)
    if start < 0 or end < 0:
        return stock
    agents = stock[start + len(_TASK_LIST_START):end].strip("\n")
    return f"{TASK_HEAD}\n{agents}\n\n{TASK_TAIL}"


def slim_description(name: str, stock: str) -> str:
    if name == "task":
        return task_description(stock)
    return DESCRIPTIONS.get(name) or inspect.cleandoc(stock)


def slim_parameters(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema with :data:`PARAMETERS`' descriptions (a copy)."""
    out = copy.deepcopy(parameters)
    for param, text in PARAMETERS.get(name, {}).items():
        prop = out.get("properties", {}).get(param)
        if not isinstance(prop, dict):
            continue
        if text is None:
            prop.pop("description", None)
        else:
            prop["description"] = text
    return out


def slim_tool(tool: Any) -> Any:
    """A copy of ``tool`` carrying the slim text, for the request only (never run)."""
    if not isinstance(tool, BaseTool):
        return tool

    parameters = convert_to_openai_tool(tool)["function"].get("parameters") or {}
    return tool.model_copy(update={
        "description": slim_description(tool.name, tool.description or ""),
        "args_schema": slim_parameters(tool.name, parameters)})


class SlimToolsMiddleware(AgentMiddleware):
    """Sends the slim copies in place of the tools (request only; state untouched).

    Sits outside the context layers, so what they measure is what is sent. Copies are
    made once per tool object and description (deepagents may rebuild a description).
    """

    def __init__(self) -> None:
        super().__init__()
        self._copies: dict[tuple[int, str], tuple[Any, Any]] = {}

    @property
    def name(self) -> str:
        return "SlimToolsMiddleware"

    def slim(self, tools: list[Any]) -> list[Any]:
        out = []
        for tool in tools:
            key = (id(tool), str(getattr(tool, "description", "")))
            hit = self._copies.get(key)
            if hit is None or hit[0] is not tool:
                hit = self._copies[key] = (tool, slim_tool(tool))
            out.append(hit[1])
        return out

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return handler(request.override(tools=self.slim(list(request.tools))))

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return await handler(request.override(tools=self.slim(list(request.tools))))
