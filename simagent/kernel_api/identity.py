"""What a case function computes, as a hash: the function half of a case's cache key.

Reusing a stale result is the one failure the case cache must not have, so the key is
built from what the workers will actually run, and anything the key cannot see into
makes the sweep uncacheable (``Identity.problems``, shown as a note) instead of being
named by its type:

* Python functions of the kernel or of user code: their code objects, recursively
  (bytecode, constants including nested code, names, argument layout; not line
  numbers, so moving a function does not invalidate it), defaults, closure values,
  attributes and the globals they read.
* Values: JSON-like containers by content (set elements sorted, so the key does not
  depend on the hash seed; cycles cut), arrays by their bytes, user classes by their
  members, installed functions, classes and modules by name and package version, and
  every other object by a hash of its cloudpickle stream, in which the functions,
  classes, modules, sets and arrays it holds are again replaced by their tokens. An
  object that cannot be pickled cannot be hashed: problem.
* User modules (a ``.py`` file outside the standard library and site-packages, such as
  ``mysim.py`` in the workspace) exist twice: the code loaded in the kernel and the file
  on disk, which differ after an edit until ``importlib.reload``. A user module the
  function reaches as an object (``mysim.run(...)``, ``from mysim import run``) is
  keyed by its loaded members and listed in ``by_value``; the caller registers it with
  ``cloudpickle.register_pickle_by_value``, so workers (local ones that imported an
  older copy, remote ones without the file) run exactly the kernel's code. A user
  module that is imported *on the worker* (an ``import`` inside shipped code, or one
  that cannot be pickled by value) is keyed by the current source of its file and of
  the user modules that file imports, and listed in ``fresh`` so the runner re-imports
  it where a worker holds another version (``runner.run_case``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import site
import sys
import sysconfig
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simagent.kernel_api.code_refs import (
    const,
    global_names,
    imports,
    resolve_import,
    source_imports,
    unwrap,
)

_SIMPLE = (str, int, float, bool, type(None))
#: Compound tokens longer than this are replaced by their hash.
_LONG = 200
#: Class attributes that say nothing about behaviour (or cannot be pickled).
_CLASS_SKIP = frozenset({"__dict__", "__weakref__", "__module__", "__qualname__", "__doc__",
                         "_abc_impl"})


def sha(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8", "surrogatepass") if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()


@dataclass
class Identity:
    """A function's cache identity and what shipping it needs."""

    #: None when something the function reads cannot be hashed (see ``problems``).
    key: str | None
    problems: list[str] = field(default_factory=list)
    #: User modules to register with ``cloudpickle.register_pickle_by_value``.
    by_value: set[str] = field(default_factory=set)
    #: User modules imported on the workers: name -> sha256 of the file's source.
    fresh: dict[str, str] = field(default_factory=dict)
    #: Every user module met (the caller unregisters those not in ``by_value``).
    user_modules: set[str] = field(default_factory=set)


class Uncacheable(TypeError):
    """Raised by :func:`function_key` when the function cannot be hashed."""


def identify(fn: Callable[..., Any], *, by_value: bool = True) -> Identity:
    """The identity of ``fn`` (see the module docstring); ``by_value=False`` keys every
    user module as imported on the workers (the fallback when pickling by value fails)."""
    keyer = Keyer(by_value=by_value)
    token = keyer.safe_token(fn, "the function")
    key = None if keyer.problems else sha(token, *sorted(f"{k}={v}"
                                                          for k, v in keyer.fresh.items()))
    return Identity(key, keyer.problems, keyer.by_value, keyer.fresh, keyer.user_modules)


def function_key(fn: Callable[..., Any]) -> str:
    """The cache identity of ``fn``; raises :class:`Uncacheable` naming what blocks it."""
    ident = identify(fn)
    if ident.key is None:
        raise Uncacheable("; ".join(ident.problems))
    return ident.key


def value_token(value: Any) -> str:
    """A content token of one value (a case parameter); raises :class:`Uncacheable`."""
    keyer = Keyer(by_value=False)
    token = keyer.safe_token(value, "a case value")
    if keyer.problems:
        raise Uncacheable("; ".join(keyer.problems))
    return token


# ------------------------------------------------------------------ user modules
@functools.lru_cache(maxsize=1)
def _installed_roots() -> tuple[str, ...]:
    paths = set(sysconfig.get_paths().values())
    paths |= set(getattr(site, "getsitepackages", list)())
    paths.add(site.getusersitepackages())
    paths |= {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return tuple(sorted({os.path.realpath(p) for p in paths if p}))


def is_user_path(path: str | None) -> bool:
    """A ``.py`` file outside the interpreter's installation (workspace code)."""
    if not path or not path.endswith(".py"):
        return False
    real = os.path.realpath(path)
    return not any(real == root or real.startswith(root + os.sep) for root in _installed_roots())


def _not_user_name(name: str) -> bool:
    """The kernel's main module, and simagent itself (an editable install looks like
    workspace code by its path, but it is the tool, not the study)."""
    return name in ("__main__", "__mp_main__") or name.split(".")[0] == "simagent"


def is_user_module(mod: types.ModuleType) -> bool:
    name = getattr(mod, "__name__", "") or ""
    return not _not_user_name(name) and is_user_path(getattr(mod, "__file__", None))


def _find_file(name: str) -> str | None:
    """The file of module ``name`` without importing it (None when not found)."""
    mod = sys.modules.get(name)
    if mod is not None:
        return getattr(mod, "__file__", None)
    path = None
    parts = name.split(".")
    spec = None
    for i in range(len(parts)):
        full = ".".join(parts[: i + 1])
        parent = sys.modules.get(full)
        if parent is not None and i < len(parts) - 1:
            path = getattr(parent, "__path__", None)
            if path is None:
                return None
            continue
        try:
            spec = importlib.machinery.PathFinder.find_spec(full, path)
        except Exception:  # namespace packages and odd finders raise all sorts
            return None
        if spec is None:
            return None
        path = spec.submodule_search_locations
        if i < len(parts) - 1 and path is None:
            return None
    return spec.origin if spec is not None and spec.has_location else None


def _version(module_name: str) -> str:
    top = sys.modules.get(module_name.split(".")[0])
    return str(getattr(top, "__version__", ""))


def _lookup(mod: types.ModuleType, qualname: str) -> Any:
    obj: Any = mod
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


class _HashWriter:
    def __init__(self) -> None:
        self.h = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.h.update(data)
        return len(data)


@functools.lru_cache(maxsize=1)
def _hash_pickler_class() -> type:
    import cloudpickle  # with the first ensemble: kernel_api imports stay stdlib-only

    class HashPickler(cloudpickle.Pickler):
        """cloudpickle whose functions, classes, modules, sets and arrays become tokens."""

        def __init__(self, file: Any, keyer: Keyer, root: Any) -> None:
            super().__init__(file, protocol=5)
            self.keyer = keyer
            self.root = root

        def persistent_id(self, obj: Any) -> Any:
            if obj is self.root or type(obj) in _SIMPLE or not self.keyer.special(obj):
                return None
            return self.keyer.token(obj, None)

    return HashPickler


# ------------------------------------------------------------------------ keyer
class Keyer:
    """Walks a function and the values it reads, producing deterministic tokens."""

    def __init__(self, *, by_value: bool) -> None:
        self.by_value_ok = by_value
        self.memo: dict[int, str] = {}
        self.active: set[int] = set()
        self.alive: list[Any] = []  # keeps walked objects alive, so ids stay unique
        self.problems: list[str] = []
        self.by_value: set[str] = set()
        self.fresh: dict[str, str] = {}
        self.user_modules: set[str] = set()
        self._mode: dict[str, str] = {}  # user module -> "pending" | "value" | "fresh"
        self._where = "the function"
        self._scanned: set[str] = set()

    # ------------------------------------------------------------------ values
    def safe_token(self, value: Any, where: str) -> str:
        """:meth:`token`, with a structure too deep to walk as a problem, not a crash."""
        try:
            return self.token(value, where)
        except RecursionError:
            self.problems.append(f"{where} is nested too deeply to hash")
            return "deep"

    def token(self, value: Any, where: str | None) -> str:
        t = type(value)
        if t in _SIMPLE:
            return json.dumps(value)
        if t in (bytes, bytearray):
            return "b" + sha(bytes(value))
        if t is complex:
            return "j" + repr(value)
        oid = id(value)
        if oid in self.memo:
            return self.memo[oid]
        if oid in self.active:
            return "cycle"
        outer = self._where
        if where is not None:
            self._where = where
        self.active.add(oid)
        self.alive.append(value)
        try:
            tok = self._compound(value)
        finally:
            self.active.discard(oid)
            self._where = outer
        if len(tok) > _LONG:
            tok = tok[0] + sha(tok)
        self.memo[oid] = tok
        return tok

    def special(self, v: Any) -> bool:
        """Objects the pickle hash replaces by their own token."""
        return (isinstance(v, (set, frozenset, types.ModuleType, types.FunctionType,
                               types.MethodType, types.BuiltinFunctionType, type,
                               functools.partial, staticmethod, classmethod, property))
                or self._array(v) or unwrap(v) is not None)

    @staticmethod
    def _array(v: Any) -> bool:
        np = sys.modules.get("numpy")
        return np is not None and type(v) is np.ndarray and not v.dtype.hasobject

    def _compound(self, v: Any) -> str:
        t = type(v)
        if t is list or t is tuple:
            return ("L[" if t is list else "T[") + ",".join(self.token(x, None) for x in v) + "]"
        if t is set or t is frozenset:
            return "S[" + ",".join(sorted(self.token(x, None) for x in v)) + "]"
        if t is dict:
            return "D{" + ",".join(sorted(f"{self.token(k, None)}:{self.token(x, None)}"
                                         for k, x in v.items())) + "}"
        if isinstance(v, types.ModuleType):
            return self._module(v)
        if isinstance(v, types.FunctionType):
            return self._function(v)
        if isinstance(v, types.MethodType):
            return f"M({self.token(v.__func__, None)},{self.token(v.__self__, None)})"
        if isinstance(v, functools.partial):
            return (f"P({self.token(v.func, None)},{self.token(v.args, None)},"
                    f"{self.token(v.keywords, None)},{self.token(vars(v) or None, None)})")
        if isinstance(v, type):
            return self._class(v)
        if isinstance(v, types.BuiltinFunctionType):
            owner = v.__self__
            name = f"{getattr(v, '__module__', None)}.{v.__qualname__}"
            if owner is None or isinstance(owner, types.ModuleType):
                return f"B:{name}=={_version(getattr(owner, '__name__', '') or name)}"
            return f"BM:{name}({self.token(owner, None)})"
        if isinstance(v, (staticmethod, classmethod)):
            return f"{t.__name__}({self.token(v.__func__, None)})"
        if isinstance(v, property):
            return f"prop({self.token((v.fget, v.fset, v.fdel), None)})"
        if isinstance(v, (types.MemberDescriptorType, types.GetSetDescriptorType)):
            return f"slot:{v.__name__}"  # __slots__ entries: the name is all there is
        if self._array(v):  # every byte, however large (a copy only if not contiguous)
            arr = v if v.flags.c_contiguous else v.copy(order="C")
            raw = arr.reshape(-1).view("u1")  # any dtype, datetime64 included
            return f"A:{v.dtype.str}:{v.shape}:" + sha(memoryview(raw))  # type: ignore[arg-type]
        inner = unwrap(v)
        if inner is not None:  # lru_cache, functools.wraps objects, numba dispatchers
            params = getattr(v, "cache_parameters", None)
            return (f"W({t.__module__}.{t.__qualname__},{self.token(inner, None)},"
                    f"{self.token(params() if callable(params) else None, None)},"
                    f"{self._pickled(v, required=False)})")
        return self._pickled(v, required=True)

    def _pickled(self, v: Any, *, required: bool) -> str:
        writer = _HashWriter()
        try:
            _hash_pickler_class()(writer, self, v).dump(v)
        except Exception as exc:
            if required:
                self.problems.append(f"{self._where} holds a {type(v).__module__}."
                                     f"{type(v).__qualname__} that cannot be pickled "
                                     f"({type(exc).__name__}: {str(exc)[:120]})")
            return "unpicklable"
        return "O:" + writer.h.hexdigest()

    # --------------------------------------------------------------- functions
    def _library(self, obj: Any) -> bool:
        """Installed (not user or kernel) code, importable by its qualified name."""
        name = getattr(obj, "__module__", None)
        mod = sys.modules.get(name) if isinstance(name, str) else None
        if mod is None or name in ("__main__", "__mp_main__") or is_user_module(mod):
            return False
        return _lookup(mod, getattr(obj, "__qualname__", "")) is obj

    def _function(self, fn: types.FunctionType) -> str:
        if self._library(fn):
            return f"f:{fn.__module__}.{fn.__qualname__}=={_version(fn.__module__)}"
        self._user_module_of(fn)
        code = fn.__code__
        parts = ["F", self._code(code), self.token(fn.__defaults__, None),
                 self.token(fn.__kwdefaults__, None)]
        for cell in fn.__closure__ or ():
            try:
                parts.append(self.token(cell.cell_contents, None))
            except ValueError:  # an empty cell
                parts.append("empty")
        if vars(fn):
            parts.append(self.token(dict(vars(fn)), None))
        glob = fn.__globals__
        for name in sorted(global_names(code)):
            if name in glob:
                parts.append(f"{name}={self.token(glob[name], name)}")
        package = glob.get("__package__") or ""
        for name, level, fromlist in sorted(imports(code), key=repr):
            for module in resolve_import(name, level, fromlist, package):
                parts.append(f"import {module}={self._fresh_import(module)}")
        return "F" + sha(*parts)

    def _code(self, code: types.CodeType) -> str:
        consts = []
        for c in code.co_consts:
            consts.append(self._code(c) if isinstance(c, types.CodeType) else const(c))
        return sha(code.co_code, getattr(code, "co_exceptiontable", b""), repr(code.co_names),
                   repr(code.co_varnames), repr(code.co_freevars), repr(code.co_cellvars),
                   repr((code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
                         code.co_flags)), *consts)

    def _class(self, cls: type) -> str:
        if self._library(cls):
            return f"c:{cls.__module__}.{cls.__qualname__}=={_version(cls.__module__)}"
        self._user_module_of(cls)
        members = sorted(f"{k}={self.token(v, None)}" for k, v in vars(cls).items()
                         if k not in _CLASS_SKIP)
        meta = "" if type(cls) is type else self.token(type(cls), None)
        return "C" + sha(cls.__qualname__, meta, *(self.token(b, None) for b in cls.__bases__),
                         *members)

    # ----------------------------------------------------------------- modules
    def _module(self, mod: types.ModuleType) -> str:
        if not is_user_module(mod):
            return f"m:{mod.__name__}=={_version(mod.__name__)}"
        mode = self._classify(mod)
        if mode == "fresh":
            return f"UF:{mod.__name__}"
        members = sorted(f"{k}={self.token(v, None)}" for k, v in vars(mod).items()
                         if not (k.startswith("__") and k.endswith("__")))
        return "UM" + sha(mod.__name__, *members)

    def _user_module_of(self, obj: Any) -> None:
        mod = sys.modules.get(getattr(obj, "__module__", None) or "")
        if mod is not None and is_user_module(mod):
            self._classify(mod)

    def _classify(self, mod: types.ModuleType) -> str:
        """``value`` when the module's loaded members can be hashed (and so pickled by
        value), else ``fresh``; ``pending`` while its members are being walked."""
        name = mod.__name__
        self.user_modules.add(name)
        mode = self._mode.get(name)
        if mode is not None:
            return mode
        if not self.by_value_ok:
            self._mode[name] = "fresh"
            self._add_fresh(name, mod.__file__)
            return "fresh"
        self._mode[name] = "pending"
        before = len(self.problems)
        outer = self._where
        self._where = f"module {name}"
        try:
            for k, v in sorted(vars(mod).items()):
                if not (k.startswith("__") and k.endswith("__")):
                    self.token(v, None)
        finally:
            self._where = outer
        if len(self.problems) == before:
            self._mode[name] = "value"
            self.by_value.add(name)
            return "value"
        del self.problems[before:]
        self._mode[name] = "fresh"
        self._add_fresh(name, mod.__file__)
        return "fresh"

    def _fresh_import(self, name: str) -> str:
        """Token of a module imported on the worker: its file's source, if user code."""
        if _not_user_name(name):
            return "-"
        path = _find_file(name)
        if not is_user_path(path):
            return "-"
        self.user_modules.add(name)
        return self._add_fresh(name, path)

    def _add_fresh(self, name: str, path: str | None) -> str:
        if name in self.fresh:
            return self.fresh[name]
        try:
            with open(path or "", "rb") as fh:
                source = fh.read()
        except OSError as exc:
            self.problems.append(f"module {name}: cannot read {path} ({exc})")
            return "unreadable"
        digest = self.fresh[name] = hashlib.sha256(source).hexdigest()
        if name not in self._scanned:  # the user modules its file imports, transitively
            self._scanned.add(name)
            is_package = os.path.basename(path or "") == "__init__.py"
            package = name if is_package else name.rpartition(".")[0]
            for imported, level, fromlist in source_imports(source):
                for module in resolve_import(imported, level, fromlist, package):
                    self._fresh_import(module)
        return digest
