"""Turn one execution's iopub messages into an :class:`ExecResult`.

Pure of any kernel: :class:`Capture` is fed ``(msg_type, content)`` pairs in arrival
order, so tests and the bench can drive it with synthetic messages. It keeps three
views of the output:

* the raw stream text, appended uncapped to ``outputs/<exec>.txt`` as it arrives;
* a bounded :class:`TerminalBuffer` per stream, the rendered view the model gets;
* an optional live callback, so a UI can show output while the cell runs.

Displays of :data:`simagent.kernel.HUMAN_MIME` are for the person, not the model: they go
to the callback (kind ``"human"``) and to ``ExecResult.human``, never into the text.

A full disk never breaks an execution: when writing the raw output (or a figure) fails
(ENOSPC, EDQUOT, EIO, EFBIG ...), the execution still returns the text the model would
have got, ``raw_path`` is None, and the notice carries one line saying what was lost
(``tests/test_data_safety.py`` writes through ``/dev/full``).

Images are stored once under their content hash (``artifacts/fig-<sha256[:8]>.png``, with
a ``.json`` sidecar holding the data summary and the execution that first showed it) and
captioned for the model by :mod:`simagent.kernel_api.figures`.
"""

from __future__ import annotations

import base64
import errno
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
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
from simagent.kernel.screen_redact import ScreenRedactor
from simagent.kernel.terminal import TerminalBuffer
from simagent.kernel_api.figures import FIGURE_MIME, figure_id, figure_title, render_caption
from simagent.kernel_api.outputs import handle
from simagent.paths import private_dir, private_opener, write_private
from simagent.trace.redact import Redactor, redact_data, secret_values

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
        self._raw: IO[bytes] | None = None
        self._raw_error: OSError | None = None  # the first failed write of the raw log
        self._raw_lost = 0  # bytes of raw output that never reached the disk
        self._figure_errors: list[str] = []
        # the secrets as they stand now, read once per execution (a cell runs in another
        # process: it cannot change this one's environment while it runs)
        self._redact = Redactor(secret_values())
        # no printed key reaches the raw log, nor one a terminal would put together
        self._secrets = ScreenRedactor(self._redact)
        self._clear_pending = False
        self._figure_ids: set[str] = set()  # figures already shown by this execution

    # --------------------------------------------------------------- raw log
    def _log(self, text: str) -> None:
        """Append to the raw log, unbuffered, so a failed write is known at once and
        exactly how much was lost can be said."""
        if self.raw_path is None:
            return
        self._write(self._secrets.feed(text))

    def _write(self, text: str) -> None:
        if not text:
            return
        data = text.encode("utf-8", errors="surrogatepass")
        if self._raw_error is not None:
            self._raw_lost += len(data)
            return
        try:
            if self._raw is None:
                self._raw = open(self.raw_path, "wb", buffering=0,  # noqa: SIM115 - closed by close()
                                 opener=private_opener)
            view = memoryview(data)
            while view:
                view = view[self._raw.write(view) or 0:]
        except OSError as exc:
            self._raw_error = exc
            self._raw_lost += len(view) if self._raw is not None else len(data)

    def close(self) -> None:
        if tail := self._secrets.flush():
            self._write(tail)
        if self._raw is not None:
            try:
                self._raw.close()
            except OSError as exc:
                self._raw_error = self._raw_error or exc
            self._raw = None

    def _disk_notice(self) -> str:
        """One line for what the disk refused ("" when nothing was lost)."""
        lines = []
        n = int(self.tag) if self.tag.isdigit() else self.tag
        if self._raw_error is not None:
            lines.append(f"{_why(self._raw_error)}: raw output of execution {n} not "
                         f"saved ({self._raw_lost:,} bytes lost); the model got the capped "
                         "text")
        if self._figure_errors:
            lines.append(f"{self._figure_errors[0]}: {len(self._figure_errors)} figure(s) of "
                         f"execution {n} not saved; their captions are kept")
        return " ".join(lines)

    def _emit(self, kind: OutputKind, text: str, path: Path | None = None) -> None:
        if self.on_output is not None:
            try:
                self.on_output(OutputEvent(kind, self._redact(text), path))
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
            self.execution_count = content.get("execution_count", self.execution_count)
            if not any(m in data for m in _IMAGE_TYPES):  # a figure value is shown as one
                self.value = cap_bytes(plain)
                self._log(f"Out[{self.execution_count}]: {plain}\n")
                return
        display_id = (content.get("transient") or {}).get("display_id")
        display = self._make_display(data, plain, display_id)
        if display.figure_id is not None:
            if display.figure_id in self._figure_ids and msg_type != "update_display_data":
                return  # the same image again in this execution (e.g. `fig` then the flush)
            self._figure_ids.add(display.figure_id)
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
                return self._figure(data, mime, ext, plain, display_id)
        if plain:
            return Display("text/plain", cap_bytes(plain), None, display_id)
        kinds = ", ".join(sorted(data)) or "empty"
        size = len(json.dumps(data)) if data else 0
        return Display(next(iter(data), "unknown"),
                       f"[display: {kinds}; {size:,} chars not shown]", None, display_id)

    def _figure(self, data: dict, mime: str, ext: str, plain: str,
                display_id: str | None) -> Display:
        """Store an image once under its content hash; caption it with its data summary.

        A repeat of an image shown by an earlier execution is captioned as such (the model
        already has its summary); a repeat within this execution adds nothing.
        """
        assert self.artifacts_dir is not None
        raw = data[mime]
        blob = raw.encode() if mime == "image/svg+xml" else base64.b64decode(raw)
        try:
            fid, path = self._store(blob, ext)
        except OSError as exc:
            self._figure_errors.append(_why(exc))
            fid = figure_id(blob, 8)
            summary = data.get(FIGURE_MIME)
            text = render_caption(fid, "(not saved: the disk refused it)", None,
                                  summary if isinstance(summary, dict) else None, None, "")
            return Display(mime, text, None, display_id, figure_id=fid)
        summary = data.get(FIGURE_MIME)
        sidecar = path.with_suffix(".json")
        here = handle(int(self.tag)) if self.tag.isdigit() else self.tag
        first = None
        try:
            first = json.loads(sidecar.read_text(encoding="utf-8")).get("first")
        except (OSError, ValueError):
            pass
        size = png_size(blob) if ext == "png" else None
        if first is None:
            first = here
            meta = {"id": fid, "path": str(path), "mime": mime, "bytes": len(blob),
                    "size": list(size) if size else None, "first": first,
                    "summary": summary if isinstance(summary, dict) else None}
            try:
                write_private(sidecar, json.dumps(redact_data(meta), default=str))
            except OSError:
                pass
        same_as = first if first != here else None
        label = plain if plain and not plain.startswith("<Figure") else ""
        text = render_caption(fid, str(path), size,
                              summary if isinstance(summary, dict) else None, same_as, label)
        return Display(mime, text, path, display_id, figure_id=fid,
                       duplicate=same_as is not None,
                       title=figure_title(summary) if isinstance(summary, dict) else None)

    def _store(self, blob: bytes, ext: str) -> tuple[str, Path]:
        """``artifacts/fig-<hash>.<ext>``, written unless identical bytes are there already
        (a 32-bit prefix that collides with different bytes gets a longer one)."""
        assert self.artifacts_dir is not None
        private_dir(self.artifacts_dir)
        for length in (8, 16, 64):
            fid = figure_id(blob, length)
            path = self.artifacts_dir / f"{fid}.{ext}"
            try:
                if path.read_bytes() == blob:
                    return fid, path
                continue  # same prefix, other image
            except OSError:
                with open(path, "wb", opener=private_opener) as fh:  # a full disk: OSError,
                    fh.write(blob)  # handled by the caller
                return fid, path
        return fid, path

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
        if disk := self._disk_notice():
            notice = f"{notice} {disk}".strip()
        saved = self._raw_error is None
        out, err = self.streams["stdout"], self.streams["stderr"]
        error = self.error
        if error is not None:
            error = ErrorInfo(error.ename, self._redact(error.evalue),
                              self._redact(error.traceback))
        return ExecResult(
            status=status,
            stdout=self._redact(out.render()),
            stderr=self._redact(err.render()),
            value=self._redact(self.value) if self.value else self.value,
            error=error,
            displays=[replace(d, text=self._redact(d.text)) for d in self.displays],
            human=list(self.human),
            raw_path=(self.raw_path if saved and self.raw_path is not None
                      and self.raw_path.exists() else None),
            execution_count=self.execution_count,
            elapsed_s=elapsed_s,
            notice=notice,
            state_lost=state_lost,
            raw_chars=out.stats.chars_in + err.stats.chars_in,
            rows_dropped=out.stats.rows_dropped + err.stats.rows_dropped,
            cap=self.cap,
        )


_DISK_ERRORS = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded",
                errno.EFBIG: "file size limit reached", errno.EIO: "disk I/O error",
                errno.EROFS: "read-only file system"}


def _why(exc: OSError) -> str:
    return _DISK_ERRORS.get(exc.errno or 0, f"write failed ({exc.strerror or exc})")
