"""The tools plugins add to the agent (the ``register_tools`` hook of
:mod:`simagent.hookspecs`).

simagent's own tools are built here in the agent layer from the session and the context
settings (:func:`simagent.agent.tools.session_tools`); a plugin's come after them, each a
langchain tool or a plain function made one. A plugin tool is not classified by
:mod:`simagent.agent.approval`, so it waits for approval in ``ask`` and ``workspace``
modes, as any new tool does; it may not take a name approval does classify
(:data:`RESERVED`), or it could slip past approval by borrowing one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from langchain_core.tools import BaseTool, tool

from simagent import plugins
from simagent.agent import approval

if TYPE_CHECKING:
    from simagent.session import Session

#: Every tool name :mod:`simagent.agent.approval` decides about by name.
RESERVED = frozenset({*approval.BUILTIN_TOOLS, *approval.NEVER_WAIT, *approval.KERNEL_TOOLS,
                      *approval.ASK_ONLY, *approval.SHELL_TOOLS, *approval.FILE_WRITE_TOOLS,
                      *approval.FILE_READ_TOOLS})


def plugin_tools(session: Session, taken: Iterable[str] = ()) -> list[BaseTool]:
    """The tools every plugin registers for ``session``; one whose name is ``taken`` (by
    simagent's own tools or an earlier plugin's) or :data:`RESERVED`, or that is not a
    tool, is reported and left out: a plugin cannot replace ``run_python``."""
    names = {*taken, *RESERVED}
    out: list[BaseTool] = []
    for entry in plugins.collect("register_tools", session=session):
        made = _as_tool(entry.item)
        if made is None:
            plugins.refuse(entry, "register_tools", "a langchain tool or a function")
        elif made.name in names:
            plugins.report(f"plugin {entry.plugin}: tool {made.name!r} is already taken; "
                           "left out")
        else:
            names.add(made.name)
            out.append(made)
    return out


def _as_tool(item: Any) -> BaseTool | None:
    if isinstance(item, BaseTool):
        return item
    if callable(item) and getattr(item, "__doc__", None):
        try:
            return tool(item)
        except (TypeError, ValueError):  # langchain could not read its signature
            return None
    return None
