"""``simagent bench cli``: how fast each usage error is answered, as a whole process.

A new user's typo (an empty prompt, a missing ``scripted:`` file, a workspace that is a
file) should be answered in under a second, with one line and exit 2, before simagent
loads langchain (seconds on a loaded machine). Each case here is the real ``simagent``
command in a subprocess, in a fresh workspace and state home, timed ``runs`` times from
start to exit; the table gives min / median / max seconds and whether the median is under
:data:`GOAL_S`. A measurement, not a test: the tests prove the early checks import
nothing heavy (``tests/test_cli_errors_fast.py``), this says what that buys on the
machine it runs on.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: The goal for a usage error's answer, seconds (median of the runs).
GOAL_S = 1.0
RUNS = 5


@dataclass(frozen=True)
class Case:
    """One usage error: its id and the arguments that cause it (``{script}``, ``{file}``,
    ``{missing}`` are filled from the fixture folder), with an optional setup of the
    state home (a broken user config)."""

    id: str
    argv: tuple[str, ...]
    user_config: bytes | None = None


CASES = (
    Case("empty prompt", ("run", "--model", "scripted:{script}", "")),
    Case("missing scripted: file", ("run", "--model", "scripted:{missing}/s.json", "hi")),
    Case("malformed --model", ("run", "--model", "nonsense", "hi")),
    Case("bad --from-notebook", ("run", "--model", "scripted:{script}", "--from-notebook",
                                 "{missing}/n.ipynb", "hi")),
    Case("workspace is a file", ("run", "--workspace", "{file}", "--model",
                                 "scripted:{script}", "hi")),
    Case("workspace missing", ("run", "--workspace", "{missing}", "--model",
                               "scripted:{script}", "hi")),
    Case("transcript -o bad folder", ("transcript", "-o", "{missing}/t.md")),
    Case("notebook -o bad folder", ("notebook", "-o", "{missing}/n.ipynb")),
    Case("--kernel ''", ("run", "--kernel", "", "--model", "scripted:{script}", "hi")),
    Case("option the command lacks", ("--model", "scripted:{script}", "sessions")),
    Case("config not UTF-8", ("run", "--model", "scripted:{script}", "hi"),
         user_config=b'model = "caf\xe9"\n'),
    Case("config invalid TOML", ("run", "--model", "scripted:{script}", "hi"),
         user_config=b"model = [\n"),
    Case("config approval bogus", ("run", "--model", "scripted:{script}", "hi"),
         user_config=b'approval = "bogus"\n'),
    Case("--json usage error", ("run", "--json", "--model", "scripted:{script}", "")),
    Case("unknown option", ("run", "--no-such-option", "hi")),
)


@dataclass(frozen=True)
class Row:
    id: str
    seconds: tuple[float, ...]
    exit_codes: tuple[int, ...]
    lines: int  # error lines on stderr (the last run)
    json_error: bool | None  # --json cases: stdout held a JSON object with "error"

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def ok(self) -> bool:
        return (self.median < GOAL_S and set(self.exit_codes) == {2} and self.lines == 1
                and self.json_error is not False)

    def as_dict(self) -> dict:
        return {"case": self.id, "min_s": round(min(self.seconds), 3),
                "median_s": round(self.median, 3), "max_s": round(max(self.seconds), 3),
                "exit_codes": sorted(set(self.exit_codes)), "error_lines": self.lines,
                "json_error": self.json_error, "under_goal": self.median < GOAL_S,
                "ok": self.ok}


def _fill(argv: tuple[str, ...], folder: Path) -> list[str]:
    names = {"script": folder / "script.json", "file": folder / "a-file",
             "missing": folder / "no-such-folder"}
    return [a.format(**{k: str(v) for k, v in names.items()}) for a in argv]


def run_case(case: Case, runs: int = RUNS) -> Row:
    """``case`` ``runs`` times, each a fresh ``simagent`` process in the same fixtures."""
    with tempfile.TemporaryDirectory(prefix="simagent-cli-bench-") as tmp:
        folder = Path(tmp)
        workspace, home = folder / "workspace", folder / "home"
        workspace.mkdir()
        home.mkdir()
        (folder / "script.json").write_text(json.dumps([{"final": "ok"}]))
        (folder / "a-file").write_text("not a folder\n")
        if case.user_config is not None:
            (home / "config.toml").write_bytes(case.user_config)
        env = {k: v for k, v in os.environ.items() if k != "SIMAGENT_MODEL"}
        env["SIMAGENT_HOME"] = str(home)
        seconds, codes = [], []
        proc = None
        for _ in range(runs):
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "simagent", *_fill(case.argv, folder)],
                                  cwd=workspace, env=env, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=120)
            seconds.append(time.perf_counter() - start)
            codes.append(proc.returncode)
    assert proc is not None
    lines = sum(1 for ln in proc.stderr.splitlines() if ": error: " in ln)
    json_error = None
    if "--json" in case.argv:
        try:
            json_error = "error" in json.loads(proc.stdout)
        except ValueError:
            json_error = False
    return Row(case.id, tuple(seconds), tuple(codes), lines, json_error)


def run_cli_bench(runs: int = RUNS, progress: Callable[[str], None] | None = None
                  ) -> list[Row]:
    rows = []
    for case in CASES:
        if progress:
            progress(f"{case.id} ({runs} runs)...")
        rows.append(run_case(case, runs))
    return rows


def machine_line() -> str:
    """The load the figures were measured under (they move with it)."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return (f"{os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} "
            f"{load[2]:.2f}")


def format_table(rows: list[Row]) -> str:
    head = f"{'case':<26} {'min s':>6} {'median':>7} {'max s':>6}  exit  <{GOAL_S:g} s  ok"
    out = [head, "-" * len(head)]
    for r in rows:
        out.append(f"{r.id:<26} {min(r.seconds):>6.2f} {r.median:>7.2f} {max(r.seconds):>6.2f}"
                   f"  {','.join(map(str, sorted(set(r.exit_codes)))):<4}  "
                   f"{'yes' if r.median < GOAL_S else 'NO':<5}  {'ok' if r.ok else 'FAIL'}")
    out.append(f"({len(rows[0].seconds) if rows else 0} runs each; {machine_line()})")
    return "\n".join(out)


def as_json(rows: list[Row]) -> dict:
    return {"goal_s": GOAL_S, "machine": machine_line(), "rows": [r.as_dict() for r in rows]}
