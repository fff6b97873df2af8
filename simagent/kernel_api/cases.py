"""Pure parts of ``ensemble``: case lists, cache keys and result rows (no dask, no pandas).

Cache key of a case: sha256 of the function's identity and the case's canonical JSON
(sorted keys), so the same case of the same function hits the cache and anything else
misses. The function's identity is its source (bytecode when there is no source), its
defaults, the values in its closure, and the simple globals (numbers, strings,
containers of them, arrays) and helper functions of the same module it reads; objects
the key cannot see into are named by type only, which the ensembles skill says.
Reusing a stale result is the one failure a cache must not have, so when in doubt a
value changes the key.
"""

from __future__ import annotations

import dis
import functools
import hashlib
import inspect
import json
import marshal
import re
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

#: Columns every result table ends with, in this order.
META_COLUMNS = ("status", "error", "elapsed_s", "attempts", "cached")
#: Column for a result that is not a mapping.
RESULT_COLUMN = "result"
_ARRAY_HASH_LIMIT = 64 << 20
_SIMPLE = (str, int, float, bool, type(None))


def normalize_cases(cases: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The cases as a list of plain dicts with string keys; a clear error otherwise."""
    if isinstance(cases, (Mapping, str, bytes)):
        raise TypeError("cases must be a list of dicts, one per case, e.g. "
                        "[{'T': 900}, {'T': 1000}]")
    if hasattr(cases, "to_dict") and hasattr(cases, "columns"):  # a DataFrame of cases
        cases = cases.to_dict("records")
    out = []
    for i, case in enumerate(cases):
        if not isinstance(case, Mapping):
            raise TypeError(f"case {i} is a {type(case).__name__}, not a dict: each case is "
                            "a dict of keyword arguments for the function")
        bad = [k for k in case if not isinstance(k, str) or not k.isidentifier()]
        if bad:
            raise TypeError(f"case {i}: keys must be valid argument names, got {bad[:3]}")
        out.append(dict(case))
    return out


def safe_name(name: str) -> str:
    """A folder-safe sweep name (``<lambda>`` -> ``lambda``)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._-")
    return cleaned[:80] or "ensemble"


def _json_default(value: Any) -> Any:
    if hasattr(value, "dtype") and hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if isinstance(value, bytes):
        return value.hex()
    return f"<{type(value).__module__}.{type(value).__qualname__}>{value!r}"


def canonical(value: Any) -> str:
    """Deterministic JSON of a case or value (sorted keys, numpy as lists)."""
    return json.dumps(value, sort_keys=True, default=_json_default, separators=(",", ":"))


def _sha(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8", "surrogatepass") if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()


def _value_token(value: Any, seen: set[int]) -> str:
    """What a global or closure value contributes to a function's identity."""
    if isinstance(value, _SIMPLE):
        return canonical(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        return "[" + ",".join(_value_token(v, seen) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k!r}:{_value_token(v, seen)}"
                              for k, v in sorted(value.items(), key=lambda kv: repr(kv[0])))+"}"
    if isinstance(value, types.ModuleType):
        return f"module:{value.__name__}:{getattr(value, '__version__', '')}"
    if callable(value) and (inspect.isfunction(value) or isinstance(value, functools.partial)):
        return function_key(value, seen)
    nbytes = getattr(value, "nbytes", None)
    if hasattr(value, "tobytes") and hasattr(value, "dtype") and isinstance(nbytes, int) \
            and nbytes <= _ARRAY_HASH_LIMIT:
        return _sha(str(value.dtype), str(getattr(value, "shape", "")), value.tobytes())
    return f"opaque:{type(value).__module__}.{type(value).__qualname__}"


def _global_names(code: types.CodeType) -> set[str]:
    """Names a code object (and the code nested in it) loads as globals."""
    names = {ins.argval for ins in dis.get_instructions(code)
             if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and isinstance(ins.argval, str)}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def function_key(fn: Callable[..., Any], _seen: set[int] | None = None) -> str:
    """A stable hash of what ``fn`` computes (see the module docstring)."""
    seen = set() if _seen is None else _seen
    if id(fn) in seen:
        return "recursive"
    seen.add(id(fn))
    if isinstance(fn, functools.partial):
        return _sha("partial", function_key(fn.func, seen),
                    _value_token(list(fn.args), seen), _value_token(dict(fn.keywords), seen))
    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else type(fn)
    func = getattr(target, "__func__", target)
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError):
        code = getattr(func, "__code__", None)
        source = marshal.dumps(code).hex() if code is not None else repr(func)
    parts = [source]
    code = getattr(func, "__code__", None)
    if code is not None:
        parts.append(_value_token(getattr(func, "__defaults__", None), seen))
        parts.append(_value_token(getattr(func, "__kwdefaults__", None), seen))
        cells = getattr(func, "__closure__", None) or ()
        for cell in cells:
            try:
                parts.append(_value_token(cell.cell_contents, seen))
            except ValueError:  # an empty cell
                parts.append("empty")
        glob = getattr(func, "__globals__", {})
        for name in sorted(_global_names(code)):
            if name in glob:
                parts.append(f"{name}={_value_token(glob[name], seen)}")
    return _sha(*parts)


def case_key(fn_key: str, case: Mapping[str, Any]) -> str:
    """The cache key of one case of one function."""
    return _sha(fn_key, canonical(dict(case)))[:24]


def result_columns(result: Any, taken: Iterable[str]) -> dict[str, Any]:
    """A case's result as table columns: a mapping's keys, else one ``result`` column.

    A key that clashes with a parameter or a meta column gets a ``result_`` prefix.
    """
    taken = set(taken) | set(META_COLUMNS)
    if hasattr(result, "to_dict") and not hasattr(result, "columns"):  # a pandas Series
        result = result.to_dict()
    if isinstance(result, Mapping):
        out = {}
        for key, value in result.items():
            col = str(key)
            out[f"result_{col}" if col in taken else col] = value
        return out
    return {RESULT_COLUMN if RESULT_COLUMN not in taken else "result_value": result}


def table_rows(cases: list[dict[str, Any]], records: list[dict[str, Any]]
               ) -> tuple[list[str], list[dict[str, Any]]]:
    """Columns (parameters, result fields, meta) and one row per case, in case order."""
    params: list[str] = []
    for case in cases:
        params += [k for k in case if k not in params]
    results: list[str] = []
    rows = []
    for case, rec in zip(cases, records, strict=True):
        fields = result_columns(rec.get("result"), params) if rec.get("status") == "ok" else {}
        results += [k for k in fields if k not in results]
        rows.append({**case, **fields, "status": rec.get("status", "cancelled"),
                     "error": rec.get("error", ""), "elapsed_s": rec.get("elapsed_s"),
                     "attempts": rec.get("attempts", 0), "cached": bool(rec.get("cached"))})
    return params + results + list(META_COLUMNS), rows
