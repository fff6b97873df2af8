"""The sessions of ``simagent acp`` and their turns: the agent stack behind the protocol.

One simagent session per ACP session, with the same graph, context layers, trace and
approval as ``simagent run`` (the runner comes from ``agent.turn_setup.turn_runner_for``).
What is ACP here is only the mapping: the ACP session id *is* the simagent session id, so
``session/load`` after a restart finds the session on disk (the state home's folder for
``cwd``); a turn runs the synchronous ``TurnRunner`` on a worker thread and its events
cross into the event loop in order (one queue, one sender: the prompt's own coroutine);
an approval pause becomes ``session/request_permission`` and the turn resumes with the
answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import acp
from acp import RequestError
from acp.schema import (
    AllowedOutcome,
    AvailableCommandsUpdate,
    LoadSessionResponse,
    NewSessionResponse,
    PromptResponse,
    SessionModeState,
    SetSessionModeResponse,
)

from simagent.acp import commands, history, updates
from simagent.acp.agent import AcpOptions, in_thread, say
from simagent.acp.client_files import ClientFiles, offered
from simagent.acp.content import client_servers, prompt_text, said_to_person
from simagent.agent.events import Event, Notice, TurnResult
from simagent.agent.mcp_hubs import open_notices
from simagent.agent.turn_setup import agent_for, turn_runner_for
from simagent.config import APPROVAL_MODES, Config, ConfigError, SessionOptions
from simagent.kernel import KernelStartError
from simagent.kernel.connection import KERNEL_META
from simagent.models import ModelError, resolve_model
from simagent.session import Session, SessionNotFound
from simagent.simulators import SimulatorError

OWN_KERNEL = "no notebook kernel named; simagent started its own."
#: How long closing waits for a running turn to stop after its cancel (the kernel's own
#: interrupt ladder is bounded by its grace period; this bounds the rest), and after a
#: signal: JupyterLab sends SIGINT and SIGTERM when its chat closes and SIGKILL 5 s later.
CLOSE_WAIT_S = 30.0
SIGNAL_WAIT_S = 2.5
FRONT_END = "acp"


@dataclass
class Live:
    """One ACP session's state in this process."""

    session: Any
    runner: Any
    resolved: Any
    #: tool names the person allowed "always" (for this session, this process)
    always: set[str] = field(default_factory=set)
    busy: bool = False
    cancelled: bool = False
    prompts: int = 0
    kernel_named: bool = False  # a kernel was given (flag, config, meta): attach to it
    worker: threading.Thread | None = None
    #: lines for the person, said before the next reply (an ignored config, MCP servers
    #: that did not start or cannot be used)
    tell: list[str] = field(default_factory=list)
    #: the client's file system as the file tools' open buffers (None: not offered)
    open_files: ClientFiles | None = None


def _forget_kernel(session: Any) -> None:
    """Drop a kernel that did not start, so the next start builds one for the kernel
    named then (a kernel object keeps the one it was made for)."""
    kernel = session.detach_kernel()
    if kernel is not None:  # it runs after all: keep it
        session.adopt_kernel(kernel)


class Host:
    """The sessions of one ``simagent acp`` process and their turns (``SimagentAgent``
    hands every session method here once the agent stack has loaded)."""

    def __init__(self, opts: AcpOptions, conn: Any, *, capabilities: Any = None) -> None:
        self.opts = opts
        self.conn = conn
        #: the client's ``initialize`` capabilities (``fs``: ``client_files``)
        self.capabilities = capabilities
        self.loop: asyncio.AbstractEventLoop | None = None  # the connection's
        self.live: dict[str, Live] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._gone = False

    async def new_session(self, cwd: str, additional_directories: list[str] | None = None,
                          mcp_servers: list[Any] | None = None, **kw: Any
                          ) -> NewSessionResponse:
        self.loop = asyncio.get_running_loop()
        live = await in_thread(functools.partial(
            self._open, cwd, None, mcp_servers, kw.get(KERNEL_META)))
        self.live[live.session.id] = live
        self._later(self._advertise(live.session.id))
        return NewSessionResponse(session_id=live.session.id, modes=self._modes(live))

    async def load_session(self, cwd: str, session_id: str,
                           mcp_servers: list[Any] | None = None,
                           additional_directories: list[str] | None = None, **kw: Any
                           ) -> LoadSessionResponse:
        if (live := self.live.get(session_id)) is not None and live.busy:
            raise RequestError(-32600, f"session {session_id} is running a prompt here")
        if live is None:
            self.loop = asyncio.get_running_loop()
            live = await in_thread(functools.partial(
                self._open, cwd, session_id, mcp_servers, kw.get(KERNEL_META)))
            self.live[live.session.id] = live
        messages = await in_thread(lambda: live.runner.agent.graph.get_state(
            live.session.thread_config).values.get("messages", []))
        for update in history.replay_updates(messages, live.session.workspace):
            await self._send(session_id, update)
        self._later(self._advertise(session_id))
        return LoadSessionResponse(modes=self._modes(live))

    async def set_session_mode(self, session_id: str, mode_id: str, **kw: Any
                               ) -> SetSessionModeResponse:
        live = self._get(session_id)
        if mode_id not in APPROVAL_MODES:
            raise RequestError(-32602, f"unknown mode {mode_id!r}; one of "
                                       f"{', '.join(APPROVAL_MODES)}")
        if live.busy:
            raise RequestError(-32600, "the approval mode changes between prompts, not "
                                       "while one runs")
        await in_thread(functools.partial(self.set_approval, live, mode_id))
        await self._send(session_id, updates.mode_update(mode_id))
        return SetSessionModeResponse()

    def set_approval(self, live: Live, mode: str) -> None:
        """Rebuild the graph for ``mode`` (approval is wired into it); the old mode stays
        if the rebuild fails, so no client is told of a mode that is not enforced."""
        old = live.session.approval
        live.session.approval = mode
        try:
            live.runner.switch_agent(agent_for(live.session, live.resolved,
                                               front_end=FRONT_END,
                                               open_files=live.open_files))
        except Exception:
            live.session.approval = old
            raise

    # ---------------------------------------------------------------- turns
    async def prompt(self, session_id: str, prompt: list[Any], **kw: Any) -> PromptResponse:
        live = self._get(session_id)
        if live.busy:
            raise RequestError(-32600, "a prompt is already running in this session: wait "
                                       "for its answer, or send session/cancel")
        live.busy, live.cancelled = True, False
        live.prompts += 1
        try:
            return await self._prompt(live, prompt, kw)
        finally:
            live.busy = False

    async def _prompt(self, live: Live, blocks: list[Any], kw: dict[str, Any]
                      ) -> PromptResponse:
        sid = live.session.id
        text, notes = prompt_text(blocks, live.session.paths.root / "attachments")
        for note in notes:
            say(f"session {sid}: {note}")
            live.session.trace.append("prompt_note", {"note": note})
        told, live.tell = live.tell, []
        for line in told + said_to_person(blocks):
            await self._say(sid, line + "\n\n")
        if (cmd := commands.parse(text)) is not None:
            mode = live.session.approval
            reply = await in_thread(functools.partial(
                commands.serve, cmd[0], cmd[1], self._command_ctx(live)))
            await self._say(sid, reply)
            if live.session.approval != mode:  # /approval MODE: the client's picker too
                await self._send(sid, updates.mode_update(live.session.approval))
            return PromptResponse(stop_reason="end_turn")
        if not text.strip():
            await self._say(sid, "(an empty prompt: nothing to do)")
            return PromptResponse(stop_reason="end_turn")
        if (problem := await self._kernel_for(live, kw.get(KERNEL_META))) is not None:
            await self._say(sid, problem)
            return PromptResponse(stop_reason="end_turn")
        turn = updates.TurnUpdates(live.session.workspace)
        leftover = await in_thread(live.runner.pending_interrupts)
        result = TurnResult(status="cancelled")  # what a cancel before the turn leaves
        if leftover:  # asked in a turn that was cancelled: the new prompt moves on
            decisions = {p.interrupt_id: [{"type": "reject"} for _ in p.action_requests]
                         for p in leftover}
            result = await self._drive(live, turn, functools.partial(
                live.runner.resume, decisions, pending=leftover))
        if not live.cancelled:
            result = await self._drive(live, turn, functools.partial(live.runner.run, text))
        while result.status == "paused" and not live.cancelled:
            decisions = {}
            for intr in result.interrupts:
                decisions[intr.interrupt_id] = [await self._ask(live, turn, req)
                                                for req in intr.action_requests]
            if live.cancelled:
                break
            result = await self._drive(live, turn, functools.partial(
                live.runner.resume, decisions, pending=result.interrupts))
        for call_id in turn.open_ids():  # asked and never run (cancelled, or paused)
            await self._send(sid, acp.update_tool_call(call_id, status="failed"))
        meta = await in_thread(functools.partial(updates.turn_meta, live.session, result,
                                                 live.runner.agent))
        return self._response(live, result, meta)

    def _response(self, live: Live, result: TurnResult, meta: dict[str, Any]
                  ) -> PromptResponse:
        if live.cancelled or result.status in ("cancelled", "paused"):
            reason = "cancelled"
        elif result.cost_ceiling is not None:
            reason = "refusal"
        elif (result.error or "").startswith("GraphRecursionError"):
            reason = "max_turn_requests"  # the graph's step limit ended the turn
        else:
            reason = "end_turn"
        return PromptResponse(stop_reason=reason, field_meta=meta)

    async def _drive(self, live: Live, turn: Any, step: Callable[..., TurnResult]
                     ) -> TurnResult:
        """One runner step (run or resume) on a worker thread, its events sent in order.

        An error of the provider or the kernel is one agent message and the end of the
        turn (the runner already turns both into an error result and a ``Notice``)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        done = object()

        def emit(event: Event) -> None:  # the worker thread
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(queue.put_nowait, event)

        def work() -> TurnResult:
            try:
                return step(emit)
            finally:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(queue.put_nowait, done)

        fut = in_thread(work)
        live.worker = fut.thread  # type: ignore[attr-defined]
        sid = live.session.id
        while True:
            try:  # now and then, the running output the pace held back
                event = await asyncio.wait_for(queue.get(), updates.OUTPUT_EVERY_S)
            except TimeoutError:
                for update in turn.flush():
                    await self._send(sid, update)
                continue
            if event is done:
                break
            for update in turn.on_event(event):
                await self._send(sid, update)
        try:
            result: TurnResult = await fut
        except Exception as exc:  # a bug below the runner: said, not a hung client
            say(f"session {sid}: turn failed: {type(exc).__name__}: {exc}")
            result = TurnResult(status="error", error=f"{type(exc).__name__}: {exc}")
            for update in turn.on_event(Notice(f"simagent: error: {result.error}",
                                               level="error")):
                await self._send(sid, update)
        return result

    async def _ask(self, live: Live, turn: Any, request: dict[str, Any]) -> dict[str, Any]:
        """The person's decision on one waiting call, by ``session/request_permission``
        (or at once, for a tool they allowed always in this session)."""
        name = str(request.get("name", ""))
        if name in live.always:
            return {"type": "approve"}
        args = dict(request.get("args") or {})
        call_id = turn.pending_id(name, args) or f"approval-{name}-{len(turn.calls)}"
        tool_call, options = updates.permission_request(request, call_id,
                                                        live.session.workspace)
        decision: dict[str, Any] = {"type": "reject"}
        try:
            answer = await self.conn.request_permission(session_id=live.session.id,
                                                        tool_call=tool_call, options=options)
        except Exception as exc:  # the client went away or refused the request
            say(f"session {live.session.id}: permission request failed: {exc}")
            live.cancelled = True
        else:
            if isinstance(answer.outcome, AllowedOutcome):
                decision, always = updates.decision_of(answer.outcome.option_id)
                if always:
                    live.always.add(name)
            else:
                live.cancelled = True  # the client cancelled the prompt while it asked
        for update in turn.decided(call_id, decision):  # a rejected card ends now
            await self._send(live.session.id, update)
        return decision

    async def cancel(self, session_id: str, **kw: Any) -> None:
        live = self.live.get(session_id)
        if live is None or not live.busy:
            return
        live.cancelled = True
        live.runner.cancel()

    # --------------------------------------------------------------- kernel
    async def _kernel_for(self, live: Live, named: str | None) -> str | None:
        """Start the session's kernel at its first prompt (attaching to the one named,
        if any); a line for the person when it cannot start, else None."""
        session = live.session
        before = session.kernel_existing, live.kernel_named
        if named and named != session.kernel_existing:
            if session.kernel_state not in ("stopped",):
                say(f"session {session.id}: kernel {named!r} named, but the session's "
                    "kernel already runs; it stays")
            else:
                session.kernel_existing = named
                live.kernel_named = True
        if session.kernel_state not in ("stopped", "dead"):
            return None
        try:
            await in_thread(session.start_kernel)
        except KernelStartError as exc:  # the next prompt tries again (or its own kernel)
            session.kernel_existing, live.kernel_named = before
            await in_thread(functools.partial(_forget_kernel, session))
            return f"simagent: the kernel did not start: {str(exc).splitlines()[0]}"
        if not live.kernel_named:
            await self._say(session.id, OWN_KERNEL + "\n\n")
        return None

    # -------------------------------------------------------------- helpers
    def _open(self, cwd: str, session_id: str | None, mcp_servers: list[Any] | None,
              kernel: str | None) -> Live:
        """Resolve the model for ``cwd`` and open (or resume) the session, as
        ``simagent run`` does; every problem one ``RequestError`` line."""
        workspace = Path(cwd).expanduser()
        if not workspace.is_absolute() or not workspace.is_dir():
            raise RequestError(-32602, f"cwd must be an existing absolute folder: {cwd}")
        named = kernel or self.opts.kernel
        try:
            config = Config.load(workspace, trust=self.opts.trust_workspace)
            if config.ignored_line:
                say(config.ignored_line)
            spec, _where = config.model_spec(self.opts.model)
            if not spec:
                raise RequestError(-32602, config.missing_model_line())
            resolved = resolve_model(spec, model_config=config.model_settings,
                                     settings_at=functools.partial(config.where, "model"),
                                     progress=say)
            resolved.prepare_workspace(workspace)
            opts = SessionOptions(workspace=workspace, model=self.opts.model,
                                  approval=self.opts.approval, kernel=named,
                                  resume=session_id,
                                  trust_workspace=self.opts.trust_workspace)
            session = Session.open(opts, model=resolved.id, config=config,
                                   default_simulator=resolved.default_simulator)
        except (ModelError, ConfigError, SimulatorError) as exc:
            raise RequestError(-32602, str(exc).splitlines()[0]) from exc
        except SessionNotFound as exc:
            raise RequestError(-32602, f"no simagent session {session_id} under "
                                       f"{workspace}: {exc}") from exc
        try:
            extra, skipped = client_servers(mcp_servers, set(session.mcp_servers))
            for line in skipped:
                say(line)
            session.mcp_servers = {**session.mcp_servers, **extra}
            open_files = self._client_files(session)
            runner = turn_runner_for(session, resolved, front_end=FRONT_END,
                                     open_files=open_files)
        except Exception as exc:
            session.close("error") if session_id else session.discard()
            raise RequestError(-32603, f"cannot build the agent: {exc}".splitlines()[0]
                               ) from exc
        # what simagent run prints on stderr at the start, the person in a chat reads
        tell = [config.ignored_line] if config.ignored_line else []
        tell += skipped + [f"! {line}" for line in open_notices(session)]
        return Live(session=session, runner=runner, resolved=resolved,
                    kernel_named=bool(session.kernel_existing), tell=tell,
                    open_files=open_files)

    def _client_files(self, session: Any) -> ClientFiles | None:
        """The client's file system for ``session``'s file tools, when ``initialize``
        offered it (``client_files``); each fallback to the disk goes to the trace."""
        read, write = offered(self.capabilities)
        if not (read or write) or self.conn is None or self.loop is None:
            return None

        def note(payload: dict[str, Any]) -> None:
            then = ("the disk was used" if payload["then"] == "disk"
                    else "nothing was written")
            say(f"session {session.id}: the client's fs/{payload['op']}_text_file of "
                f"{payload['path']} failed ({payload['reason']}); {then}")
            session.trace.append("client_files", payload)

        return ClientFiles(self.conn, self.loop, session.id, read=read, write=write,
                           note=note)

    def _get(self, session_id: str) -> Live:
        live = self.live.get(session_id)
        if live is None:
            raise RequestError(-32602, f"unknown session {session_id!r}: open it with "
                                       "session/new or session/load first")
        return live

    def _modes(self, live: Live) -> SessionModeState:
        return updates.mode_state(live.session.approval)

    def _command_ctx(self, live: Live) -> Any:
        return commands.Context(session=live.session, runner=live.runner,
                                set_approval=functools.partial(self.set_approval, live))

    async def _advertise(self, session_id: str) -> None:
        await self._send(session_id, AvailableCommandsUpdate(
            session_update="available_commands_update",
            available_commands=commands.available_commands()))

    def _later(self, coro: Any) -> None:
        """Send after the response that announces the session (a client may drop
        updates for a session it does not know yet)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _say(self, session_id: str, text: str) -> None:
        await self._send(session_id, acp.update_agent_message_text(text))

    async def _send(self, session_id: str, update: Any) -> None:
        """One update; a client that has gone is not an error (the turn runs on to its
        end, and closing tidies up)."""
        if self.conn is None:
            return
        try:
            await self.conn.session_update(session_id=session_id, update=update)
        except Exception as exc:
            if not self._gone:
                say(f"cannot send to the client ({type(exc).__name__}: {exc}); the "
                    "turn goes on to its end")
            self._gone = True

    # ---------------------------------------------------------------- close
    def close(self, *, signalled: bool = False) -> None:
        """The client has gone (stdin closed, or a signal): cancel running turns (their
        cells are interrupted, state kept), wait for them (bounded; after a signal
        briefly, without waiting for the cell), then close every session: trace and
        checkpoints stay, owned kernels stop, attached ones run on."""
        for live in self.live.values():
            if live.busy or (live.worker is not None and live.worker.is_alive()):
                live.cancelled = True
                with contextlib.suppress(Exception):
                    live.runner.cancel(force=signalled)
        deadline = time.monotonic() + (SIGNAL_WAIT_S if signalled else CLOSE_WAIT_S)
        for live in self.live.values():
            if live.worker is not None:
                live.worker.join(timeout=max(0.0, deadline - time.monotonic()))
                if live.worker.is_alive():
                    with contextlib.suppress(Exception):
                        live.runner.cancel(force=True)
                    live.worker.join(timeout=1.0 if signalled else 5.0)
        for live in list(self.live.values()):
            session = live.session
            attached = session.kernel_existing if session.kernel_state not in (
                "stopped", "dead") else None
            try:
                session.close_unused()
            except Exception as exc:
                say(f"session {session.id}: close failed: {exc}")
            else:
                if attached:
                    say(f"session {session.id}: the attached kernel {attached} runs on")
        self.live.clear()
