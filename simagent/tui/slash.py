"""What each slash command does (the ``handler`` and ``source`` names of ``commands.py``).

Each ``cmd_*`` takes the controller and the argument text and adds its output to the
conversation; each ``complete_*`` returns ``(value, meta)`` pairs for Tab. They reuse
the pure renderers the CLI uses (``render_context``, ``render_notes``, the sessions
table, the transcript renderers), so a panel reads the same in both places.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from simagent.config import APPROVAL_MODES
from simagent.context.memory import list_notes, read_note, render_notes
from simagent.kernel.ladder import offer_text
from simagent.models import kind_suggestions
from simagent.paths import write_private
from simagent.presentation.transcript import render_html, render_markdown
from simagent.trace.sessions import format_sessions_table, list_sessions
from simagent.tui.commands import help_text
from simagent.tui.text import clip

if TYPE_CHECKING:
    from simagent.tui.controller import TuiController

#: Model strings offered by Tab after ``/model `` (any provider:model string works).
SUGGESTED_MODELS = (
    ("anthropic:claude-sonnet-4-5", "Anthropic (ANTHROPIC_API_KEY)"),
    ("anthropic:claude-haiku-4-5", "Anthropic, fast and cheap"),
    ("openai:gpt-5", "OpenAI (OPENAI_API_KEY)"),
    ("openai:gpt-5-mini", "OpenAI, fast and cheap"),
    ("google_genai:gemini-2.5-pro", "Google (GOOGLE_API_KEY)"),
    ("ollama:qwen3:8b", "local Ollama server"),
    ("openai-compatible:MODEL@http://127.0.0.1:8080/v1", "llama.cpp, vLLM, LM Studio"),
)


def _width(ctl: TuiController) -> int:
    return max(20, min(100, ctl.width - 2))


# ----------------------------------------------------------------- commands
def cmd_help(ctl: TuiController, arg: str) -> None:
    ctl.panel("Help", help_text(_width(ctl)))


def cmd_context(ctl: TuiController, arg: str) -> None:
    from simagent.context.panel import render_context  # langchain: not at first paint

    if ctl.session is None:
        ctl.note("no session", "warning")
        return
    ctl.stats = ctl.context_stats()
    ctl.panel("", render_context(ctl.stats, width=_width(ctl)))


def _manual(ctl: TuiController, arg: str, which: str) -> None:
    from simagent.context.manual import checkpoint_now, compact_now  # heavy (langchain), as above

    if ctl.runner is None or ctl.runner.agent.context is None:
        ctl.note(f"/{which} needs a model (choose one with /model)", "warning")
        return
    agent, config = ctl.runner.agent, ctl.session.thread_config
    fn = compact_now if which == "compact" else checkpoint_now

    def work() -> str:
        result = fn(agent.graph, config, agent.context, arg or None)
        return ("~ " if result.done else "") + result.message

    if ctl.background(f"/{which}", work):
        ctl.note("compacting…" if which == "compact" else "writing a task checkpoint…",
                 "context")


def cmd_compact(ctl: TuiController, arg: str) -> None:
    _manual(ctl, arg, "compact")


def cmd_done(ctl: TuiController, arg: str) -> None:
    _manual(ctl, arg, "done")


def cmd_model(ctl: TuiController, arg: str) -> None:
    if not arg:
        window = ctl.runner.agent.window if ctl.runner is not None else None
        where = f" (window {window:,} tokens)" if window else ""
        ctl.note(f"model: {ctl.model_id}{where}" if ctl.model_id else
                 "no model configured; /model provider:model chooses one", "info")
        return
    held = ctl.held
    if ctl.switch_model(arg):
        ctl.note(f"model: {ctl.model_id} (same conversation)", "info")
        if held and ctl.draft == held:
            ctl.note("your message is back in the input line; Enter sends it", "info")
        elif ctl.draft:
            ctl.note("replay demo: its prompt is in the input line; Enter sends it", "info")


def cmd_reset(ctl: TuiController, arg: str) -> None:
    if ctl.session is None:
        return
    if not ctl.kernel_ready:
        ctl.note("the kernel is still starting; /reset when it is up", "warning")
        return

    def work() -> str:
        seconds = ctl.session.restart_kernel()
        return f"kernel restarted in {seconds:.1f}s; variables are gone"

    def go() -> None:
        if ctl.background("/reset", work):
            ctl.note("restarting the kernel…", "warning")

    kernel = ctl.session.kernel.status()
    if kernel.owned:
        go()
    else:  # the person's kernel: say what a restart does to it, and ask
        ctl.ask(f"/reset restarts {kernel.where}. {kernel.on_restart} Restart it?", go)


def cmd_restore(ctl: TuiController, arg: str) -> None:
    """Restart and replay (``Session.restore_kernel``): after a crash that lost more than
    the automatic replay could bring back, or after ``--continue`` in a new process."""
    if ctl.session is None:
        return
    if ctl.session.kernel_state == "replay":
        ctl.note("a replayed session's kernel is its recording; nothing to restore", "info")
        return
    if not ctl.kernel_ready:
        ctl.note("the kernel is still starting; /restore when it is up", "warning")
        return

    def work() -> str | None:
        rec = ctl.session.restore_kernel()
        if not rec.offered:
            return rec.message()
        # left out for what they did outside the kernel: show it, then ask

        text, ns = offer_text(rec, ctl.session.workspace), [s.n for s in rec.offered]
        ctl.post(lambda: ctl.note(rec.message(), "info"))
        ctl.post(lambda: ctl.panel("/restore: not replayed", text))
        ctl.post(lambda: ctl.ask("Run them now?", lambda: _run_offered(ctl, ns)))
        return None

    if ctl.background("/restore", work):
        ctl.note("restarting the kernel and replaying this session's cells…", "warning")


def _run_offered(ctl: TuiController, ns: list[int]) -> None:
    """The cells ``/restore`` offered, run after the user said yes."""
    def work() -> str:
        done = ctl.session.run_offered(ns)
        return "; ".join(f"_out[{d['n']}] `{d['line']}`: {d['status']}"
                         + (f" ({d['error']})" if d["error"] else "") for d in done)

    if ctl.background("/restore", work):
        ctl.note("running the cells again…", "warning")


def cmd_interrupt(ctl: TuiController, arg: str) -> None:
    if not ctl.busy:
        ctl.note("nothing is running", "info")
        return
    ctl.cancel_turn()


def cmd_memory(ctl: TuiController, arg: str) -> None:
    folder = ctl.session.memory_dir
    if not arg:
        ctl.panel("", render_notes(list_notes(folder), folder))
        return
    try:
        path, text = read_note(folder, arg)
    except LookupError as exc:
        ctl.note(str(exc), "warning")
        return
    ctl.panel(str(path), text)


def skill_rows(sources: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """``(source label, name, description)`` of every skill folder in ``sources``."""
    from simagent.frontmatter import read_frontmatter  # yaml: /skills only

    rows = []
    for folder, label in sources:
        for md in sorted(Path(folder).glob("*/SKILL.md")):
            try:
                meta, _ = read_frontmatter(md)
            except (ValueError, OSError):  # listed by folder name, description unknown
                meta = {}
            rows.append((label, str(meta.get("name") or md.parent.name),
                         " ".join(str(meta.get("description") or "").split())))
    return rows


def cmd_skills(ctl: TuiController, arg: str) -> None:
    from simagent.agent.context_layers import skill_sources  # heavy (langchain), as above

    rows = skill_rows(skill_sources(ctl.session))
    if not rows:
        ctl.note("no skills found", "warning")
        return
    width = _width(ctl)
    name_w = max(len(r[1]) for r in rows)
    lines, label = [], None
    for src, name, desc in rows:
        if src != label:
            lines.append(f"{src}:")
            label = src
        lines.append(clip(f"  {name:<{name_w}}  {desc}", width))
    ctl.panel("Skills (the agent loads one when a task needs it)", "\n".join(lines))


def cmd_sessions(ctl: TuiController, arg: str) -> None:
    infos = list_sessions(ctl.session.workspace)
    ctl.panel("Sessions (resume one with: simagent --resume ID)",
              format_sessions_table(infos) if infos else "no sessions yet")


def cmd_transcript(ctl: TuiController, arg: str) -> None:
    fmt = (arg or "md").lower()
    if fmt not in ("md", "html"):
        ctl.note("/transcript takes md or html", "warning")
        return
    s = ctl.session
    events = s.trace.events()
    text = (render_html(events, session_dir=s.paths.root) if fmt == "html"
            else render_markdown(events, session_dir=s.paths.root))
    out = s.paths.root / f"transcript.{fmt}"
    write_private(out, text)  # state: 0600, as every file in the session folder
    ctl.note(f"transcript written: {out}", "info")


def cmd_notebook(ctl: TuiController, arg: str) -> None:
    from simagent.notebooks.export import ExportError, export  # nbformat: /notebook only

    s = ctl.session
    try:
        _, _, message = export(s.paths.root, arg.strip() or None, s.workspace)
    except ExportError as exc:
        ctl.note(f"/notebook: {exc}", "warning")
        return
    ctl.note(message, "info")


def cmd_approval(ctl: TuiController, arg: str) -> None:
    if not arg:
        from simagent.agent.approval import MODE_HELP, NEVER_GATED  # langchain: not at first paint

        lines = [f"now: {ctl.session.approval} (shift+Tab cycles; /approval MODE sets it)",
                 *[f"{m}: {h}" for m, h in MODE_HELP.items()], f"every mode: {NEVER_GATED}"]
        ctl.panel("Approval", "\n".join(lines))
        return
    if arg not in APPROVAL_MODES:
        ctl.note(f"approval mode must be one of {', '.join(APPROVAL_MODES)}", "warning")
        return
    if ctl.set_approval(arg):
        ctl.note(f"approval: {arg}", "info")
    else:
        ctl.note(f"approval stays {ctl.session.approval}", "warning")


def cmd_reset_ceiling(ctl: TuiController, arg: str) -> None:
    if ctl.runner is None:
        ctl.note("no model yet", "warning")
        return
    if ctl.runner.reset_cost_ceiling():
        ctl.note("cost ceiling reset; the configured limits still apply to the turns "
                 "that follow", "context")
    else:
        ctl.note("the cost ceiling has not been reached", "info")


def cmd_clear(ctl: TuiController, arg: str) -> None:
    if not ctl.kernel_ready:
        ctl.note("the kernel is still starting; /clear when it is up", "warning")
        return
    old = ctl.session.id
    if not ctl.new_conversation():
        return
    ctl.note(f"new conversation {ctl.session.id} (kernel state kept; "
             f"resume the old one with: simagent --resume {old})", "info")


def cmd_quit(ctl: TuiController, arg: str) -> None:
    ctl.quit_requested = True
    if ctl.busy:
        ctl.cancel_turn()


# --------------------------------------------------------------- completion
def complete_models(ctl: TuiController) -> list[tuple[str, str]]:
    return [*SUGGESTED_MODELS, *kind_suggestions()]  # replay: offers the bench's workflows


def complete_memory(ctl: TuiController) -> list[tuple[str, str]]:
    if ctl.session is None:
        return []
    return [(Path(n.file).stem, n.title) for n in list_notes(ctl.session.memory_dir)]


def complete_transcript(ctl: TuiController) -> list[tuple[str, str]]:
    return [("md", "markdown"), ("html", "HTML with plots embedded")]


def complete_approval(ctl: TuiController) -> list[tuple[str, str]]:
    from simagent.agent.approval import MODE_HELP  # langchain: not at first paint

    return list(MODE_HELP.items())
