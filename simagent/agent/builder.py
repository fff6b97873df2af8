"""``build_agent``: the deepagents graph for a session and a model.

Stock layers do the work (deepagents' filesystem tools, eviction, summarization,
subagents, human-in-the-loop; langchain's middleware protocol). simagent adds its tools,
its skills and memory indexes, recovery, and the trace recorder. The order of our
middleware matters: skills and memory first, so the recorder, last and innermost, sees
the request exactly as the model gets it. Building is cheap, so switching model or
approval mode rebuilds the graph on the same checkpointer thread.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deepagents import create_deep_agent
from deepagents.middleware.memory import MemoryMiddleware
from deepagents.middleware.skills import SkillsMiddleware
from langchain_core.runnables import RunnableConfig

from simagent.agent import confine
from simagent.agent.abandon_guard import AbandonGuard
from simagent.agent.approval import interrupt_on_for_mode, readable_roots
from simagent.agent.backend import OpenFiles, WorkspacePathsMiddleware, build_backend
from simagent.agent.context_layers import context_layers, skill_sources
from simagent.agent.number_check import NumberCheckMiddleware
from simagent.agent.plugin_tools import plugin_tools
from simagent.agent.prompts import (
    MEMORY_PROMPT,
    SKILLS_PROMPT,
    RuntimeContext,
    build_system_prompt,
)
from simagent.agent.provider_retry import ProviderRetryMiddleware
from simagent.agent.recorder import TraceRecorder
from simagent.agent.recovery import RecoveryMiddleware
from simagent.agent.scripted import ScriptedChatModel
from simagent.agent.secrets import ToolResultRedaction
from simagent.agent.subagents import (
    FILE_TOOLS,
    SubagentError,
    build_specs,
    discover_subagents,
    model_spec_for,
    runtime_note,
)
from simagent.agent.tool_deferral import mcp_tooling
from simagent.agent.tools import make_view_figure, session_tools
from simagent.context.memory import INDEX
from simagent.models import ModelError, image_support, resolve_model
from simagent.paths import CONTENT_FOLDERS, content_dir

if TYPE_CHECKING:
    from simagent.context.middleware import ContextMiddleware
    from simagent.context.settings import ContextSettings
    from simagent.models import ResolvedModel
    from simagent.session import Session

GENERAL_PURPOSE = "general-purpose"
GENERAL_PURPOSE_PROMPT = """You are a general-purpose helper of simagent, working on one \
delegated task in your own context window. You share the session's Python kernel \
(`run_python`) and files. Do the task, then reply with a short digest: the answer, the \
key values with units, the files you read or wrote, and anything left open. Do not paste \
long outputs; give paths instead."""


class IndexedSkillsMiddleware(SkillsMiddleware):
    """Stock skills index under a name of our own, so it stays where we list it.

    deepagents moves a middleware named ``SkillsMiddleware`` to its innermost slot, past
    the context layers and the recorder, which then could not count the index they
    send. Listed before memory, the (stable) skills index also precedes the (changing)
    memory index in the prompt, which keeps the cached prefix longer.
    """

    @property
    def name(self) -> str:
        return "IndexedSkillsMiddleware"


class WorkspaceMemoryMiddleware(MemoryMiddleware):
    """MEMORY.md index in the prompt, re-read at the start of every turn.

    Stock memory loads once per thread, so a note saved with ``remember`` would stay
    invisible for the rest of the session; re-reading one small file per turn is cheap
    and keeps the prompt prefix stable within a turn.
    """

    def before_agent(self, state: Any, runtime: Any, config: RunnableConfig) -> Any:
        fresh = {k: v for k, v in state.items() if k != "memory_contents"}
        return super().before_agent(fresh, runtime, config)

    async def abefore_agent(self, state: Any, runtime: Any, config: RunnableConfig) -> Any:
        fresh = {k: v for k, v in state.items() if k != "memory_contents"}
        return await super().abefore_agent(fresh, runtime, config)


@dataclass
class BuiltAgent:
    """A compiled graph plus what the runner and the UI need to know about it."""

    graph: Any
    model_id: str
    window: int | None
    system_prompt: str
    backend: Any
    tools: list[Any] = field(default_factory=list)
    #: The main agent's ContextMiddleware (manual /compact and /done use it).
    context: ContextMiddleware | None = None
    #: Stops the model's reply in progress when a turn is cancelled
    #: (``ResolvedModel.reply_stopper``); None: nothing beyond closing the connection.
    stop_reply: Callable[[], Any] | None = None


def runtime_context(session: Session, source_dirs: Sequence[Path] = ()) -> RuntimeContext:
    info = session.resume_info
    return RuntimeContext(
        workspace=session.workspace, session_dir=session.paths.root,
        artifacts_dir=session.paths.artifacts, outputs_dir=session.paths.outputs,
        memory_dir=session.memory_dir,
        python=f"{sys.version.split()[0]} ({sys.executable})",
        approval=session.approval,
        resumed_at=info.resumed_at if info else None,
        kernel_restarted=bool(info and info.kernel_restarted),
        source_dirs=tuple(source_dirs),
        cluster=session.config.ensemble_scheduler()[0])


def build_defined_subagents(session: Session, defs: Any, *, tools: Sequence[Any],
                            backend: Any,
                            main: tuple[Any, str, int | None, int | None, Any],
                            settings: ContextSettings | None,
                            source_dirs: Sequence[Path]) -> list[dict[str, Any]]:
    """deepagents specs for the markdown-defined subagents (shared + simulator's own).

    Each runs on its configured model (resolved once per model string, so subagents
    naming the same one share it) with its own context layers and trace recorder.
    """
    resolved: dict[str, tuple[Any, str, int | None, int | None, Any, Any]] = {}

    def model_for(defn: Any) -> tuple[Any, str, int | None, int | None, Any, Any]:
        """(chat model, id, window, max output, retry policy, server revival) of a
        subagent's model."""
        spec = model_spec_for(defn, session.config)
        if spec is None or spec == main[1]:
            return main
        if spec not in resolved:
            try:
                r = resolve_model(spec, model_config=subagent_model_settings(defn.name))
            except ModelError as exc:
                raise SubagentError(
                    f"subagent {defn.name!r}: model {spec!r}: {str(exc).splitlines()[0]} "
                    f"(set [subagents] model, or [subagents.{defn.name}] model, in "
                    ".simagent/config.toml)", exc.code) from exc
            resolved[spec] = (r.chat_model, r.id, r.window, r.max_output, r.retry, r.reviver)
        return resolved[spec]

    def subagent_model_settings(name: str) -> dict[str, Any]:
        """``[subagents.<name>]`` minus ``model``: window, api_key_env ... for its model."""
        own = session.config.section("subagents").get(name, {})
        return {k: v for k, v in own.items() if k != "model"} if isinstance(own, dict) else {}

    def layers_for(defn: Any) -> tuple[list[Any], Any]:
        chat, mid, win, max_out, retry, revive = model_for(defn)
        fs_tools = ["read_file", *[t for t in defn.tools if t in FILE_TOOLS and
                                   t != "read_file"]]
        layers = context_layers(session, chat_model=chat, model_id=mid, window=win,
                                max_output=max_out, backend=backend, agent=defn.name,
                                settings=settings, fs_tools=fs_tools)
        return middleware_stack(session, layers, agent=defn.name, model_id=mid,
                                retry=retry, revive=revive), chat

    note = runtime_note(session.workspace, session.paths.outputs, session.simulator,
                        source_dirs)
    return build_specs(defs, tools=tools, layers_for=layers_for, prompt_suffix=note)


def _as_resolved(model: Any) -> tuple[Any, str, int | None]:
    if hasattr(model, "chat_model"):
        return model.chat_model, model.id, model.window
    profile = getattr(model, "profile", None) or {}
    name = getattr(model, "model_name", None) or type(model).__name__
    return model, str(name), profile.get("max_input_tokens")



def middleware_stack(session: Session, layers: Any, *, agent: str, model_id: str,
                     retry: Any, prompt: Sequence[Any] = (),
                     revive: Callable[[], str | None] | None = None,
                     check_numbers: str = "off") -> list[Any]:
    """simagent's middleware for one agent, outermost first; every agent gets this order.
    ``revive``: the model's ``ResolvedModel.reviver`` (a local server to bring back);
    ``check_numbers``: the main agent's ``[answers] check_numbers`` (:func:`numbers_mode`).

    ``prompt`` is what adds to the request before the context layers see it (the MCP
    schema deferral; the main agent's skills and memory indexes), so the recorder, near
    the inside, counts the request exactly as the model gets it.
    """
    return [
        AbandonGuard(session.turns),  # outermost: an abandoned run neither calls nor records
        *prompt,
        *layers.middleware,
        RecoveryMiddleware(session.trace, agent=agent),
        # the main agent's final answer: numbers no source shows are asked about once
        *([NumberCheckMiddleware(session.trace, check_numbers)] if agent == "main" else []),
        WorkspacePathsMiddleware(session.workspace),
        TraceRecorder(session.trace, session.usage, agent=agent, model_id=model_id,
                      turns=session.turns, ruler=layers.context.ruler,
                      window=layers.context.thresholds.window),
        # innermost: retries repeat exactly the request the layers above built
        ProviderRetryMiddleware(session.trace, agent=agent, policy=retry,
                                cancel=session.cancel_requested, revive=revive),
        ToolResultRedaction(),  # innermost for tools: no layer sees a secret in a result
    ]


def numbers_mode(session: Session, chat_model: Any) -> str:
    """``[answers] check_numbers`` for this model: the config's, else ``nudge``; a
    scripted model (the bench's replays, ``scripted:``) plays its steps in order and cannot
    answer a nudge, so for it the check is off unless the config sets it."""
    return session.config.check_numbers(
        default="off" if isinstance(chat_model, ScriptedChatModel) else "nudge")


def workspace_backend(session: Session, source_dirs: Sequence[Path],
                      open_files: OpenFiles | None = None) -> Any:
    """The file tools' backend: the workspace, with what they may read but not write
    (``open_files``: an editor's open buffers, read and written in place of the disk)."""
    # every bundled content folder (memory/ included: it seeds each workspace's index)
    read_only = [content_dir(n).resolve() for n in CONTENT_FOLDERS]
    notebook = confine.notebook_read_only(*session.notebook)  # --from-notebook's file
    return build_backend(session.workspace, session.paths.root,
                         read_only=[*read_only, *source_dirs, *notebook],
                         open_files=open_files)


def readable_outside(session: Session, source_dirs: Sequence[Path]) -> tuple[Path, ...]:
    """What the file tools read outside the workspace unasked (``approval.readable_roots``)."""
    sim = session.simulator
    return readable_roots(content=[content_dir(n) for n in CONTENT_FOLDERS],
                          source=[*source_dirs, *([sim.skills_dir] if sim else [])],
                          own=[session.paths.root, session.memory_dir],
                          allowed=session.config.files_readable())


def index_layers(session: Session, backend: Any) -> list[Any]:
    """The main agent's skills and memory indexes, skills first (see IndexedSkills...)."""
    memory_path = str((session.memory_dir / INDEX).resolve())
    return [IndexedSkillsMiddleware(backend=backend, sources=skill_sources(session),
                                    system_prompt=SKILLS_PROMPT),
            WorkspaceMemoryMiddleware(backend=backend, sources=[memory_path],
                                      system_prompt=MEMORY_PROMPT, add_cache_control=True)]


def general_purpose_spec(tools: list[Any], middleware: list[Any]) -> dict[str, Any]:
    return {
        "name": GENERAL_PURPOSE,
        "description": "A helper with the same tools and kernel, for a self-contained "
                       "multi-step task whose details should not fill your context; "
                       "it returns a short digest.",
        "system_prompt": GENERAL_PURPOSE_PROMPT,
        "tools": tools,
        "middleware": middleware,
    }


def callable_tool_names(tools: Sequence[Any], middleware: Sequence[Any],
                        subagents: Sequence[Any]) -> list[str]:
    """Every tool an agent can call, middleware's own included: an unclassified one waits
    for approval, so none may be missed."""
    return [t.name for t in tools] + [
        t.name for m in middleware for t in getattr(m, "tools", ())] + [
        getattr(t, "name", "") for spec in subagents if isinstance(spec, dict)
        for t in spec.get("tools") or ()]


def build_agent(session: Session, model: ResolvedModel | Any, *,
                middleware: Sequence[Any] = (), subagents: Sequence[Any] = (),
                extra_tools: Sequence[Any] = (),
                context_settings: ContextSettings | None = None,
                front_end: str = "tui", open_files: OpenFiles | None = None) -> BuiltAgent:
    """Build the session's agent for ``model`` (a ``ResolvedModel`` or a chat model).

    ``middleware`` goes outside simagent's own; ``subagents`` are deepagents ``SubAgent``
    specs added beside the general-purpose one; ``context_settings`` (default: the
    session's, from config) shapes the context layers — the bench's policies vary it;
    ``front_end`` (``tui`` | ``headless``) picks the REPL watchdog's mode when
    ``[context] repl_watchdog`` is unset (``thresholds.REPL_WATCHDOG_BY_FRONT_END``);
    ``open_files``: the editor's open buffers the file tools read and write
    (``backend.OpenFiles``; ``simagent acp`` with a client that offers them).
    """
    chat_model, model_id, window = _as_resolved(model)
    retry = getattr(model, "retry", None)  # [model] retry keys (a ResolvedModel's)
    revive = getattr(model, "reviver", None)  # a local server to bring back (its kind's)
    max_out = getattr(model, "max_output", None)
    sim = session.simulator
    source_dirs = sim.package_dirs() if sim else []
    backend = workspace_backend(session, source_dirs, open_files)
    prompt = build_system_prompt(sim, runtime_context(session, source_dirs))

    # view_figure knows whether this model can be sent images (a switch rebuilds the graph)
    images = image_support(chat_model)
    tools = [*session_tools(session, context_settings),
             make_view_figure(session, *images), *extra_tools]
    tools += plugin_tools(session, taken=[t.name for t in tools])  # register_tools hooks
    mcp = mcp_tooling(session, images)  # [mcp.servers.*]: their tools, held by the session
    tools += mcp.tools if mcp else []

    def stack(agent: str, **kw: Any) -> tuple[list[Any], Any]:
        """(middleware, context layers) of the main or the general-purpose agent."""
        layers = context_layers(session, chat_model=chat_model, model_id=model_id,
                                window=window, max_output=max_out, backend=backend,
                                agent=agent, settings=context_settings, **kw)
        deferral = mcp.middleware(  # MCP schemas behind find_tools
            agent=agent, window=layers.context.thresholds.window, ruler=layers.context.ruler,
            settings=layers.context.settings) if mcp else []
        indexes = index_layers(session, backend) if agent == "main" else []
        return middleware_stack(session, layers, agent=agent, model_id=model_id, retry=retry,
                                prompt=[*deferral, *indexes], revive=revive,
                                check_numbers=numbers_mode(session, chat_model)), layers

    own, layers = stack("main", front_end=front_end)
    general = general_purpose_spec(tools, stack(GENERAL_PURPOSE)[0])

    defined = build_defined_subagents(
        session, discover_subagents(sim), tools=tools, backend=backend,
        main=(chat_model, model_id, window, max_out, retry, revive), settings=context_settings,
        source_dirs=source_dirs)
    graph = create_deep_agent(
        model=chat_model, tools=tools, system_prompt=prompt,
        middleware=[*middleware, *own], subagents=[general, *defined, *subagents],
        backend=backend, checkpointer=session.checkpointer,
        interrupt_on=interrupt_on_for_mode(
            session.approval, session.workspace,
            callable_tool_names(tools, [*middleware, *own], subagents),
            readable_outside(session, source_dirs)) or None,
        name="simagent")
    return BuiltAgent(graph=graph, model_id=model_id, window=window, system_prompt=prompt,
                      backend=backend, tools=tools, context=layers.context,
                      stop_reply=getattr(model, "reply_stopper", None))
