"""Assistant markdown as terminal rows: rich's renderer, converted to prompt_toolkit fragments.

Pure: ``markdown_rows(text, width)`` returns rows of ``(style, text)`` fragments, at most
``width`` cells each, with no escape sequences, so it is tested without a terminal.
`rich <https://rich.readthedocs.io>`_ does the layout a terminal markdown viewer does:
paragraphs wrapped at word boundaries, tables with aligned columns, nested lists, code
blocks, emphasis. Its segments are converted to prompt_toolkit style strings directly
(no ANSI round trip), every row tagged ``class:md`` so the app's style can tune them.

HTML is not interpreted: a model that writes ``<tau>`` or ``<b>`` sees it shown as
typed, not silently dropped (rich drops inline HTML tags).

Streaming: the growing message is re-rendered at the current width as text arrives.
Each top-level block (paragraph, list, table, fence ...) is rendered on its own and
cached by its source and the width, and only the last blocks are parsed again as text
arrives, so a frame costs the block being written, not the whole message. Splitting at
top-level blocks is exact: rich separates them with one blank row, and markdown-it
resolves reference links at parse time, so no block depends on another's rendering.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import ClassVar

from markdown_it import MarkdownIt
from markdown_it.token import Token
from rich.color import Color, ColorType
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markdown import CodeBlock, ListItem, Markdown, MarkdownElement
from rich.segment import Segment
from rich.style import Style
from rich.syntax import Syntax
from rich.theme import Theme

from simagent.tui.text import Line, sanitize

#: Code blocks use the terminal's own 16 colours (any background, light or dark).
CODE_THEME = "ansi_dark"
#: Inline code without rich's black background box, which is unreadable on light themes.
_THEME = Theme({"markdown.code": "bold cyan", "markdown.block_quote": "italic"})
#: Rendered blocks kept (source, width) -> rows; a long session re-renders little.
_BLOCK_CACHE_SIZE = 2_048

#: prompt_toolkit's names for the 16 standard colours, in ANSI order.
_ANSI = ("ansiblack", "ansired", "ansigreen", "ansiyellow", "ansiblue", "ansimagenta",
         "ansicyan", "ansigray", "ansibrightblack", "ansibrightred", "ansibrightgreen",
         "ansibrightyellow", "ansibrightblue", "ansibrightmagenta", "ansibrightcyan",
         "ansiwhite")
_ATTRS = ("bold", "dim", "italic", "underline", "strike", "blink", "reverse")

# html off: tags are text; tables and ~~strike~~ on, as rich enables them
_PARSER = MarkdownIt("commonmark", {"html": False}).enable("strikethrough").enable("table")


class _Item(ListItem):
    """A list item whose ordered number reads ``1.`` (rich draws a bare ``1``)."""

    def render_number(self, console: Console, options: ConsoleOptions, number: int,
                      last_number: int) -> RenderResult:
        gutter = len(str(last_number)) + 3  # " 12. "
        style = console.get_style("markdown.item.number", default="none")
        body = console.render_lines(self.elements, options.update(
            width=max(1, options.max_width - gutter)), style=self.style)
        for i, line in enumerate(body):
            yield Segment(f"{number}. ".rjust(gutter) if i == 0 else " " * gutter, style)
            yield from line
            yield Segment("\n")


class _Code(CodeBlock):
    """A code block behind a ``│`` gutter, so it stands apart without colour too (and a
    copied line has no padding glued to it)."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        syntax = Syntax(str(self.text).rstrip(), self.lexer_name, theme=self.theme,
                        word_wrap=True, padding=0)
        gutter = Segment("│ ", console.get_style("markdown.hr", default="dim"))
        for line in console.render_lines(syntax, options.update(
                width=max(1, options.max_width - 2))):
            yield gutter
            yield from line
            yield Segment("\n")


class _Tokens(Markdown):
    """rich's Markdown over tokens parsed elsewhere (our parser; one top-level block)."""

    elements: ClassVar[dict[str, type[MarkdownElement]]] = {
        **Markdown.elements, "list_item_open": _Item, "fence": _Code, "code_block": _Code}

    def __init__(self, tokens: list[Token]) -> None:
        super().__init__("", code_theme=CODE_THEME, hyperlinks=False)
        self.parsed = tokens


def _color(color: Color | None) -> str | None:
    if color is None or color.type == ColorType.DEFAULT:
        return None
    if color.type in (ColorType.STANDARD, ColorType.WINDOWS) and color.number is not None \
            and color.number < len(_ANSI):
        return _ANSI[color.number]
    return color.get_truecolor().hex


def pt_style(style: Style | None) -> str:
    """A rich style as a prompt_toolkit style string (links are shown as text)."""
    parts = ["class:md"]
    if style is None:
        return parts[0]
    parts += [name for name in _ATTRS if getattr(style, name)]
    if fg := _color(style.color):
        parts.append(fg)
    if bg := _color(style.bgcolor):
        parts.append(f"bg:{bg}")
    return " ".join(parts)


def _console(width: int) -> Console:
    return Console(width=width, force_terminal=True, color_system="truecolor", theme=_THEME,
                   emoji=False, highlight=False, markup=False, legacy_windows=False,
                   soft_wrap=False, file=_NullFile())


class _NullFile:
    """Rendering never prints; a Console still wants a file."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def _render(tokens: list[Token], width: int) -> list[Line]:
    console = _console(width)
    lines = console.render_lines(_Tokens(tokens), console.options.update(width=width),
                                 pad=False, new_lines=False)
    rows: list[Line] = []
    for segments in lines:
        row: Line = []
        for seg in segments:
            if seg.control or not seg.text:
                continue
            style = pt_style(seg.style)
            if row and row[-1][0] == style:
                row[-1] = (style, row[-1][1] + seg.text)
            else:
                row.append((style, seg.text))
        # the padding rich adds to fill the width is not content
        while row and not row[-1][1].strip() and "bg:" not in row[-1][0]:
            row.pop()
        if row and "bg:" not in row[-1][0]:
            row[-1] = (row[-1][0], row[-1][1].rstrip())
        rows.append(row)
    # blocks are joined with one blank row; rich's own edges (a table's) are dropped
    while rows and not rows[-1]:
        rows.pop()
    while rows and not rows[0]:
        rows.pop(0)
    return rows


@dataclass(frozen=True)
class Block:
    """One top-level block: its first source line, its source text, its tokens."""

    line: int
    source: str
    tokens: list[Token]


@dataclass(frozen=True)
class _Parsed:
    text: str
    blocks: list[Block]
    refs: bool  # reference definitions: a later one changes earlier links


def _parse(lines: list[str], first: int) -> _Parsed:
    """Blocks of ``lines[first:]`` (their line numbers count from the whole text)."""
    text = "\n".join(lines[first:])
    env: dict[str, object] = {}
    tokens = _PARSER.parse(text, env)
    out: list[Block] = []
    start = 0
    for i, tok in enumerate(tokens):
        if tok.level != 0 or tok.nesting == 1:
            continue
        # a block ends on a level-0 close, or is a level-0 token on its own (fence, hr)
        span = tokens[start].map or tok.map or [0, 0]
        out.append(Block(first + span[0], "\n".join(lines[first + span[0]:first + span[1]]),
                         tokens[start:i + 1]))
        start = i + 1
    return _Parsed(text, out, bool(env.get("references")))


def blocks(text: str) -> list[Block]:
    """The top-level blocks of ``text``, parsed whole."""
    return _parse(text.split("\n"), 0).blocks


#: Recent parses: a streaming message re-parses only from its second-to-last block.
_RECENT: deque[_Parsed] = deque(maxlen=4)


def _blocks_streaming(text: str) -> list[Block]:
    """``blocks(text)``, reusing a recent parse of a prefix of ``text``.

    Appending text can change only the blocks at the end (a paragraph becomes a table or
    a setext heading, a list or quote continues), so the blocks before the last two are
    kept and the rest is parsed again. Reference definitions can reach back to any
    block: with one in sight the whole text is parsed.
    """
    lines = text.split("\n")
    prev = max((p for p in _RECENT if text.startswith(p.text)), key=lambda p: len(p.text),
               default=None)
    parsed: _Parsed | None = None
    if prev is not None and not prev.refs and len(prev.blocks) > 2:
        tail = _parse(lines, prev.blocks[-2].line)
        if not tail.refs:
            parsed = _Parsed(text, prev.blocks[:-2] + tail.blocks, False)
    if parsed is None:
        parsed = _parse(lines, 0)
    if not _RECENT or _RECENT[-1].text != text:
        _RECENT.append(parsed)
    return parsed.blocks


class _LRU(OrderedDict[tuple[str, int], list[Line]]):
    def get_rows(self, key: tuple[str, int]) -> list[Line] | None:
        rows = self.get(key)
        if rows is not None:
            self.move_to_end(key)
        return rows

    def put(self, key: tuple[str, int], rows: list[Line]) -> None:
        self[key] = rows
        if len(self) > _BLOCK_CACHE_SIZE:
            self.popitem(last=False)


_CACHE = _LRU()


def markdown_rows(text: str, width: int) -> list[Line]:
    """``text`` (markdown) as rows of at most ``width`` cells, as a terminal viewer shows it."""
    width = max(1, width)
    rows: list[Line] = []
    for block in _blocks_streaming(sanitize(text)):
        key = (block.source, width)
        part = _CACHE.get_rows(key)
        if part is None:
            part = _render(block.tokens, width)
            _CACHE.put(key, part)
        if rows and part:
            rows.append([])
        rows += part
    return rows
