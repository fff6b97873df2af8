"""An in-process kernel: the test seam below the supervisor.

What httpx's ``MockTransport`` is to its ``Client``, :class:`MemoryLink` is to
:class:`simagent.kernel.supervisor.Kernel`: the supervisor, capture, raw files, records,
``_out[n]``, figure summaries, timeouts and the recovery ladder all run unchanged; only the
transport differs. Instead of a kernel process reached over ZeroMQ, cells run in this
process on a worker thread, in an IPython shell of their own, and the messages they
produce are the Jupyter messages ipykernel would send (``status``, ``execute_input``,
``stream``, ``display_data``, ``execute_result``, ``error`` and the shell's
``execute_reply``), so what the layers above see has the same shapes.

It exists so that tests of everything above the kernel layer (agent, context, front ends)
need no kernel process: a start takes milliseconds instead of seconds. Select it with
``SIMAGENT_TEST_KERNEL=memory`` in the environment (``make test-fast`` does) or
``Kernel(..., transport="memory")``. It is not a sandbox and never a user's kernel:

- **Process state is shared.** A cell's working folder, ``sys.stdout``, environment
  variables and ``__main__`` are this process's; they are swapped in for each cell under
  one process-wide lock (:data:`_CELL_LOCK`) and put back after, so one in-memory cell
  runs at a time in a process.
- **Interrupts reach Python code only.** ``interrupt`` raises ``KeyboardInterrupt`` in the
  worker thread between bytecodes; a cell blocked in C (``time.sleep``, a socket) stops
  when that call returns. Signals, child processes, heartbeat loss and a dying process
  are the real kernel's to test (``tests/test_kernel*.py`` keep them).
- **Output written to file descriptors** (``os.write(1, ...)``, a subprocess's) is not
  captured, and cells' effects on files are not recorded (that is an audit hook, which
  cannot be removed from a process once added).
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import io
import itertools
import os
import queue
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from simagent.kernel_api import figures, outputs
from simagent.paths import SESSION_DIR_ENV, SessionPaths

#: The environment variable that selects the transport of every kernel simagent starts
#: itself (``memory``: this module); unset or anything else, a kernel process.
SEAM_ENV = "SIMAGENT_TEST_KERNEL"
MEMORY = "memory"
#: One in-memory cell at a time per process (see the module docstring).
_CELL_LOCK = threading.RLock()
#: How long a cell's writes gather before they are sent (ipykernel's flush interval).
FLUSH_S = 0.2
#: How long ``restart``/``close`` wait for a running cell to take its KeyboardInterrupt.
STOP_WAIT_S = 2.0
_ids = itertools.count(1)


def selected(transport: str | None = None) -> bool:
    """Whether a kernel should run in memory: ``transport`` when given, else the
    environment's :data:`SEAM_ENV`."""
    return (transport or os.environ.get(SEAM_ENV, "")).strip().lower() == MEMORY


def _message(msg_type: str, content: dict[str, Any], parent: Mapping[str, Any] | None,
             session: str) -> dict[str, Any]:
    header = {"msg_id": f"{session}_{next(_ids)}", "msg_type": msg_type, "session": session,
              "username": "simagent", "version": "5.3"}
    return {"header": header, "msg_id": header["msg_id"], "msg_type": msg_type,
            "parent_header": dict(parent or {}), "metadata": {}, "content": content,
            "buffers": []}


class _Session:
    """``kc.session``: builds messages (the ladder's control requests)."""

    def __init__(self) -> None:
        self.session = uuid.uuid4().hex[:12]

    def msg(self, msg_type: str, content: dict[str, Any] | None = None) -> dict[str, Any]:
        return _message(msg_type, content or {}, None, self.session)


class _Stream:
    """``sys.stdout``/``sys.stderr`` while a cell runs. As ipykernel's ``OutStream`` does,
    writes are gathered and sent as one ``stream`` message per :data:`FLUSH_S` (and at the
    cell's end), so a loop of prints arrives as ipykernel would send it, not a write each."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, name: str, publish: Any) -> None:
        self.name, self._publish = name, publish
        self._lock = threading.Lock()
        self._pending: list[str] = []
        self._timer: threading.Timer | None = None

    def write(self, text: str) -> int:
        if text:
            with self._lock:
                self._pending.append(str(text))
                if self._timer is None:
                    self._timer = threading.Timer(FLUSH_S, self.flush)
                    self._timer.daemon = True
                    self._timer.start()
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        with self._lock:
            text, self._pending = "".join(self._pending), []
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        if text:
            self._publish("stream", {"name": self.name, "text": text})

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:  # numpy, faulthandler: there is no descriptor behind it
        raise io.UnsupportedOperation("an in-memory kernel's stream has no file descriptor")


class MemoryClient:
    """The parts of jupyter_client's ``BlockingKernelClient`` the supervisor and the
    ladder use: ``execute``, the iopub and shell queues, the control channel, the
    heartbeat. Requests are served in order by one worker thread."""

    def __init__(self, link: MemoryLink) -> None:
        self._link = link
        self.session = _Session()
        self.iopub: queue.Queue[dict[str, Any]] = queue.Queue()
        self.shell: queue.Queue[dict[str, Any]] = queue.Queue()
        self.control = queue.Queue()
        self.control_channel = _Control(self)
        self.hb_channel = _Heartbeat(link)

    def execute(self, code: str, silent: bool = False, store_history: bool = True,
                user_expressions: dict[str, str] | None = None, allow_stdin: bool = False,
                stop_on_error: bool = True) -> str:
        msg = self.session.msg("execute_request", {
            "code": code, "silent": silent, "store_history": store_history,
            "user_expressions": dict(user_expressions or {}), "allow_stdin": allow_stdin})
        self._link.submit(msg)
        return msg["header"]["msg_id"]

    def get_iopub_msg(self, timeout: float | None = None) -> dict[str, Any]:
        return self.iopub.get(timeout=timeout)

    def get_shell_msg(self, timeout: float | None = None) -> dict[str, Any]:
        return self.shell.get(timeout=timeout)

    def is_alive(self) -> bool:
        return self._link.is_alive()

    def wait_for_ready(self, timeout: float | None = None) -> None:
        if not self._link.is_alive():
            raise RuntimeError("the in-memory kernel is not running")

    def start_channels(self) -> None:
        return None

    def stop_channels(self) -> None:
        return None


class _Control:
    """``kc.control_channel``: interrupt and shutdown requests, answered at once."""

    def __init__(self, client: MemoryClient) -> None:
        self._client = client

    def send(self, msg: dict[str, Any]) -> None:
        link, kind = self._client._link, msg["msg_type"]
        if kind == "interrupt_request":
            link.interrupt()
        elif kind == "shutdown_request":
            if msg["content"].get("restart"):
                link.restart()
            else:
                link.close()
        self._client.control.put(_message(kind.replace("_request", "_reply"),
                                          {"status": "ok"}, msg["header"],
                                          self._client.session.session))

    def get_msg(self, timeout: float | None = None) -> dict[str, Any]:
        return self._client.control.get(timeout=timeout)


class _Heartbeat:
    def __init__(self, link: MemoryLink) -> None:
        self._link = link

    def is_beating(self) -> bool:
        return self._link.is_alive()


@functools.cache
def _shell_class() -> type:
    """An IPython shell whose display and errors become Jupyter messages (IPython is
    imported here, on first start: the kernel layer must not load it at import; the
    classes are made once per process, every start and restart reuses them)."""
    from ipykernel.compiler import XCachingCompiler  # heavy: only an in-memory kernel needs it
    from IPython.core.displayhook import DisplayHook  # heavy, as above
    from IPython.core.displaypub import DisplayPublisher  # heavy, as above
    from IPython.core.interactiveshell import InteractiveShell  # heavy, as above
    from traitlets import Any as AnyTrait  # with IPython, as above
    from traitlets import Type  # with IPython, as above

    class Hook(DisplayHook):
        """``execute_result`` instead of printing ``Out[n]:``."""

        def write_output_prompt(self) -> None:
            return None

        def write_format_data(self, format_dict: dict, md_dict: dict | None = None) -> None:
            self.shell.publish("execute_result", {
                "data": format_dict, "metadata": md_dict or {},
                "execution_count": self.prompt_count})

    class Publisher(DisplayPublisher):
        def publish(self, data: dict, metadata: dict | None = None, source: Any = None, *,
                    transient: dict | None = None, update: bool = False, **_: Any) -> None:
            self.shell.publish("update_display_data" if update else "display_data", {
                "data": data, "metadata": metadata or {}, "transient": transient or {}})

        def clear_output(self, wait: bool = False) -> None:
            self.shell.publish("clear_output", {"wait": wait})

    class Shell(InteractiveShell):
        compiler_class = Type(XCachingCompiler)
        displayhook_class = Type(Hook)
        display_pub_class = Type(Publisher)
        #: where messages go: set by the link per cell (called with type and content)
        publish = AnyTrait()

        def init_sys_modules(self) -> None:  # __main__ is swapped in per cell instead
            return None

        def _showtraceback(self, etype: type, evalue: BaseException, stb: list[str]) -> None:
            self.last_error = {"ename": etype.__name__, "evalue": str(evalue),
                               "traceback": list(stb)}
            self.publish("error", dict(self.last_error))

    return Shell


class MemoryLink:
    """The transport of an in-memory kernel (see the module docstring): the same duties
    as :class:`simagent.kernel.process.OwnedLink` and ``attach.AttachedLink``."""

    owned = True
    #: ``_out`` and figure summaries are installed at each start by the link itself
    needs_helpers = False

    def __init__(self, paths: SessionPaths, cwd: Path, extra_env: dict[str, str]) -> None:
        self.paths, self.cwd, self.extra_env = paths, cwd, dict(extra_env)
        self.kc: MemoryClient | None = None
        self._shell: Any = None
        self._requests: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._running: str | None = None  # msg_id of the cell being run
        self._alive = False
        self._stopped = "no kernel"

    @property
    def where(self) -> str:
        return "the in-memory kernel"

    # ------------------------------------------------------------------ life
    def start(self) -> None:
        self.kc = MemoryClient(self)
        self._new_shell()
        self._alive = True
        self._requests = queue.Queue()
        self._worker = threading.Thread(target=self._serve, args=(self._requests,),
                                        name="simagent-memory-kernel", daemon=True)
        self._worker.start()

    def _new_shell(self) -> None:
        from traitlets.config import Config  # with IPython (see _shell_class)

        config = Config()
        config.HistoryManager.enabled = False  # as the real kernel: no history file
        old, self._shell = self._shell, _shell_class()(config=config)
        self._shell.publish = self._drop
        with self._process_state():
            self._install_helpers()
        if old is not None:
            _dispose(old)

    def _install_helpers(self) -> None:
        """``_out`` and figure summaries, as simagent's launcher installs them in its own
        kernel (effects are not recorded here: see the module docstring)."""
        outputs.install(self._shell.user_ns, self._shell.user_ns_hidden)
        figures.install(self._shell)
        self._shell.events.register("post_execute", self._flush_figures)

    def _flush_figures(self) -> None:
        """Show and close the cell's open matplotlib figures, as the inline backend does."""
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None or not plt.get_fignums():
            return
        from IPython.core.display_functions import display  # with IPython (_shell_class)
        from IPython.core.pylabtools import select_figure_formats  # as above

        if not getattr(self._shell, "_figures_selected", False):  # once per shell
            select_figure_formats(self._shell, {"png"})
            self._shell._figures_selected = True
        try:
            for num in plt.get_fignums():
                display(plt.figure(num))
        finally:
            plt.close("all")

    def restart(self) -> bool:
        """A fresh namespace (the cell running now, if any, is interrupted first)."""
        self._stop_cell()
        self._requests.put(None)  # the old worker ends; start() makes a new one
        self.start()
        return True

    def close(self) -> None:
        self._stop_cell()
        self._requests.put(None)
        self._alive, self._stopped = False, "shut down"
        if self._shell is not None:
            _dispose(self._shell)
            self._shell = None

    def _stop_cell(self) -> None:
        deadline = time.monotonic() + STOP_WAIT_S
        while self._running is not None and time.monotonic() < deadline:
            self.interrupt()
            time.sleep(0.02)

    # ------------------------------------------------------------ the link API
    def process(self) -> None:
        return None

    @property
    def pid(self) -> None:
        """No process of its own: signals to a pid are skipped by the ladder."""
        return None

    def is_alive(self) -> bool:
        return self._alive

    def exit_reason(self) -> str:
        return self._stopped

    def interrupt(self) -> None:
        worker = self._worker
        if self._running is not None and worker is not None and worker.ident is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident),
                                                       ctypes.py_object(KeyboardInterrupt))

    def kill(self) -> None:
        """As SIGKILL would: the kernel is gone (its running cell is interrupted)."""
        self._alive, self._stopped = False, "killed (in-memory kernel)"
        self.interrupt()

    def ack(self, chars: int) -> None:
        return None

    def log_hint(self) -> str:
        return "the in-memory kernel keeps no log"

    def submit(self, msg: dict[str, Any]) -> None:
        self._requests.put(msg)

    # ------------------------------------------------------------- the worker
    def _drop(self, msg_type: str, content: dict[str, Any]) -> None:
        return None  # output of no cell (helpers at start)

    def _serve(self, requests: queue.Queue[dict[str, Any] | None]) -> None:
        while (msg := requests.get()) is not None:
            if not self._alive or requests is not self._requests:
                continue
            try:
                self._execute(msg)
            except BaseException:
                self._running = None

    def _execute(self, request: dict[str, Any]) -> None:
        kc, shell, content = self.kc, self._shell, request["content"]
        assert kc is not None
        parent = request["header"]

        def publish(msg_type: str, body: dict[str, Any]) -> None:
            if msg_type != "stream":  # what was printed before it comes first, as in ipykernel
                for stream in (sys.stdout, sys.stderr):
                    if isinstance(stream, _Stream):
                        stream.flush()
            kc.iopub.put(_message(msg_type, body, parent, kc.session.session))

        silent, store = bool(content.get("silent")), bool(content.get("store_history"))
        store = store and not silent
        count = shell.execution_count
        publish("status", {"execution_state": "busy"})
        if not silent:
            publish("execute_input", {"code": content["code"], "execution_count": count})
        shell.publish, shell.last_error = (publish if not silent else self._drop), None
        self._running = parent["msg_id"]
        try:
            with self._process_state(publish):
                result = shell.run_cell(content["code"], store_history=store, silent=silent)
                expressions = shell.user_expressions(content.get("user_expressions") or {})
        except KeyboardInterrupt:  # arrived outside run_cell's own handling
            result, expressions = None, {}
            shell.last_error = {"ename": "KeyboardInterrupt", "evalue": "", "traceback": []}
            publish("error", dict(shell.last_error))
        finally:
            self._running = None
            shell.publish = self._drop
        ok = result is not None and result.success
        reply: dict[str, Any] = {"status": "ok" if ok else "error", "execution_count": count,
                                 "user_expressions": expressions, "payload": []}
        if not ok:
            reply.update(shell.last_error or {"ename": "Error", "evalue": "", "traceback": []})
        kc.shell.put(_message("execute_reply", reply, parent, kc.session.session))
        publish("status", {"execution_state": "idle"})

    @contextmanager
    def _process_state(self, publish: Any = None) -> Iterator[None]:
        """This cell's view of process state, put back after (see the module docstring)."""
        from IPython.core.interactiveshell import InteractiveShell  # see _shell_class

        env = {SESSION_DIR_ENV: str(self.paths.root), **self.extra_env}
        with _CELL_LOCK:
            saved_env = {k: os.environ.get(k) for k in env}
            saved = (sys.stdout, sys.stderr, sys.modules.get("__main__"),
                     InteractiveShell._instance, os.getcwd())
            os.environ.update(env)
            streams = (_Stream("stdout", publish), _Stream("stderr", publish)) if publish else ()
            if streams:
                sys.stdout, sys.stderr = streams
            sys.modules["__main__"] = self._shell.user_module
            InteractiveShell._instance = self._shell  # display() and get_ipython() find it
            try:
                os.chdir(self.cwd)
                yield
            finally:
                for stream in streams:  # the cell's last words, before its reply
                    stream.flush()
                sys.stdout, sys.stderr = saved[0], saved[1]
                if saved[2] is not None:
                    sys.modules["__main__"] = saved[2]
                InteractiveShell._instance = saved[3]
                try:
                    os.chdir(saved[4])
                except OSError:
                    pass
                for key, value in saved_env.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value


def _dispose(shell: Any) -> None:
    """Let a shell's namespace go: IPython keeps every shell alive until exit (atexit)."""
    try:
        atexit.unregister(shell.atexit_operations)
        shell.user_ns.clear()
        shell.user_ns_hidden.clear()
    except Exception:  # a half-built shell: nothing more to free
        pass
