"""PyBaMM's output digester (``digest = "digest:digest"`` in simulator.toml).

What PyBaMM prints when a run is long: its logger (``pybamm.set_logging_level``), one
timestamped line per record, where INFO/DEBUG/VERBOSE records are model-building and
solver set-up chatter worth a count, NOTICE records trace an experiment (cycle k/N,
step j/M) and WARNING records carry the facts that change a result ("Experiment is
infeasible", on a continuation line below the record); the IDAKLU solver's
``print_stats`` blocks (``Number of steps = 64``), one per solve; and per-step tables
users print from a solution. The generic core collapses the tables and the repeated
stats; these rules name the noise, keep every warning with its continuation, and keep
the lines that close a run (termination, "Finish experiment simulation, took ...").
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from simagent.kernel.digest import (
    DEFAULT_MAX_CHARS,
    FINAL_PATTERN,
    Rules,
    digest_lines,
)

#: ``2026-01-01 12:00:00.123 - [NOTICE] logger.func(7): ...``
LOG_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[.,]\d+ - ")

RULES = Rules(
    name="pybamm",
    # not the generic pattern: DEBUG records print ``||dy|| = inf`` on every first Newton
    # iteration and expression trees full of words; the level says what is a warning
    keep=re.compile(r"\[(?:WARNING|ERROR|CRITICAL)\]|(?i:infeasible|\bwarn(?:ing)?s?\b|"
                    r"\berrors?\b|traceback|\bfail(?:s|ed|ure)?\b|not converged)|"
                    r"\w+(?:Error|Warning|Exception)\b"),
    # chatter, counted by level: set-up and bookkeeping records; the solver's Newton
    # iterations stay, to collapse into a table
    noise=re.compile(r"^\S+ \S+ - \[(?P<key>DEBUG|VERBOSE|SPAM|INFO)\] (?!.*Newton iter)"),
    finals=re.compile(r"(?i)\b(?:termination|event:|took|capacity|cut-?off)\b|"
                      + FINAL_PATTERN.replace("elapsed|", "")),
    # a record's message continues on the lines below it (PyBaMM indents them with tabs)
    continuation=re.compile(r"^\s+\S|^(?!\d{4}-\d\d-\d\d )[A-Z][\w ]+ is \w+:"),
    prefer=re.compile(r"(?i)^(?:v|voltage|q|capacity|i|current|t|time|soc|ocv|ce_min)\b"),
    prefix=LOG_PREFIX,
)


def digest(lines: Iterable[str], max_chars: int = DEFAULT_MAX_CHARS) -> str:
    return digest_lines(lines, RULES, max_chars)
