"""The status bar as styled fragments (pure: a snapshot in, fragments out).

The ``ctx NN%`` label and its level come from ``simagent.context.panel.status_label``,
the same function ``/context`` uses, so the bar and the panel cannot disagree. On a
narrow terminal the least important fields go first; the context share goes last.
While a model call waits to retry a provider fault, ``retry`` (``provider 503 — retry
2/5 in 3s``, counted down by the controller) takes the place of ``● working``.
While the model has been asked and has not answered yet, the bar counts the seconds
(``first token… 12s``: a small local model can think for a minute); once it answers, it
shows how long its first token took (``first token 3.4s``) until the next call
(:func:`latency_label`).
"""

from __future__ import annotations

from dataclasses import dataclass

from simagent.tui.text import Fragment, cells, clip

_LEVEL_STYLE = {"dim": "class:status.ctx", "warning": "class:status.ctx.warning",
                "alert": "class:status.ctx.alert"}
_KERNEL_STYLE = {"idle": "class:status.kernel", "busy": "class:status.kernel.busy",
                 "starting": "class:status.kernel.busy",
                 "restarting": "class:status.kernel.busy",
                 "dead": "class:status.kernel.dead", "stopped": "class:status.kernel"}


@dataclass(frozen=True)
class StatusSnapshot:
    simulator: str | None
    model: str | None
    session_id: str
    approval: str
    kernel: str
    cost_usd: float | None
    ctx_label: str
    ctx_level: str  # dim | warning | alert
    busy: bool = False
    retry: str | None = None  # a provider retry's countdown label, while one waits
    waiting_s: float | None = None  # seconds the model has been asked without answering
    first_token_s: float | None = None  # how long the last call's first token took


#: The retry countdown: the warning colour the app already defines, plus its own class.
RETRY_STYLE = "class:status.ctx.warning class:status.retry"

#: Longest model id the bar shows (the whole id is in /model and /context).
MODEL_CELLS = 32


def short_model(model_id: str) -> str:
    """A model id for the bar: a scripted model's file name, long ids clipped."""
    kind, _, rest = model_id.partition(":")
    if kind == "scripted" and "/" in rest:
        model_id = f"scripted:{rest.rsplit('/', 1)[-1]}"
    return clip(model_id, MODEL_CELLS)


def _cost(usd: float | None) -> str:
    if usd is None:
        return "cost ?"
    return f"${usd:.4f}" if usd < 1 else f"${usd:,.2f}"


def latency_label(waiting_s: float | None, first_token_s: float | None) -> str | None:
    """``first token… 12s`` while the model has said nothing yet (whole seconds, counting
    up), else ``first token 3.4s`` (the last call's), else None."""
    if waiting_s is not None:
        return f"first token… {int(max(0.0, waiting_s))}s"
    if first_token_s is not None:
        return f"first token {first_token_s:.1f}s"
    return None


def status_fragments(s: StatusSnapshot, width: int) -> list[Fragment]:
    """Fields joined by `` · ``, dropping optional ones until the bar fits ``width``."""
    fields: list[tuple[float, Fragment]] = [  # (priority: lower drops first, fragment)
        (1, ("class:status.sim", s.simulator or "no simulator")),
        (4, ("class:status.model", short_model(s.model) if s.model
              else "no model — /model to choose")),
        (0, ("class:status", s.session_id[:15])),  # the date-time prefix resumes it
        (2, ("class:status.approval", f"approval {s.approval}")),
        (5, (_KERNEL_STYLE.get(s.kernel, "class:status.kernel"), f"kernel {s.kernel}")),
        (3, ("class:status", _cost(s.cost_usd))),
        (6, (_LEVEL_STYLE.get(s.ctx_level, "class:status.ctx"), s.ctx_label)),
    ]
    latency = latency_label(s.waiting_s if s.busy else None, s.first_token_s)
    if latency:  # after the busy mark, dropped before the context share
        fields.insert(0, (5.5, ("class:status", latency)))
    if s.busy and s.retry:  # the turn waits on the provider: say why and for how long
        fields.insert(0, (7, (RETRY_STYLE, f"↻ {s.retry}")))
    elif s.busy:  # input waits and ctrl+C interrupts until this goes
        fields.insert(0, (7, ("class:status.busy", "● working")))

    def size(items: list[tuple[float, Fragment]]) -> int:
        return 1 + sum(cells(f[1]) for _, f in items) + 3 * (len(items) - 1)

    kept = list(fields)
    while len(kept) > 1 and size(kept) > width:
        kept.remove(min(kept, key=lambda item: item[0]))
    out: list[Fragment] = [("class:status", " ")]
    for i, (_, frag) in enumerate(kept):
        if i:
            out.append(("class:status", " · "))
        out.append(frag)
    if size(kept) > width:  # one field left and still too wide
        out = [(kept[0][1][0], clip(" " + kept[0][1][1], width))]
    used = sum(cells(t) for _, t in out)
    if used < width:
        out.append(("class:status", " " * (width - used)))
    return out
