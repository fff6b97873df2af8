"""The system prompt, assembled per session from pure parts.

Three parts, in an order chosen for prompt caching (stable first): ground rules stated
once; the active simulator's description and domain hints; runtime context (paths,
plotting, resume note). The skills index and the memory index are appended by their
middleware on every call; their bodies are read on demand. Always-on rules live here,
never in skills, because skills are only read when the model chooses to.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from simagent.context.counting import MEMORY_MARKER, SKILLS_MARKER
from simagent.simulators import Simulator

MEMORY_PROMPT = MEMORY_MARKER + """
{agent_memory}
</workspace_memory>
Above is the index of this workspace's memory: notes saved in earlier sessions, one line \
each. Read a note with `read_file` when its title matters for the task. Save new durable \
findings with `remember` (never edit MEMORY.md by hand). Trust what you measure now over a \
stale note, and update the note when it is wrong."""

SKILLS_PROMPT = SKILLS_MARKER + """\
Skills are verified recipes for this environment. Only their names and descriptions are \
listed here; before a task a skill describes, read its SKILL.md with \
`read_file(file_path=<path>, limit=1000)` and follow it. Files a skill mentions sit beside \
its SKILL.md.
{skills_locations}{skills_load_warnings}
{skills_list}"""

GROUND_RULES = """\
You are simagent, an assistant for scientists who study systems by simulation. You work \
in a persistent Python kernel: you write code, run it with `run_python`, read the results \
and iterate until the question is answered with evidence.

How you work:
- Compute, don't guess. Every number you report comes from code you ran in this session \
(or a file you read), and you say which run produced it. Report units.
- The kernel keeps state between calls. Build on earlier cells instead of re-running \
them; define expensive objects once.
- Start small (a short run, a coarse grid), check the result is plausible, then scale up.
- Print summaries, not raw arrays. A cell's long output is cut, and older results are \
cleared from view; either way the result names the full output, `_out[n]` in the \
kernel: page it back with `_out[n].slice(first, last)`, `.grep(pattern)` or `.tail(k)`; \
the cell's code is `_out[n].code`. Other cleared results say how to get them back.
- When a simulator's API is unclear, read its installed source or examples (real paths \
below) rather than guessing signatures. Skills listed below hold verified recipes: read \
one before a task it describes.
- Delegate with `task`: `source-explorer` answers one narrow question from the installed \
source, `run-analyst` digests a long log or result file; each returns a short typed record \
(answer, key values with units, files read), so browsing never fills your context.
- When you search parameters, log every evaluated attempt with `record_attempt`.
- Save durable, reusable findings (validated settings, data locations, pitfalls, user \
preferences) with `remember`.
- File tools take absolute paths. Write files inside the workspace unless asked otherwise.
- Finish with a short answer: the result, the key numbers with units, the files and \
figures produced, and any caveat that matters. If something failed, say what and why."""


@dataclass(frozen=True)
class RuntimeContext:
    workspace: Path
    session_dir: Path
    artifacts_dir: Path
    outputs_dir: Path
    memory_dir: Path
    python: str
    plotting: bool = True
    approval: str = "ask"
    resumed_at: str | None = None
    kernel_restarted: bool = False
    source_dirs: tuple[Path, ...] = ()
    #: The Dask scheduler ``ensemble`` uses, when one is configured (else a local cluster).
    cluster: str | None = None
    extra: str = ""


def simulator_section(sim: Simulator | None) -> str:
    if sim is None:
        return ("## Simulator\nNo simulator is configured for this workspace: use general "
                "scientific Python (numpy, scipy, matplotlib) and whatever packages are "
                "installed.")
    parts = [f"## Simulator: {sim.display_name}", sim.description]
    if sim.packages:
        parts.append("Import packages: " + ", ".join(f"`{p}`" for p in sim.packages))
    if sim.domain_hints:
        parts.append("### Domain hints\n" + sim.domain_hints)
    return "\n\n".join(parts)


def runtime_section(ctx: RuntimeContext) -> str:
    lines = [
        "## Runtime",
        f"- Workspace (kernel working directory): {ctx.workspace}",
        f"- Figures are saved to: {ctx.artifacts_dir}",
        f"- Full raw output of every run: {ctx.outputs_dir}/<n>.txt",
        f"- Session state folder: {ctx.session_dir}",
        f"- Workspace memory notes: {ctx.memory_dir}",
        f"- Python: {ctx.python}",
    ]
    if ctx.plotting:
        lines.append("- Plotting: matplotlib is available; each figure shown in a cell is "
                     "saved as PNG and returned as its id, path and a data summary (axes, "
                     "ranges, series). There is no display window.")
    if ctx.source_dirs:
        lines.append("- Installed simulator source (read-only): "
                     + ", ".join(str(p) for p in ctx.source_dirs))
    if ctx.cluster:
        lines.append(f"- Ensembles and sweeps (`simagent.kernel_api.ensemble`) run on the Dask "
                     f"cluster at {ctx.cluster}; read the `ensembles` skill first.")
    mode = {"ask": "shell commands and file writes wait for the user's approval",
            "workspace": "shell commands, and file writes outside the workspace, wait for "
                         "the user's approval",
            "auto": "tools run without asking"}[ctx.approval]
    lines.append(f"- Approval mode `{ctx.approval}`: {mode}. `run_python` never waits.")
    if ctx.resumed_at:
        if ctx.kernel_restarted:
            lines.append(f"- This session was resumed at {ctx.resumed_at} and the Python "
                         "kernel was restarted then: variables, imports and figures from "
                         "before are gone. Re-run the setup you need before using them.")
        else:
            lines.append(f"- This session was resumed at {ctx.resumed_at}; the kernel kept "
                         "running, so its variables are still defined.")
    if ctx.extra:
        lines.append(ctx.extra)
    return "\n".join(lines)


def build_system_prompt(sim: Simulator | None, ctx: RuntimeContext) -> str:
    return "\n\n".join([GROUND_RULES, simulator_section(sim), runtime_section(ctx)])
