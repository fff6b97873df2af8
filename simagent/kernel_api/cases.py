"""Pure parts of ``ensemble``: case lists, cache keys and result rows (no dask, no pandas).

Cache key of a case: sha256 of the function's identity (``identity.identify``: what the
workers will run, or no key at all when something cannot be hashed) and the case's
canonical text (sorted keys; JSON for numbers, strings and containers of them, where a
NumPy scalar equals the Python number; any other value by its content token, never by
its ``repr``, which holds memory addresses or truncates). Reusing a stale result is the
one failure a cache must not have, so when in doubt a value changes the key, and a hit
is used only when the stored case equals the requested one (:func:`same_case`).
"""

from __future__ import annotations

import json
import pickle
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from simagent.kernel_api.identity import Uncacheable, sha, value_token

#: Columns every result table ends with, in this order.
META_COLUMNS = ("status", "error", "elapsed_s", "attempts", "cached")
#: Column for a result that is not a mapping.
RESULT_COLUMN = "result"
_SIMPLE = (str, int, float, bool, type(None))


def normalize_cases(cases: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The cases as a list of plain dicts with string keys; a clear error otherwise.

    A parameter may not be named like a meta column: the table would silently replace
    its values with the status, error, ... of the case.
    """
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
        clash = [k for k in case if k in META_COLUMNS]
        if clash:
            raise ValueError(f"case {i}: parameter name {clash[0]!r} is reserved for the "
                             f"result table's own columns ({', '.join(META_COLUMNS)}); "
                             "rename the function's argument")
        out.append(dict(case))
    return out


def safe_name(name: str) -> str:
    """A folder-safe sweep name (``<lambda>`` -> ``lambda``)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._-")
    return cleaned[:80] or "ensemble"


def _case_value(v: Any) -> str:
    t = type(v)
    if t in _SIMPLE:
        return json.dumps(v)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(v, np.generic):
        item = v.item()
        if type(item) in _SIMPLE:
            return json.dumps(item)
    if t is list:
        return "[" + ",".join(_case_value(x) for x in v) + "]"
    if t is tuple:
        return "(" + ",".join(_case_value(x) for x in v) + ")"
    if t is dict and all(type(k) is str for k in v):
        return "{" + ",".join(f"{json.dumps(k)}:{_case_value(x)}"
                              for k, x in sorted(v.items())) + "}"
    return "#" + value_token(v)  # arrays, sets, mixed keys, objects: by content


def canonical(case: Mapping[str, Any]) -> str:
    """Deterministic text of a case; raises ``Uncacheable`` for a value it cannot hash."""
    return _case_value(dict(case))


def case_key(fn_key: str, case: Mapping[str, Any]) -> str:
    """The cache key of one case of one function (raises ``Uncacheable``)."""
    return sha(fn_key, canonical(case))[:24]


def same_case(a: Any, b: Any) -> bool:
    """True when a stored case equals the requested one (NaN equals NaN; arrays and
    other objects compare by value, or by their pickles when ``==`` is not a bool)."""
    if a is b:
        return True
    if type(a) is not type(b):
        np = sys.modules.get("numpy")
        numbers = (int, float, bool) + ((np.generic,) if np is not None else ())
        if not (isinstance(a, numbers) and isinstance(b, numbers)):
            return False
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_case(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_case(x, y) for x, y in zip(a, b, strict=True))
    try:
        eq = a == b
        if isinstance(eq, bool) or getattr(eq, "shape", None) == ():  # NumPy bools too
            return bool(eq)
    except Exception:
        pass
    try:
        return value_token(a) == value_token(b)
    except Uncacheable:
        try:
            return pickle.dumps(a) == pickle.dumps(b)
        except Exception:
            return False


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
