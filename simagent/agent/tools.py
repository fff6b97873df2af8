"""simagent's own tools: the kernel, memory, and the investigation log.

Tool docstrings are the model-facing API, so they are precise about what each tool
returns and where full outputs live. Every tool reports progress through the langgraph
stream writer as ``{"type": "tool_output", ...}`` records, which ``TurnRunner`` turns
into typed events; none of them print.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain.tools import ToolRuntime
from langchain_core.tools import BaseTool, tool

from simagent.agent.cancel_account import lost_line
from simagent.agent.cell_order import CellOrder, calls_before
from simagent.context import memory as memory_notes
from simagent.context.ledger import recall_text
from simagent.context.settings import ContextSettings
from simagent.context.thresholds import tool_cap
from simagent.kernel.connection import MODEL_MAY_NOT_RESET
from simagent.kernel.digesters import output_digester
from simagent.kernel_api.figures import is_figure_id, render_caption
from simagent.kernel_api.outputs import count_lines
from simagent.tool_names import (
    RECALL,
    RECORD_ATTEMPT,
    REMEMBER,
    RESET_KERNEL,
    RUN_PYTHON,
    VIEW_FIGURE,
)

if TYPE_CHECKING:
    from simagent.kernel import ExecResult
    from simagent.session import Session

#: Seconds a single ``run_python`` call may run before it is interrupted (state kept).
DEFAULT_RUN_TIMEOUT_S = 1800.0
#: Longest image edge sent to a model, in pixels; providers scale larger images down to
#: about this anyway (Anthropic at 1568) and bill the pixels sent, so we shrink first.
MAX_IMAGE_EDGE = 1568
#: Image formats view_figure can send (those the providers all accept).
_SENDABLE = {".png": "image/png", ".jpg": "image/jpeg"}


def _writer(runtime: ToolRuntime | None):
    writer = getattr(runtime, "stream_writer", None) if runtime is not None else None
    return writer if callable(writer) else (lambda _item: None)


def make_run_python(session: Session, settings: ContextSettings | None = None) -> BaseTool:
    cap = tool_cap(RUN_PYTHON, settings or session.context_settings)
    order = CellOrder(session.cancel_requested.is_set)  # one message's cells in its order

    @tool(RUN_PYTHON, response_format="content_and_artifact")
    def run_python(code: str, runtime: ToolRuntime,
                   timeout_s: float | None = None) -> tuple[str, dict[str, Any]]:
        """Run Python code in the session's persistent IPython kernel (working directory:
        the workspace); variables, imports and figures persist between calls.

        Returns stdout, `[stderr]`, `Out[n]: <last expression>`, displays and any error
        with a compact traceback; progress bars show their final state. Long output
        keeps head and tail around a marker naming the full raw output file (page it
        with `read_file`). Each figure shown is saved once and listed as
        `[figure fig-<hash> WxH: <path>]` with a data summary (axes, labels with units,
        ranges; per series: points, x range, y min…max, last); a repeat says
        `same as fig-<hash>`; `view_figure` shows the image. A run past `timeout_s`
        (default 1800 s) is interrupted; the kernel state is kept.
        """
        call_id = runtime.tool_call_id
        write = _writer(runtime)

        def on_output(event: Any) -> None:
            write({"type": "tool_output", "tool_call_id": call_id, "kind": event.kind,
                   "text": event.text, "path": str(event.path) if event.path else None})

        messages = (runtime.state or {}).get("messages", []) \
            if isinstance(runtime.state, dict) else []
        with order.turn(call_id, calls_before(messages, call_id, RUN_PYTHON)):
            text, result = run_python_text(session, code, cap=cap, on_output=on_output,
                                           timeout_s=timeout_s, tool_call_id=call_id)
        raw = str(result.raw_path) if result.raw_path else None
        # the line count lets a placeholder say how long the output is once cleared
        return text, {"raw_path": raw, "status": result.status, "recovery": result.recovery,
                      "lines": count_lines(raw) if raw else None}

    return run_python


def run_python_text(session: Session, code: str, *, cap: int | None, on_output: Any = None,
                    timeout_s: float | None = None,
                    tool_call_id: str | None = None) -> tuple[str, ExecResult]:
    """Run ``code`` and make the text a caller sees of it: capped at ``cap`` chars,
    progress bars collapsed, the digest, the ``_out[n]`` pointer and the raw file's path.

    One home for that text: the agent's ``run_python`` and ``simagent mcp``'s both call it,
    so an MCP host gets exactly what simagent's own model gets.
    """
    result = session.execute(code, on_output=on_output,
                             timeout=timeout_s or DEFAULT_RUN_TIMEOUT_S,
                             tool_call_id=tool_call_id)
    if lost := lost_line(code, result.status, result.recovery):  # restarted under it
        result.notice = f"{result.notice}; {lost}" if result.notice else lost
    # over the cap, the simulator's digest of the raw output joins head and tail; only
    # under simagent's own cap (the raw and stock bench baselines keep plain head/tail)
    digest = output_digester(session.simulator, result.raw_path, session.trace) \
        if cap else None
    return result.model_text(cap, digest=digest), result


def make_view_figure(session: Session, images: bool, why: str = "") -> BaseTool:
    """``view_figure``; ``images`` says whether the model takes images in tool results
    (``simagent.models.image_support``), ``why`` is the reason given when it does not."""

    @tool(VIEW_FIGURE)
    def view_figure(figure_id: str) -> str | list[dict[str, Any]]:
        """Show a saved figure as an image (`figure_id`: the `fig-<hash>` of a
        `[figure ...]` line). Each view costs hundreds of tokens: first use the data
        summary under that line or compute from the data; view only for what the picture
        alone shows (layout, shapes, artefacts). A model that cannot take images gets the
        summary instead.
        """
        found = find_figure(session, figure_id)
        if isinstance(found, str):
            return found
        path, meta = found
        size = tuple(meta["size"]) if meta.get("size") else None
        caption = render_caption(path.stem, str(path), size, meta.get("summary"))
        if not images:
            return (f"view_figure: {path.stem} was not sent: this model cannot be given images "
                    f"({why or 'text-only'}). Work from its data summary:\n{caption}")
        mime = _SENDABLE.get(path.suffix)
        if mime is None:
            return (f"view_figure: {path.stem} is {path.suffix} and only PNG or JPEG images "
                    f"can be sent. Its data summary:\n{caption}")
        blob, note = _sendable_image(path.read_bytes(), mime)
        head = caption.split("\n", 1)[0] + note
        return [{"type": "text", "text": head},
                {"type": "image", "base64": base64.b64encode(blob).decode("ascii"),
                 "mime_type": mime}]

    return view_figure


def find_figure(session: Session, figure_id: str) -> tuple[Any, dict[str, Any]] | str:
    """The figure's file and sidecar record, or a message naming the known ids."""
    folders = session.artifact_dirs
    key = Path(str(figure_id).strip()).stem
    if is_figure_id(key):
        for path in sorted(p for folder in folders for p in folder.glob(f"{key}.*")):
            if path.suffix != ".json":
                try:
                    meta = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    meta = {}
                return path, meta if isinstance(meta, dict) else {}
    known = sorted((p for folder in folders for p in folder.glob("fig-*.json")),
                   key=lambda p: p.stat().st_mtime)
    ids = ", ".join(p.stem for p in known[-10:]) or "none yet"
    return (f"view_figure: no figure {figure_id!r} in this session. Ids look like "
            f"fig-1a2b3c4d; the latest figures are: {ids}")


def _sendable_image(blob: bytes, mime: str) -> tuple[bytes, str]:
    """The image scaled to at most :data:`MAX_IMAGE_EDGE` pixels a side (Pillow, which
    matplotlib depends on); unchanged when already small or when Pillow is missing."""
    try:
        from PIL import Image  # Pillow comes with matplotlib; without it, the image as is
    except ImportError:
        return blob, ""
    try:
        with Image.open(io.BytesIO(blob)) as img:
            w, h = img.size
            if max(w, h) <= MAX_IMAGE_EDGE:
                return blob, ""
            scale = MAX_IMAGE_EDGE / max(w, h)
            small = img.resize((max(1, round(w * scale)), max(1, round(h * scale))))
            out = io.BytesIO()
            small.save(out, format="PNG" if mime == "image/png" else "JPEG")
            return out.getvalue(), f" (sent scaled to {small.size[0]}x{small.size[1]})"
    except Exception:
        return blob, ""


def make_reset_kernel(session: Session) -> BaseTool:
    @tool(RESET_KERNEL)
    def reset_kernel() -> str:
        """Restart the Python kernel, losing every variable, import and figure. Only for
        a wedged or hopelessly inconsistent kernel; an interrupted or failed cell needs
        no reset.
        """
        if not session.kernel.status().owned:  # the person's kernel: never without their consent
            return MODEL_MAY_NOT_RESET
        seconds = session.restart_kernel()
        return (f"Kernel restarted in {seconds:.1f} s. All variables and imports are gone; "
                "re-run the setup code you need.")

    return reset_kernel


def make_remember(session: Session) -> BaseTool:
    @tool(REMEMBER)
    def remember(title: str, content: str, kind: str = "project") -> str:
        """Save a durable note to this workspace's memory for later sessions: `<slug>.md`
        plus its line in the MEMORY.md index shown in your instructions. For facts that
        will still matter: validated parameters, data locations, user preferences,
        pitfalls. `kind`: project, user, simulator, preference or reference. Saving a
        title again replaces its note. Returns the note's path.
        """
        saved = memory_notes.remember(session.memory_dir, title, content, kind)
        session.trace.append("memory_write", {"path": str(saved.path), "title": title,
                                              "kind": kind})
        verb = "Saved" if saved.created else "Updated"
        return f"{verb} memory note {saved.path}"

    return remember


def make_record_attempt(session: Session) -> BaseTool:
    @tool(RECORD_ATTEMPT)
    def record_attempt(rationale: str, parameters: dict[str, Any],
                       metrics: dict[str, Any] | None = None, outcome: str = "",
                       parent: int | None = None, notes: str = "") -> str:
        """Log one attempt of a parameter investigation; call after each run you
        evaluate. `rationale`: why you tried it; `parameters`: the values; `metrics`:
        the results with units in the key names (e.g. {"capacity_Ah": 4.8}); `outcome`:
        a short verdict (e.g. "rejected: voltage below cut-off"); `parent`: the number
        of the attempt it refines. The log is never cleared from your context: it is
        the reliable memory of what was tried. Returns the attempt number.
        """
        record = session.attempts.add(rationale=rationale, parameters=parameters,
                                      metrics=metrics or {}, outcome=outcome,
                                      parent=parent, notes=notes)
        session.trace.append("attempt", record)
        shown = ", ".join(f"{k}={v}" for k, v in list(parameters.items())[:6])
        parent_s = f" (refines #{parent})" if parent else ""
        return f"attempt #{record['index']}{parent_s} recorded: {shown}"

    return record_attempt


def make_recall(session: Session) -> BaseTool:
    @tool(RECALL)
    def recall(query: str) -> str:
        """Find values, files, figures and decisions that left your context (cleared
        results, summaries, finished tasks). Every word of `query` must occur in a line,
        e.g. "capacity Ah". Returns up to 12 lines, each with where its full text is:
        `_out[n]`, a file path, or a history file:line. Use before re-running code.
        """
        return recall_text(session.paths, query)

    return recall


def session_tools(session: Session, settings: ContextSettings | None = None) -> list[BaseTool]:
    """The session's own tools; ``settings`` (default: the session's) sets output caps and
    whether the ledger's ``recall`` is offered."""
    ledger = (settings or session.context_settings).ledger
    return [make_run_python(session, settings), make_reset_kernel(session),
            make_remember(session), make_record_attempt(session),
            *([make_recall(session)] if ledger else [])]
