"""One MCP client's simagent session: the server's tools as blocking calls on a Session.

Each tool body here runs in a worker thread (``server.py`` hands it to
``anyio.to_thread``), never on the event loop, and every call is written to the session's
trace as the agent's calls are (``tool_call``, the kernel's ``kernel_exec`` and
``artifact`` events, ``tool_result``), so ``simagent transcript`` reads an MCP session
like any other. Texts are redacted before they leave (the kernel's already are; the rest
pass the same :func:`simagent.trace.redact.redact`).

No MCP SDK here: tests drive a service on a real kernel without a transport.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simagent.agent.tools import (
    _SENDABLE,
    RUN_PYTHON,
    _sendable_image,
    find_figure,
    run_python_text,
)
from simagent.context.state_card import render_card
from simagent.context.thresholds import STATE_CARD_TOKENS, tool_cap
from simagent.kernel import snapshot
from simagent.kernel_api.figures import render_caption
from simagent.kernel_api.outputs import handle, raw_name, record_name
from simagent.mcp_server import ops
from simagent.mcp_server.ops import McpToolError
from simagent.outcomes import outcome_of
from simagent.session import Session
from simagent.trace.redact import redact


class KernelService:
    """The server's tools on one :class:`~simagent.session.Session` (one kernel)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        #: The agent's own cap for ``run_python`` text ([context] tool_cap_chars).
        self.cap = tool_cap(RUN_PYTHON, session.context_settings)
        self._run_lock = threading.Lock()  # one cell at a time, in call order
        self._running: str | None = None  # the call whose cell is in the kernel now
        self._starting: str | None = None  # the call waiting for the kernel to start
        self._cancelled: set[str] = set()  # calls cancelled before their cell began
        self._stage_lock = threading.Lock()  # cancel() vs a call changing stage
        self._traced: set[str] = set()  # calls whose body ran (and traced them)

    # ------------------------------------------------------------ tracing
    def traced(self, call_id: str, name: str, args: dict[str, Any],
               body: Callable[[], tuple[str, dict[str, Any]]],
               lock: threading.Lock | None = None) -> str:
        """Run ``body`` as tool call ``call_id``: ``tool_call`` before, ``tool_result``
        after (also when it fails); returns its text, or raises :class:`McpToolError`.

        ``body`` returns (text, extra result fields: ``exec_status``, ``recovery``).
        ``lock`` is held while ``body`` runs and its result is traced: :meth:`close`, which
        takes it, then finds the result in the trace before the session's end (released
        before the result was written, a loaded machine wrote ``session_end`` first).
        """
        trace = self.session.trace
        self._traced.add(call_id)
        trace.append("tool_call", {"id": call_id, "name": name, "args": args})
        started = time.monotonic()
        status, extra, error = "success", {}, None
        with lock if lock is not None else contextlib.nullcontext():
            try:
                text, extra = body()
            except McpToolError as exc:
                status, text, error = "error", str(exc), exc
            except Exception as exc:  # a bug or a kernel that cannot start: one clear line
                status, text = "error", f"{name} failed: {type(exc).__name__}: {exc}"
                error = McpToolError(text)
            text = redact(text)
            outcome = outcome_of(status, extra.get("exec_status"), extra.get("recovery"))
            trace.append("tool_result", {"tool_call_id": call_id, "name": name,
                                         "content": text, "status": status,
                                         "outcome": outcome,
                                         "elapsed_s": round(time.monotonic() - started, 3)})
        if error is not None:
            raise McpToolError(text) from None
        return text

    def note_rejected(self, call_id: str, name: str, args: Any, error: str) -> None:
        """Trace a call the SDK refused before any tool body ran (an unknown tool, bad
        arguments), so the trace holds every request the host made."""
        if call_id in self._traced:
            return
        self._traced.add(call_id)
        trace = self.session.trace
        trace.append("tool_call", {"id": call_id, "name": name,
                                   "args": args if isinstance(args, dict) else {}})
        trace.append("tool_result", {"tool_call_id": call_id, "name": name,
                                     "content": redact(error), "status": "error",
                                     "outcome": "error", "elapsed_s": 0.0})

    def _gate(self, tool: str) -> None:
        why = ops.refusal(self.session.approval, tool, self.session.workspace)
        if why:
            raise McpToolError(why)

    # -------------------------------------------------------------- tools
    def run_python(self, call_id: str, code: str, timeout_s: float | None = None,
                   on_output: Any = None) -> tuple[str, bool]:
        """Run a cell: (the text the agent's ``run_python`` gets, ``run_python_text``;
        whether the cell completed). A cell that raised, timed out, was interrupted or
        lost its kernel did not: the host is told by an error result (``isError``), as a
        failed call of any other MCP tool, so it need not read the traceback to know."""
        status: list[str] = []

        def body() -> tuple[str, dict[str, Any]]:
            self._gate("run_python")
            if not isinstance(code, str) or not code.strip():
                raise McpToolError("run_python: code is empty")
            if timeout_s is not None and not timeout_s > 0:
                raise McpToolError(f"run_python: timeout_s must be a positive number of "
                                   f"seconds, not {timeout_s!r}")
            self._stage(call_id, "_starting")  # under the run lock (traced holds it)
            try:
                # A first cell waits for the kernel (and the simulator's warm-up): a
                # cancel then cannot interrupt anything, so it is checked once more
                # after, before the cell is sent. A dead kernel is left to execute,
                # whose recovery restarts it and replays the state.
                if self.session.kernel_state == "stopped":
                    self.session.start_kernel()
                self._stage(call_id, "_running", starting=False)
                text, result = run_python_text(self.session, code, cap=self.cap,
                                               on_output=on_output, timeout_s=timeout_s,
                                               tool_call_id=call_id)
            finally:
                self._starting = self._running = None
            status.append(result.status)
            return text, {"exec_status": result.status, "recovery": result.recovery}

        text = self.traced(call_id, "run_python",
                           {"code": code, **({"timeout_s": timeout_s} if timeout_s else {})},
                           body, lock=self._run_lock)
        return text, status == ["ok"]

    def _stage(self, call_id: str, attr: str, *, starting: bool = True) -> None:
        """Move ``call_id`` to ``attr`` (``_starting`` or ``_running``), unless the host
        cancelled it meanwhile: then it never reaches the kernel."""
        with self._stage_lock:
            if call_id in self._cancelled:
                self._cancelled.discard(call_id)
                when = "before its cell began" if starting else \
                    "while the kernel was starting"
                raise McpToolError(f"run_python: not run: the request was cancelled {when}")
            self._starting = None
            setattr(self, attr, call_id)

    def cancel(self, call_id: str) -> bool:
        """The host cancelled ``call_id``: interrupt its cell if it is in the kernel
        (state kept), else make sure it never gets there. True when a cell was interrupted."""
        with self._stage_lock:
            running = self._running == call_id
            stage = "running" if running else \
                "starting" if self._starting == call_id else "queued"
            if running:
                self.session.interrupt_kernel()
            else:
                self._cancelled.add(call_id)
        self.session.trace.append("tool_cancelled", {"tool_call_id": call_id,
                                                     "name": "run_python", "stage": stage})
        return running

    def close(self, wait_s: float = 30.0) -> None:
        """Close the session when the client goes: a cell still running (its request was
        abandoned) is interrupted and given ``wait_s`` to end and be traced first, so
        the kernel is never shut down under a running execution."""
        if self._running is not None:
            self.session.interrupt_kernel()
        got = self._run_lock.acquire(timeout=wait_s)
        try:
            self.session.close()
        finally:
            if got:
                self._run_lock.release()

    def output(self, call_id: str, n: int, op: str, arg: str | int | None = None) -> str:
        args = {"n": n, "op": op, **({"arg": arg} if arg is not None else {})}
        return self.traced(call_id, "output", args, lambda: (
            ops.output_text(self.session.paths.outputs, n, op, arg, self.cap), {}))

    def state(self, call_id: str) -> str:
        def body() -> tuple[str, dict[str, Any]]:
            budget = self.session.context_settings.state_card_tokens or STATE_CARD_TOKENS
            card = render_card(self.session.state_snapshot(), reason="request", budget=budget)
            return card["text"], {}

        return self.traced(call_id, "state", {}, body)

    def figure(self, call_id: str, n: str | int) -> tuple[str, bytes | None, str | None]:
        """(caption with the data summary, image bytes, mime); no image for a format a
        host cannot show (the caption says so)."""
        box: dict[str, Any] = {}

        def body() -> tuple[str, dict[str, Any]]:
            key = ops.figure_key(n)
            if isinstance(key, int):
                key = Path(ops.pick_figure(snapshot.figures(self.session.trace), key)["path"]).stem
            found = find_figure(self.session, str(key))
            if isinstance(found, str):
                raise McpToolError(found.replace("view_figure:", "figure:", 1))
            path, meta = found
            size = tuple(meta["size"]) if meta.get("size") else None
            caption = render_caption(path.stem, str(path), size, meta.get("summary"))
            mime = _SENDABLE.get(path.suffix)
            if mime is None:
                return caption + f"\n(no image sent: {path.suffix} is not PNG or JPEG)", {}
            blob, note = _sendable_image(path.read_bytes(), mime)
            box.update(blob=blob, mime=mime)
            return caption.replace("\n", note + "\n", 1) if note else caption, {}

        text = self.traced(call_id, "figure", {"n": n}, body)
        return text, box.get("blob"), box.get("mime")

    def interrupt(self, call_id: str) -> str:
        def body() -> tuple[str, dict[str, Any]]:
            if self.session.kernel_state != "busy":
                return f"nothing to interrupt: the kernel is {self.session.kernel_state}", {}
            self.session.interrupt_kernel()
            return ("interrupt sent: the running cell stops with KeyboardInterrupt and its "
                    "run_python call returns; variables are kept"), {}

        return self.traced(call_id, "interrupt", {}, body)

    def restore(self, call_id: str) -> str:
        def body() -> tuple[str, dict[str, Any]]:
            self._gate("restore")
            recovery = self.session.restore_kernel()
            return recovery.message() or "kernel restarted; nothing to replay", \
                {"recovery": recovery.to_dict()}

        return self.traced(call_id, "restore", {}, body, lock=self._run_lock)

    def reset(self, call_id: str) -> str:
        def body() -> tuple[str, dict[str, Any]]:
            self._gate("reset")
            seconds = self.session.restart_kernel()
            return (f"kernel restarted in {seconds:.1f} s: every variable, import and "
                    f"figure is gone; restore() will not bring back cells run before "
                    f"this reset"), {}

        return self.traced(call_id, "reset", {}, body, lock=self._run_lock)

    # ---------------------------------------------------------- resources
    def raw_output(self, n: int, page: int = 1) -> str:
        """Page ``page`` of execution ``n``'s raw output (redacted as written;
        ``ops.page_of``: never the whole of a large file)."""
        folder = self.session.paths.outputs
        if (folder / record_name(n)).exists() and not (folder / raw_name(n)).exists():
            if page != 1:
                raise McpToolError(f"no page {page} of {handle(n)}: it printed nothing")
            return ""  # it ran and printed nothing
        path = ops.resource_file(folder, raw_name(n))
        return ops.page_of(path, n, page)

    def figure_file(self, figure_id: str) -> bytes:
        found = find_figure(self.session, figure_id)
        if isinstance(found, str):
            raise McpToolError(found.replace("view_figure:", "figure:", 1))
        path = ops.resource_file(self.session.paths.artifacts, found[0].name)
        return path.read_bytes()
