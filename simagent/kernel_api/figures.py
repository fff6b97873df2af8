"""Figures as a budgeted resource: content-addressed files plus a data summary for the model.

An image costs a multimodal model hundreds of tokens and a text-only model nothing useful,
while most questions about a plot ("did it converge?", "what is the peak?") are answered by
the numbers behind it. So every figure is stored once under a content hash
(``fig-<sha256[:8]>``) and the model gets one caption line plus a compact summary read from
the figure *object*: per axes the title, labels (where the units are), ranges and scales;
per series its label, point count, x range and y min/max/last. ``view_figure(id)`` sends
the image itself when the model can see images and the summary is not enough.

Two halves live here so they agree on one format:

* kernel side: :func:`install` registers an IPython display formatter for
  :data:`FIGURE_MIME`, so the inline backend's own flush sends the summary in the same
  ``display_data`` message as the PNG (no second render, no extra message);
* client side: :func:`figure_id`, :func:`render_caption` and :func:`parse_captions` turn
  that summary and the image bytes into the model's text, and the TUI finds figures again.

Standard library only, matplotlib by duck typing (numpy used only if already imported):
kernels started by name get this module's source in a silent cell, whatever their
environment holds.
"""

from __future__ import annotations

import hashlib
import math
import re
import sys
from typing import Any

#: The display_data mime type carrying a figure's data summary (a JSON object).
FIGURE_MIME = "application/vnd.simagent.figure+json"
#: Bounds on a summary: axes per figure, series per axes, text annotations per axes.
MAX_AXES = 8
MAX_SERIES = 6
MAX_TEXTS = 3
MAX_CATEGORIES = 6
#: A rendered summary never exceeds this many characters (the caption line excluded).
MAX_SUMMARY_CHARS = 1500
_LABEL_CHARS = 60
#: Collection class names (less "Collection", lower case) as the summary names them.
_KINDS = {"path": "scatter", "quadmesh": "mesh", "fillbetweenpoly": "fill_between",
          "quadcontourset": "contour", "contourset": "contour"}
_ID_RE = re.compile(r"^fig-[0-9a-f]{8,64}$")
#: One caption line; ``parse_captions`` relies on this shape (id, size, path last).
_CAPTION_RE = re.compile(
    r"^\[figure (?P<id>fig-[0-9a-f]{8,64})(?: (?P<w>\d+)x(?P<h>\d+))?(?P<dup> \(same as [^)]*\))?"
    r": (?P<path>[^\]\n]+)\]", re.M)


# ------------------------------------------------------------------ identity (both sides)
def figure_id(blob: bytes, length: int = 8) -> str:
    """``fig-`` plus the first ``length`` hex digits of the image's sha256."""
    return "fig-" + hashlib.sha256(blob).hexdigest()[:length]


def is_figure_id(text: str) -> bool:
    return bool(_ID_RE.match(text or ""))


# ------------------------------------------------------------------------- kernel side
def install(shell: Any) -> bool:
    """Register the summary formatter on an IPython shell (idempotent; False if it failed).

    Matplotlib's inline backend removes every ``Figure`` printer from every formatter when
    it activates (``select_figure_formats``), so this formatter does not register a type:
    it recognises figures by duck typing at call time and survives that reset.
    """
    try:
        from IPython.core.formatters import BaseFormatter  # kernel side: simagent needs no IPython
        from traitlets import ObjectName, Unicode  # kernel side, as above
    except ImportError:
        return False
    formatters = shell.display_formatter.formatters
    if FIGURE_MIME in formatters:
        return True

    class FigureSummaryFormatter(BaseFormatter):
        format_type = Unicode(FIGURE_MIME)
        print_method = ObjectName("_repr_simagent_figure_")

        def __call__(self, obj: Any) -> Any:
            if not self.enabled or not is_matplotlib_figure(obj):
                return None
            try:
                return summarize(obj)
            except Exception:  # a summary must never break the display of the figure
                return None

    formatters[FIGURE_MIME] = FigureSummaryFormatter(parent=shell.display_formatter)
    return True


def is_matplotlib_figure(obj: Any) -> bool:
    cls = type(obj)
    return (cls.__module__.split(".")[0] == "matplotlib" and hasattr(obj, "get_axes")
            and hasattr(obj, "savefig"))


def summarize(fig: Any, max_axes: int = MAX_AXES, max_series: int = MAX_SERIES) -> dict:
    """A bounded, JSON-able description of a matplotlib figure's content."""
    out: dict[str, Any] = {}
    title = _suptitle(fig)
    if title:
        out["title"] = title
    axes = [ax for ax in fig.get_axes() if _call(ax, "get_visible", True)]
    plots = [ax for ax in axes if not hasattr(ax, "_colorbar")]
    bars = [ax for ax in axes if hasattr(ax, "_colorbar")]
    out["axes"] = [_axes(ax, max_series) for ax in plots[:max_axes]]
    if len(plots) > max_axes:
        out["more_axes"] = len(plots) - max_axes
    cbars = [c for c in (_colorbar(ax) for ax in bars) if c]
    if cbars:
        out["colorbars"] = cbars[:max_axes]
    return out


def _call(obj: Any, name: str, default: Any = None, *args: Any) -> Any:
    fn = getattr(obj, name, None)
    if not callable(fn):
        return default
    try:
        return fn(*args)
    except Exception:
        return default


def _text(value: Any) -> str:
    text = " ".join(str(value or "").split())
    return text if len(text) <= _LABEL_CHARS else text[: _LABEL_CHARS - 1] + "…"


def _suptitle(fig: Any) -> str:
    title = _call(fig, "get_suptitle")
    if title is None:  # matplotlib < 3.8
        title = _call(getattr(fig, "_suptitle", None), "get_text", "")
    return _text(title)


def _axes(ax: Any, max_series: int) -> dict:
    info: dict[str, Any] = {}
    titles = [_text(_call(ax, "get_title", "", loc)) for loc in ("left", "center", "right")]
    if any(titles):
        info["title"] = " | ".join(t for t in titles if t)
    for axis in ("x", "y", "z"):
        if not hasattr(ax, f"get_{axis}label"):
            continue
        label = _text(_call(ax, f"get_{axis}label", ""))
        lim = _call(ax, f"get_{axis}lim")
        scale = _call(ax, f"get_{axis}scale", "linear")
        entry: dict[str, Any] = {}
        if label:
            entry["label"] = label
        if lim is not None:
            entry["lim"] = [_num(lim[0]), _num(lim[1])]
        if scale and scale != "linear":
            entry["scale"] = scale
        units = _call(getattr(ax, f"{axis}axis", None), "get_units")
        mapping = getattr(units, "_mapping", None)  # a categorical axis (strings plotted)
        if isinstance(mapping, dict) and mapping:
            names = [_text(k) for k in list(mapping)[:MAX_CATEGORIES]]
            entry["categories"] = names + ([f"+{len(mapping) - len(names)}"]
                                           if len(mapping) > len(names) else [])
        info[axis] = entry
    series = _series(ax)
    info["series"] = series[:max_series]
    if len(series) > max_series:
        info["more_series"] = len(series) - max_series
    texts = [_text(_call(t, "get_text", "")) for t in getattr(ax, "texts", [])]
    texts = [t for t in texts if t]
    if texts:
        info["texts"] = texts[:MAX_TEXTS]
    return info


def _label(artist: Any) -> str | None:
    label = str(_call(artist, "get_label", "") or "")
    return None if not label or label.startswith("_") else _text(label)


def _series(ax: Any) -> list[dict]:
    out: list[dict] = []
    data_transform = getattr(ax, "transData", None)
    for line in _call(ax, "get_lines", []) or []:
        if str(_call(line, "get_label", "")) == "_nolegend_":
            continue  # errorbar caps and the like
        x, y = _values(_call(line, "get_xdata")), _values(_call(line, "get_ydata"))
        if _call(line, "get_transform") is not data_transform and len(x) == 2 == len(y):
            if y[0] == y[1] and isinstance(y[0], float):  # axhline
                out.append(_drop_none({"kind": "hline", "label": _label(line), "y": _num(y[0])}))
                continue
            if x[0] == x[1] and isinstance(x[0], float):  # axvline
                out.append(_drop_none({"kind": "vline", "label": _label(line), "x": _num(x[0])}))
                continue
        out.append(_xy("line", _label(line), x, y))
    for container in getattr(ax, "containers", []) or []:
        patches = getattr(container, "patches", None)
        lines = getattr(container, "lines", None)
        if patches:
            horizontal = getattr(container, "orientation", "vertical") == "horizontal"
            pos = [(_call(p, "get_y", 0.0) + _call(p, "get_height", 0.0) / 2) if horizontal
                   else (_call(p, "get_x", 0.0) + _call(p, "get_width", 0.0) / 2)
                   for p in patches]
            val = [_call(p, "get_width" if horizontal else "get_height") for p in patches]
            out.append(_xy("barh" if horizontal else "bar", _label(container), _values(pos),
                           _values(val)))
        elif lines and lines[0] is not None:  # errorbar: its data line is unlabelled
            line = lines[0]
            out.append(_xy("errorbar", _label(container), _values(_call(line, "get_xdata")),
                           _values(_call(line, "get_ydata"))))
    for coll in getattr(ax, "collections", []) or []:
        if (str(_call(coll, "get_label", "")) == "_nolegend_"
                and getattr(coll, "levels", None) is None):
            continue  # errorbar bars and the like
        out.append(_collection(coll))
    for image in getattr(ax, "images", []) or []:
        out.append(_image(image))
    return out


def _xy(kind: str, label: str | None, x: list, y: list) -> dict:
    item: dict[str, Any] = {"kind": kind}
    if label:
        item["label"] = label
    item["n"] = len(y)
    xs = _finite(x)
    if xs:
        item["x"] = [_num(min(xs)), _num(max(xs))]
    elif x and not isinstance(x[0], float):
        item["x"] = [_text(x[0]), _text(x[-1])]  # categories or dates, in plot order
    ys = _finite(y)
    if ys:
        item["y"] = [_num(min(ys)), _num(max(ys))]
        last = y[-1]
        item["last"] = _num(last) if isinstance(last, float) and math.isfinite(last) else None
    return _drop_none(item)


def _collection(coll: Any) -> dict:
    kind = type(coll).__name__.replace("Collection", "").lower() or "collection"
    item: dict[str, Any] = {"kind": _KINDS.get(kind, kind)}
    if label := _label(coll):
        item["label"] = label
    offsets = _call(coll, "get_offsets")
    pts = _points(offsets)
    if len(pts) > 1 or item["kind"] == "scatter":
        item["n"] = len(pts)
        xs, ys = _finite([p[0] for p in pts]), _finite([p[1] for p in pts])
        if xs:
            item["x"] = [_num(min(xs)), _num(max(xs))]
        if ys:
            item["y"] = [_num(min(ys)), _num(max(ys))]
    elif item["kind"] == "fill_between":
        ys = _finite(_path_values(coll, 1))
        if ys:
            item["y"] = [_num(min(ys)), _num(max(ys))]
    levels = getattr(coll, "levels", None)
    if levels is not None:
        lv = _finite(_values(levels))
        if lv:
            item["levels"] = [len(lv), _num(min(lv)), _num(max(lv))]
    else:
        _add_value_range(item, _call(coll, "get_array"))
    return item


def _path_values(coll: Any, column: int, limit: int = 100_000) -> list:
    """One coordinate of a collection's path vertices (bounded), in data units."""
    out: list = []
    for path in _call(coll, "get_paths", []) or []:
        vertices = getattr(path, "vertices", None)
        if vertices is None or len(out) > limit:
            break
        out.extend(_values(vertices[:, column]) if hasattr(vertices, "shape") else [])
    return out


def _image(image: Any) -> dict:
    item: dict[str, Any] = {"kind": "image"}
    if label := _label(image):
        item["label"] = label
    array = _call(image, "get_array")
    shape = getattr(array, "shape", None)
    if shape is not None:
        item["shape"] = list(shape)
    extent = _call(image, "get_extent")
    if extent is not None and len(extent) == 4:
        item["x"] = [_num(extent[0]), _num(extent[1])]
        item["y"] = [_num(extent[2]), _num(extent[3])]
    if shape is not None and len(shape) == 2:
        _add_value_range(item, array)
    return item


def _colorbar(ax: Any) -> dict | None:
    cb = getattr(ax, "_colorbar", None)
    label = _text(_call(ax, "get_ylabel", "")) or _text(_call(ax, "get_xlabel", ""))
    norm = getattr(cb, "norm", None)
    lo, hi = getattr(norm, "vmin", None), getattr(norm, "vmax", None)
    item: dict[str, Any] = {}
    if label:
        item["label"] = label
    if isinstance(lo, int | float) and isinstance(hi, int | float):
        item["range"] = [_num(lo), _num(hi)]
    return item or None


def _add_value_range(item: dict, array: Any) -> None:
    if array is None:
        return
    vals = _finite(_values(array))
    if vals:
        item["values"] = [_num(min(vals)), _num(max(vals))]


def _values(data: Any) -> list:
    """A flat list: floats where the data is numeric, else the items as they are."""
    if data is None:
        return []
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            arr = np.ma.asarray(data)
            if arr.dtype.kind in "biuf":
                flat = np.ma.filled(arr.astype(float), np.nan).ravel()
                return flat.tolist()
            if arr.dtype.kind == "M":
                return [str(v) for v in arr.ravel().tolist()]
            return list(arr.ravel().tolist())
        except Exception:
            pass
    try:
        items = list(data)
    except TypeError:
        return [data]
    out: list = []
    for v in items:
        try:
            out.append(float(v))
        except (TypeError, ValueError):
            out.append(v)
    return out


def _points(offsets: Any) -> list[tuple[Any, Any]]:
    """Scatter offsets as (x, y) pairs; masked or missing coordinates become NaN."""
    if offsets is None:
        return []
    flat = _values(offsets)
    if len(flat) % 2:
        return []
    return [(_as_float(flat[i]), _as_float(flat[i + 1])) for i in range(0, len(flat), 2)]


def _as_float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _finite(values: list) -> list[float]:
    return [v for v in values if isinstance(v, float) and math.isfinite(v)]


def _num(v: Any) -> Any:
    """Four significant digits, as a float or int (JSON-able)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return _text(v)
    if not math.isfinite(f):
        return str(f)
    if f == int(f) and abs(f) < 1e15:
        return int(f)
    return float(f"{f:.4g}")


def _drop_none(item: dict) -> dict:
    return {k: v for k, v in item.items() if v is not None}


# ------------------------------------------------------------------------- client side
def render_caption(fid: str, path: str, size: tuple[int, int] | None = None,
                   summary: dict | None = None, same_as: str | None = None,
                   label: str = "") -> str:
    """The model's text for one figure: a caption line, then the data summary.

    ``same_as`` (where the identical image was first shown, e.g. ``_out[3]``) marks a
    duplicate: the caption alone, since the summary was already given there.
    """
    dims = f" {size[0]}x{size[1]}" if size else ""
    dup = f" (same as {fid} from {same_as}, stored once)" if same_as else ""
    head = f"[figure {fid}{dims}{dup}: {path}]"
    if label:
        head += f" ({_text(label)})"
    if same_as or not summary:
        return head
    body = render_summary(summary)
    return f"{head}\n{body}" if body else head


def render_summary(summary: dict, max_chars: int = MAX_SUMMARY_CHARS) -> str:
    """Indented lines: figure title, one per axes, one per series (bounded)."""
    lines: list[str] = []
    if title := summary.get("title"):
        lines.append(f"  title {_quoted(title)}")
    axes = summary.get("axes") or []
    for i, ax in enumerate(axes):
        name = f"axes {i + 1}" if len(axes) > 1 else "axes"
        head = f"  {name}" + (f" {_quoted(ax['title'])}" if ax.get("title") else "") + ":"
        parts = [_axis_text(axis, ax[axis]) for axis in ("x", "y", "z") if axis in ax]
        lines.append(f"{head} {', '.join(p for p in parts if p)}".rstrip(": ")
                     if parts else head.rstrip(":"))
        lines += [f"    {_series_text(s)}" for s in ax.get("series") or []]
        if more := ax.get("more_series"):
            lines.append(f"    … {more} more series not summarised")
        if texts := ax.get("texts"):
            lines.append("    text: " + "; ".join(_quoted(t) for t in texts))
    if more := summary.get("more_axes"):
        lines.append(f"  … {more} more axes not summarised")
    for cb in summary.get("colorbars") or []:
        rng = cb.get("range")
        lines.append("  colorbar" + (f" {_quoted(cb['label'])}" if cb.get("label") else "")
                     + (f" {_range_text(rng)}" if rng else ""))
    text = "\n".join(lines)
    if len(text) > max_chars:
        cut = text[:max_chars].rsplit("\n", 1)[0]
        text = f"{cut}\n  … (summary cut at {max_chars} chars)"
    return text


def _quoted(text: Any) -> str:
    return '"' + str(text).replace('"', "'") + '"'


def _range_text(pair: list) -> str:
    return f"{_fmt(pair[0])}…{_fmt(pair[1])}"


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _axis_text(axis: str, entry: dict) -> str:
    out = axis
    if entry.get("label"):
        out += f" {_quoted(entry['label'])}"
    if entry.get("lim"):
        out += f" {_range_text(entry['lim'])}"
    if entry.get("categories"):
        out += " [" + ", ".join(entry["categories"]) + "]"
    if entry.get("scale"):
        out += f" ({entry['scale']})"
    return out if out != axis else ""


def _series_text(s: dict) -> str:
    kind = s.get("kind", "series")
    out = kind + (f" {_quoted(s['label'])}" if s.get("label") else "")
    if kind in ("hline", "vline"):
        axis = "y" if kind == "hline" else "x"
        return f"{out} at {axis}={_fmt(s.get(axis))}"
    bits = []
    if "n" in s:
        bits.append(f"{s['n']} {'bars' if kind.startswith('bar') else 'pts'}")
    if "shape" in s:
        bits.append("x".join(str(d) for d in s["shape"]))
    if "x" in s:
        bits.append(f"x {_range_text(s['x'])}")
    if "y" in s:
        y = f"{'value' if kind.startswith('bar') else 'y'} {_range_text(s['y'])}"
        if s.get("last") is not None and kind == "line":
            y += f" last {_fmt(s['last'])}"
        bits.append(y)
    if "values" in s:
        bits.append(f"values {_range_text(s['values'])}")
    if "levels" in s:
        n, lo, hi = s["levels"]
        bits.append(f"{n} levels {_fmt(lo)}…{_fmt(hi)}")
    return out + (": " + ", ".join(bits) if bits else "")


def figure_title(summary: dict) -> str | None:
    """What a figure is called: its suptitle, else its axes' titles (state card, trace)."""
    if summary.get("title"):
        return str(summary["title"])
    titles = [str(ax["title"]) for ax in summary.get("axes") or [] if ax.get("title")]
    return " / ".join(titles[:3]) or None


def parse_captions(text: str) -> list[dict[str, Any]]:
    """The figures named in a model text: ``[{id, path, size, duplicate}]`` in order."""
    found = []
    for m in _CAPTION_RE.finditer(text or ""):
        size = (int(m["w"]), int(m["h"])) if m["w"] else None
        found.append({"id": m["id"], "path": m["path"].strip(), "size": size,
                      "duplicate": bool(m["dup"])})
    return found
