"""Assembling the context layers for one agent (main or a subagent).

Stock parts are reused where they do the job: deepagents' ``FilesystemMiddleware`` evicts
a single large result (here rooted in the session directory through the backend's
``artifacts_root``, and traced); its stock summarization is switched off in place because
it sits outside the skills and memory middleware and so cannot see the whole request —
``ContextMiddleware`` does summarization, clearing, the budget check and emergencies on
the exact request instead, and ``ToolCapMiddleware`` caps each tool result right after
it. The guards (watchdog, cost ceiling) ride along.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deepagents.middleware._message_eviction import (
    _aoffload_tool_message_content,
    _extract_text_from_message,
    _offload_tool_message_content,
)
from deepagents.middleware.filesystem import FilesystemMiddleware
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import HumanMessage, ToolMessage

from simagent.agent.scripted import ScriptedChatModel
from simagent.agent.small_tier import SmallModelMiddleware, skill_names, small_prompt
from simagent.agent.tool_text import SlimToolsMiddleware
from simagent.context import thresholds as th
from simagent.context.capping import ToolCapMiddleware
from simagent.context.compaction import Compactor
from simagent.context.counting import count_messages
from simagent.context.guards import CostCeilingMiddleware, WatchdogMiddleware
from simagent.context.ledger import Ledger
from simagent.context.manual import make_mark_task_done
from simagent.context.middleware import ContextMiddleware
from simagent.context.repl_watch import ReplWatchMiddleware
from simagent.context.reporting import emit
from simagent.context.settings import ContextSettings
from simagent.context.summary import ExtractiveSummarizer, ModelSummarizer, Summarizer
from simagent.context.tokens import Ruler, resolve_ruler
from simagent.models import resolve_model
from simagent.paths import content_dir
from simagent.trace.usage import usage_record

if TYPE_CHECKING:
    from simagent.session import Session
    from simagent.trace.log import TraceLog


SUMMARIZER_AGENT = "summarizer"


class TracedFilesystemMiddleware(FilesystemMiddleware):
    """Stock eviction (same name, so it replaces the default in place), measured in real
    tokens, plus a trace event.

    deepagents decides by characters (4 per token), which lets a 20k-token limit pass
    ~40k real tokens of numeric output; here the limit is counted with the agent's ruler
    and deepagents' own offloading writes the file and the preview.
    """

    def __init__(self, *, trace: TraceLog | None, agent: str = "main",
                 ruler: Ruler | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._trace = trace
        self._agent = agent
        self._ruler = ruler or resolve_ruler(None)

    @property
    def name(self) -> str:
        return "FilesystemMiddleware"

    def _note(self, before: ToolMessage, after: ToolMessage) -> None:
        path = self._large_tool_results_prefix + "/" + before.tool_call_id
        for line in after.text.splitlines():
            if "saved in the filesystem at this path:" in line:
                path = line.rsplit(":", 1)[1].strip()
                break
        emit(self._trace, "context_eviction", {
            "tool_call_id": before.tool_call_id, "tool": before.name, "path": path,
            "chars": len(before.text),
            "tokens_before": count_messages([before], self._ruler),
            "tokens_after": count_messages([after], self._ruler), "agent": self._agent})

    def _evict_and_truncate_messages(self, request: Any) -> Any:
        out = super()._evict_and_truncate_messages(request)
        self._note_user(out)
        return out

    async def _aevict_and_truncate_messages(self, request: Any) -> Any:
        out = await super()._aevict_and_truncate_messages(request)
        self._note_user(out)
        return out

    def _note_user(self, out: Any) -> None:
        """deepagents saves a person's message over its limit to
        ``conversation_history/<uuid>.md`` and shows the model a preview. Moving a
        person's own words out of view is a context event like any other: traced (so
        ``simagent context`` lists it) and shown, naming the file that holds them."""
        command = out[1] if out else None
        if command is None:
            return
        shown = {m.id: m for m in out[0]}
        for msg in (command.update or {}).get("messages", []):
            path = getattr(msg, "additional_kwargs", {}).get("lc_evicted_to")
            if not isinstance(msg, HumanMessage) or not path:
                continue
            after = shown.get(msg.id, msg)
            emit(self._trace, "context_eviction", {
                "tool_call_id": None, "tool": None, "source": "user", "path": path,
                "chars": len(_extract_text_from_message(msg)),
                "tokens_before": count_messages([msg], self._ruler),
                "tokens_after": count_messages([after], self._ruler), "agent": self._agent})

    def _too_large(self, message: ToolMessage) -> str | None:
        """The text to offload when it is over the limit in real tokens, else None."""
        limit = self._tool_token_limit_before_evict
        if not limit:
            return None
        text = _extract_text_from_message(message)
        return text if self._ruler.count(text) > limit else None

    def _process_large_message(self, message: ToolMessage, resolved_backend: Any
                               ) -> tuple[ToolMessage, bool]:
        text = self._too_large(message)
        out = None if text is None else _offload_tool_message_content(
            message, text, resolved_backend, self._large_tool_results_prefix)
        if out is None:
            return message, False
        self._note(message, out)
        return out, True

    async def _aprocess_large_message(self, message: ToolMessage, resolved_backend: Any
                                      ) -> tuple[ToolMessage, bool]:
        text = self._too_large(message)
        out = None if text is None else await _aoffload_tool_message_content(
            message, text, resolved_backend, self._large_tool_results_prefix)
        if out is None:
            return message, False
        self._note(message, out)
        return out, True


class SummarizationOff(AgentMiddleware):
    """Takes the stock summarization's slot (by name) and does nothing."""

    @property
    def name(self) -> str:
        return "SummarizationMiddleware"


def build_summarizer(settings: ContextSettings, chat_model: Any, model_id: str,
                     session: Session | None = None) -> Summarizer:
    """``auto``: the agent's model (extractive for scripted/replay models, which cannot
    summarize); ``extractive``; or any model spec for a cheaper summarizer. Summary calls
    are traced as ``agent=summarizer`` so their tokens count in totals and ceilings."""
    choice = settings.summary_model
    if choice == "extractive":
        return ExtractiveSummarizer()
    on_usage = _usage_recorder(session) if session is not None else None
    if choice == "auto":
        if isinstance(chat_model, ScriptedChatModel):
            return ExtractiveSummarizer()
        return ModelSummarizer(chat_model, name=model_id, on_usage=on_usage)
    return ModelSummarizer(resolve_model(choice).chat_model, name=choice, on_usage=on_usage)


def _usage_recorder(session: Session) -> Any:
    def record(model: str, usage: dict[str, Any] | None) -> None:
        rec: dict[str, Any] = usage_record(usage)
        rec["source"] = "provider" if usage else "estimated"
        if session.turns.current_abandoned():
            rec["dropped"] = True
        session.usage.record(SUMMARIZER_AGENT, model, rec)
        session.trace.append("model_usage", {"agent": SUMMARIZER_AGENT, "model": model, **rec})
        session.turns.check()  # an abandoned turn's summary is paid, never applied

    return record


def skill_sources(session: Session) -> list[tuple[str, str]]:
    """The skill folders (path, label), shared first: the skills index and the small
    tier's skill names read the same list."""
    sources = [(str(content_dir("skills").resolve()), "Shared")]
    sim = session.simulator
    if sim is not None and sim.skills_dir.is_dir():
        sources.append((str(sim.skills_dir.resolve()), sim.display_name))
    return sources


def small_model_middleware(session: Session, thresholds: th.Thresholds,
                           settings: ContextSettings) -> SmallModelMiddleware:
    """The small model's prompt, tools and reply limit for this session
    (``agent/small_tier.py``); the limit never passes the output the budget reserves."""
    sources = [Path(path) for path, _label in skill_sources(session)]
    window = thresholds.window
    return SmallModelMiddleware(small_prompt(session.simulator, session.workspace,
                                             skill_names(sources)),
                                th.small_agent_tools(window),
                                force_call=settings.small_agent_force_call,
                                reply_tokens=th.reply_limit(window, small=True,
                                                            reserved=thresholds.max_output))


@dataclass
class ContextLayers:
    """The middleware list for ``create_deep_agent`` plus handles the UI needs."""

    middleware: list[Any]
    context: ContextMiddleware
    tools: list[Any] = field(default_factory=list)


def context_layers(session: Session, *, chat_model: Any, model_id: str, window: int | None,
                   max_output: int | None, backend: Any, agent: str = "main",
                   settings: ContextSettings | None = None,
                   fs_tools: list[str] | None = None, front_end: str = "tui") -> ContextLayers:
    """The context layers of one agent; ``fs_tools`` limits its file tools (None = stock).

    The main agent's layers end with its guards: the identical-call watchdog, the cost
    ceiling and the REPL watchdog, whose mode follows the tier and ``front_end`` when config
    leaves it unset (a TUI user can steer a large model; a small one and a headless run
    are stopped, not warned)."""
    settings = settings or session.context_settings
    suffix = "" if agent == "main" else f"-{agent}"
    history = session.paths.conversation_history / f"{session.id}{suffix}.md"
    compactor = Compactor(history, build_summarizer(settings, chat_model, model_id, session),
                          Ledger(session.paths.ledger, agent) if settings.ledger else None)
    tools = [make_mark_task_done()] if settings.checkpoints and agent == "main" else []
    context = ContextMiddleware(
        trace=session.trace, compactor=compactor, settings=settings, model_id=model_id,
        window=window, max_output=max_output, agent=agent, tools=tools,
        state_source=session.state_snapshot,
        task_records=session.paths.task_records if agent == "main" else None)
    fs = TracedFilesystemMiddleware(trace=session.trace, agent=agent, backend=backend,
                                    ruler=context.ruler,
                                    tool_token_limit_before_evict=context.thresholds.evict_tokens,
                                    tools=fs_tools)
    middleware: list[Any] = [fs, SummarizationOff()]
    if settings.slim_tools:  # outside the context layers: they measure what is sent
        middleware.append(SlimToolsMiddleware())
    small = agent == "main" and th.small_agent(model_id, settings)
    if small:
        middleware.append(small_model_middleware(session, context.thresholds, settings))
    middleware += [context, ToolCapMiddleware(settings, session.paths.large_tool_results,
                                              agent=agent)]
    if agent == "main":
        middleware += [WatchdogMiddleware(session.trace, settings, agent=agent),
                       CostCeilingMiddleware(session.trace, session.usage, settings),
                       ReplWatchMiddleware(session.trace, settings, front_end=front_end,
                                           small=small)]
    return ContextLayers(middleware=middleware, context=context, tools=tools)
