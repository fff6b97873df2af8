"""What a function's code refers to (pure, standard library only): the function inside a
wrapper, constants as stable text, the global names and imports its bytecode uses, and
the modules a source file imports. ``identity.Keyer`` hashes a function with these.
"""

from __future__ import annotations

import ast
import dis
import importlib.util
import inspect
import types
from typing import Any


def unwrap(v: Any) -> Any:
    """The function inside a wrapper object (not a plain function), else None.

    Only a real ``__wrapped__`` (``functools.update_wrapper`` puts it in the instance
    dict) or a class-level ``py_func`` (numba) counts: objects that answer any attribute
    through ``__getattr__`` (proxies, ``dask.delayed``) would otherwise unwrap forever.
    """
    if isinstance(v, (types.FunctionType, type)):
        return None
    try:
        attrs = object.__getattribute__(v, "__dict__")
    except Exception:
        attrs = None
    inner = attrs.get("__wrapped__") if isinstance(attrs, dict) else None
    if inner is None and inspect.getattr_static(type(v), "py_func", None) is not None:
        try:
            inner = v.py_func
        except Exception:
            inner = None
    return inner if callable(inner) else None


def const(c: Any) -> str:
    if isinstance(c, (tuple, frozenset)):
        items = [const(x) for x in c]
        if isinstance(c, frozenset):
            items.sort()
        return f"{type(c).__name__}({','.join(items)})"
    return f"{type(c).__name__}:{c!r}"


def global_names(code: types.CodeType) -> set[str]:
    """Names a code object (and the code nested in it) loads as globals."""
    names = {ins.argval for ins in dis.get_instructions(code)
             if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS")
             and isinstance(ins.argval, str)}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= global_names(const)
    return names


def imports(code: types.CodeType) -> set[tuple[str, int, tuple[str, ...]]]:
    """``(name, level, fromlist)`` of every import statement in the code, nested too."""
    found = set()
    consts: list[Any] = []
    for ins in dis.get_instructions(code):
        if ins.opname == "IMPORT_NAME":
            level = consts[-2] if len(consts) >= 2 and isinstance(consts[-2], int) else 0
            fromlist = consts[-1] if consts and isinstance(consts[-1], tuple) else ()
            found.add((ins.argval, level, tuple(x for x in fromlist if isinstance(x, str))))
        consts = [*consts[-1:], ins.argval] if ins.opname == "LOAD_CONST" else []
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= imports(const)
    return found


def source_imports(source: bytes) -> list[tuple[str, int, tuple[str, ...]]]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, 0, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.module or "", node.level, tuple(a.name for a in node.names)))
    return out


def resolve_import(name: str, level: int, fromlist: tuple[str, ...], package: str
                    ) -> list[str]:
    """The modules an import statement may load: the name, its parents, submodules."""
    if level:
        try:
            name = importlib.util.resolve_name("." * level + name, package)
        except (ImportError, ValueError):
            return []
    if not name:
        return []
    parts = name.split(".")
    out = [".".join(parts[: i + 1]) for i in range(len(parts))]
    out += [f"{name}.{item}" for item in fromlist if item != "*"]
    return out
