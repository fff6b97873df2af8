"""What a cell did outside the kernel's memory: files written or deleted, processes started.

Replay after a kernel restart (:mod:`simagent.kernel.replay`) re-runs earlier cells; a
cell that appended to ``results.csv`` would append again. So each execution's record
(``outputs/NNNN.json``, key ``effects``) lists its *effects*, seen from inside the kernel
by a Python audit hook (:pep:`578`; the events are :data:`_HANDLERS`' keys). ``pathlib``,
``numpy.savetxt``, pandas' ``to_csv``, ``shutil.copyfile`` and ``%%writefile`` go
through ``open`` and are seen.

Not seen (documented limits): writes by native code that opens files itself (HDF5,
NetCDF, a compiled simulator), what a started process or a forked child then does,
what a thread the cell started does after the cell ended, network traffic, and what a
library does while it is imported (caches, ``find_library``'s processes; a module in
the kernel's folder is recorded). Noise left out: the kernel's own files (the session
folder, IPython's), caches (``~/.cache``, matplotlib's, ``__pycache__``), ``/dev``,
``/proc``, ``/sys``, and what the ``tempfile`` module makes: a replay makes new names,
clobbering none (a temp file moved into place is a write of its new name).

One home for the format, both sides: the kernel half (:func:`install`) collects events
between ``pre_run_cell`` and ``post_run_cell``, folds them (:func:`fold`) and writes them
to ``<session>/kernel.effects.json`` before the cell's reply (a cell with none writes
nothing); the supervisor
(:func:`take`) moves them into the execution's record; :func:`describe` words them for
the recovery account, ``/restore`` and the state card. Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import tempfile
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

SESSION_DIR_ENV = "SIMAGENT_SESSION_DIR"  # simagent.paths.SESSION_DIR_ENV (kernel side)
#: The kernel's hand-over file, in the session folder.
EFFECTS_FILE = "kernel.effects.json"
#: Record key.
KEY = "effects"
#: Effects kept per execution; the rest are counted (one ``more`` effect).
MAX_EFFECTS = 200
#: Raw events kept per cell; past it a cell only counts them (a ``more`` effect).
MAX_EVENTS = 5000

#: Effect kinds with their verbs (present: what a replay would do; past: what a cell
#: did). ``write``: the whole file (truncated or created first); ``modify``: in place
#: (``r+``, ``os.truncate``); ``rename``/``link`` carry ``to``; ``database``: an SQLite
#: file opened (it may be written); ``process``: ``command``; ``signal``: ``pid``;
#: ``more``: ``count`` operations past the caps, not recorded.
VERBS = {
    "write": ("writes", "wrote"), "append": ("appends", "appended"),
    "modify": ("modifies", "modified"), "delete": ("deletes", "deleted"),
    "rename": ("renames", "renamed"), "folder": ("creates folder", "created folder"),
    "database": ("opens database", "opened database"), "process": ("runs", "ran"),
    "signal": ("signals process", "signalled process"), "link": ("links", "linked"),
    "more": ("does more file operations", "did more file operations"),
}

_NOISE_PREFIXES = ("/dev/", "/proc/", "/sys/")
_OPENS = frozenset({"write", "create", "append", "modify"})
_ACCESS = os.O_WRONLY | os.O_RDWR
_O_TMPFILE = getattr(os, "O_TMPFILE", 0)


# ----------------------------------------------------------------- words (both sides)
def describe(effect: Mapping[str, Any], base: str | os.PathLike[str] | None = None,
             past: bool = False) -> str:
    """``appends results.csv`` (``past``: ``appended results.csv``); paths inside
    ``base`` are shown relative to it."""
    kind = str(effect.get("kind") or "?")
    verb = VERBS.get(kind, (kind, kind))[1 if past else 0]
    if kind == "process":
        times = int(effect.get("times") or 1)
        return f"{verb} `{effect.get('command') or '?'}`" + (f" ({times} times)"
                                                            if times > 1 else "")
    if kind == "signal":
        return f"{verb} {effect.get('pid')}"
    if kind == "more":
        return f"{verb} ({effect.get('count')} not recorded)"
    what = shown_path(str(effect.get("path") or "?"), base)
    if kind in ("rename", "link"):
        return f"{verb} {what} to {shown_path(str(effect.get('to') or '?'), base)}"
    return f"{verb} {what}"


def describe_all(effects: Iterable[Mapping[str, Any]], base: Any = None,
                 past: bool = False, limit: int = 3) -> str:
    """Several effects in one phrase: ``appends results.csv, runs `sim` (+2 more)``."""
    items = list(effects)
    words = [describe(e, base, past) for e in items[:limit]]
    more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
    return ", ".join(words) + more


def shown_path(path: str, base: str | os.PathLike[str] | None = None) -> str:
    if base:
        try:
            rel = os.path.relpath(path, base)
        except ValueError:
            rel = ""
        if rel and not rel.startswith(".."):
            return rel
    home = os.path.expanduser("~")
    if home not in ("", "/") and path.startswith(home + os.sep):
        return "~" + path[len(home):]
    return path


def of(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An execution record's effects (none for records written before effects existed)."""
    return [e for e in record.get(KEY) or [] if isinstance(e, dict)]


# ------------------------------------------------------------------ folding (pure)
def fold(events: Iterable[tuple[str, str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One effect per path from a cell's raw events, in order of first touch.

    Each event is ``(op, path, extra)``: ``op`` one of ``write`` (truncating open),
    ``create`` (a new file: ``O_EXCL``), ``append``, ``modify``, ``delete``, ``tree``
    (``rmtree``), ``rename``/``link`` (``extra["to"]``), ``folder``, ``database``,
    ``process``, ``signal``. ``extra["existed"]``: whether a written path existed before.
    A file the cell made and removed again leaves nothing; a file written whole and then
    renamed (the atomic-write pattern) is a ``write`` of its new name.
    """
    state: dict[str, dict[str, Any]] = {}
    others: list[dict[str, Any]] = []

    def entry(path: str) -> dict[str, Any]:
        return state.setdefault(path, {"kind": None, "made": False, "existed": True})

    for op, path, extra in events:
        if op in ("process", "signal"):
            others.append({"kind": op, **extra})
            continue
        e = entry(path)
        whole = e["kind"] == "write"
        if op in ("write", "create"):
            if e["kind"] is None:
                e["existed"] = bool(extra.get("existed", op == "write"))
                e["made"] = not e["existed"]
            e["kind"] = "write" if e["kind"] in (None, "write", "delete") else e["kind"]
        elif op in ("append", "modify"):  # after a truncation or a delete: still whole
            e["kind"] = "write" if whole or e["kind"] == "delete" else (e["kind"] or op)
        elif op in ("delete", "tree"):
            known = e["kind"] is not None or _under_made(state, path)
            for p in [p for p in state if p == path or p.startswith(path.rstrip("/") + "/")]:
                if state[p]["made"]:
                    del state[p]  # made and removed by this cell: no trace outside
                else:
                    state[p]["kind"] = "delete"
            if op == "tree" and not known:
                state[path] = {"kind": "delete", "made": False, "existed": True}
        elif op in ("rename", "link"):
            to = str(extra.get("to") or "")
            if op == "rename" and whole:  # written whole, then moved into place
                state.pop(path)
                if not e["made"]:
                    state[path] = {"kind": "delete", "made": False, "existed": True}
                dst = entry(to)
                dst.update(kind="write", made=dst["made"] or dst["kind"] is None)
            else:
                e.update(kind=op, to=to)
        elif op in ("folder", "database") and e["kind"] is None:
            e.update(kind=op, made=op == "folder")
    out = [{"kind": s["kind"], "path": p, **({"to": s["to"]} if "to" in s else {})}
           for p, s in state.items() if s["kind"] is not None]
    seen: dict[str, dict[str, Any]] = {}
    for o in others:  # a pool's forks: one effect, counted
        key = json.dumps(o, sort_keys=True, default=str)
        if key in seen:
            seen[key]["times"] = seen[key].get("times", 1) + 1
        else:
            seen[key] = dict(o)
    return out + list(seen.values())


def _under_made(state: Mapping[str, Mapping[str, Any]], path: str) -> bool:
    return any(s["made"] and s["kind"] == "folder" and (path == p or path.startswith(p + "/"))
               for p, s in state.items())


def finish(effects: list[dict[str, Any]]) -> dict[str, Any]:
    """The record's ``effects`` list with sizes of written files; past
    :data:`MAX_EFFECTS` the rest are one ``more`` effect, which no replay repeats (what
    it stands for is unknown)."""
    if len(effects) > MAX_EFFECTS:
        rest = sum(int(e.get("count") or 1) if e["kind"] == "more" else 1
                   for e in effects[MAX_EFFECTS - 1:])
        effects = [*effects[:MAX_EFFECTS - 1], {"kind": "more", "count": rest}]
    for e in effects:
        if e["kind"] == "write":
            try:
                e["bytes"] = os.path.getsize(e["path"])
            except OSError:
                e["bytes"] = None
    return {KEY: effects}


# ------------------------------------------------------------ supervisor side
def take(session_dir: Path, pid: int | None, count: int | None) -> list[dict[str, Any]]:
    """The effects the kernel ``pid`` wrote for execution ``count``; the file is removed
    so a later execution cannot be given them. [] when there are none."""
    path = os.path.join(session_dir, EFFECTS_FILE)
    try:  # os.open: most cells have no effects, and a missing file costs 4 us, not 22
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_CLOEXEC), encoding="utf-8") as fh:
            data = json.load(fh)
        os.unlink(path)
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict) or data.get("pid") != pid or data.get("count") != count:
        return []
    return [e for e in data.get(KEY) or [] if isinstance(e, dict)]


# ------------------------------------------------------------------ kernel side
class Recorder:
    """The audit hook's state: records only while a stored cell runs (any thread)."""

    def __init__(self, session_dir: str | None, ignore: Iterable[str]) -> None:
        self.session_dir = session_dir
        self.ignore = tuple(sorted({_norm(p).rstrip("/") + "/" for p in ignore if p}))
        tempfile.gettempdir()  # cached now: its first call writes a probe file
        self.home = os.getcwd().rstrip("/") + "/"
        self.active = False
        self.events: list[tuple[str, str, dict[str, Any]]] = []
        self.fresh: list[str] = []  # made new by the tempfile module this cell
        self.dropped = 0  # events past MAX_EVENTS
        self.last: dict[str, str] = {}  # each path's latest recorded operation
        self.local = threading.local()
        self.lock = threading.Lock()

    # -- the hook ------------------------------------------------------------
    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active:
            return
        handler = _HANDLERS.get(event)
        if handler is None or getattr(self.local, "busy", False):
            return
        self.local.busy = True  # what the hook does itself (stat, frames) is not audited
        try:
            item = handler(self, args)
            if item is not None:
                self._keep(*item)
        except Exception:  # a hook that raises would fail the user's call
            pass
        finally:
            self.local.busy = False

    def _keep(self, op: str, path: str, extra: dict[str, Any]) -> None:
        if op == "rename" and self._noise(path) and not self._noise(extra["to"]):
            to = extra["to"]  # a temp file moved into place: a whole write of its target
            op, path, extra = "write", to, {"existed": os.path.lexists(to)}
        # the same operation again on a path (a loop reopening one file) folds to
        # nothing new: skip it before the stack walks, which cost the most
        if op not in ("process", "signal") and (self._noise(path)
                                                or self.last.get(path) == op):
            return
        if len(self.events) >= MAX_EVENTS:
            with self.lock:
                self.dropped += 1
            return
        if _importing(self.home) or (op in _OPENS and os.path.isdir(path)):
            return  # a folder "opened": tempfile's opener makes the real file
        if op == "write" and "existed" not in extra:
            extra = {"existed": os.path.lexists(path)}
        if op in ("create", "folder") and _on_stack(_TEMPFILE):
            self.fresh.append(path.rstrip("/") + "/")
            return
        with self.lock:
            self.events.append((op, path, extra))
            self.last[path] = op

    def _noise(self, path: str) -> bool:
        if path.startswith(_NOISE_PREFIXES) or "/__pycache__/" in path:
            return True
        p = path.rstrip("/") + "/"
        return p.startswith(self.ignore) or any(p.startswith(f) for f in self.fresh)

    # -- cell boundaries -----------------------------------------------------
    def pre_run_cell(self, info: Any = None) -> None:
        with self.lock:
            self.events, self.fresh, self.dropped, self.last = [], [], 0, {}
        self.active = bool(getattr(info, "store_history", True))

    def post_run_cell(self, result: Any = None) -> None:
        if not self.active:
            return
        self.active = False
        with self.lock:
            events, dropped = list(self.events), self.dropped
        if not events and not dropped:
            return  # nothing to hand over: take() reads a missing file as none (and
            # the write is ~0.3 ms of a ~6 ms round trip, ``simagent bench kernel``)
        count = getattr(result, "execution_count", None)
        self.local.busy = True
        try:
            done = fold(events) + ([{"kind": "more", "count": dropped}] if dropped else [])
            self.write(count, finish(done))
        finally:
            self.local.busy = False

    def write(self, count: int | None, data: dict[str, Any]) -> None:
        """Hand the effects to the supervisor (private, and deleted as it reads them)."""
        if not self.session_dir:
            return
        path = os.path.join(self.session_dir, EFFECTS_FILE)
        try:  # a key in a command line: redacted where simagent is importable
            from simagent.trace.redact import redact_data  # in the try: the kernel may lack it

            data = redact_data(data)
        except Exception:
            pass
        try:
            fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"pid": os.getpid(), "count": count, **data}, fh, default=str)
            os.replace(path + ".tmp", path)
        except OSError:
            pass


def _norm(path: Any) -> str:
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    return os.path.abspath(os.fspath(path))


def _on_stack(match: Any) -> bool:
    """Whether a frame on the calling stack has a file name ``match`` accepts."""
    f = sys._getframe(1)
    while f is not None:
        if match(f.f_code.co_filename):
            return True
        f = f.f_back
    return False


_TEMPFILE = re.compile(r"(^|/)tempfile\.py$").search


def _importing(mine: str) -> bool:
    """Whether the event comes from a library being imported: importlib's frames are
    reached before any frame of a file in ``mine``, the folder the kernel started in (a
    module of the user's own that writes when imported is recorded)."""
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if name.startswith("<frozen importlib._bootstrap"):
            return True
        if name.startswith(mine) and "/site-packages/" not in name:  # not a .venv inside
            return False
        f = f.f_back
    return False


def _path_arg(value: Any, dir_fd: Any = None) -> str | None:
    """An absolute path, or None for a file descriptor or a path relative to a dir_fd
    (``rmtree``'s inner calls: the tree itself is recorded once)."""
    if isinstance(value, int) or value is None or dir_fd not in (None, -1):
        return None
    return _norm(value)


def _on_open(rec: Recorder, args: tuple[Any, ...]) -> tuple[str, str, dict] | None:
    path, _mode, flags = (*args, None, None, 0)[:3]
    flags = int(flags or 0)
    if not flags & _ACCESS or (_O_TMPFILE and flags & _O_TMPFILE == _O_TMPFILE):
        return None  # read-only, or an unnamed temp file
    p = _path_arg(path)
    if p is None:
        return None
    if flags & os.O_EXCL:
        return "create", p, {"existed": False}
    if flags & os.O_TRUNC:
        return "write", p, {}  # existed: looked up by _keep, only when it is kept
    if flags & os.O_APPEND:
        return "append", p, {}
    return "modify", p, {}


def _process(args: Any) -> tuple[str, str, dict]:
    """A started process, named by its command line (one line, 80 characters at most)."""
    if isinstance(args, bytes):
        args = os.fsdecode(args)
    if isinstance(args, (list, tuple)):
        args = shlex.join(os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in args)
    text = " ".join(str(args).split())
    return "process", "", {"command": text if len(text) <= 80 else text[:79] + "…"}


def _file_op(op: str, dir_fd_at: int | None = 1):
    def handler(rec: Recorder, args: tuple[Any, ...]):
        fd = args[dir_fd_at] if dir_fd_at is not None and len(args) > dir_fd_at else None
        p = _path_arg(args[0], fd)
        return None if p is None else (op, p, {})
    return handler


def _two_paths(op: str):
    def handler(rec: Recorder, args: tuple[Any, ...]):
        fds = [a for a in args[2:4] if isinstance(a, int)]
        src, dst = _path_arg(args[0]), _path_arg(args[1])
        if src is None or dst is None or any(fd != -1 for fd in fds):
            return None
        return op, src, {"to": dst}
    return handler


def _database(rec: Recorder, args: tuple[Any, ...]):
    """An SQLite file opened writable (a ``file:`` URI with ``mode=ro`` is a read)."""
    db = os.fsdecode(args[0]) if args and isinstance(args[0], (str, bytes, os.PathLike)) else ""
    if db.startswith("file:"):
        db, _, query = db[5:].partition("?")
        if "mode=ro" in query or "immutable=1" in query or "mode=memory" in query:
            return None
    return None if db in ("", ":memory:") else ("database", _norm(db), {})


def _fork() -> tuple[str, str, dict]:
    """A fork: IPython's ``!cmd`` (its ``system`` frame holds the command) or another
    fork of the kernel (multiprocessing, a native library)."""
    f = sys._getframe(3)
    while f is not None:
        cmd = f.f_locals.get("cmd") if f.f_code.co_name.startswith("system") else None
        if isinstance(cmd, str):
            return _process(cmd)
        f = f.f_back
    return _process("a fork of the kernel")


def _signal(target: Any, own: int, what: str = "") -> tuple[str, str, dict] | None:
    """A signal to another process (the kernel's own pid/group is ipykernel's interrupt
    handling, or a cell stopping itself: nothing outside)."""
    if target in (own, 0) or (not what and _child(target)):
        return None
    return "signal", "", {"pid": f"{what}{target}"}


def _child(pid: Any) -> bool:
    """Whether ``pid`` is the kernel's own child (a pool worker the cell started)."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[1]) == os.getpid()
    except (OSError, ValueError, IndexError):
        return False


_HANDLERS = {
    "open": _on_open,
    "os.remove": _file_op("delete"),
    "os.rmdir": _file_op("delete"),
    "shutil.rmtree": _file_op("tree"),
    "os.truncate": _file_op("modify", None),
    "os.mkdir": _file_op("folder", 2),
    "os.rename": _two_paths("rename"),
    "os.link": _two_paths("link"),
    "os.symlink": lambda rec, a: (None if _path_arg(a[1]) is None else
                                  ("link", _path_arg(a[1]), {"to": os.fsdecode(a[0])})),
    "sqlite3.connect": _database,
    "subprocess.Popen": lambda rec, a: _process(a[1]),
    "os.system": lambda rec, a: _process(a[0]),
    "os.exec": lambda rec, a: _process(a[1]),
    "os.spawn": lambda rec, a: _process(a[2]),
    "os.posix_spawn": lambda rec, a: _process(a[1]),
    "os.fork": lambda rec, a: _fork(),
    "os.forkpty": lambda rec, a: _fork(),
    "os.kill": lambda rec, a: _signal(a[0], os.getpid()),
    "os.killpg": lambda rec, a: _signal(a[0], os.getpgrp(), "group "),
}

_recorder: Recorder | None = None


def _audit(event: str, args: tuple[Any, ...], _handled: Mapping[str, Any] = _HANDLERS) -> None:
    """The audit hook. Python calls it for every audited operation in the kernel, most of
    them none of ours (``id()``, ``sys._getframe``, ``compile``, attribute reads): one
    dict lookup in a plain function dismisses those (~0.2 us a call; a bound method
    that looked further cost ~0.7 us, paid by every ``id()`` of every cell)."""
    if event in _handled and _recorder is not None:
        _recorder.hook(event, args)


def ignored_roots(shell: Any = None) -> list[str]:
    """Folders whose files are the kernel's own or caches (see the module docstring)."""
    home = os.path.expanduser("~")
    roots = [os.environ.get(SESSION_DIR_ENV) or "",
             os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"),
             os.environ.get("MPLCONFIGDIR") or os.path.join(home, ".config", "matplotlib"),
             os.environ.get("IPYTHONDIR") or os.path.join(home, ".ipython"),
             os.environ.get("JUPYTER_RUNTIME_DIR") or "",
             getattr(shell, "ipython_dir", None) or "",
             getattr(getattr(shell, "profile_dir", None), "location", None) or ""]
    return [r for r in roots if r]


def install(shell: Any) -> Recorder | None:
    """Add the audit hook and the cell hooks (once per process; an audit hook cannot be
    removed, so a second call reuses the first recorder)."""
    global _recorder
    if _recorder is None:
        _recorder = Recorder(os.environ.get(SESSION_DIR_ENV), ignored_roots(shell))
        sys.addaudithook(_audit)
    shell.events.register("pre_run_cell", _recorder.pre_run_cell)
    shell.events.register("post_run_cell", _recorder.post_run_cell)
    return _recorder
