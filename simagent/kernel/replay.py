"""Which earlier cells to re-run so a restarted kernel gets its state back (pure).

A kernel that died, froze or ignored every interrupt is restarted with an empty
namespace; the session's records (``outputs/NNNN.json``, written by the supervisor)
still hold every cell's code, status, seconds and *lineage*. :func:`select` turns them
into a :class:`ReplayPlan`: the cells to re-run, in order, and the ones left out with a
reason. No kernel here, so the rules are tested on plain dicts.

The rules, and why:

* **Lineage.** ``/reset`` asks for a clean kernel, so cells before it are not state to
  restore. Each record carries the lineage id current when it ran; a clean restart
  bumps the id, a crash restart keeps it (replay restores that lineage). Records
  without a lineage (written before it existed) never replay.
* **Failed cells** (status other than ``ok``) are skipped: an error, an interrupt or a
  crash left no state worth reproducing, and re-running a crash would crash again.
* **Display-only cells** are skipped: a cell whose top-level statements are all
  expression statements that only show something (``print(x)``, ``plt.plot(t, y)``,
  ``df.head()``, a bare ``x``) defines no names. An expression statement that calls
  anything else (``sim.solve()``, ``np.random.seed(0)``, ``lst.append(1)``) may change
  state, so its cell is replayed: replaying a needless cell costs seconds, skipping a
  needed one costs a silently wrong kernel.
* **Effects outside the kernel** (the record's ``effects``, :mod:`simagent.kernel_api.
  effects`): a results file must not change because the kernel restarted. A cell that
  appended to a file, changed one in place, deleted or renamed one, opened an SQLite
  file, started a process or signalled one is never replayed: it is listed with what it
  did ("appends results.csv"), and ``/restore`` offers to run it after showing that.
  A cell whose only effects are whole-file writes (the file truncated or created first)
  and folders *is* replayed, under a backup: every file those cells write is copied
  aside before the replay and put back byte for byte after it (one absent before is
  removed, like a folder it made), so a cell that writes a file and reads it back
  rebuilds its state and no file ends different. Files too big to back up
  (:data:`BACKUP_MAX_BYTES` in all) make their cell a listed skip instead.
* **Secrets.** A record's code is kept redacted (``[redacted:NAME]`` for a key typed
  into the cell); such a record has ``secret`` set and is never replayed: the kept code
  is not what ran. It is listed ("it held a secret, not kept on disk").
* **Time budget** (:class:`ReplayBudget`, config ``[kernel] replay_cell_s`` /
  ``replay_total_s``): a cell that took longer than the per-cell limit is not replayed,
  and replay stops once the total would pass the budget; such cells are *listed*
  (number, first line, seconds, why) so the user and the model know what is missing.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simagent.config import Config, ConfigError
from simagent.kernel_api import effects as fx
from simagent.paths import SessionPaths, write_private

#: Default per-cell limit: a cell that took longer is listed, not replayed.
REPLAY_CELL_S = 60.0
#: Default total: replay stops before the replayed cells' recorded seconds pass this.
REPLAY_TOTAL_S = 300.0
#: Effect kinds a replay may repeat: making a folder that exists changes nothing, and a
#: whole-file write is repeated only under the replay's backup (see the module doc).
REPEATABLE = frozenset({"folder", "write"})
#: Most bytes of files a replay backs up (and puts back) before rewriting them.
BACKUP_MAX_BYTES = 256 << 20
#: The current lineage id, in the session folder.
LINEAGE_FILE = "kernel.lineage"

#: Functions whose call as a whole statement only shows something.
_DISPLAY_FUNCS = frozenset({
    "print", "display", "pprint", "repr", "len", "type", "help", "dir", "vars", "id",
    "str", "format", "sorted", "list", "sum", "min", "max", "abs", "round", "isinstance",
})
#: Roots of attribute calls that only draw or show (``plt.plot``, ``sns.lineplot``).
_DISPLAY_ROOTS = frozenset({"plt", "pyplot", "sns", "seaborn", "IPython", "px"})
#: Methods whose call as a whole statement only draws or shows (``ax.plot``, ``df.head``).
_DISPLAY_METHODS = frozenset({
    "plot", "show", "hist", "scatter", "imshow", "bar", "barh", "errorbar", "semilogx",
    "semilogy", "loglog", "fill_between", "contour", "contourf", "pcolormesh", "legend",
    "xlabel", "ylabel", "title", "suptitle", "grid", "tight_layout", "colorbar", "text",
    "annotate", "axhline", "axvline", "xlim", "ylim", "set_xlabel", "set_ylabel",
    "set_title", "set_xlim", "set_ylim", "set_xscale", "set_yscale", "head", "tail",
    "describe", "info", "summary", "print", "display", "to_string", "savefig",
})
#: IPython line magics that only show something (any other magic is assumed to change
#: state: ``%run``, ``%cd``, ``%load_ext`` ...).
_DISPLAY_MAGICS = frozenset({
    "who", "whos", "who_ls", "pwd", "ls", "history", "hist", "timeit", "pinfo", "pinfo2",
    "psearch", "pdoc", "pdef", "psource", "pfile", "lsmagic", "magic", "page", "env",
    "pip", "conda", "system", "sx",
})


@dataclass(frozen=True)
class ReplayBudget:
    """How much replay a restart may do (config ``[kernel]``; defaults here only)."""

    cell_s: float = REPLAY_CELL_S
    total_s: float = REPLAY_TOTAL_S
    enabled: bool = True


@dataclass(frozen=True)
class ReplaySource:
    """What a replay reads and may spend, as plain values (the recovery ladder gets them
    from ``LadderKernel.replay_source``): the session's folders (the execution records,
    and where files a replay rewrites are backed up), the workspace the cells ran in, and
    the budget."""

    paths: SessionPaths
    cwd: Path
    budget: ReplayBudget


@dataclass(frozen=True)
class Cell:
    """One earlier execution to re-run; ``writes``: files it rewrites (backed up) and
    folders it makes (removed after the replay if they were absent before it)."""

    n: int
    code: str
    seconds: float
    writes: tuple[str, ...] = ()

    @property
    def first_line(self) -> str:
        return first_line(self.code)


@dataclass(frozen=True)
class Skip:
    """An earlier cell left out of the replay; ``kind`` is ``failed``, ``display``,
    ``effects`` (it acted outside the kernel: ``effects`` says how), ``secret`` (its
    code was kept redacted), ``too-slow``,
    ``over-budget``, ``off`` (replay disabled) or, at run time, ``stopped``."""

    n: int
    line: str
    seconds: float
    kind: str
    why: str
    effects: tuple[dict[str, Any], ...] = ()

    @property
    def loses_state(self) -> bool:
        """Whether leaving this cell out loses names (failed/display cells define none)."""
        return self.kind not in ("failed", "display")

    def to_dict(self) -> dict[str, Any]:
        out = {"n": self.n, "line": self.line, "seconds": round(self.seconds, 3),
               "kind": self.kind, "why": self.why}
        return out | ({"effects": list(self.effects)} if self.effects else {})


@dataclass
class ReplayPlan:
    run: list[Cell] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)

    @property
    def listed(self) -> list[Skip]:
        """Skipped cells that defined state: what the message must name."""
        return [s for s in self.skipped if s.loses_state]

    @property
    def seconds(self) -> float:
        return sum(c.seconds for c in self.run)

    @property
    def writes(self) -> list[str]:
        """Every file the replayed cells rewrite (what the replay backs up), once each."""
        return list(dict.fromkeys(p for c in self.run for p in c.writes))


def first_line(code: str, limit: int = 60) -> str:
    line = next((ln.strip() for ln in code.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _call_name(call: ast.Call) -> tuple[str | None, str | None]:
    """(root name, final attribute or function name) of a call's target."""
    func: ast.AST = call.func
    last = func.attr if isinstance(func, ast.Attribute) else (
        func.id if isinstance(func, ast.Name) else None)
    while isinstance(func, (ast.Attribute, ast.Call, ast.Subscript)):
        func = func.value if not isinstance(func, ast.Call) else func.func
    return (func.id if isinstance(func, ast.Name) else None), last


def _magic_name(call: ast.Call) -> str | None:
    """``get_ipython().run_line_magic('who', '')`` -> ``who`` (``system`` for ``!cmd``);
    None when the call is not IPython's rewrite of a magic."""
    f = call.func
    if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Call)
            and isinstance(f.value.func, ast.Name) and f.value.func.id == "get_ipython"):
        return None
    if f.attr in ("system", "getoutput"):
        return "system"
    if f.attr == "run_line_magic" and call.args and isinstance(call.args[0], ast.Constant):
        return str(call.args[0].value)
    return f.attr  # run_cell_magic and anything else: treated as state-changing


def _shows_only(stmt: ast.stmt) -> bool:
    """True for an expression statement that only shows something (see module doc)."""
    if not isinstance(stmt, ast.Expr):
        return isinstance(stmt, ast.Pass)
    value = stmt.value
    if any(isinstance(n, (ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom))
           for n in ast.walk(value)):
        return False
    if isinstance(value, ast.Call):
        magic = _magic_name(value)
        if magic is not None:
            return magic in _DISPLAY_MAGICS
        root, last = _call_name(value)
        if isinstance(value.func, ast.Name):
            shows = last in _DISPLAY_FUNCS
        else:
            shows = root in _DISPLAY_ROOTS or last in _DISPLAY_METHODS
        return shows  # its arguments may call (plt.plot(t, np.sin(t))): still a display
    # no call, or only display functions ('a' in dir(), len(x) == 3): nothing changes
    return all(isinstance(n.func, ast.Name) and n.func.id in _DISPLAY_FUNCS
               for n in ast.walk(value) if isinstance(n, ast.Call))


def _parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except SyntaxError:
        pass
    try:  # IPython syntax: %magics, !shell, ?help; rewritten the way the kernel does it
        from IPython.core.inputtransformer2 import TransformerManager  # heavy; magics are rare

        return ast.parse(TransformerManager().transform_cell(code))
    except Exception:
        return None


def defines_state(code: str) -> bool:
    """Whether a cell may define state (names, imports, mutated objects).

    Only a cell whose every top-level statement shows something is display-only; code
    that cannot be parsed counts as defining (replaying it is the safe side).
    """
    tree = _parse(code)
    if tree is None:
        return True
    return not all(_shows_only(s) for s in tree.body)


def select(records: Iterable[Mapping[str, Any]], budget: ReplayBudget = ReplayBudget(),
           lineage: int | None = None, sizes: Mapping[str, int | None] | None = None,
           base: str | None = None) -> ReplayPlan:
    """The cells of ``lineage`` (None: the lineage of the last record) to replay, in order.

    ``records`` are execution records (``n``, ``code``, ``status``, ``elapsed_s``,
    ``lineage``, ``effects``) in any order; ``sizes``: the current size of each file the
    records wrote (None: absent; a path missing from it counts as too big to back up);
    ``base``: the folder effect paths are shown relative to. See the module docstring.
    """
    sizes = sizes or {}
    backed: set[str] = set()
    backup = 0
    recs = sorted((r for r in records if isinstance(r.get("n"), int)), key=lambda r: r["n"])
    if lineage is None:
        lineage = next((r.get("lineage") for r in reversed(recs)), None)
    plan = ReplayPlan()
    total = 0.0
    stopped = False
    for rec in recs:
        if lineage is None or rec.get("lineage") != lineage:
            continue
        code = str(rec.get("code") or "")
        seconds = float(rec.get("elapsed_s") or 0.0)
        n, line = rec["n"], first_line(code)
        status = rec.get("status")
        if status != "ok":
            plan.skipped.append(Skip(n, line, seconds, "failed", f"it ended {status}"))
        elif not code.strip() or not defines_state(code):
            plan.skipped.append(Skip(n, line, seconds, "display", "it only showed output"))
        elif rec.get("secret"):
            plan.skipped.append(Skip(n, line, seconds, "secret",
                                     "it held a secret, which is not kept on disk"))
        elif outside := [e for e in fx.of(rec) if e.get("kind") not in REPEATABLE]:
            plan.skipped.append(Skip(n, line, seconds, "effects",
                                     fx.describe_all(outside, base), tuple(outside)))
        elif not budget.enabled:
            plan.skipped.append(Skip(n, line, seconds, "off", "replay is off in config"))
        elif seconds > budget.cell_s:
            plan.skipped.append(Skip(n, line, seconds, "too-slow",
                                     f"it took {seconds:.1f} s, over the {budget.cell_s:g} s "
                                     f"per-cell replay limit"))
        elif stopped or total + seconds > budget.total_s:
            stopped = True
            plan.skipped.append(Skip(n, line, seconds, "over-budget",
                                     f"replaying it would pass the {budget.total_s:g} s total "
                                     f"replay budget"))
        else:
            writes = tuple(dict.fromkeys(
                str(e["path"]) for e in fx.of(rec) if e.get("kind") == "write"))
            folders = tuple(str(e["path"]) for e in fx.of(rec) if e.get("kind") == "folder")
            new = [p for p in writes if p not in backed]
            need = sum(sizes.get(p, BACKUP_MAX_BYTES + 1) or 0 for p in new)
            if backup + need > BACKUP_MAX_BYTES:
                big = [e for e in fx.of(rec) if e.get("kind") == "write"]
                plan.skipped.append(Skip(n, line, seconds, "effects", fx.describe_all(
                    big, base) + f", more than the {BACKUP_MAX_BYTES >> 20} MiB a replay "
                    f"backs up", tuple(big)))
                continue
            backup += need
            backed.update(new)
            total += seconds
            plan.run.append(Cell(n, code, seconds, folders + writes))
    return plan


def _record(path: Path) -> dict[str, Any] | None:
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and isinstance(rec.get("n"), int) else None


def load_records(folder: Path) -> list[dict[str, Any]]:
    """Every readable execution record in ``folder`` (``outputs/NNNN.json``), by number."""
    found = (_record(p) for p in folder.glob("[0-9][0-9][0-9][0-9]*.json"))
    return sorted((r for r in found if r is not None), key=lambda r: r["n"])


def _last_record(folder: Path) -> dict[str, Any] | None:
    """The readable record with the highest number, reading as few files as it can."""
    paths = [p for p in folder.glob("[0-9][0-9][0-9][0-9]*.json") if p.stem.isdigit()]
    for path in sorted(paths, key=lambda p: int(p.stem), reverse=True):
        if (rec := _record(path)) is not None:
            return rec
    return None


def read_lineage(root: Path, outputs: Path) -> int:
    """The lineage a kernel continues: the saved id (``root/kernel.lineage``, written by
    each clean restart), or the last record's, whichever is higher; 1 for a new session."""
    last = _last_record(outputs)
    ids = [last.get("lineage")] if last is not None else []
    try:
        ids.append(int((root / LINEAGE_FILE).read_text().strip()))
    except (OSError, ValueError):
        pass
    return max((i for i in ids if isinstance(i, int)), default=1)


def save_lineage(root: Path, lineage: int) -> None:
    """Keep a new lineage id, so a later process does not replay cells before a reset
    that no cell has run after yet."""
    try:
        write_private(root / LINEAGE_FILE, f"{lineage}\n")
    except OSError:  # the records still say which cells came after the reset
        pass


class BadBudget(ValueError):
    """A ``[kernel]`` replay key that cannot be used; ``key`` names it, so that the
    caller can name the file that set it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def budget_from(section: Mapping[str, Any]) -> ReplayBudget:
    """A budget from a ``[kernel]`` config table (``replay``, ``replay_cell_s``,
    ``replay_total_s``); ``BadBudget`` (a ``ValueError``) names the bad key."""
    values: dict[str, Any] = {}
    for key, attr in (("replay_cell_s", "cell_s"), ("replay_total_s", "total_s")):
        if key in section:
            v = section[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise BadBudget(key, f"[kernel] {key} must be a number of seconds >= 0")
            values[attr] = float(v)
    if "replay" in section:
        if not isinstance(section["replay"], bool):
            raise BadBudget("replay", "[kernel] replay must be true or false")
        values["enabled"] = section["replay"]
    return ReplayBudget(**values)


def budget_of(config: Config) -> ReplayBudget:
    """The replay budget a config sets (its ``[kernel]`` table; see :func:`budget_from`),
    a bad value raised as the ``ConfigError`` every front end reports, naming the file."""
    try:
        return budget_from(config.section("kernel"))
    except BadBudget as exc:
        raise ConfigError(f"{config.source('kernel', exc.key)}: {exc}") from exc
