"""The prompt_toolkit application: layout, keys and completion over ``TuiController``.

A thin shell: what to show comes from the pure renderers (``render.py``, ``status.py``),
what to do from the controller. The transcript is drawn as the visible slice of
pre-wrapped rows, so scrolling, Ctrl+O and very wide output cost the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import Any

from prompt_toolkit.application import Application
from prompt_toolkit.completion import Completer, Completion
from prompt_toolkit.filters import Condition, has_completions
from prompt_toolkit.formatted_text import StyleAndTextTuples
from prompt_toolkit.history import History, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings
from prompt_toolkit.layout import Float, FloatContainer, HSplit, Layout, Window
from prompt_toolkit.layout.controls import FormattedTextControl
from prompt_toolkit.layout.dimension import Dimension
from prompt_toolkit.layout.menus import CompletionsMenu
from prompt_toolkit.styles import Style
from prompt_toolkit.widgets import TextArea

from simagent import exit_codes
from simagent.kernel.connection import left_running
from simagent.outcomes import STYLES as OUTCOME_STYLES
from simagent.paths import state_home
from simagent.tui import commands, slash
from simagent.tui.controller import TuiController
from simagent.tui.history import redacting_file_history
from simagent.tui.render import RenderCache
from simagent.tui.status import status_fragments
from simagent.tui.text import Line

#: A second ctrl+C within this many seconds quits (when idle).
QUIT_WINDOW_S = 2.0
#: Redraw period while something runs (spinner, elapsed time, live output).
TICK_S = 0.2

STYLE = Style.from_dict({
    "user.mark": "bold ansicyan", "user": "bold",
    "md": "",  # assistant markdown carries its own styles (simagent.tui.markdown)
    "tool.label": "bold", "tool.summary": "", "running": "ansiyellow",
    "ok": "ansigreen", "error": "ansired bold", "warning": "ansiyellow",
    "alert": "ansired bold", "notice": "", "human": "ansicyan", "dim": "ansigray",
    "code": "ansibrightblack", "output": "", "reasoning": "italic ansigray",
    "panel": "", "panel.title": "bold", "approval": "bold ansiyellow",
    "diff.add": "ansigreen", "diff.del": "ansired", "diff.hunk": "ansicyan",
    "diff.file": "bold",
    "status": "reverse", "status.sim": "reverse bold", "status.model": "reverse",
    "status.approval": "reverse", "status.kernel": "reverse",
    "status.busy": "reverse ansicyan bold",
    "status.kernel.busy": "reverse ansiyellow", "status.kernel.dead": "reverse ansired bold",
    "status.ctx": "reverse ansigray", "status.ctx.warning": "reverse ansiyellow",
    "status.ctx.alert": "reverse ansired bold", "status.retry": "reverse ansiyellow bold",
    "separator": "ansigray",
    **OUTCOME_STYLES,
})


class SlashCompleter(Completer):
    """Commands on the first word, then each command's argument (from the spec table)."""

    def __init__(self, ctl: TuiController) -> None:
        self.ctl = ctl

    def get_completions(self, document: Any, complete_event: Any) -> Any:
        def source(name: str) -> list[tuple[str, str]]:
            try:
                return getattr(slash, name)(self.ctl)
            except Exception:  # completion must never break typing
                return []

        text = document.text_before_cursor
        if "\n" in text:
            return
        for value, start, meta in commands.completions(text, source):
            yield Completion(value, start_position=start, display_meta=meta)


def _history(ctl: TuiController) -> History:
    try:
        path = state_home() / "input_history"
        return redacting_file_history(str(path))  # a pasted key never reaches the file
    except Exception:
        return InMemoryHistory()


class TuiApp:
    def __init__(self, ctl: TuiController, *, input: Any = None, output: Any = None,
                 history: History | None = None) -> None:
        self.ctl = ctl
        self.expanded = False
        self.scroll = 0  # rows scrolled up from the bottom
        self._last_ctrl_c = 0.0
        self._rows: list[Line] = []
        self._cache = RenderCache()
        self.drawn_kernel = ""  # the kernel state the status bar shows now
        self.input = TextArea(
            height=Dimension(min=1, max=8), prompt=self._prompt, multiline=True,
            wrap_lines=True, dont_extend_height=True, completer=SlashCompleter(ctl),
            complete_while_typing=True,
            history=history if history is not None else _history(ctl))
        self.transcript = Window(FormattedTextControl(self._transcript_fragments),
                                 wrap_lines=False, always_hide_cursor=True)
        status = Window(FormattedTextControl(self._status_fragments), height=1)
        body = HSplit([self.transcript, Window(height=1, char="─", style="class:separator"),
                       self.input, status])
        root = FloatContainer(body, floats=[Float(xcursor=True, ycursor=True,
                                                  content=CompletionsMenu(max_height=10))])
        self.app: Application[Any] = Application(
            layout=Layout(root, focused_element=self.input), key_bindings=self._keys(),
            full_screen=True, mouse_support=False, style=STYLE, input=input, output=output,
            refresh_interval=None)

    # -------------------------------------------------------------- drawing
    def _width(self) -> int:
        try:
            return max(1, self.app.output.get_size().columns)
        except Exception:
            return 80

    def _height(self) -> int:
        info = self.transcript.render_info
        if info is not None:
            return max(1, info.window_height)
        try:
            return max(1, self.app.output.get_size().rows - 3)
        except Exception:
            return 20

    def rows(self) -> list[Line]:
        """Every transcript row at the current width (tests read these)."""
        self.ctl.width = self._width()
        return self._cache.render(self.ctl.conversation.entries, self._width(), self.expanded,
                                  previews=self.ctl.previews)

    def screen_text(self) -> str:
        return "\n".join("".join(t for _, t in row) for row in self.rows())

    def _transcript_fragments(self) -> StyleAndTextTuples:
        rows = self.rows()
        if self.scroll > 0:  # scrolled back: keep the same rows in view as more arrive
            self.scroll += max(0, len(rows) - len(self._rows))
        self._rows = rows
        height = self._height()
        self.scroll = max(0, min(self.scroll, len(rows) - height))
        end = len(rows) - self.scroll
        shown = rows[max(0, end - height):end]
        out: StyleAndTextTuples = []
        for i, row in enumerate(shown):
            if i:
                out.append(("", "\n"))
            out.extend(row)
        return out

    def _status_fragments(self) -> StyleAndTextTuples:
        snap = self.ctl.snapshot()
        self.drawn_kernel = snap.kernel
        return list(status_fragments(snap, self._width()))

    def _prompt(self) -> StyleAndTextTuples:
        if self.ctl.conversation.pending_approvals():
            return [("class:approval", "y/n/reply › ")]
        return [("class:user.mark", "› ")]

    # ----------------------------------------------------------------- keys
    def _keys(self) -> KeyBindings:
        kb = KeyBindings()
        menu_open = Condition(lambda: self.input.buffer.complete_state is not None)

        @kb.add("enter", filter=has_completions & menu_open)
        def _pick(event: Any) -> None:
            buf = self.input.buffer
            state, before = buf.complete_state, buf.text
            if state is not None and state.current_completion is not None:
                buf.apply_completion(state.current_completion)
            buf.complete_state = None
            spec, _ = commands.parse(buf.text)
            # Enter on a finished choice sends; on a command that takes an argument it
            # only completes, so the argument can follow
            if buf.text == before or (spec is not None and not spec.usage):
                self.send()

        @kb.add("enter", filter=~(has_completions & menu_open))
        def _send(event: Any) -> None:
            self.send()

        @kb.add("escape", "enter")
        def _newline(event: Any) -> None:
            self.input.buffer.insert_text("\n")

        @kb.add("c-c")
        def _ctrl_c(event: Any) -> None:
            self.ctrl_c()

        @kb.add("c-d", filter=Condition(lambda: not self.input.text))
        def _ctrl_d(event: Any) -> None:
            self.quit()

        @kb.add("c-o")
        def _toggle(event: Any) -> None:
            self.expanded = not self.expanded
            self.app.invalidate()

        @kb.add("s-tab")
        def _cycle(event: Any) -> None:
            from simagent.agent.approval import next_mode  # langchain: not before first paint

            if self.ctl.session is None:
                return
            if self.ctl.busy:
                self.ctl.note("the approval mode changes when the turn ends", "warning")
                return
            self.ctl.submit(f"/approval {next_mode(self.ctl.session.approval)}")

        @kb.add("c-p")
        def _prev(event: Any) -> None:
            self.input.buffer.history_backward()

        @kb.add("c-n")
        def _next(event: Any) -> None:
            self.input.buffer.history_forward()

        @kb.add("pageup")
        def _up(event: Any) -> None:
            self.scroll += max(1, self._height() - 2)

        @kb.add("pagedown")
        def _down(event: Any) -> None:
            self.scroll = max(0, self.scroll - max(1, self._height() - 2))

        return kb

    # -------------------------------------------------------------- actions
    def send(self) -> None:
        buf = self.input.buffer
        text = buf.text
        if not text.strip():
            return
        buf.append_to_history()
        self.scroll = 0
        if self.ctl.submit(text):
            buf.reset()  # a refused line stays, so nothing typed is lost
        if self.ctl.quit_requested:
            self.quit()
        self._take_draft()
        self.app.invalidate()

    def _take_draft(self) -> None:
        """Put a replay demo's prompt into an empty input line (once)."""
        if self.ctl.draft and not self.input.text:
            self.input.buffer.text = self.ctl.draft
            self.input.buffer.cursor_position = len(self.ctl.draft)
            self.ctl.draft = ""

    def ctrl_c(self) -> None:
        """Interrupt a turn; else clear the input; else ask once more, then quit."""
        now = time.monotonic()
        again = self.ctl.cancelling
        if self.ctl.cancel_turn(force=again):
            self.ctl.note("not waiting any longer: abandoning the turn" if again else
                          "interrupting… (ctrl+C again stops waiting)", "warning")
        elif self.input.text:
            self.input.buffer.reset()
        elif now - self._last_ctrl_c < QUIT_WINDOW_S:
            self.quit()
            return
        else:
            self.ctl.note("press ctrl+C again to quit (the session can be resumed)", "info")
            self._last_ctrl_c = now
            self.app.invalidate()
            return
        self._last_ctrl_c = 0.0  # an interrupt or a cleared line is not half of a quit
        self.app.invalidate()

    def quit(self) -> None:
        self.ctl.quit_requested = True
        if self.app.is_running:
            self.app.exit()

    async def _ticker(self) -> None:
        """Redraw while something runs (spinner, elapsed time, live output), and when the
        kernel's state changes on its own (a cell of an abandoned turn stopping, the
        ladder's restart), so the bar never shows a state the kernel has left."""
        while True:
            await asyncio.sleep(TICK_S)
            if (self.ctl.busy or self.ctl.conversation.running_cards()
                    or self.ctl.snapshot().kernel != self.drawn_kernel):
                self.app.invalidate()

    async def run_async(self, *, open_session: bool = True) -> bool:
        """Open the session (unless already open) and run until quit; False if it
        could not open (the reason is the conversation's last notice)."""
        loop = asyncio.get_running_loop()

        def post(fn: Any) -> None:
            if loop.is_closed():
                return  # the app has ended; late events from workers have no screen
            with contextlib.suppress(RuntimeError):  # closed between the check and here
                loop.call_soon_threadsafe(fn)

        self.ctl.post = post
        self.ctl.invalidate = self.app.invalidate
        if open_session and self.ctl.session is None and not self.ctl.open():
            return False
        self._take_draft()
        ticker = loop.create_task(self._ticker())
        try:
            await self.app.run_async()
        finally:
            ticker.cancel()
            # close while the loop still runs: the turn's last events can still land
            await loop.run_in_executor(None, self.ctl.close)
        return True


def run_tui(opts: Any) -> int:
    """``simagent [tui]``: run the app in this terminal; the exit status for the CLI."""
    ctl = TuiController(opts)
    ui = TuiApp(ctl)
    try:
        opened = asyncio.run(ui.run_async())
    finally:
        ctl.close()
    if not opened:
        last = ctl.conversation.entries[-1] if ctl.conversation.entries else None
        print(f"simagent: error: {getattr(last, 'text', 'the session could not open')}",
              file=sys.stderr)
        return exit_codes.USAGE
    kernel_file = ctl.session.kernel.status().connection_file if ctl.session is not None else None
    if kernel_file is not None:  # the person's kernel: how it was left, and how to go on
        print(f"simagent: session {ctl.session.id}; "
              f"{left_running(kernel_file, f'simagent --resume {ctl.session.id}')}",
              file=sys.stderr)
    elif ctl.session is not None:
        print(f"simagent: session {ctl.session.id} (resume with: simagent --resume "
              f"{ctl.session.id})", file=sys.stderr)
    return exit_codes.OK
