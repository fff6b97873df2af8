"""Skill examples are executable claims: extract them and run them in a real kernel.

A skill that lies is worse than none, so every fenced ```` ```python ```` block in a
bundled SKILL.md is an example and runs, in order, in one fresh kernel per skill (later
blocks see earlier blocks' variables, as the agent's kernel would). A block may be
followed by lines ``<!-- expect: REGEX -->``: the block's rendered output (stdout,
stderr and the value of its last expression) must match each one (``re.search``,
multiline). Claims about numbers belong in ``assert`` statements inside the block. A
block preceded by ``<!-- no-run: reason -->`` is shown to the model but not run; the
reason is required, and tests list such blocks.

``python -m simagent.skill_examples PATH...`` runs the examples of the given SKILL.md
files (or folders holding them) and prints one line per block.
"""

from __future__ import annotations

import re
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from simagent.kernel import Kernel
from simagent.paths import SessionPaths
from simagent.simulators import Simulator, discover

_FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
_EXPECT = re.compile(r"\A\s*<!--\s*expect:\s*(.*?)\s*-->[ \t]*\n?", re.S)
#: Only the comment right before a block (no other ``-->`` between) marks it no-run.
_NO_RUN = re.compile(r"<!--\s*no-run:\s*((?:(?!-->).)*?)\s*-->\s*\Z", re.S)
#: Seconds one example block may run before it counts as a failure.
BLOCK_TIMEOUT_S = 180.0


class ExampleFormatError(ValueError):
    """A malformed example annotation; names the file and the block."""


@dataclass(frozen=True)
class Example:
    index: int
    line: int
    code: str
    expects: tuple[str, ...] = ()
    no_run: str | None = None


@dataclass
class Outcome:
    example: Example
    ok: bool
    seconds: float
    detail: str = ""
    output: str = field(default="", repr=False)


def examples(text: str, where: str = "skill") -> list[Example]:
    """Every python block of a skill body, with its expectations, in order."""
    found = []
    for i, match in enumerate(_FENCE.finditer(text)):
        rest = text[match.end():].split("\n", 1)[1] if "\n" in text[match.end():] else ""
        expects = []
        while m := _EXPECT.match(rest):
            pattern = m.group(1)
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ExampleFormatError(f"{where}: block {i}: bad expect regex "
                                         f"{pattern!r}: {exc}") from exc
            expects.append(pattern)
            rest = rest[m.end():]
        before = text[:match.start()]
        no_run = _NO_RUN.search(before)
        if no_run is not None and not no_run.group(1):
            raise ExampleFormatError(f"{where}: block {i}: no-run needs a reason")
        found.append(Example(index=i, line=before.count("\n") + 1, code=match.group(1),
                             expects=tuple(expects),
                             no_run=no_run.group(1) if no_run else None))
    return found


def simulator_of(skill_md: Path) -> Simulator | None:
    """The simulator whose folder holds ``skill_md`` (None for shared skills)."""
    resolved = skill_md.resolve()
    for sim in discover().values():
        if resolved.is_relative_to(sim.root.resolve()):
            return sim
    return None


def rendered(result) -> str:
    """What a block printed: stdout, stderr and the value, as the check sees it."""
    parts = [result.stdout, result.stderr]
    if result.value is not None:
        parts.append(result.value)
    return "\n".join(p for p in parts if p)


def run_skill(skill_md: Path, *, workdir: Path | None = None) -> Iterator[Outcome]:
    """Run a skill's examples in a fresh kernel (with its simulator's env); yield outcomes.

    A failing block stops the skill: later blocks depend on its state.
    """
    skill_md = Path(skill_md)
    blocks = examples(skill_md.read_text(encoding="utf-8"), str(skill_md))
    sim = simulator_of(skill_md)
    with tempfile.TemporaryDirectory(prefix="skill-") as tmp:
        cwd = workdir or Path(tmp) / "workspace"
        cwd.mkdir(parents=True, exist_ok=True)
        kernel = Kernel(SessionPaths(Path(tmp) / "session"), cwd=cwd,
                        env=dict(sim.env) if sim else None)
        try:
            kernel.start()
            for block in blocks:
                if block.no_run is not None:
                    continue
                started = time.monotonic()
                result = kernel.execute(block.code, timeout=BLOCK_TIMEOUT_S)
                seconds = time.monotonic() - started
                out = rendered(result)
                if result.status != "ok":
                    why = result.error.text() if result.error else result.status
                    yield Outcome(block, False, seconds, f"{result.status}: {why}", out)
                    return
                missing = [p for p in block.expects if not re.search(p, out, re.M)]
                if missing:
                    yield Outcome(block, False, seconds,
                                  f"output does not match {missing[0]!r}", out)
                    return
                yield Outcome(block, True, seconds, "", out)
        finally:
            kernel.shutdown()


def skill_files(paths: Sequence[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        out.extend(sorted(p.rglob("SKILL.md")) if p.is_dir() else [p])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m simagent.skill_examples SKILL.md|DIR ...", file=sys.stderr)
        return 2
    failed = 0
    for path in skill_files(args):
        for o in run_skill(path):
            mark = "ok  " if o.ok else "FAIL"
            print(f"{mark} {path}:{o.example.line} block {o.example.index} "
                  f"({o.seconds:.1f} s) {o.detail}")
            if not o.ok:
                failed += 1
                print("  output:\n    " + "\n    ".join(o.output[-3000:].splitlines()))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
