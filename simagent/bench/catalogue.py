"""What the bench's catalogues of cases share (``fault_cases``, ``attack_cases``): which
cases a run takes, by id or as the fast subset ``make test`` runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar


class Case(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def fast(self) -> bool: ...


C = TypeVar("C", bound=Case)


def select_cases(cases: Sequence[C], ids: list[str] | None = None, *, fast: bool = False,
                 noun: str = "case") -> list[C]:
    """The cases to run: by id (unknown ids are an error naming the known ones), the fast
    subset, or all."""
    if ids:
        known = {c.id: c for c in cases}
        unknown = [i for i in ids if i not in known]
        if unknown:
            raise ValueError(f"unknown {noun}(s) {', '.join(unknown)}; known: "
                             f"{', '.join(known)}")
        return [known[i] for i in ids]
    return [c for c in cases if c.fast] if fast else list(cases)
