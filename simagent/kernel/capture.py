"""Turn one execution's iopub messages into an :class:`ExecResult`.

Pure of any kernel: :class:`Capture` is fed ``(msg_type, content)`` pairs in arrival
order, so tests and the bench can drive it with synthetic messages. It keeps three
views of the output:

* the raw stream text, appended uncapped to ``outputs/<exec>.txt`` as it arrives;
* a bounded :class:`TerminalBuffer` per stream, the rendered view the model gets;
* an optional live callback, so a UI can show output while the cell runs.

Displays of :data:`simagent.kernel.HUMAN_MIME` are for the person, not the model: they go
to the callback (kind ``"human"``) and to ``ExecResult.human``, never into the text.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from simagent.kernel import HUMAN_MIME
from simagent.kernel.result import (
    MODEL_TEXT_CAP,
    Display,
    ErrorInfo,
    ExecResult,
    Status,
    cap_bytes,
    compact_traceback,
    png_size,
)
from simagent.kernel.terminal import TerminalBuffer

OutputKind = Literal["stdout", "stderr", "display", "error", "clear", "human"]

_INPUT_HINT = ("input() and getpass() are unavailable: code runs without a terminal. "
               "Pass values in as variables instead.")
_CAP_SLACK = 4096
_IMAGE_TYPES = {"image/png": "png", "image/jpeg": "jpg", "image/svg+xml": "svg"}


@dataclass(frozen=True)
class OutputEvent:
    """One piece of output as it arrived (for live display)."""

    kind: OutputKind
    text: str
    path: Path | None = None


OnOutput = Callable[[OutputEvent], None]


class Capture:
    def __init__(
        self,
        raw_path: Path | None,
        artifacts_dir: Path | None,
        tag: str,
        on_output: OnOutput | None = None,
        cap: int = MODEL_TEXT_CAP,
    ) -> None:
        self.raw_path = raw_path
        self.artifacts_dir = artifacts_dir
        self.tag = tag
        self.on_output = on_output
        self.cap = cap
        # The model never sees more than ``cap`` characters of streams, so that (plus a
        # partial first line) is all each buffer must keep.
        keep = cap + _CAP_SLACK
        self.streams = {"stdout": TerminalBuffer(max_chars=keep),
                        "stderr": TerminalBuffer(max_chars=keep)}
        self.value: str | None = None
        self.error: ErrorInfo | None = None
        self.displays: list[Display] = []
        self.human: list[str] = []
        self.execution_count: int | None = None
        self._raw: IO[str] | None = None
        self._clear_pending = False
        self._n_images = 0

    # --------------------------------------------------------------- raw log
    def _log(self, text: str) -> None:
        if self.raw_path is None:
            return
        if self._raw is None:
            self._raw = open(self.raw_path, "w", encoding="utf-8",  # noqa: SIM115 - closed by close()
                             errors="surrogatepass", newline="")
        self._raw.write(text)

    def close(self) -> None:
        if self._raw is not None:
            self._raw.close()
            self._raw = None

    def _emit(self, kind: OutputKind, text: str, path: Path | None = None) -> None:
        if self.on_output is not None:
            try:
                self.on_output(OutputEvent(kind, text, path))
            except Exception:
                pass  # a display callback must never break the execution

    # -------------------------------------------------------------- messages
    def handle(self, msg_type: str, content: dict) -> None:
        if msg_type == "stream":
            self._stream(content.get("name", "stdout"), content.get("text", ""))
        elif msg_type in ("execute_result", "display_data", "update_display_data"):
            self._rich(msg_type, content)
        elif msg_type == "error":
            self._error(content)
        elif msg_type == "clear_output":
            if content.get("wait"):
                self._clear_pending = True
            else:
                self._clear()
        elif msg_type == "execute_input":
            self.execution_count = content.get("execution_count", self.execution_count)

    def _clear(self) -> None:
        self._clear_pending = False
        for buf in self.streams.values():
            buf.clear()
        self.displays = [d for d in self.displays if d.path is not None]  # images stay on disk
        self._emit("clear", "")

    def _stream(self, name: str, text: str) -> None:
        if self._clear_pending:
            self._clear()
        self._log(text)
        self.streams.get(name, self.streams["stdout"]).feed(text)
        self._emit("stderr" if name == "stderr" else "stdout", text)

    def _rich(self, msg_type: str, content: dict) -> None:
        if self._clear_pending:
            self._clear()
        data: dict = content.get("data") or {}
        if HUMAN_MIME in data and msg_type != "execute_result":
            self._human(data[HUMAN_MIME], data.get("text/plain", ""))
            return
        plain = data.get("text/plain", "")
        if msg_type == "execute_result":
            self.value = cap_bytes(plain)
            self.execution_count = content.get("execution_count", self.execution_count)
            self._log(f"Out[{self.execution_count}]: {plain}\n")
            return
        display_id = (content.get("transient") or {}).get("display_id")
        display = self._make_display(data, plain, display_id)
        if msg_type == "update_display_data" and display_id:
            for i, d in enumerate(self.displays):
                if d.display_id == display_id:
                    self.displays[i] = display
                    break
        else:
            self.displays.append(display)
        self._log(display.text + "\n")
        self._emit("display", display.text, display.path)

    def _human(self, payload: object, plain: str) -> None:
        """A notice for the person only: no raw log, no model text, one live event."""
        text = payload.get("text") if isinstance(payload, dict) else payload
        text = str(text if text is not None else plain)
        self.human.append(text)
        self._emit("human", text)

    def _make_display(self, data: dict, plain: str, display_id: str | None) -> Display:
        for mime, ext in _IMAGE_TYPES.items():
            if mime in data and self.artifacts_dir is not None:
                self._n_images += 1
                path = self.artifacts_dir / f"{self.tag}-{self._n_images}.{ext}"
                raw = data[mime]
                blob = raw.encode() if mime == "image/svg+xml" else base64.b64decode(raw)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(blob)
                size = png_size(blob) if ext == "png" else None
                dims = f" {size[0]}x{size[1]}" if size else ""
                label = f" ({plain})" if plain and not plain.startswith("<Figure") else ""
                return Display(mime, f"[image{dims} saved: {path}]{label}", path, display_id)
        if plain:
            return Display("text/plain", cap_bytes(plain), None, display_id)
        kinds = ", ".join(sorted(data)) or "empty"
        size = len(json.dumps(data)) if data else 0
        return Display(next(iter(data), "unknown"),
                       f"[display: {kinds}; {size:,} chars not shown]", None, display_id)

    def _error(self, content: dict) -> None:
        ename = content.get("ename", "Error")
        evalue = cap_bytes(content.get("evalue", ""))
        tb = compact_traceback(content.get("traceback") or [])
        self.error = ErrorInfo(ename, evalue, tb)
        self._log("\n".join(content.get("traceback") or [f"{ename}: {evalue}"]) + "\n")
        self._emit("error", self.error.text())

    # ---------------------------------------------------------------- result
    def result(self, status: Status, elapsed_s: float, notice: str = "",
               state_lost: bool = False) -> ExecResult:
        self.close()
        if self.error is not None and self.error.ename == "StdinNotImplementedError":
            notice = f"{notice} {_INPUT_HINT}".strip()
        out, err = self.streams["stdout"], self.streams["stderr"]
        return ExecResult(
            status=status,
            stdout=out.render(),
            stderr=err.render(),
            value=self.value,
            error=self.error,
            displays=list(self.displays),
            human=list(self.human),
            raw_path=(self.raw_path if self.raw_path is not None and self.raw_path.exists()
                      else None),
            execution_count=self.execution_count,
            elapsed_s=elapsed_s,
            notice=notice,
            state_lost=state_lost,
            raw_chars=out.stats.chars_in + err.stats.chars_in,
            rows_dropped=out.stats.rows_dropped + err.stats.rows_dropped,
            cap=self.cap,
        )
