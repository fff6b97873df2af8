"""The kernel side of the human-only channel (see :data:`simagent.kernel.HUMAN_MIME`).

Some things matter to the person but would only cost the model tokens and distract it:
a dashboard URL, a "this will take a while" note. They are published as a
``display_data`` of a private mime type, which simagent's capture routes to the UI
(and the trace) but never into the model-facing text. Other Jupyter front-ends show the
``text/plain`` twin, so the helper stays useful outside simagent.
"""

from __future__ import annotations

import sys

from simagent.kernel import HUMAN_MIME

_shown: set[str] = set()


def notify_human(text: str, *, once: bool = False) -> None:
    """Show ``text`` to the user, not to the model (stderr outside an IPython kernel).

    With ``once=True`` the same text is shown at most once per kernel process.
    """
    text = str(text)
    if once:
        if text in _shown:
            return
        _shown.add(text)
    shell = None
    if "IPython" in sys.modules:
        try:
            from IPython import get_ipython  # already loaded (checked above); kernel side

            shell = get_ipython()
        except Exception:
            shell = None
    if shell is None or getattr(shell, "display_pub", None) is None:
        print(text, file=sys.stderr, flush=True)
        return
    from IPython.display import publish_display_data  # in a kernel only: IPython is there

    publish_display_data({HUMAN_MIME: {"text": text}, "text/plain": text})
