"""Per-module mutation score from a ``mutmut run`` folder (``make mutate`` prints it).

Reads mutmut's own result files (``mutants/**/*.py.meta``), exit codes as mutmut's
``stats.status_by_exit_code`` names them: killed = a test failed (1, 3) or the mutant
timed out (36, or killed by a signal); survived = every test passed (0); no tests = none
reached it (5, 33). The score is killed over all checked mutants; unchecked, skipped and
interrupted ones are left out."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def scores(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for meta in sorted((root / "mutants").rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"].values()
        done = [c for c in codes if c is not None and c not in (2, 34)]
        killed = sum(1 for c in done if c in (1, 3, 36) or c < 0)
        out[str(meta.relative_to(root / "mutants"))[: -len(".meta")]] = (killed, len(done))
    return out


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    total_k = total_n = 0
    for module, (killed, n) in scores(root).items():
        total_k, total_n = total_k + killed, total_n + n
        print(f"{module:40} {killed:5} / {n:<5} killed  {100 * killed / max(n, 1):5.1f} %")
    print(f"{'all':40} {total_k:5} / {total_n:<5} killed  {100 * total_k / max(total_n, 1):5.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
