"""Draw conversation entries as terminal rows (pure: entries + width in, rows out).

Tool cards are one line when collapsed; a running ``run_python`` card also shows its
code and a live tail of the rendered output, so a progress bar redraws in place. Ctrl+O
expands every card and reasoning block; an expanded card still shows a bounded tail of
the output with a note naming the file that holds all of it, and lists the PNG file of
every figure the tool showed (see :func:`figure_rows` on why images are not drawn).
"""

from __future__ import annotations

import time
from typing import Any

from simagent.kernel_api.figures import parse_captions
from simagent.outcomes import mark as outcome_mark
from simagent.presentation.footnotes import SOURCES, sup
from simagent.presentation.notices import one_line
from simagent.presentation.previews import action_preview
from simagent.tui.entries import (
    NOTES_MAX_CHARS,
    TASK_TOOL,
    ApprovalEntry,
    AssistantEntry,
    Entry,
    NoticeEntry,
    PanelEntry,
    ReasoningEntry,
    ToolCard,
    UserEntry,
)
from simagent.tui.extent import UNKNOWN, Extent, buffer_lines, hidden_note, raw_extent
from simagent.tui.markdown import markdown_rows
from simagent.tui.text import (
    Line,
    cells,
    clip,
    clip_fragments,
    sanitize,
    wrap,
    wrap_fragments,
)

#: Rows of code and of output a running card shows; rows an expanded card shows.
LIVE_CODE_ROWS = 8
LIVE_TAIL_ROWS = 8
EXPANDED_ROWS = 40
REASONING_TAIL_ROWS = 3
REASONING_TAIL_CHARS = 2_000
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
#: Why an expanded card lists figure files instead of drawing them (said once per card).
INLINE_IMAGES_NOTE = ("images are not drawn here: this full-screen UI repaints a text grid, "
                      "which would erase kitty/iTerm2/sixel pictures; open the file")
_NOTICE_STYLE = {"info": "class:notice", "warning": "class:warning", "error": "class:error",
                 "alert": "class:alert", "context": "class:dim", "human": "class:human"}


def tool_label(card: ToolCard) -> str:
    """``run_python``, or ``task → source-explorer`` for a subagent run."""
    if card.name == TASK_TOOL:
        return f"task → {card.args.get('subagent_type') or 'subagent'}"
    return card.name


def _summary(card: ToolCard) -> str:
    if card.name == TASK_TOOL:
        return str(card.args.get("description") or "").split("\n")[0]
    return one_line(card.args, width=200)


def _last_line(text: str) -> str:
    for line in reversed(sanitize(text).split("\n")):
        if line.strip():
            return line.strip()
    return ""


def _outcome(card: ToolCard) -> str:
    """One line of how it ended: the error, else the last printed line, else the result."""
    if card.status == "error" or card.name == TASK_TOOL:
        return _last_line(card.content)
    return (_last_line(card.output.render(max_rows=20))
            or _last_line(card.errors.render(max_rows=20)) or _last_line(card.content))


def _duration(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds < 60 else f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def _indent_rows(rows: list[Line], prefix: str, style: str = "class:dim") -> list[Line]:
    return [[(style, prefix), *row] for row in rows]


def _plain_rows(text: str, width: int, style: str) -> list[Line]:
    return [[(style, piece)] for line in sanitize(text).split("\n") for piece in wrap(line, width)]


def _bounded(text: str, rows: int, width: int, style: str, raw_path: str | None,
             total: Extent | None = None, tail: bool = False) -> list[Line]:
    """The end of ``text`` in at most ``rows`` wrapped rows, from a line's start where one
    fits, under a note saying how much is not shown.

    The note counts real lines: ``total`` is the whole output when ``text`` is a capped
    copy of it (the raw file behind a capped result, the live buffers with the rows they
    dropped, or :data:`UNKNOWN`). ``tail``: ``text`` is only the end of ``total`` (a live
    view), so lines are hidden even when all of ``text`` fits; otherwise ``text`` stands
    whole (a capped result carries its own marker) unless rows of it are cut.
    """
    lines = sanitize(text).rstrip("\n").split("\n") if text.strip() else []
    kept: list[list[str]] = []
    used = 0
    shown = shown_bytes = 0
    for line in reversed(lines):  # wrapped from the end: a long text costs its tail only
        line_rows = wrap(line, width)
        if used + len(line_rows) > rows:
            if not kept:  # one line longer than the room: its end
                kept.insert(0, line_rows[-rows:])
                shown, shown_bytes = 1, len(line.encode()) + 1
            break
        kept.insert(0, line_rows)
        used += len(line_rows)
        shown += 1
        shown_bytes += len(line.encode()) + 1
    out: list[Line] = []
    cut = shown < len(lines)
    more = total is not None and (total.lines is None or total.lines > shown)
    if cut or (tail and more):
        where = f"; full output: {raw_path}" if raw_path else ""
        note = hidden_note(len(lines), shown, shown_bytes, total)
        out += _plain_rows(note + where, width, "class:dim")
    out += [[(style, piece)] for line_rows in kept for piece in line_rows]
    return out


def card_header(card: ToolCard, width: int, now: float) -> Line:
    if card.running:
        mark, style = SPINNER[int(now * 10) % len(SPINNER)], "class:running"
    else:  # from how it ended (simagent.outcomes), not from whether the tool returned
        m = outcome_mark(card.outcome)
        mark, style = m.glyph, f"class:{m.style}"
    who = "" if card.agent == "main" else f"[{card.agent}] "
    label = sanitize(f"{who}{tool_label(card)}")
    timed = card.started is not None or card.elapsed_s is not None
    tail = f" {_duration(card.elapsed(now))}" if timed else ""
    if not card.running and (outcome := _outcome(card)):
        tail += f" · {outcome}"
    summary = sanitize(_summary(card)).replace("\n", " ")
    body = f"{summary}  {tail.strip()}" if summary else tail.strip()
    return clip_fragments([(style, f"{mark} "), ("class:tool.label", label),
                           ("", "  " if body else ""), ("class:tool.summary", body)], width)


def render_card(card: ToolCard, width: int, expanded: bool, now: float) -> list[Line]:
    rows: list[Line] = [card_header(card, width, now)]
    inner = max(1, width - 2)
    live = card.running
    if not (expanded or live):
        return rows
    code = str(card.args.get("code") or "")
    if code and (expanded or card.name == "run_python"):
        code_rows = [(piece, i) for i, line in enumerate(sanitize(code).rstrip("\n")
                                                         .split("\n"))
                     for piece in wrap(line, max(1, inner - 2))]
        limit = len(code_rows) if expanded else LIVE_CODE_ROWS
        shown = code_rows[:limit]
        rows += [[("class:dim", "  │ "), ("class:code", r)] for r, _ in shown]
        if len(code_rows) > limit:  # lines, not wrapped rows: a partly shown one counts
            more = code_rows[-1][1] - shown[-1][1] + (code_rows[limit][1] == shown[-1][1])
            rows.append([("class:dim", clip(f"  │ … {more} more line{'s' * (more != 1)} of "
                                            "code", width))])
    elif expanded and card.args and not code:
        rows += _indent_rows(_plain_rows(one_line(card.args, width=10_000), inner - 2,
                                         "class:code"), "  │ ")
    if card.name == TASK_TOOL and card.notes.strip():
        kept_all = len(card.notes) < NOTES_MAX_CHARS  # else its head was dropped
        rows += _indent_rows(_bounded(card.notes, EXPANDED_ROWS if expanded else
                                      LIVE_TAIL_ROWS, inner, "class:dim", None,
                                      None if kept_all else UNKNOWN, tail=True), "  ")
    # while it runs, the live terminal view; once done, what the tool returned
    room = EXPANDED_ROWS if expanded else LIVE_TAIL_ROWS
    output = card.rendered(room + 1)
    total: Extent | None = Extent(buffer_lines(card.output, card.errors))
    tail = True
    if not live and card.content.strip():
        # the result is capped for the model; its raw file holds every line printed
        output, total, tail = card.content, raw_extent(card.raw_path), False
    if output.strip():
        out_rows = _bounded(output, room, inner - 2, "class:output", card.raw_path, total,
                            tail)
        rows += [[("class:dim", "  ⎿ " if i == 0 else "    "), *row]
                 for i, row in enumerate(out_rows)]
    if expanded and not live:
        rows += figure_rows(card, width)
    return rows


def figure_rows(card: ToolCard, width: int) -> list[Line]:
    """One row per distinct figure the card's result names: id, size and PNG path.

    The path is the whole deal: drawing the image inline (kitty, iTerm2 or sixel graphics)
    would need an escape stream written past prompt_toolkit, which repaints its text grid
    on every frame and scroll and so erases or smears such pictures; no well-kept library
    does that cheaply for a full-screen prompt_toolkit app. So the card says where the
    file is and one line says why it is not drawn.
    """
    seen: dict[str, dict[str, Any]] = {}
    for fig in parse_captions(card.content):
        seen.setdefault(fig["id"], fig)
    if not seen:
        return []
    rows: list[Line] = []
    for fig in seen.values():
        size = f" {fig['size'][0]}x{fig['size'][1]}" if fig["size"] else ""
        rows += _indent_rows(_plain_rows(f"▣ {fig['id']}{size}  {fig['path']}", width - 4,
                                         "class:tool.label"), "  ")
    rows += _indent_rows(_plain_rows(f"({INLINE_IMAGES_NOTE})", width - 4, "class:dim"),
                         "  ")
    return rows


def render_answer(entry: AssistantEntry, width: int, expanded: bool) -> list[Line]:
    """A final answer with its numbers' markers, then its sources block; ctrl+O shows
    under each footnote the lines around it in the cell's output (or code)."""
    f = entry.footnoted
    assert f is not None
    inner = max(1, width - 4)
    rows = _indent_rows(markdown_rows(f.text, max(1, width - 2)), "  ", "")
    hint = "" if expanded else " · ctrl+O shows their lines"
    rows += [[], [("class:dim", clip(f"  {SOURCES}{hint}", width))]]
    for note, line in zip(f.notes, f.block(sup), strict=False):
        rows += _indent_rows(_plain_rows(line, inner, "class:notice"), "  ", "")
        if expanded:
            for n, text in entry.lines.get(note.key, ()):
                style = "class:output" if n == note.line else "class:dim"
                rows += _indent_rows(_plain_rows(text, max(1, inner - 8), style),
                                     f"    {n:>4} │ ")
    if f.unsourced:
        rows += _indent_rows(_plain_rows(f.block()[-1], inner, "class:warning"), "  ", "")
    return rows


def render_reasoning(entry: ReasoningEntry, width: int, expanded: bool, now: float
                     ) -> list[Line]:
    if entry.done and not expanded:
        took = (entry.ended or now) - entry.started
        return [[("class:reasoning", clip(f"✻ thought for {_duration(took)} "
                                          f"({len(entry.text):,} chars) · ctrl+O shows it",
                                          width))]]
    rows = [[("class:reasoning", clip("✻ thinking…" if not entry.done else "✻ reasoning",
                                      width))]]
    # the rolling tail needs only the end of the text (bounded work per frame)
    text = entry.text if expanded else entry.text[-REASONING_TAIL_CHARS:]
    body = _plain_rows(text.strip(), max(1, width - 2), "class:reasoning")
    if not expanded:
        body = body[-REASONING_TAIL_ROWS:]
    return rows + _indent_rows(body, "  ", "class:reasoning")


def _diff_style(line: str) -> str:
    if line.startswith(("+++", "---")):
        return "class:diff.file"
    if line.startswith("+"):
        return "class:diff.add"
    if line.startswith("-"):
        return "class:diff.del"
    if line.startswith("@@"):
        return "class:diff.hunk"
    return "class:output"


def render_approval(entry: ApprovalEntry, width: int, preview: str,
                    expanded: bool = False) -> list[Line]:
    inner = max(1, width - 4)
    if entry.decision is not None:
        return [[("class:dim", clip(sanitize(f"⏸ {entry.name}: {entry.decision}"), width))]]
    rows: list[Line] = [[("class:approval", clip(sanitize(f"⏸ approve {entry.name}?"),
                                                 width))]]
    lines = sanitize(preview).split("\n")
    shown = lines if expanded else lines[:EXPANDED_ROWS]
    for line in shown:
        rows += [[("class:dim", "  │ "), (_diff_style(line), piece)] for piece in wrap(line, inner)]
    if len(lines) > len(shown):
        rows.append([("class:dim", clip(f"  │ … {len(lines) - len(shown)} more lines "
                                        "(ctrl+O shows all)", width))])
    choices = ["y approve" if "approve" in entry.allowed else "",
               "n reject" if "reject" in entry.allowed else "",
               "or type a reply to send instead" if "respond" in entry.allowed else ""]
    rows += wrap_fragments([("class:approval", "  " + " · ".join(c for c in choices if c))],
                           width)
    return rows


def render_entry(entry: Entry, width: int, expanded: bool, now: float,
                 previews: dict[tuple[str, int], str] | None = None) -> list[Line]:
    """One entry's rows, each at most ``width`` cells (prefixes included)."""
    width = max(1, width)
    rows = _entry_rows(entry, width, expanded, now, previews)
    return [row if sum(cells(t) for _, t in row) <= width else clip_fragments(row, width)
            for row in rows]


def _entry_rows(entry: Entry, width: int, expanded: bool, now: float,
                previews: dict[tuple[str, int], str] | None) -> list[Line]:
    if isinstance(entry, UserEntry):
        rows: list[Line] = []
        for i, line in enumerate(sanitize(entry.text).split("\n")):
            mark = ("class:user.mark", "› " if i == 0 else "  ")
            rows += wrap_fragments([mark, ("class:user", line)], width, indent="  ")
        return rows
    if isinstance(entry, AssistantEntry):
        if entry.footnoted is not None:
            return render_answer(entry, width, expanded)
        return _indent_rows(markdown_rows(entry.text, max(1, width - 2)), "  ", "")
    if isinstance(entry, ReasoningEntry):
        return render_reasoning(entry, width, expanded, now)
    if isinstance(entry, ToolCard):
        return render_card(entry, width, expanded, now)
    if isinstance(entry, NoticeEntry):
        mark = "↳ " if entry.level == "human" else ""
        return [[(_NOTICE_STYLE.get(entry.level, "class:notice"), r)]
                for r in wrap(mark + sanitize(entry.text), width)]
    if isinstance(entry, PanelEntry):
        title = ([[("class:panel.title", clip(sanitize(entry.title).replace("\n", " "), width))]]
                 if entry.title else [])
        return title + _plain_rows(entry.text.rstrip("\n"), width, "class:panel")
    if isinstance(entry, ApprovalEntry):
        key = (entry.interrupt_id, entry.index)
        preview = (previews or {}).get(key) or action_preview(entry.name, entry.args, None)
        return render_approval(entry, width, preview, expanded)
    return []


def render_conversation(entries: list[Entry], width: int, expanded: bool,
                        now: float | None = None,
                        previews: dict[tuple[str, int], str] | None = None) -> list[Line]:
    """All entries as rows, a blank row between blocks (consecutive cards stay together)."""
    return RenderCache().render(entries, width, expanded, now, previews)


def _signature(entry: Entry) -> tuple[object, ...] | None:
    """What an entry's rows depend on besides width and ctrl+O; None = always redraw."""
    if isinstance(entry, ToolCard):
        if entry.running:
            return None  # spinner, elapsed time, live output
        return (entry.status, entry.elapsed_s, len(entry.content), len(entry.notes),
                entry.raw_path)
    if isinstance(entry, ReasoningEntry):
        return (len(entry.text),) if entry.done else None
    if isinstance(entry, AssistantEntry):
        return (len(entry.text), entry.footnoted is not None)
    if isinstance(entry, ApprovalEntry):
        return (entry.decision,)
    return ()


class RenderCache:
    """Rows of settled entries kept between frames, so a long session redraws cheaply.

    Only running cards and streaming reasoning are drawn every frame; everything else is
    redrawn when its signature, the width or the ctrl+O state changes.
    """

    def __init__(self) -> None:
        self._rows: dict[int, tuple[tuple[object, ...], Entry, list[Line]]] = {}

    def render(self, entries: list[Entry], width: int, expanded: bool,
               now: float | None = None,
               previews: dict[tuple[str, int], str] | None = None) -> list[Line]:
        now = time.monotonic() if now is None else now
        rows: list[Line] = []
        prev: Entry | None = None
        alive: dict[int, tuple[tuple[object, ...], Entry, list[Line]]] = {}
        for entry in entries:
            glued = isinstance(entry, ToolCard) and isinstance(prev, ToolCard) and not expanded
            if prev is not None and not glued:
                rows.append([])
            sig = _signature(entry)
            key = (width, expanded, sig)
            hit = self._rows.get(id(entry))
            if sig is not None and hit is not None and hit[0] == key and hit[1] is entry:
                part = hit[2]
            else:
                part = render_entry(entry, width, expanded, now, previews)
            if sig is not None:
                alive[id(entry)] = (key, entry, part)
            rows += part
            prev = entry
        self._rows = alive
        return rows
