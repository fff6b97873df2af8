"""Kernel-side bootstrap for simagent's default Python kernel.

Run as ``python -m simagent.kernel.launcher -f {connection_file}``. It starts a stock
ipykernel with these adjustments that only the kernel process can make (ipykernel is
pinned, and ``tests/test_kernel.py`` proves each one on the real kernel):

1. **C-level output is decoded incrementally.** ipykernel reads fd 1/2 in 1000-byte
   pieces and decodes each with ``errors="replace"``, so a multi-byte character split
   across reads becomes two U+FFFD. We read 64 KiB at a time through an incremental
   UTF-8 decoder, and do not echo the bytes into the kernel's log file.
2. **C-level output belongs to the cell that printed it.** After each cell we flush C
   stdio and read what is left in the fd pipes ourselves, before ipykernel reports the
   cell idle; otherwise the tail of ``printf``/``os.write`` output races the idle message
   and is lost. The watcher thread reads the pipe under a lock, so no read is in flight
   while the cell's end drains it: no hand-off between threads per cell (a sentinel
   pushed through the pipes and waited for cost ~0.3 ms of a ~6 ms round trip).
3. **Stream messages are bounded.** ipykernel batches writes for 0.2 s, so a fast
   printer sends 10-100 MB messages that the client must hold in memory whole. We flush
   once a buffer passes 1 MiB, which also gives the printer back-pressure.
4. **Output has back-pressure.** The kernel can print far faster than a client renders;
   unread iopub messages then pile up in the *client's* memory (a 1 GB log would need
   1 GB there). The client acknowledges the stream characters it has consumed in a
   small file (``$SIMAGENT_FLOW_FILE``); ``write`` blocks while more than
   :data:`FLOW_WINDOW_CHARS` are unacknowledged. A client that stops reading for
   :data:`FLOW_STALL_S` is assumed absent and flow control pauses until it reads again,
   so background output can never hang the kernel.
5. **Crashes leave a trace.** ``faulthandler`` writes the native stack of a segfault to
   the kernel's original stderr (``kernel.log``).
6. **Earlier outputs are objects.** ``_out[n]`` (``simagent.kernel_api.outputs``) is put
   in the user namespace, hidden from ``%who``, at every (re)start.
7. **The kernel dies with simagent.** A simagent process that is SIGKILLed (or OOM-killed)
   cannot shut its kernel down. ipykernel's own parent poller notices within a second,
   but exits alone: processes a cell started (a simulator, ``sleep``) live on. A watcher
   thread waits on a pidfd of the parent and, the instant it exits, SIGKILLs the kernel's
   whole process group (jupyter_client starts each kernel in a new session, so the group
   is the kernel and what its cells spawned). ``prctl(PR_SET_PDEATHSIG)`` is not used: it
   fires when the *thread* that started the kernel ends, and simagent starts kernels from
   worker threads.
8. **Figures carry their data.** A display formatter (``simagent.kernel_api.figures``)
   adds a data summary of every matplotlib figure to the display message of its PNG, so
   the model can read a plot's numbers without being sent the image.
9. **Cells' effects are recorded.** An audit hook (``simagent.kernel_api.effects``) notes
   files a cell writes or deletes and processes it starts, so a replay after a restart
   does not append to a results file twice.
10. **No history file.** IPython would save every cell's code to the user's profile
    (``~/.ipython/profile_default/history.sqlite``): outside the session, shared by every
    IPython the user runs, and unredacted, so a key typed into a cell stayed there. The
    session already keeps each cell's code, redacted, in its trace and ``outputs/`` (the
    replay and the notebook export read those), so the kernel keeps its history in
    memory only; a second copy in the session folder would add a sink the redaction
    cannot reach.
"""

from __future__ import annotations

import codecs
import ctypes
import faulthandler
import os
import select
import signal
import sys
import threading
import time

_READ_SIZE = 64 * 1024
_FLUSH_AT_CHARS = 1 << 20
#: Longest a cell's end waits on its C-level output (a C thread that never stops printing).
_SYNC_WAIT_S = 2.0
#: IPython's input history stays in memory (``In``, ``_ih``, ``%history`` of this
#: kernel's life work) and never reaches ``~/.ipython/.../history.sqlite`` (point 10).
NO_HISTORY_ARGS = ("--HistoryManager.enabled=False",)
#: Unacknowledged stream characters allowed in flight (see point 4 above).
FLOW_WINDOW_CHARS = 8 << 20
FLOW_STALL_S = 2.0
FLOW_ENV = "SIMAGENT_FLOW_FILE"
#: The flow file holds one counter: stream chars the client consumed, 8 bytes little-endian.
_ACK_BYTES = 8


class FlowAck:
    """Client side of the flow control (the supervisor's): publishes stream chars
    consumed. It lives here, beside :class:`_Flow`, so both halves share one format."""

    def __init__(self, path: os.PathLike[str] | str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self.consumed = 0
        self.reset()

    def reset(self) -> None:
        self.consumed = 0
        os.pwrite(self.fd, (0).to_bytes(_ACK_BYTES, "little"), 0)

    def ack(self, n: int) -> None:
        self.consumed += n
        os.pwrite(self.fd, self.consumed.to_bytes(_ACK_BYTES, "little"), 0)

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


class _Flow:
    """Kernel side of the flow control: counts characters written, waits for acks."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY)
        self.written = 0
        self.ack_seen = 0  # last ack read; acks only grow, so this bounds the backlog
        self.stalled_at_ack = -1  # ack value at which the client was judged absent
        self.lock = threading.Lock()

    def acked(self) -> int:
        data = os.pread(self.fd, _ACK_BYTES, 0)
        self.ack_seen = int.from_bytes(data, "little") if len(data) == _ACK_BYTES else 0
        return self.ack_seen

    def wrote(self, n: int, stream) -> None:
        self.written += n
        if self.written - self.ack_seen <= FLOW_WINDOW_CHARS:
            return  # hot path: no syscall, no lock
        with self.lock:
            ack = self.acked()
            if self.written - ack <= FLOW_WINDOW_CHARS or ack == self.stalled_at_ack:
                return
            stream.flush()  # the client can only ack what was sent
            deadline = time.monotonic() + FLOW_STALL_S
            last = ack
            while self.written - ack > FLOW_WINDOW_CHARS:
                time.sleep(0.001)
                ack = self.acked()
                if ack != last:
                    last, deadline = ack, time.monotonic() + FLOW_STALL_S
                elif time.monotonic() > deadline:
                    self.stalled_at_ack = ack
                    return


_flow: _Flow | None = None
_fflush = None  # libc's fflush, resolved once at start-up


def _load_fflush():
    try:
        return ctypes.CDLL(None).fflush
    except Exception:
        return None


def _forward(stream) -> int | None:
    """One read of ``stream``'s fd pipe, written to the stream: bytes read (0: none were
    waiting), None once the pipe is closed. The caller holds ``stream._simagent_pipe``."""
    try:
        data = os.read(stream._fid, _READ_SIZE)
    except BlockingIOError:
        return 0
    if not data:
        return None
    if text := stream._simagent_decoder.decode(data):
        stream.write(text)
    return len(data)


def _watch_pipe_fd(self) -> None:  # replaces OutStream._watch_pipe_fd
    if self._fid is None:
        return
    os.set_blocking(self._fid, False)
    readable = select.poll()
    readable.register(self._fid, select.POLLIN)
    try:
        while self._should_watch:
            # consumes nothing: a read happens only under the lock
            if any(ev & select.POLLNVAL for _fd, ev in readable.poll()):
                break  # the pipe was closed under us
            with self._simagent_pipe:
                if _forward(self) is None:
                    break
    except Exception:
        self._exc = sys.exc_info()


def _patch_outstream() -> None:
    from ipykernel.iostream import OutStream  # kernel process only: simagent imports FLOW_ENV

    original_init = OutStream.__init__
    original_write = OutStream.write

    def __init__(self, *args, **kwargs):
        self._simagent_pipe = threading.Lock()  # held for each read of the fd pipe
        self._simagent_decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._simagent_unflushed = 0
        original_init(self, *args, **kwargs)

    def write(self, string):
        n = original_write(self, string)
        self._simagent_unflushed += len(string)
        if self._simagent_unflushed > _FLUSH_AT_CHARS:
            self._simagent_unflushed = 0  # timer flushes do not reset it: at worst one early flush
            self.flush()
        if _flow is not None and self._is_master_process():
            _flow.wrote(len(string), self)
        return n

    OutStream.__init__ = __init__
    OutStream._watch_pipe_fd = _watch_pipe_fd
    OutStream.write = write


def _sync_fd_output(*_args) -> None:
    """post_run_cell hook: make the cell's C-level output arrive before its idle, read
    here from the pipes (what ipykernel's flush after the cell then sends)."""
    from ipykernel.iostream import OutStream  # kernel process only (see _patch_outstream)

    if _fflush is not None:
        _fflush(None)  # C stdio buffers into the pipes first
    deadline = time.monotonic() + _SYNC_WAIT_S
    for stream in (sys.stdout, sys.stderr):
        if (isinstance(stream, OutStream) and stream._should_watch
                and stream._fid is not None and hasattr(stream, "_simagent_pipe")):
            _drain(stream, deadline)


def _drain(stream, deadline: float) -> None:
    """Forward all ``stream``'s pipe holds now. A read shorter than asked for emptied the
    pipe, so everything written before this call is forwarded (by the watcher, which
    reads under the same lock, or here); a C thread that keeps the pipe full is cut off
    at ``deadline``."""
    if not stream._simagent_pipe.acquire(timeout=max(0.0, deadline - time.monotonic())):
        return
    try:
        while _forward(stream) == _READ_SIZE and time.monotonic() < deadline:
            pass
    finally:
        stream._simagent_pipe.release()


def _enable_faulthandler() -> None:
    fd = getattr(sys.stderr, "_original_stdstream_copy", None)
    try:
        faulthandler.enable(file=fd if fd is not None else sys.__stderr__, all_threads=True)
    except Exception:
        pass


def _die_with_group() -> None:
    try:
        if os.getpgrp() == os.getpid():  # our own group: take what the cells spawned along
            os.killpg(os.getpid(), signal.SIGKILL)
    finally:
        os.kill(os.getpid(), signal.SIGKILL)


def watch_parent(parent_pid: int | None = None, poll_s: float = 0.5) -> threading.Thread | None:
    """Kill this process's group when ``parent_pid`` (the process that started the
    kernel) exits; see point 7 above. None when there is no parent to watch."""
    ppid = parent_pid or int(os.environ.get("JPY_PARENT_PID") or 0) or os.getppid()
    if ppid <= 1 or ppid != os.getppid():
        return None  # started through an intermediate: ipykernel's poller still applies
    try:
        pidfd: int | None = os.pidfd_open(ppid)
    except (AttributeError, OSError):  # not Linux >= 5.3: poll the parent instead
        pidfd = None
    if os.getppid() != ppid:  # the parent died before the pidfd was opened
        _die_with_group()

    def wait() -> None:
        if pidfd is not None:
            select.select([pidfd], [], [])  # readable once the parent has exited
        else:
            while os.getppid() == ppid:
                time.sleep(poll_s)
        _die_with_group()

    thread = threading.Thread(target=wait, name="simagent-parent-watch", daemon=True)
    thread.start()
    return thread


def main() -> None:
    global _flow, _fflush
    watch_parent()
    _fflush = _load_fflush()
    if path := os.environ.pop(FLOW_ENV, None):
        try:
            _flow = _Flow(path)
        except OSError:
            _flow = None
    _patch_outstream()
    from ipykernel.kernelapp import IPKernelApp  # kernel process only (see _patch_outstream)

    app = IPKernelApp.instance()
    app.initialize([*sys.argv[1:], *NO_HISTORY_ARGS])
    _enable_faulthandler()
    shell = getattr(app, "shell", None)
    if shell is not None:
        shell.events.register("post_run_cell", _sync_fd_output)
        _install_outputs(shell)
        _install_figures(shell)
        _install_effects(shell)
    app.start()


def _install_outputs(shell: object) -> None:
    """``_out[n]``: earlier executions' outputs, queryable in the kernel (a restart
    rebuilds it from the session's ``outputs/``)."""
    try:
        from simagent.kernel_api.outputs import install  # in the try: the kernel starts anyway

        install(shell.user_ns, getattr(shell, "user_ns_hidden", None))  # type: ignore[attr-defined]
    except Exception as exc:  # the kernel must start even if this fails
        print(f"simagent: _out is unavailable: {exc}", file=sys.__stderr__)


def _install_figures(shell: object) -> None:
    """Figure data summaries beside each PNG (the model's default view of a plot)."""
    try:
        from simagent.kernel_api.figures import install  # in the try: the kernel starts anyway

        install(shell)
    except Exception as exc:  # the kernel must start even if this fails
        print(f"simagent: figure summaries are unavailable: {exc}", file=sys.__stderr__)


def _install_effects(shell: object) -> None:
    """What each cell does outside the kernel (files written, processes started), for
    its execution record: a replay must not repeat it."""
    try:
        from simagent.kernel_api.effects import install  # in the try: the kernel starts anyway

        install(shell)
    except Exception as exc:  # the kernel must start even if this fails
        print(f"simagent: cell effects are not recorded: {exc}", file=sys.__stderr__)


if __name__ == "__main__":
    main()
