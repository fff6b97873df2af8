"""ASE's output digester (``digest = "digest:digest"`` in simulator.toml).

ASE's long outputs are optimizer logs (``BFGS:   12 10:01:02   -3.456789   0.012345``
under a ``Step Time Energy fmax`` header, one table per ``run()``, so the step counter
restarting marks each relaxation) and molecular-dynamics logs from ``MDLogger``
(``Time[ps] Etot[eV] Epot[eV] Ekin[eV] T[K]``, per atom with ``peratom=True``) or from a
per-step callback. The core collapses each into rows, per-column first -> last and
extremes, and the final row of every relaxation; these rules name the optimizer columns
even without their header, keep ASE's warnings (deprecations, ``FutureWarning`` of the
Langevin ``fixcm``), missing-element and property errors, and the convergence verdicts
(``run()`` printing ``True``/``False``, "converged").
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from simagent.kernel.digest import (
    DEFAULT_MAX_CHARS,
    FINAL_PATTERN,
    KEEP_PATTERN,
    Rules,
    digest_lines,
)

#: ``BFGS:    3 10:01:02       -0.028133        0.008055`` (also FIRE, LBFGS, GPMin, ...)
OPTIMIZER_ROW = re.compile(r"^\s*[A-Za-z][\w-]*:\s+\d+\s+\d\d:\d\d:\d\d\s+[-+]?\d")

RULES = Rules(
    name="ase",
    keep=re.compile(r"PropertyNotImplemented|NotImplementedError|(?i:not converged)|"
                    + KEEP_PATTERN),
    finals=re.compile(r"^\s*(?:True|False)\s*$|(?i:\bconverged\b|\bfmax\b.*[<>])|"
                      + FINAL_PATTERN),
    columns=((OPTIMIZER_ROW, ("step", "energy", "fmax")),),
    prefer=re.compile(r"(?i)^(?:step|energy|fmax|etot|epot|ekin|t\[k\]|t|temp\w*|"
                      r"time\[ps\]|time)"),
)


def digest(lines: Iterable[str], max_chars: int = DEFAULT_MAX_CHARS) -> str:
    return digest_lines(lines, RULES, max_chars)
