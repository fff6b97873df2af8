"""simagent's own tools: the kernel, memory, and the investigation log.

Tool docstrings are the model-facing API, so they are precise about what each tool
returns and where full outputs live. Every tool reports progress through the langgraph
stream writer as ``{"type": "tool_output", ...}`` records, which ``TurnRunner`` turns
into typed events; none of them print.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from langchain.tools import ToolRuntime
from langchain_core.tools import BaseTool, tool

from simagent.agent import memory as memory_notes
from simagent.context.thresholds import ContextSettings, tool_cap

if TYPE_CHECKING:
    from simagent.session import Session

#: Seconds a single ``run_python`` call may run before it is interrupted (state kept).
DEFAULT_RUN_TIMEOUT_S = 1800.0
#: Tool names; the one home for them (labels, exclusions and gating read these).
RUN_PYTHON = "run_python"
RESET_KERNEL = "reset_kernel"
REMEMBER = "remember"
RECORD_ATTEMPT = "record_attempt"


def _writer(runtime: ToolRuntime | None):
    writer = getattr(runtime, "stream_writer", None) if runtime is not None else None
    return writer if callable(writer) else (lambda _item: None)


def make_run_python(session: Session, settings: ContextSettings | None = None) -> BaseTool:
    cap = tool_cap(RUN_PYTHON, settings or session.context_settings)

    @tool(RUN_PYTHON, response_format="content_and_artifact")
    def run_python(code: str, runtime: ToolRuntime,
                   timeout_s: float | None = None) -> tuple[str, dict[str, Any]]:
        """Run Python code in the session's persistent IPython kernel and return its output.

        Variables, imports and open figures persist between calls (one kernel for the
        whole session; the working directory is the workspace). Returns the rendered
        text: stdout, then `[stderr]`, then `Out[n]: <value of the last expression>`,
        then displays and any error with a compact traceback. Progress bars collapse to
        their final state. Long output keeps its head and tail around a marker giving
        the path of the full raw output, which `read_file` can page through. Matplotlib figures are
        saved as PNG files and their paths are listed. If the run exceeds `timeout_s`
        (default 1800 s) it is interrupted and the kernel state is kept.
        """
        call_id = runtime.tool_call_id
        write = _writer(runtime)

        def on_output(event: Any) -> None:
            write({"type": "tool_output", "tool_call_id": call_id, "kind": event.kind,
                   "text": event.text, "path": str(event.path) if event.path else None})

        result = session.execute(code, on_output=on_output,
                                 timeout=timeout_s or DEFAULT_RUN_TIMEOUT_S,
                                 tool_call_id=call_id)
        raw = str(result.raw_path) if result.raw_path else None
        return result.model_text(cap), {"raw_path": raw, "status": result.status}

    return run_python


def make_reset_kernel(session: Session) -> BaseTool:
    @tool(RESET_KERNEL)
    def reset_kernel() -> str:
        """Restart the Python kernel: every variable, import and figure is lost.

        Use only when the kernel is wedged or its state is hopelessly inconsistent;
        an interrupted or failed cell does not need a reset.
        """
        seconds = session.restart_kernel()
        return (f"Kernel restarted in {seconds:.1f} s. All variables and imports are gone; "
                "re-run the setup code you need.")

    return reset_kernel


def make_remember(session: Session) -> BaseTool:
    @tool(REMEMBER)
    def remember(title: str, content: str, kind: str = "project") -> str:
        """Save a durable note to this workspace's memory for future sessions.

        Writes `<slug>.md` in the memory folder and adds or refreshes its one-line
        entry in MEMORY.md (the index shown in your instructions). Save facts that will
        still matter later: validated parameters, data locations, user preferences,
        pitfalls found. `kind` is one of project, user, simulator, preference,
        reference. Saving a title again replaces that note. Returns the note's path.
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
        """Log one attempt of a parameter investigation (an auditable record).

        Call after each run you evaluate while searching parameters: why you tried it
        (`rationale`), the parameter values (`parameters`), the resulting figures with
        units in the key names (`metrics`, e.g. {"capacity_Ah": 4.8}), a short verdict
        (`outcome`, e.g. "accepted", "rejected: voltage below cut-off") and, if it
        refines an earlier attempt, that attempt's number (`parent`). Records are kept
        in full for the whole session and never cleared from your context, so the log
        is the reliable memory of what was tried. Returns the attempt number.
        """
        record = session.attempts.add(rationale=rationale, parameters=parameters,
                                      metrics=metrics or {}, outcome=outcome,
                                      parent=parent, notes=notes)
        session.trace.append("attempt", record)
        shown = ", ".join(f"{k}={v}" for k, v in list(parameters.items())[:6])
        parent_s = f" (refines #{parent})" if parent else ""
        return f"attempt #{record['index']}{parent_s} recorded: {shown}"

    return record_attempt


class AttemptLog:
    """The session's attempts, one JSON line each in ``attempts.jsonl`` (survives resume)."""

    def __init__(self, path) -> None:
        self.path = path

    def all(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a torn last line from a killed process
        return out

    def add(self, **fields: Any) -> dict[str, Any]:
        record = {"index": len(self.all()) + 1, "id": uuid.uuid4().hex[:12],
                  "ts": time.strftime("%Y-%m-%dT%H:%M:%S"), **fields}
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, default=str) + "\n")
        return record


def session_tools(session: Session, settings: ContextSettings | None = None) -> list[BaseTool]:
    """The session's own tools; ``settings`` (default: the session's) sets output caps."""
    return [make_run_python(session, settings), make_reset_kernel(session),
            make_remember(session), make_record_attempt(session)]
