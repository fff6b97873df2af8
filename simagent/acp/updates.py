"""A turn's events as ACP ``session/update`` payloads, and the approval round trip's
shapes (pure: no IO but reading a file for a diff's old text or a figure's bytes).

One :class:`TurnUpdates` per prompt turn folds ``simagent.agent.events`` into the SDK's
update models, ready for ``conn.session_update(session_id, update)``. Every tool call is a
``tool_call`` (``pending`` when the model asks for it, ``in_progress`` when it starts), then
``tool_call_update``s: the running output's tail while it runs, and at the end
``completed`` or ``failed`` by its outcome (``simagent.outcomes``: a cell that raised is a
failure though the tool returned), with the text the model got, a ``diff`` for a file
write or edit, and each figure as an image block. ``write_todos`` is the ``plan``.
What the TUI shows as notice lines goes out as a line of the reply ("!" guards, harness
notices) or as a thought ("~" routine context management), in the same words
(``presentation.notices``).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acp import (
    image_block,
    plan_entry,
    start_tool_call,
    text_block,
    tool_content,
    tool_diff_content,
    update_agent_message_text,
    update_agent_thought_text,
    update_plan,
    update_tool_call,
)
from acp.helpers import update_current_mode
from acp.schema import (
    CurrentModeUpdate,
    PermissionOption,
    SessionMode,
    SessionModeState,
    ToolCallLocation,
    ToolCallUpdate,
)

from simagent.agent import confine
from simagent.agent.approval import MODE_HELP
from simagent.agent.events import (
    ContextEvent,
    Event,
    Interrupt,
    Notice,
    ReasoningDelta,
    Retrying,
    TextDelta,
    ToolFinished,
    ToolOutput,
    ToolRequested,
    ToolStarted,
    TurnResult,
)
from simagent.config import APPROVAL_MODES
from simagent.kernel.terminal import TerminalBuffer
from simagent.kernel_api.figures import parse_captions
from simagent.outcomes import outcome_of
from simagent.presentation.footnotes import final_numbers
from simagent.presentation.notices import GUARD_NOTICES, context_line, one_line
from simagent.presentation.previews import DIFF_TOOLS, action_preview, edited, file_now
from simagent.tool_names import RESET_KERNEL, RUN_PYTHON, TASK, VIEW_FIGURE, WRITE_TODOS
from simagent.trace.redact import redact

#: ACP tool kind of each of simagent's and deepagents' tools; any other tool (an MCP
#: server's, a plugin's) is ``other``.
TOOL_KINDS: dict[str, str] = {
    RUN_PYTHON: "execute", RESET_KERNEL: "execute", "execute": "execute",
    "read_file": "read", "ls": "read", VIEW_FIGURE: "read",
    "glob": "search", "grep": "search", "recall": "search", "find_tools": "search",
    "write_file": "edit", "edit_file": "edit", "delete": "delete",
    TASK: "think", WRITE_TODOS: "think",
}
#: How often a running call's output is sent again (seconds), and how much of its tail.
OUTPUT_EVERY_S = 0.3
OUTPUT_TAIL_ROWS = 40
OUTPUT_TAIL_CHARS = 4_000
#: Figures sent as images per call, and the largest file sent (bytes): the caption and
#: summary text name every figure either way.
MAX_IMAGES = 4
MAX_IMAGE_BYTES = 4 << 20
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}

Update = Any  # one of acp.helpers.SessionUpdate's models


def tool_kind(name: str) -> str:
    """The ACP ``ToolKind`` of tool ``name`` (read/edit/delete/search/execute/think/other)."""
    return TOOL_KINDS.get(name, "other")


def title(name: str, args: dict[str, Any], agent: str = "main") -> str:
    """A card's one-line title: ``run_python: import numpy as np``, ``task → explorer:
    find the solver``; a subagent's own calls carry its name in brackets."""
    who = f"[{agent}] " if agent and agent != "main" else ""
    if name == TASK:
        what = str(args.get("description") or "").split("\n")[0][:80]
        return f"{who}task → {args.get('subagent_type') or 'subagent'}: {what}".rstrip(": ")
    if name in confine.PATH_ARGS:  # the file, and what a search looks for
        where = str(args.get(confine.PATH_ARGS[name]) or "")
        pattern = args.get("pattern")
        what = f"{pattern!r} in {where}" if pattern and where else repr(pattern) if pattern \
            else where
        what = redact(what)
        return f"{who}{name} {what if len(what) <= 80 else what[:79] + '…'}".rstrip()
    summary = one_line(args, width=80)
    return f"{who}{name}: {summary}" if summary else f"{who}{name}"


def _target(name: str, args: dict[str, Any], workspace: Path) -> Path | None:
    """The real path a file tool touches (``confine``: where the act lands), or None."""
    try:
        if name in confine.WRITE_TOOLS:
            key, follow = confine.WRITE_TOOLS[name]
            return confine.resolve(str(args.get(key) or ""), workspace, follow_last=follow)
        if name in confine.READ_TOOLS:
            return confine.read_target(name, args, workspace)
    except (OSError, ValueError):
        return None
    return None


def locations(name: str, args: dict[str, Any], workspace: Path) -> list[ToolCallLocation]:
    """The file a file tool reads or changes (absolute; ``read_file``'s first line when it
    pages from an offset)."""
    target = _target(name, args, workspace)
    if target is None:
        return []
    line = None
    if name == "read_file" and isinstance(args.get("offset"), int) and args["offset"] > 0:
        line = args["offset"] + 1  # deepagents' offset counts lines from 0
    return [ToolCallLocation(path=str(target), line=line)]


def _diff(name: str, args: dict[str, Any], before: str | None,
          workspace: Path) -> list[Any]:
    """A ``diff`` content item for a write or edit: the file before → after."""
    if name not in DIFF_TOOLS or (target := _target(name, args, workspace)) is None:
        return []
    after = edited(name, args, before)
    if after is None:
        return []
    return [tool_diff_content(str(target), after, before)]


def figure_blocks(content: str, workspace: Path) -> list[Any]:
    """Each figure a result names (``[figure fig-… WxH: path]``) as an image block, read
    from the file the kernel saved; the caption and summary stay in the text."""
    blocks: list[Any] = []
    for fig in parse_captions(content):
        path = Path(fig["path"])
        path = path if path.is_absolute() else workspace / path
        mime = IMAGE_TYPES.get(path.suffix.lower())
        if mime is None or len(blocks) >= MAX_IMAGES:
            continue
        try:
            if path.stat().st_size > MAX_IMAGE_BYTES:
                continue
            data = path.read_bytes()
        except OSError:  # not saved (the disk refused it) or gone: the text still says so
            continue
        blocks.append(tool_content(image_block(base64.b64encode(data).decode("ascii"), mime,
                                               uri=path.as_uri())))
    return blocks


def plan_update(args: dict[str, Any]) -> Update | None:
    todos = args.get("todos")
    if not isinstance(todos, list):
        return None
    entries = []
    for todo in todos:
        if not isinstance(todo, dict):
            continue
        status = todo.get("status")
        entries.append(plan_entry(str(todo.get("content") or ""),
                                  status=status if status in ("pending", "in_progress",
                                                              "completed") else "pending"))
    return update_plan(entries)


@dataclass
class _Call:
    name: str
    args: dict[str, Any]
    agent: str
    before: str | None = None  # a write/edit's file text before it ran
    out: TerminalBuffer = field(default_factory=lambda: TerminalBuffer(
        max_chars=OUTPUT_TAIL_CHARS * 4, max_rows=OUTPUT_TAIL_ROWS * 4))
    err: TerminalBuffer = field(default_factory=lambda: TerminalBuffer(
        max_chars=OUTPUT_TAIL_CHARS * 4, max_rows=OUTPUT_TAIL_ROWS * 4))
    sent_at: float | None = None
    unsent: bool = False  # output came since the last send
    started: bool = False
    finished: bool = False

    def tail(self) -> str:
        out = self.out.render(max_rows=OUTPUT_TAIL_ROWS).rstrip("\n")
        err = self.err.render(max_rows=OUTPUT_TAIL_ROWS).rstrip("\n")
        text = "\n".join(part for part in (out, err) if part.strip())
        return text[-OUTPUT_TAIL_CHARS:]


class TurnUpdates:
    """One prompt turn's events → ACP updates (see the module doc). ``clock`` paces the
    running-output updates (a test seam)."""

    def __init__(self, workspace: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.workspace = Path(workspace)
        self.clock = clock
        self.calls: dict[str, _Call] = {}
        self._muted: set[str] = set()
        self._speaker = "main"  # whose text or thought went out last
        self._ends_line = True  # the reply so far ends a line (a notice starts its own)

    # ------------------------------------------------------------------ API
    def on_event(self, event: Event) -> list[Update]:
        if isinstance(event, ReasoningDelta):
            return [update_agent_thought_text(self._labelled(event.agent, event.text))]
        if isinstance(event, TextDelta):
            if event.agent != "main":  # a subagent's words: the main reply stays clean
                return [update_agent_thought_text(self._labelled(event.agent, event.text))]
            self._speaker = "main"
            self._ends_line = event.text.endswith("\n")
            return [update_agent_message_text(event.text)] if event.text else []
        if isinstance(event, ToolRequested | ToolStarted):
            return self._tool_start(event)
        if isinstance(event, ToolOutput):
            return self._tool_output(event)
        if isinstance(event, ToolFinished):
            return self._tool_end(event)
        if isinstance(event, ContextEvent):
            if event.kind in GUARD_NOTICES:
                self._muted.add(GUARD_NOTICES[event.kind])
            line = context_line(event)
            if not line:
                return []
            return [self._line(line)] if line.startswith("!") else [
                update_agent_thought_text(line + "\n")]
        if isinstance(event, Notice):
            if any(event.text.startswith(p) for p in self._muted):
                return []
            return [self._line(event.text)]
        if isinstance(event, Retrying):
            taken = (" (the text the failed attempt streamed is repeated by the retry)"
                     if event.discarded else "")
            return [update_agent_thought_text(f"{event.label()}: {event.reason}{taken}\n")]
        if isinstance(event, Interrupt):
            return []  # the runtime asks with session/request_permission
        return []

    def pending_id(self, name: str, args: dict[str, Any]) -> str | None:
        """The id of the announced, not yet started call of ``name`` with ``args``: an
        approval's action request carries no call id."""
        for call_id, call in reversed(self.calls.items()):
            if call.name == name and call.args == args and not call.started:
                return call_id
        return None

    def decided(self, call_id: str, decision: dict[str, Any]) -> list[Update]:
        """The card of a call the person rejected ends now (``failed``): the graph answers
        a rejection itself, with no tool run and no event; an approved call goes on to
        its ``ToolStarted``."""
        call = self.calls.get(call_id)
        if call is None or call.finished or decision.get("type") != "reject":
            return []
        call.finished = True
        return [update_tool_call(call_id, status="failed", content=[tool_content(text_block(
            "rejected: not run"))], raw_output={"outcome": "rejected"})]

    def flush(self) -> list[Update]:
        """The running output not sent yet because it came too soon after the last send:
        the runtime calls this now and then (every :data:`OUTPUT_EVERY_S` or so) while a
        turn runs, so a cell that prints and then computes quietly shows its last line."""
        now = self.clock()
        found = []
        for call_id, call in self.calls.items():
            if call.unsent and not call.finished and (
                    call.sent_at is None or now - call.sent_at >= OUTPUT_EVERY_S):
                found += self._send_tail(call_id, call, now)
        return found

    def open_ids(self) -> list[str]:
        """Calls announced and not finished (the runtime closes them when a turn ends)."""
        return [i for i, c in self.calls.items() if not c.finished]

    # ------------------------------------------------------------ internals
    def _labelled(self, agent: str, text: str) -> str:
        if agent == self._speaker:
            return text
        self._speaker = agent
        return f"\n[{agent}] {text}" if agent != "main" else f"\n{text}"

    def _line(self, text: str) -> Update:
        """A notice as its own line of the reply, set apart from the streamed text."""
        lead = "" if self._ends_line else "\n\n"
        self._ends_line = True
        return update_agent_message_text(f"{lead}> {text}\n\n")

    def _tool_start(self, event: ToolRequested | ToolStarted) -> list[Update]:
        started = isinstance(event, ToolStarted)
        call = self.calls.get(event.id)
        if call is not None and call.finished:
            call = None  # a provider reused an ended call's id: a new card
        args = dict(event.args) or (call.args if call else {})
        if event.name == WRITE_TODOS:
            first = call is None
            self.calls[event.id] = call or _Call(event.name, args, event.agent)
            self.calls[event.id].started |= started
            plan = plan_update(args) if first else None
            return [plan] if plan is not None else []
        if event.name in DIFF_TOOLS and (call is None or started):
            before = file_now(event.name, args, self.workspace)  # before the tool writes
        else:
            before = call.before if call else None
        status = "in_progress" if started else "pending"
        if call is None:
            call = self.calls[event.id] = _Call(event.name, args, event.agent, before)
            call.started = started
            return [start_tool_call(
                event.id, title(event.name, args, event.agent), kind=tool_kind(event.name),
                status=status,
                locations=locations(event.name, args, self.workspace) or None, raw_input=args,
                content=_diff(event.name, args, before, self.workspace) or None)]
        call.args, call.before, call.started = args, before, call.started or started
        if event.agent != "main":
            call.agent = event.agent  # a subagent's start names it; its request says "subagent"
        return [update_tool_call(event.id, status=status,
                                 title=title(event.name, args, call.agent),
                                 raw_input=args)] if started else []

    def _tool_output(self, event: ToolOutput) -> list[Update]:
        if event.kind == "human":  # for the person only (a dashboard link)
            return [self._line(event.text.strip())]
        call = self.calls.get(event.id)
        if call is None or call.finished:
            return []
        if event.kind == "clear":
            call.out.clear()
            call.err.clear()
        elif event.kind == "stderr":
            call.err.feed(event.text)
        elif event.kind in ("stdout", "error"):
            call.out.feed(event.text)
        elif event.kind == "display" and event.text:
            call.out.feed(f"[display] {event.text.strip()}\n")
        call.unsent = True
        now = self.clock()
        if call.sent_at is not None and now - call.sent_at < OUTPUT_EVERY_S:
            return []  # the next output, flush() or the result carries it
        return self._send_tail(event.id, call, now)

    @staticmethod
    def _send_tail(call_id: str, call: _Call, now: float) -> list[Update]:
        call.sent_at, call.unsent = now, False
        tail = call.tail()
        if not tail:
            return []
        return [update_tool_call(call_id, status="in_progress",
                                 content=[tool_content(text_block(tail))])]

    def _tool_end(self, event: ToolFinished) -> list[Update]:
        call = self.calls.get(event.id)
        fresh = call is None or call.finished
        if fresh:
            call = self.calls[event.id] = _Call(event.name, {}, event.agent)
        assert call is not None
        call.finished = True
        if event.name == WRITE_TODOS and not fresh:
            return []  # shown as the plan
        outcome = event.outcome or outcome_of(event.status)
        status = "completed" if outcome == "ok" else "failed"
        content = []
        if outcome == "ok":
            content += _diff(call.name, call.args, call.before, self.workspace)
        content.append(tool_content(text_block(event.content)))
        content += figure_blocks(event.content, self.workspace)
        raw_output = {"outcome": outcome, "elapsed_s": round(event.elapsed_s, 3)}
        if event.raw_path:
            raw_output["raw_path"] = event.raw_path
        if event.recovery:
            raw_output["recovery"] = event.recovery
        if fresh:
            return [start_tool_call(
                event.id, title(event.name, {}, event.agent), kind=tool_kind(event.name),
                status=status, content=content, raw_output=raw_output)]
        return [update_tool_call(event.id, status=status, content=content,
                                 raw_output=raw_output)]


# ------------------------------------------------------------------ approval
ALLOW_ONCE, ALLOW_ALWAYS, REJECT_ONCE = "allow_once", "allow_always", "reject_once"
PERMISSION_OPTIONS = (
    PermissionOption(option_id=ALLOW_ONCE, name="Allow", kind="allow_once"),
    PermissionOption(option_id=ALLOW_ALWAYS, name="Always allow (this session)",
                     kind="allow_always"),
    PermissionOption(option_id=REJECT_ONCE, name="Reject", kind="reject_once"),
)


def permission_request(action_request: dict[str, Any], tool_call_id: str, workspace: Path
                       ) -> tuple[ToolCallUpdate, list[PermissionOption]]:
    """What ``session/request_permission`` sends for one waiting call: the call as it
    would run (the whole cell, the command, a diff of the file change, with the line
    naming the real file and why it waits) and the three choices."""
    name = str(action_request.get("name") or "?")
    args = dict(action_request.get("args") or {})
    workspace = Path(workspace)
    current = file_now(name, args, workspace)
    preview = action_preview(name, args, current)
    note = confine.prompt_line(action_request)
    content: list[Any] = _diff(name, args, current, workspace)
    text = note if content else f"{note}\n\n{preview}" if note else preview  # a diff says it
    if text:
        content.append(tool_content(text_block(text)))
    update = ToolCallUpdate(tool_call_id=tool_call_id, title=title(name, args),
                            kind=tool_kind(name), status="pending", content=content,
                            locations=locations(name, args, workspace) or None,
                            raw_input=args)
    return update, list(PERMISSION_OPTIONS)


def decision_of(option_id: str | None) -> tuple[dict[str, Any], bool]:
    """The graph's decision for the option picked, and whether it holds for the rest of
    the session. No option (the prompt was cancelled) or an unknown one rejects."""
    if option_id == ALLOW_ONCE:
        return {"type": "approve"}, False
    if option_id == ALLOW_ALWAYS:
        return {"type": "approve"}, True
    return {"type": "reject"}, False


# --------------------------------------------------------------------- modes
MODES: list[SessionMode] = [SessionMode(id=mode, name=mode.capitalize(),
                                        description=MODE_HELP[mode])
                            for mode in APPROVAL_MODES]


def mode_state(current: str) -> SessionModeState:
    """The session's modes for ``session/new`` and ``session/load``: simagent's approval
    modes, ``current`` the one in force."""
    return SessionModeState(current_mode_id=current, available_modes=list(MODES))


def mode_update(mode: str) -> CurrentModeUpdate:
    return update_current_mode(mode)


# ---------------------------------------------------------------------- meta
def turn_meta(session: Any, result: TurnResult, agent: Any = None) -> dict[str, Any]:
    """``{"simagent": {...}}`` for a prompt response's ``_meta``: this turn's tokens, the
    session's cost and context share as the TUI's status bar shows them (the same
    ``stats_from_trace`` and ``status_label``), and the final answer's ``numbers``
    (``[{text, value, status, source}]``, as ``run --json`` writes them). ``agent``: the
    runner's ``BuiltAgent`` (its model and window); without it the trace's are used."""
    from simagent.context.panel import status_label, whole_percent  # langchain: after the turn
    from simagent.context.stats import stats_from_trace  # as above

    model_id = getattr(agent, "model_id", None)
    stats = stats_from_trace(session.paths.trace, session.context_settings,
                             model_id=model_id, window=getattr(agent, "window", None))
    usage = result.usage
    return {"simagent": {
        "cost_usd": stats.cost_usd,
        "input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
        "cache_read": usage.cache_read,
        "ctx_pct": whole_percent(stats) if stats.window_known else None,
        "ctx_label": status_label(stats)[0],
        "window": stats.window if stats.window_known else None,
        "numbers": final_numbers(session.trace.events(), result),
    }}
