"""The attacks ``simagent bench attacks`` runs, in the order of issue 40's classes.

Each case is a few lines of catalogue in the module of its kind: the folder and its
files (``attack_cases_files``: trust, notebooks, paths, links, reads, memory), what
reaches in from beside the session (``attack_cases_reach``: MCP tool servers, MCP over
HTTP, another uid on the Dask cluster) and secrets at rest (``attack_cases_secrets``).
"""

from __future__ import annotations

from simagent.bench import attack_cases_files, attack_cases_reach, attack_cases_secrets
from simagent.bench.attack_bench import AttackCase
from simagent.bench.catalogue import select_cases

CASES: list[AttackCase] = [*attack_cases_files.CASES, *attack_cases_reach.CASES,
                           *attack_cases_secrets.CASES]


def select(ids: list[str] | None = None, *, fast: bool = False) -> list[AttackCase]:
    """The attacks to run: by id, the fast subset, or all (``catalogue.select_cases``)."""
    return select_cases(CASES, ids, fast=fast, noun="attack")
