"""Structural digests of long kernel output (issue 15, item 3).

When a ``run_python`` result is over the tool cap the model used to get only its head
and tail, so everything in the middle of a long solver log (the shape of a step table,
a warning at step 4,000, the final row of the third relaxation) was reachable only by
paging the raw file. A digest says what the middle held in a few hundred tokens: runs of
lines that share a shape (the same text once numbers are masked) collapse into one
summary per table (rows, the first and last row verbatim, per column first -> last and
any interior min/max with where it happened), while warnings, errors and final lines are
kept verbatim, each with its line number (``_out[n].slice`` pages back what surrounds
it). Short tables (results: one row per metal, per C-rate) stay verbatim, since
collapsing them would lose the numbers a user asked for.

Simulator folders add knowledge through :class:`Rules` (which lines are warnings, which
are log noise to count, column names of known row formats, which columns matter) and
declare their digester in ``simulator.toml`` (``digest = "digest:digest"``: a function
``(lines, max_chars) -> str`` in ``digest.py`` beside it); :data:`GENERIC` serves every
other simulator. Everything here is pure and deterministic (the bench replays it), reads
the raw file line by line with bounded memory (a 200 MB output is never held), and a
digester that raises, times out or has nothing to add leaves the plain head/tail.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from simagent.kernel.line_fields import (
    clip,
    column_labels,
    looks_like_header,
    split_numbers,
    wordy,
)
from simagent.kernel.terminal import ESC_SEQ_RE

#: Chars of digest the host asks for by default (and a simulator digester's default).
DEFAULT_MAX_CHARS = 4000
#: Seconds a digester may run before the result falls back to plain head/tail (the
#: generic core reads ~8 MB/s here: a 200 MB output digests in ~25 s, in ~20 MB RSS).
DIGEST_TIMEOUT_S = 30.0
#: Outputs of fewer lines get no digest (head and tail show most of them).
DIGEST_MIN_LINES = 30
#: A family (lines of one shape) with at most this many rows is shown verbatim: short
#: tables are results, long ones are step logs.
VERBATIM_ROWS = 12
#: Row text is cut to this many chars when quoted.
ROW_CHARS = 240
#: Bounds on what the stream keeps (memory stays bounded for any input).
MAX_FAMILIES = 4000
MAX_COLUMNS = 64
MAX_KEPT = 400
KEEP_PER_SHAPE = 5
CONTINUATION_LINES = 8
RUN_FINALS = 6
#: Detail levels, tried in order until the digest fits: (rows of a short table shown
#: verbatim, columns per table, continuation lines per kept line, chars per row). Every
#: level keeps a kept line's first continuation: a log record's message may sit there.
LEVELS = ((VERBATIM_ROWS, 12, 8, ROW_CHARS), (6, 8, 8, ROW_CHARS), (3, 6, 4, ROW_CHARS),
          (0, 4, 2, ROW_CHARS // 2), (0, 3, 1, ROW_CHARS // 2), (0, 0, 1, ROW_CHARS // 3))
_READ_CHUNK = 1 << 16

#: A tqdm-style bar (``refine:  45%|████▌     | 29/64 [00:01<00:02, 30.1it/s]``), which
#: a print may follow on the same terminal line.
PROGRESS_RE = re.compile(r"[^|\n]*?\d+%\|[^|]*\|[^\[\n]*\[[^\]\n]*\]")
#: Warnings, errors and failures: always verbatim.
#: (Patterns are strings too, so simulator rules can extend them with ``|``.)
KEEP_PATTERN = (
    r"(?i:\b(?:warn(?:ing)?s?|errors?|exception|traceback|fail(?:s|ed|ure)?|abort(?:ed)?|"
    r"diverg\w*|not converged|did not converge|unconverged|infeasible|singular|"
    r"overflow|nan|inf)\b)|\B(?:Error|Warning|Exception)\b")
KEEP_RE = re.compile(KEEP_PATTERN)
#: Final quantities and summaries: verbatim too.
FINAL_PATTERN = (r"(?i:\b(?:final|total|results?|summary|converged|terminat\w*|finished|"
                 r"completed?|elapsed|took)\b)")
FINAL_RE = re.compile(FINAL_PATTERN)
#: Lines that belong to the kept line above them (indented detail, traceback frames).
CONT_RE = re.compile(r"^\s+\S")
#: ``path.py:12: UserWarning: message``, as ``warnings`` prints it.
PY_WARNING_RE = re.compile(r"^\S.*:\d+: \w*Warning: ")
#: Column labels that name the independent variable (where a min/max happened).
X_LABEL_RE = re.compile(r"(?i)^(?:t|time|step|steps|iter\w*|it|n|cycle|epoch|nstep)\b")


@dataclass(frozen=True)
class Rules:
    """What one simulator knows about its logs; every field has a safe generic default."""

    name: str = "generic"
    #: Warnings, errors, failures: always verbatim.
    keep: re.Pattern[str] | None = KEEP_RE
    #: Final quantities and summary lines: verbatim.
    finals: re.Pattern[str] | None = FINAL_RE
    #: Log noise, only counted; the named group ``key`` (else the match) says which kind.
    noise: re.Pattern[str] | None = None
    #: Lines that continue the kept line above them.
    continuation: re.Pattern[str] | None = CONT_RE
    #: Known row formats: (pattern, column names) for rows a header does not name.
    columns: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...] = ()
    #: Column labels shown first when a table has more columns than fit.
    prefer: re.Pattern[str] | None = None
    #: A prefix that is not part of a line's shape or columns (timestamps).
    prefix: re.Pattern[str] | None = None
    #: A kept block: a line matching ``block`` opens it, one matching ``block_end`` (or
    #: the bound) closes it; every line between is kept (e.g. Cantera's framed errors).
    block: re.Pattern[str] | None = None
    block_end: re.Pattern[str] | None = None


GENERIC = Rules()


@dataclass
class Column:
    """One numeric field: its first and last text, extremes (text, value, and the x
    column's text where each happened), as printed, so quoted numbers are verbatim."""

    label: str
    first: str = ""
    last: str = ""
    lo: float = math.inf
    hi: float = -math.inf
    lo_s: str = ""
    lo_at: str = ""
    hi_s: str = ""
    hi_at: str = ""
    rows: int = 0


@dataclass
class Family:
    """Every line of one shape: counts, column statistics, the rows worth quoting."""

    shape: str
    first_no: int
    labels: list[str] = field(default_factory=list)
    header: str = ""
    count: int = 0
    last_no: int = 0
    rows: list[tuple[int, str]] = field(default_factory=list)  # the first VERBATIM_ROWS
    last_row: tuple[int, str] = (0, "")
    cols: list[Column] = field(default_factory=list)
    x: int = 0
    prev_x: float | None = None
    runs: int = 1
    run_finals: deque[tuple[int, str]] = field(default_factory=lambda: deque(maxlen=RUN_FINALS))

    def add(self, no: int, text: str, values: list[tuple[str, float]]) -> None:
        self.count += 1
        self.last_no = no
        if len(self.rows) < VERBATIM_ROWS:
            self.rows.append((no, clip(text, ROW_CHARS * 2)))
        if values and self.cols:
            xv = values[self.x] if self.x < len(values) else None
            if xv is not None:
                if self.prev_x is not None and xv[1] < self.prev_x:
                    self.runs += 1
                    self.run_finals.append(self.last_row)
                self.prev_x = xv[1]
            at = xv[0] if xv is not None else str(no)
            for col, (s, v) in zip(self.cols, values, strict=False):
                col.rows += 1
                col.first = col.first or s
                col.last = s
                if v < col.lo:
                    col.lo, col.lo_s, col.lo_at = v, s, at
                if v > col.hi:
                    col.hi, col.hi_s, col.hi_at = v, s, at
        self.last_row = (no, clip(text, ROW_CHARS * 2))


@dataclass
class Kept:
    """A line kept verbatim (with its continuation lines), or the tally of a kind of
    kept line seen more than :data:`KEEP_PER_SHAPE` times (``tally``: its latest)."""

    no: int
    text: str
    more: list[str] = field(default_factory=list)
    count: int = 1
    tally: str = ""  # the shape this entry counts, when it is a tally


class Digester:
    """Streams lines into families, kept lines and noise counts; renders within a budget."""

    def __init__(self, rules: Rules = GENERIC) -> None:
        self.rules = rules
        self.families: dict[str, Family] = {}
        self.kept: list[Kept] = []
        self.kept_by_shape: dict[str, int] = {}
        self.kept_dropped = 0
        self.tallies: dict[str, Kept] = {}
        self.header_shapes: set[str] = set()
        self.noise: dict[str, int] = {}
        self.noise_first = 0
        self.lines = 0
        self.other = 0  # lines of shapes past MAX_FAMILIES
        self._prev_plain = ""
        self._open: Kept | None = None
        self._block: Kept | None = None

    def feed(self, lines: Iterable[str]) -> Digester:
        for raw in lines:
            self.line(raw)
        return self

    def line(self, raw: str) -> None:
        r = self.rules
        text = raw.rstrip("\r\n")
        if "\r" in text:  # a progress bar: a terminal shows the last rewrite
            text = next((p for p in reversed(text.split("\r")) if p.strip()), "")
        if "\x1b" in text:
            text = ESC_SEQ_RE.sub("", text)
        text = text.rstrip()
        self.lines += 1
        no = self.lines
        if "%|" in text and (bar := PROGRESS_RE.match(text)):
            self.noise["progress bars"] = self.noise.get("progress bars", 0) + 1
            self.noise_first = self.noise_first or no
            text = text[bar.end():]
        if not text.strip():
            return
        if self._block is not None:
            self._block.more.append(clip(text, ROW_CHARS * 2))
            if len(self._block.more) >= 2 * CONTINUATION_LINES or (
                    r.block_end is not None and r.block_end.search(text)):
                self._block = None
            return
        if r.block is not None and r.block.search(text) and len(self.kept) < MAX_KEPT:
            self._block = Kept(no, clip(text, ROW_CHARS * 2))
            self.kept.append(self._block)
            self._open = None
            return
        if self._open is not None and r.continuation is not None \
                and r.continuation.search(text) and wordy(text):
            self._open.more.append(clip(text, ROW_CHARS * 2))
            # a Python warning continues on one line (its source line), no more
            limit = 1 if PY_WARNING_RE.match(self._open.text) else CONTINUATION_LINES
            if len(self._open.more) >= limit:
                self._open = None
            return
        self._open = None
        body = r.prefix.sub("", text, count=1) if r.prefix is not None else text
        shape, values, spans = split_numbers(body)
        fam = self.families.get(shape)
        if fam is not None and shape not in self.kept_by_shape:
            # the rules see words, and a shape keeps every word: its lines read alike
            fam.add(no, text, values)
            self._prev_plain = body
            return
        if r.keep is not None and r.keep.search(body) \
                and (self._keep(no, text, shape) or not values):
            return  # kept verbatim, or tallied (a tallied row's numbers go to its table)
        if r.noise is not None and (m := r.noise.search(text)):
            key = m.groupdict().get("key") or m.group()
            if not self.noise:
                self.noise_first = no
            if key in self.noise or len(self.noise) < 50:
                self.noise[key] = self.noise.get(key, 0) + 1
            return
        if r.finals is not None and r.finals.search(body) \
                and self.kept_by_shape.get(shape, 0) < KEEP_PER_SHAPE:
            # (a "final" line that keeps coming is a table row: past a few, it collapses)
            self._keep(no, text, shape)
            self._open = None  # a final line has no continuation: what follows is new
            return
        if fam is None:
            if len(self.families) >= MAX_FAMILIES:
                self.other += 1
                return
            fam = self.families[shape] = Family(shape, no)
            if values:
                names = next((n for p, n in r.columns if p.search(body)), ())
                header = self._prev_plain if "=" not in body \
                    and looks_like_header(self._prev_plain) else ""
                fam.header = header
                if header:
                    self.header_shapes.add(split_numbers(header)[0])
                fam.labels = column_labels(body, spans, header, names)[:MAX_COLUMNS]
                fam.cols = [Column(label) for label in fam.labels]
                fam.x = next((i for i, lab in enumerate(fam.labels)
                              if X_LABEL_RE.match(lab)), 0)
        fam.add(no, text, values)
        self._prev_plain = body

    def _keep(self, no: int, text: str, shape: str) -> bool:
        """Keep a line verbatim (True), or tally a kind of line seen too often (False)."""
        seen = self.kept_by_shape.get(shape, 0)
        self.kept_by_shape[shape] = seen + 1
        if seen and self.kept and self.kept[-1].text == clip(text, ROW_CHARS * 2):
            self.kept[-1].count += 1  # the same line again: one entry, counted
            self._open = self.kept[-1]
            return True
        if seen < KEEP_PER_SHAPE and len(self.kept) < MAX_KEPT:
            self._open = Kept(no, clip(text, ROW_CHARS * 2))
            self.kept.append(self._open)
            return True
        # the same kind of line again and again: count it, keep its latest verbatim
        self._open = None
        tally = self.tallies.get(shape)
        if tally is None:
            if len(self.tallies) >= MAX_KEPT:
                self.kept_dropped += 1
                return False
            tally = self.tallies[shape] = Kept(no, "", count=0, tally=shape)
            self.kept.append(tally)
        tally.count += 1
        tally.text = clip(text, ROW_CHARS * 2)
        return False

    # ------------------------------------------------------------------ render
    def tables(self) -> list[Family]:
        return [f for f in self.families.values() if f.count > VERBATIM_ROWS]

    def render(self, max_chars: int = DEFAULT_MAX_CHARS) -> str:
        """The digest, at the most detailed level that fits ``max_chars``; "" when the
        output had no table to collapse and nothing to keep (head/tail say it all)."""
        if not self.tables() and not self.kept:
            return ""
        text = ""
        for level in range(len(LEVELS)):
            text = self._render(*LEVELS[level])
            if len(text) <= max_chars:
                return text
        cut = text[: max(0, max_chars - 40)]
        return f"{cut[: cut.rfind(chr(10)) + 1]}[digest cut at {max_chars:,} chars]"

    def _render(self, verbatim: int, max_cols: int, more: int, width: int) -> str:
        items: list[tuple[int, int, str]] = []  # (line number, order, text)
        omitted = self.kept_dropped + self.other
        for fam in self.families.values():
            if fam.count > VERBATIM_ROWS and not fam.cols:  # one line again and again
                items.append((fam.first_no, 0, f"{clip(fam.last_row[1], width)}  [×"
                                               f"{fam.count:,}, lines {fam.first_no:,}-"
                                               f"{fam.last_no:,}]"))
            elif fam.count > VERBATIM_ROWS:
                items.append((fam.first_no, 0, self._table(fam, max_cols, width)))
            elif fam.shape in self.header_shapes:
                continue  # shown with its table
            elif fam.count <= verbatim and (fam.cols or verbatim == VERBATIM_ROWS):
                if fam.header:
                    items.append((fam.first_no, 0, clip(fam.header, width)))
                items.extend((no, 1, clip(t, width)) for no, t in fam.rows)
            else:
                omitted += fam.count
        for k in self.kept:
            if k.tally:
                items.append((k.no, 2, f"[×{k.count:,} more lines like the one above; the "
                                       f"latest: {clip(k.text, 2 * width)}]"))
                continue
            # a continuation carries the record's message ("Experiment is infeasible:
            # ..." under a WARNING line): it is clipped like the line it continues
            # with its line number: ``_out[n].slice`` pages back what surrounds it
            where = f"×{k.count:,} from line {k.no:,}" if k.count > 1 else f"line {k.no:,}"
            body = "\n".join([f"{clip(k.text, 2 * width)}  [{where}]",
                               *(clip(t, 2 * width) for t in k.more[:more])])
            items.append((k.no, 2, body))
        if self.noise:
            kinds = ", ".join(f"{key} ×{n:,}" for key, n in
                              sorted(self.noise.items(), key=lambda kv: -kv[1])[:8])
            items.append((self.noise_first, 3, f"[{sum(self.noise.values()):,} log lines "
                                               f"counted, not shown: {kinds}]"))
        out = [t for _, _, t in sorted(items, key=lambda it: it[:2])]
        if omitted:
            out.append(f"[{omitted:,} other lines not in this digest]")
        return "\n".join(out)

    def _table(self, fam: Family, max_cols: int, width: int) -> str:
        runs = f", {fam.runs:,} runs" if fam.runs > 1 else ""
        lines = [f"[table: {fam.count:,} rows of one shape, lines {fam.first_no:,}-"
                 f"{fam.last_no:,}{runs}]"]
        if max_cols == 0:  # the barest level: what and where, and the last row
            return f"{lines[0]} last: {clip(fam.last_row[1], width)}"
        if fam.header:
            lines.append(f"  header: {clip(fam.header.strip(), width)}")
        if max_cols >= 8:
            lines.append(f"  first: {clip(fam.rows[0][1], width)}")
        if stats := self._columns(fam, max_cols):
            lines.append(f"  {stats}")
        if 1 < fam.runs <= RUN_FINALS and max_cols >= 6:
            lines.extend(f"  end of run: {clip(t, width)}" for _, t in fam.run_finals)
        lines.append(f"  last: {clip(fam.last_row[1], width)}")
        return "\n".join(lines)

    def _columns(self, fam: Family, max_cols: int) -> str:
        if not fam.cols:
            return ""
        xl = fam.labels[fam.x] if fam.x < len(fam.labels) else ""
        const = [c for c in fam.cols if c.rows and c.lo == c.hi]
        varying = [c for c in fam.cols if c.rows and c.lo != c.hi]
        prefer = self.rules.prefer
        order = {id(c): i for i, c in enumerate(fam.cols)}
        ranked = sorted(varying, key=lambda c: (
            order[id(c)] != fam.x,
            not (prefer is not None and prefer.search(c.label)),
            "[" in c.label, order[id(c)]))
        parts = []
        for c in sorted(ranked[:max_cols], key=lambda c: order[id(c)]):
            s = f"{c.label} {c.first}→{c.last}"
            extra = []
            at = (lambda v: f" @{xl}={v}") if c.label != xl else (lambda v: "")
            if c.lo_s not in (c.first, c.last):
                extra.append(f"min {c.lo_s}{at(c.lo_at)}")
            if c.hi_s not in (c.first, c.last):
                extra.append(f"max {c.hi_s}{at(c.hi_at)}")
            parts.append(f"{s} ({', '.join(extra)})" if extra else s)
        if const:
            parts.append("constant " + " ".join(f"{c.label}={c.first}" for c in const[:6])
                         + (f" +{len(const) - 6}" if len(const) > 6 else ""))
        rest = [c.label for c in ranked[max_cols:]]
        if rest:
            groups: dict[str, int] = {}
            for lab in rest:
                g = lab.split("[", 1)[0]
                groups[g] = groups.get(g, 0) + 1
            parts.append(f"+{len(rest)} more columns (" + ", ".join(
                f"{g} ×{n}" if n > 1 else g for g, n in list(groups.items())[:8]) + ")")
        return " · ".join(parts)


def digest_lines(lines: Iterable[str], rules: Rules = GENERIC,
                 max_chars: int = DEFAULT_MAX_CHARS) -> str:
    """The digest of ``lines`` (raw output, one line each) under ``rules``."""
    return Digester(rules).feed(lines).render(max_chars)


def digest_text(text: str, rules: Rules = GENERIC, max_chars: int = DEFAULT_MAX_CHARS) -> str:
    return digest_lines(text.split("\n"), rules, max_chars)


def generic(lines: Iterable[str], max_chars: int = DEFAULT_MAX_CHARS) -> str:
    """The digester of simulators that declare none: only when there is a table to
    collapse (a digest of prose would only repeat head and tail)."""
    d = Digester(GENERIC).feed(lines)
    return d.render(max_chars) if d.tables() else ""
