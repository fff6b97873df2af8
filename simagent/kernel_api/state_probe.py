"""What the kernel holds, read from inside it for the state card (issue 15, item 2).

After a compaction the model has lost the prose that said which names exist; the live
kernel still knows. :func:`probe` walks the user namespace once and returns plain data
(JSON-ready): each user-defined name with its type and shape/dtype/len (numpy, pandas,
xarray and containers by duck typing, so this module needs nothing beyond the standard
library and can be sent as source to any Python kernel), the imports, the functions and
classes defined in the session, and the objects of the simulator's own registry with the
fields its ``simulator.toml`` names. It reads attributes only: it never converts, copies
or prints an array, so probing a kernel holding gigabytes costs milliseconds.

The host evaluates :func:`expression` as a silent ``user_expressions`` entry, so nothing
is added to the namespace, the history or the execution count.

A string's value is written only when :func:`string_shown` allows it (issue 40, defect
5): the card goes into every model request and into the checkpoints, and a variable
such as ``db_password`` is never printed, so redaction (which matches known values)
cannot catch it. The decision is made here, inside the kernel, so a hidden value never
leaves it.
"""

from __future__ import annotations

import json
import math
import re
import sys
import types
from pathlib import Path

#: Names every IPython namespace has that the user did not define.
_IPYTHON_NAMES = frozenset({"In", "Out", "get_ipython", "exit", "quit", "open"})
#: Most names reported; the card trims further to its token budget.
MAX_NAMES = 200
_SHORT = 60
#: Longest string whose value the card may show; a longer one is shown by its length.
SHOWN_STRING_CHARS = 40
#: ``scheme://user:password@host``: a URL that carries a password.
_URL_PASSWORD = re.compile(r"://[^/\s:@]*:[^/\s@]+@")
#: A long unbroken run of base64/hex characters: how API keys, tokens and hashes look.
_TOKEN_RUN = re.compile(r"[A-Za-z0-9+/=]{16,}")


def string_shown(name: str, value: str, secret_name: re.Pattern[str]) -> bool:
    """Whether the card may show the string ``value`` held by ``name`` verbatim.

    Only when nothing suggests a secret: the name does not look like one (``secret_name``
    is the host's credential-name rule, ``trace.redact``), nor does the value (it names
    no credential word, is no URL with a password, has no run of 16+ base64/hex
    characters with a digit in it, as keys and tokens do), and it is short. Values like
    ``'Chen2020 1C'`` or ``'h2o2.yaml'`` stay readable; everything else is shown by type
    and length, which is what the model needs to use the name.
    """
    if len(value) > SHOWN_STRING_CHARS or secret_name.search(name) or secret_name.search(value):
        return False
    if _URL_PASSWORD.search(value):
        return False
    return not any(any(c.isdigit() for c in run) for run in _TOKEN_RUN.findall(value))


def _string(name: str, value: str, secret_name: re.Pattern[str]) -> str:
    """A string as the card says it: ``= 'value'``, or ``(24 chars)``."""
    if string_shown(name, value, secret_name):
        return f"= {value!r}"
    return f"({len(value)} chars)"


def _short(text: str, limit: int = _SHORT) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _number(v: object) -> str:
    if isinstance(v, str):
        return _short(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return _short(repr(v))
    if isinstance(v, float):
        return repr(v) if not math.isfinite(v) else f"{v:.6g}"
    return str(v)


def _type_name(v: object) -> str:
    cls = type(v)
    top = (cls.__module__ or "").split(".")[0]
    return cls.__name__ if top in ("builtins", "__main__", "") else f"{top}.{cls.__name__}"


def _shape(v: object, var: str, secret_name: re.Pattern[str]) -> tuple[str, int]:
    """(description, approximate bytes) of ``v``, held by the name ``var``, without
    touching the data."""
    cls = type(v)
    mod = (cls.__module__ or "").split(".")[0]
    name = cls.__name__
    try:
        if mod == "numpy" and hasattr(v, "shape") and hasattr(v, "dtype"):
            if getattr(v, "ndim", 1) == 0:  # a numpy scalar: its value is the fact
                item = v.item()
                shown = _string(var, item, secret_name) if isinstance(item, str) else \
                    f"= {_number(item)}"
                return shown, int(getattr(v, "nbytes", 8))
            return f"{tuple(v.shape)} {v.dtype}", int(v.nbytes)
        if mod == "pandas" and name == "DataFrame":
            cols = [str(c) for c in list(v.columns)[:6]]
            more = f", +{len(v.columns) - 6}" if len(v.columns) > 6 else ""
            size = int(v.memory_usage(index=True, deep=False).sum())
            return f"{tuple(v.shape)} columns [{', '.join(cols)}{more}]", size
        if mod == "pandas" and name == "Series":
            label = f" '{v.name}'" if v.name is not None else ""
            return f"len {len(v)} {v.dtype}{label}", int(v.memory_usage(index=True, deep=False))
        if mod == "xarray" and name == "DataArray":
            dims = ", ".join(f"{d}={n}" for d, n in zip(v.dims, v.shape, strict=False))
            return f"({dims}) {v.dtype}", int(v.nbytes)
        if mod == "xarray" and name == "Dataset":
            dims = ", ".join(f"{d}={n}" for d, n in dict(v.sizes).items())
            names = ", ".join(str(k) for k in list(v.data_vars)[:6])
            return f"({dims}) vars [{names}]", int(v.nbytes)
    except Exception:  # a half-built object must not break the probe
        return "", sys.getsizeof(v)
    if isinstance(v, (bool, int, float, complex)) or v is None:
        return f"= {_number(v)}", sys.getsizeof(v)
    if isinstance(v, str):
        return _string(var, v, secret_name), sys.getsizeof(v)
    if isinstance(v, dict):
        keys = ", ".join(_short(repr(k), 20) for k in list(v)[:5])
        more = ", …" if len(v) > 5 else ""
        return f"len {len(v)} keys [{keys}{more}]", sys.getsizeof(v)
    if isinstance(v, (list, tuple, set, frozenset)):
        inner = {type(x).__name__ for x in list(v)[:50]} if not isinstance(v, set) else set()
        of = f" of {inner.pop()}" if len(inner) == 1 else ""
        return f"len {len(v)}{of}", sys.getsizeof(v)
    try:
        n = len(v)  # type: ignore[arg-type]
    except Exception:
        return "", sys.getsizeof(v)
    return f"len {n}", sys.getsizeof(v)


def _matches(v: object, type_path: str) -> bool:
    """``"pybamm.Solution"`` matches any class in ``v``'s MRO named Solution from pybamm."""
    top, _, cls_name = type_path.rpartition(".")
    for cls in type(v).__mro__:
        module = cls.__module__ or ""
        if cls.__name__ == cls_name and (module == top or module.startswith(top + ".")):
            return True
    return False


def _fields(v: object, fields: dict, secret_name: re.Pattern[str]) -> list[list[str]]:
    out = []
    for label, expr in fields.items():
        try:
            value = eval(expr, {"__builtins__": __builtins__}, {"obj": v})
        except Exception:
            continue  # a field the object lacks is left out, not reported as an error
        shown = _number(value) if not isinstance(value, str) or string_shown(
            str(label), value, secret_name) else f"str ({len(value)} chars)"
        out.append([str(label), shown])
    return out


def _is_user(name: str, value: object, hidden: dict) -> bool:
    if name.startswith("_") or name in _IPYTHON_NAMES:
        return False
    return not (name in hidden and hidden[name] is value)


def probe(ns: dict, hidden: dict, registry: list | None = None,
          max_names: int = MAX_NAMES, secret_name: str = "(?!)") -> dict:
    """Plain-data picture of ``ns`` (IPython's ``user_ns``; ``hidden``: ``user_ns_hidden``).

    ``registry``: ``[{"type": "pkg.Class", "label": str, "fields": {label: expr}}]``; a
    field's expression sees the object as ``obj``. ``secret_name``: the host's pattern of
    credential-like names (:func:`string_shown`).
    """
    secret = re.compile(secret_name, re.IGNORECASE)
    names, imports, functions = [], [], []
    registry = list(registry or [])
    for name, value in list(ns.items()):
        if not _is_user(name, value, hidden):
            continue
        if isinstance(value, types.ModuleType):
            mod = value.__name__
            imports.append(name if mod == name else f"{name}={mod}")
            continue
        if isinstance(value, (types.FunctionType, type)) and getattr(
                value, "__module__", "") == "__main__":
            functions.append(name)
            continue
        if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type)):
            imports.append(name)  # from x import f: as good as an import
            continue
        desc, size = _shape(value, name, secret)
        entry = {"name": name, "type": _type_name(value), "desc": desc, "bytes": int(size)}
        for reg in registry:
            if _matches(value, str(reg.get("type", ""))):
                entry["registry"] = str(reg.get("label") or reg.get("type"))
                entry["fields"] = _fields(value, dict(reg.get("fields") or {}), secret)
                break
        names.append(entry)
    # the simulator's own objects first (small in bytes, large in meaning), then by size
    names.sort(key=lambda e: ("registry" not in e, -e["bytes"], e["name"]))
    return {"names": names[:max_names], "more_names": max(0, len(names) - max_names),
            "imports": sorted(imports), "functions": sorted(functions)}


def probe_json(ns: dict, hidden: dict, registry_json: str = "[]",
               secret_name: str = "(?!)") -> str:
    return json.dumps(probe(ns, hidden, json.loads(registry_json), secret_name=secret_name),
                      default=str)


def expression(registry: list | None, secret_name: str) -> str:
    """One expression that defines this module in a throwaway namespace and probes with it.

    Evaluated as a ``user_expressions`` entry: its value (a JSON string) comes back in the
    execute reply, and nothing is left behind in the kernel. ``secret_name`` is the
    host's credential-name pattern (this module runs in kernels without simagent, so it
    is sent, not imported).
    """
    source = Path(__file__).read_text(encoding="utf-8")
    reg = json.dumps(registry or [])
    return ("(lambda _g: (exec(compile(" + repr(source) + ", 'simagent_state_probe', 'exec'), "
            "_g), _g['probe_json'](get_ipython().user_ns, get_ipython().user_ns_hidden, "
            + repr(reg) + ", " + repr(secret_name) + "))[1])"
            "({'__name__': 'simagent_state_probe'})")
