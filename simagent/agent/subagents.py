"""Subagents as data: ``<agent>.md`` files that become deepagents subagents with typed reports.

A subagent answers one delegated question in its own context window, so source browsing
and long logs never enter the main agent's context; the parent gets back a small typed
record (:class:`SubagentReport`). Definitions are markdown files (frontmatter ``name``,
``description``, ``tools``, optional ``model``; the body is the system prompt): the
shared ones in the bundled ``subagents/`` folder, overridden by name by the active
simulator's ``subagents/`` folder. Adding one adds a file, never agent code.

The model is configurable so exploration can run on a cheaper one:
``[subagents.<name>] model`` > ``[subagents] model`` > the file's ``model`` > the main
model. Every subagent has its own context layers and trace recorder
(``agent=<name>``), so its tokens are traced and rolled up apart from the main agent's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NotRequired

from langchain.agents.middleware import AgentMiddleware
from langchain.agents.structured_output import ToolStrategy
from langchain_core.messages import AIMessage
from pydantic import BaseModel, Field
from typing_extensions import TypedDict  # pydantic needs this one on Python < 3.12

from simagent import exit_codes
from simagent.config import ConfigError
from simagent.frontmatter import FrontmatterError, read_frontmatter
from simagent.records import KeyValueArgs, Report, files_read
from simagent.simulators import subagent_files

if TYPE_CHECKING:
    from simagent.config import Config
    from simagent.simulators import Simulator

#: Name of the tool a subagent files its report with (the report schema's name).
REPORT_TOOL = "submit_report"
#: Tools a subagent file may ask for; file tools are deepagents' own, restricted per agent.
FILE_TOOLS = ("ls", "read_file", "glob", "grep")
ALLOWED_TOOLS = ("run_python", *FILE_TOOLS)
INHERIT = "inherit"
_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


class SubagentError(ConfigError):
    """A subagent file or setting that cannot be used; names the file and the field.

    ``code`` is the exit code a command leaves with: usage/config by default, the model
    error's own (e.g. a missing key is a provider error) when the subagent's model fails.
    """

    def __init__(self, message: str, code: int = exit_codes.USAGE) -> None:
        super().__init__(message)
        self.code = code


#: The normalized record the parent receives (the model-facing schema is below); its
#: shape is shared with task records (``simagent/records.py``).
SubagentReport = Report


class submit_report(TypedDict):  # the class name is the tool name the model sees
    """File the final report of the delegated task (call exactly once, at the end)."""

    answer: Annotated[str, Field(description="The direct answer to the delegated question, "
                                             "in a few sentences; cite file:line for facts "
                                             "read from source.")]
    key_values: NotRequired[Annotated[list[KeyValueArgs],
                                      Field(description="The numbers that matter, with units.")]]
    files_read: NotRequired[Annotated[list[str], Field(description="Paths you read.")]]
    assumptions: NotRequired[Annotated[list[str], Field(
        description="Assumptions the answer rests on.")]]
    open_questions: NotRequired[Annotated[list[str], Field(
        description="What you could not settle.")]]


#: The structured-output schema. A TypedDict, so the filed report is validated (bad
#: arguments go back to the model) yet stays a plain dict in checkpointed state.
ReportSchema = submit_report


@dataclass(frozen=True)
class SubagentDef:
    name: str
    description: str
    tools: tuple[str, ...]
    prompt: str
    source: Path
    model: str | None = None


def parse_subagent(path: Path) -> SubagentDef:
    """Read one ``<agent>.md``; raises :class:`SubagentError` naming the file and field."""
    try:
        meta, text_body = read_frontmatter(path)
    except FrontmatterError as exc:
        raise SubagentError(str(exc)) from exc
    name, desc = meta.get("name"), meta.get("description")
    if not isinstance(name, str) or not _NAME.match(name) or name != path.stem:
        raise SubagentError(f"{path}: name must be lowercase-hyphen and equal the file "
                            f"name {path.stem!r}, got {name!r}")
    if not isinstance(desc, str) or not desc.strip():
        raise SubagentError(f"{path}: description is required")
    tools = meta.get("tools", list(ALLOWED_TOOLS))
    if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
        raise SubagentError(f"{path}: tools must be a list of tool names")
    unknown = sorted(set(tools) - set(ALLOWED_TOOLS))
    if unknown:
        raise SubagentError(f"{path}: unknown tools {unknown} (allowed: "
                            f"{', '.join(ALLOWED_TOOLS)})")
    model = meta.get("model")
    if model is not None and not isinstance(model, str):
        raise SubagentError(f"{path}: model must be a model string or 'inherit'")
    body = text_body.strip()
    if not body:
        raise SubagentError(f"{path}: empty body (the body is the system prompt)")
    return SubagentDef(name=name, description=" ".join(desc.split()), tools=tuple(tools),
                       prompt=body, source=path,
                       model=None if model in (None, "", INHERIT) else model)


def discover_subagents(simulator: Simulator | None) -> dict[str, SubagentDef]:
    """Shared definitions, overridden by name by the simulator's own."""
    found: dict[str, SubagentDef] = {}
    for path in subagent_files(simulator):
        d = parse_subagent(path)
        found[d.name] = d
    return found


def model_spec_for(defn: SubagentDef, config: Config) -> str | None:
    """The model string for a subagent (None = the main agent's model)."""
    section = config.section("subagents")
    own = section.get(defn.name, {})
    if not isinstance(own, Mapping):
        raise SubagentError(f"{config.source('subagents', defn.name)}: "
                            f"[subagents.{defn.name}] must be a table")
    for value, table in ((own.get("model"), (defn.name,)), (section.get("model"), ()),
                         (defn.model, ())):  # the file's own model is a string: parse_subagent
        if value is None:
            continue
        if not isinstance(value, str):
            raise SubagentError(f"{config.source('subagents', *table, 'model')}: "
                                f"[{'.'.join(('subagents', *table))}] model must be a model "
                                f"string or 'inherit', got {value!r}")
        return None if value in ("", INHERIT) else value
    return None


def runtime_note(workspace: Path, outputs: Path, simulator: Simulator | None,
                 source_dirs: Sequence[Path]) -> str:
    lines = ["## Runtime",
             "- You share the main agent's Python kernel: work inside functions or with "
             "`_sa_`-prefixed names, never reassign, mutate or delete existing variables "
             "(build your own objects), and close figures you create.",
             f"- Workspace (kernel working directory): {workspace}",
             f"- Full raw output of every kernel run: {outputs}/<n>.txt"]
    if simulator is not None:
        lines.append(f"- Simulator: {simulator.display_name}")
    if source_dirs:
        lines.append("- Installed simulator source (read-only): "
                     + ", ".join(str(p) for p in source_dirs))
    lines.append(f"- Finish by calling `{REPORT_TOOL}` exactly once; its record is all the "
                 "main agent sees of your work, so put every needed number in `key_values` "
                 "with its unit.")
    return "\n".join(lines)


def finish_report(structured: Any, messages: Sequence[Any]) -> SubagentReport:
    """The record the parent gets: the filed report, or one built from the last reply.

    ``files_read`` always includes what was actually read, whatever the model claimed.
    """
    report: SubagentReport | None = None
    if isinstance(structured, BaseModel):
        structured = structured.model_dump()
    if isinstance(structured, Mapping):
        try:
            report = SubagentReport.model_validate(dict(structured))
        except ValueError:
            report = None
    if report is None:
        last = next((m.text for m in reversed(messages)
                     if isinstance(m, AIMessage) and m.text and m.text.strip()), "")
        report = SubagentReport(
            answer=last.strip() or "(the subagent ended without an answer)",
            open_questions=[f"The subagent ended without calling {REPORT_TOOL}; this record "
                            "was built from its last message."])
    actual = files_read(messages)
    merged = list(dict.fromkeys([*report.files_read, *actual]))
    return report.model_copy(update={"files_read": merged})


class ReportMiddleware(AgentMiddleware):
    """Guarantees a typed record when the subagent ends, filed or not."""

    def __init__(self, agent: str) -> None:
        super().__init__()
        self.agent = agent

    @property
    def name(self) -> str:
        return f"ReportMiddleware[{self.agent}]"

    def after_agent(self, state: Any, runtime: Any) -> dict[str, Any]:
        report = finish_report(state.get("structured_response"), state.get("messages", []))
        return {"structured_response": report.model_dump()}  # plain data in state


def build_specs(defs: Mapping[str, SubagentDef], *, tools: Sequence[Any],
                layers_for: Callable[[SubagentDef], tuple[list[Any], Any]],
                prompt_suffix: str) -> list[dict[str, Any]]:
    """deepagents ``SubAgent`` specs for ``defs``.

    ``layers_for(defn)`` returns ``(middleware, chat_model)`` for one subagent: its
    context layers, recovery and trace recorder, and the model it runs on.
    """
    by_name = {getattr(t, "name", None): t for t in tools}
    specs = []
    for defn in defs.values():
        middleware, chat_model = layers_for(defn)
        specs.append({
            "name": defn.name,
            "description": defn.description,
            "system_prompt": f"{defn.prompt}\n\n{prompt_suffix}",
            "tools": [by_name[t] for t in defn.tools if t in by_name],
            "model": chat_model,
            "middleware": [*middleware, ReportMiddleware(defn.name)],
            "response_format": ToolStrategy(ReportSchema),
        })
    return specs
