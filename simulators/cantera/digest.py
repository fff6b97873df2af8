"""Cantera's output digester (``digest = "digest:digest"`` in simulator.toml).

Long Cantera output is almost always a table the user prints while stepping a
``ReactorNet`` (one row per ``net.step()``: time, T, P, dT/dt, mole fractions), often one
table per initial condition, plus ignition or equilibrium summary lines. The core
collapses each table with where every column peaked (the time of max dT/dt is the
ignition delay); these rules keep Cantera's framed errors whole (``CanteraError thrown
by ...`` between rules of asterisks, where the reason is on the lines inside), its
warnings (clone, NASA polynomial discontinuities), and the summary quantities
(ignition delay, adiabatic flame temperature, flame speed).
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

RULES = Rules(
    name="cantera",
    keep=re.compile(r"CanteraError|CVodes|IDA_|(?i:mxstep|too much work|error test failed)|"
                    + KEEP_PATTERN),
    finals=re.compile(r"(?i)\b(?:ignition|delay|tau\w*|T_?ad|adiabatic|equilibri\w*|"
                      r"flame speed|S_?u|burning velocity)\b|" + FINAL_PATTERN),
    block=re.compile(r"^\*{20,}\s*$"),
    block_end=re.compile(r"^\*{20,}\s*$"),
    prefer=re.compile(r"(?i)^(?:t|time|T|P|dT\w*|OH|X_?OH|H2O|CO2?|HO2|CH4|H2|O2|Y_)"),
)


def digest(lines: Iterable[str], max_chars: int = DEFAULT_MAX_CHARS) -> str:
    return digest_lines(lines, RULES, max_chars)
