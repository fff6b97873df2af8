"""Plain-text renderers of :class:`ContextStats`: the ``/context`` panel and the status label.

Pure functions of the stats (no terminal, no colours), so ``simagent context``, the TUI and
tests show the same text; the TUI styles the status label by the level returned beside it.
The thresholds printed are the :class:`Thresholds` the middleware acts on, so a user reading
"old tool results start clearing at 120,000 tokens" can trust that it happens there.
"""

from __future__ import annotations

import textwrap
from datetime import datetime

from simagent.context.counting import CALIBRATION_BOUNDS, CATEGORIES, CATEGORY_LABELS
from simagent.context.deferral_policy import tools_lines
from simagent.context.stats import ContextStats, TokenRow
from simagent.records import format_value

BAR_CELLS = 24
#: Status-bar levels: dim below 70 % of the window, warning from 70 %, alert from 90 %.
WARNING_PERCENT = 70
ALERT_PERCENT = 90
_MAX_BOUNDARIES = 10
_MAX_TASKS = 5


def format_tokens(n: int | None) -> str:
    """Compact count for tight places: 1.2M, 85k, 1.5k, 950."""
    n = int(n or 0)
    if abs(n) >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    if abs(n) >= 10_000:
        return f"{n // 1000}k"
    return f"{n / 1000:.1f}k" if abs(n) >= 1000 else str(n)


def _num(n: int | None) -> str:
    return "?" if n is None else f"{n:,}"


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def _share(part: int, whole: int) -> str:
    """A threshold's share of the window as configured: 60%, 62.5%."""
    return f"{100.0 * part / whole:.1f}".removesuffix(".0") + "%" if whole else "-"


def _when(ts: str | None) -> str:
    """Local time; the date only when it is not today."""
    if not ts:
        return "-"
    try:
        when = datetime.fromisoformat(ts).astimezone()
    except ValueError:
        return ts[:19]
    today = datetime.now().astimezone().date()
    return when.strftime("%H:%M:%S" if when.date() == today else "%Y-%m-%d %H:%M")


def _usd(value: float | None) -> str:
    if value is None:
        return "?"
    return f"${value:.4f}" if value < 1 else f"${value:,.2f}"


def bar(percent: float, cells: int = BAR_CELLS) -> str:
    filled = min(cells, max(0, round(cells * percent / 100)))
    return "█" * filled + "░" * (cells - filled)


def whole_percent(stats: ContextStats) -> int:
    """Floor of the exact share, so "70%" is never shown while the level still says dim."""
    return 100 * stats.used // stats.window if stats.window else 0


def status_label(stats: ContextStats) -> tuple[str, str]:
    """``("ctx 42%", level)`` for the status bar; level is dim | warning | alert.

    ``~`` marks an estimate (right after a compaction); with no known window the label
    shows tokens (``ctx 12k``) instead of a share of a guessed window.
    """
    mark = "~" if stats.estimated else ""
    if not stats.window_known:
        return f"ctx {mark}{format_tokens(stats.used)}", "dim"
    pct = whole_percent(stats)
    level = "alert" if pct >= ALERT_PERCENT else "warning" if pct >= WARNING_PERCENT else "dim"
    return f"ctx {mark}{pct}%", level


def _headline(s: ContextStats) -> list[str]:
    est = " (estimated)" if s.estimated else ""
    if not s.window_known:
        return [f"{_num(s.used)} tokens in context{est} (window size unknown; thresholds "
                f"assume {_num(s.window)})"]
    lines = [f"{bar(s.percent)}  {whole_percent(s)}% — {_num(s.used)} of {_num(s.window)} "
             f"tokens{est}"]
    if s.estimated and s.estimated_after:
        lines.append(f"  estimated after a {s.estimated_after} — refined on the next model call")
    elif s.estimated:
        lines.append("  estimated: the model reported no usage, so simagent counted it")
    return lines


def _categories(s: ContextStats) -> list[str]:
    lines = ["Usage by category:"]
    if s.categories is None:
        lines.append(f"  (no split recorded for this session) {_num(s.used)} in all")
    else:
        for cat in CATEGORIES:
            tokens, label = getattr(s.categories, cat), CATEGORY_LABELS[cat]
            lines.append(f"  {label:<15}{_num(tokens):>10}  {_pct(tokens, s.window):>6}")
    free = s.free_tokens
    lines.append(f"  {'free space':<15}{_num(free):>10}  {_pct(free, s.window):>6}")
    return lines


def _thresholds(s: ContextStats) -> list[str]:
    th = s.thresholds
    lines = ["Thresholds:"]
    if th.clear_trigger is not None:
        lines.append(f"  old tool results start clearing at {_num(th.clear_trigger)} tokens "
                     f"({_share(th.clear_trigger, th.window)}), keeping {th.clear_keep}")
        if th.clear_by_cost:
            lines += _clear_cost(s)
    else:
        lines.append("  clearing of old tool results is off")
    if th.summary_trigger is not None:
        tier = f"tier {th.tier}" if th.tier else "tier unknown"
        lines.append(f"  summary at {_num(th.summary_trigger)} tokens "
                     f"({_share(th.summary_trigger, th.window)}, {tier}), keeping "
                     f"{_num(th.summary_keep)} verbatim")
    else:
        lines.append("  summarization is off")
    if th.evict_tokens is not None:
        lines.append(f"  a single result over {_num(th.evict_tokens)} tokens is saved to disk")
    lines.append(f"  reserved for the reply: {_num(th.max_output)} tokens")
    return lines


def _clear_cost(s: ContextStats) -> list[str]:
    """The cost rule and the latest call's figures for it (``context.epoch_cost``)."""
    c = s.clear_cost
    lines = ["  ... or sooner, when keeping old results has cost (cached reads) what",
             "  clearing costs (cache writes), or would over as many calls again"
             + (":" if c else "")]
    if c:
        due = f"; cleared ({c['due']})" if c.get("due") else ""
        lines.append(f"  last call {_num(c.get('rent'))} of {_num(c.get('price'))} input tokens' "
                     f"worth, {_num(c.get('candidates'))} results holding "
                     f"{_num(c.get('freed'))} tokens{due}")
    return lines


def _wrap(text: str, width: int, indent: str = "  ") -> list[str]:
    return textwrap.wrap(text, width=max(width, 40), subsequent_indent=indent) or [""]


def _clip(line: str, width: int) -> str:
    return line if len(line) <= width else line[: width - 1] + "…"


def _history(s: ContextStats, width: int) -> list[str]:
    tallies = (("evictions", s.evictions), ("clears", s.clears), ("summaries", s.summaries),
               ("checkpoints", s.checkpoints), ("emergencies", s.emergencies),
               ("state cards", s.state_cards), ("watchdog alerts", s.watchdog_alerts),
               ("REPL alerts", s.repl_alerts))
    done = [(name, t) for name, t in tallies if t.count]
    if not done:
        return ["Context events: none yet"]
    lines = ["Context events:"]
    lines += [f"  {name:<16}{t.count:>4}   last {_when(t.last)}" for name, t in done]
    shown = s.boundaries[-_MAX_BOUNDARIES:]
    if shown:
        more = len(s.boundaries) - len(shown)
        lines.append("History:" + (f" (last {len(shown)}; {more} earlier)" if more else ""))
    for b in shown:
        who = f" [{b.agent}]" if b.agent != "main" else ""
        led = f" ledger {b.ledger_items}" if b.ledger_items is not None else ""
        cache = f" cache write {format_tokens(b.cache_write)}" if b.cache_write else ""
        line = (f"  {_when(b.ts)}  {b.kind:<10} {format_tokens(b.tokens_before)} → "
                f"{format_tokens(b.tokens_after)}{who}{led}{cache}")
        lines.append(_clip(line + (f"  {b.detail}" if b.detail else ""), max(width, 40)))
    return lines + _ledger(s, width)


def _ledger(s: ContextStats, width: int) -> list[str]:
    """The latest dropped-items ledger entry: what left the view and where it is."""
    led = s.ledger
    if led is None:
        return []
    kinds = ", ".join(f"{n} {k}{'s' if n != 1 and not k.endswith('s') else ''}"
                      for k, n in led.kinds.items()) or "nothing"
    capped = f"; {led.found} found" if led.found > led.items else ""
    lines = _wrap(f"Ledger: {s.ledger_entries} entr{'ies' if s.ledger_entries != 1 else 'y'}; "
                  f"latest #{led.id} after a {led.after}: {kinds}{capped}", width, "  ")
    lines += [_clip(f"  - {item}", max(width, 40)) for item in led.preview]
    lines += _wrap(f"  recall(query) searches it{'; all entries: ' + led.path if led.path else ''}",
                   width, "    ")
    return lines


def _tasks(s: ContextStats, width: int) -> list[str]:
    """The typed records of closed tasks, newest last: answer, key values, files."""
    if not s.task_records:
        return []

    shown = s.task_records[-_MAX_TASKS:]
    more = len(s.task_records) - len(shown)
    lines = ["", f"Task records ({len(s.task_records)}" + (f"; last {len(shown)})" if more
                                                         else "):")]
    for t in shown:
        r = t.record
        when = "filed; closed at the next request" if not t.written else ""
        answer = (str(r.get("answer") or "").strip().splitlines() or [""])[0]
        lines.append(_clip(f"  {_when(t.ts)}  {t.source}{f' ({when})' if when else ''}  "
                           f"{answer}", max(width, 40)))
        values = " · ".join(format_value(kv) for kv in r.get("key_values") or ())
        files = " · ".join(f"{label} {', '.join(r[key])}" for key, label in
                           (("files_written", "wrote"), ("files_read", "read")) if r.get(key))
        caveats = " · ".join(f"{len(r[key])} {label}{'s' if len(r[key]) != 1 else ''}"
                             for key, label in (("assumptions", "assumption"),
                                                ("open_questions", "open question"))
                             if r.get(key))
        lines += [_clip(f"    {x}", max(width, 40)) for x in (values, files, caveats) if x]
    return lines


def _rows(rows: tuple[TokenRow, ...], *, with_cost: bool, width: int = 80) -> list[str]:
    """One line per agent or model: name, calls, in, out (, cache read, cost)."""
    name_w = min(28, max(len(r.name) for r in rows))
    out = []
    for r in rows:
        name = r.name if len(r.name) <= name_w else r.name[: name_w - 1] + "…"
        line = (f"  {name:<{name_w}} {r.calls:>3} calls in {format_tokens(r.input_tokens):>5} "
                f"out {format_tokens(r.output_tokens):>5}")
        if with_cost:
            cache = f" cache {format_tokens(r.cache_read):>5}" if width >= 72 else ""
            line += f"{cache} {_usd(r.usd) if r.usd is not None else 'no price'}"
        out.append(line)
    return out


def _models_and_cost(s: ContextStats, width: int) -> list[str]:
    lines: list[str] = []
    if s.subagents:
        lines.append("Subagents:")
        lines += _rows(s.subagents, with_cost=True, width=width)
    if s.models:
        lines.append("Models (by cost):" if len(s.models) > 1 else "Model:")
        lines += _rows(s.models, with_cost=True, width=width)
    tokens = f"{_num(s.total_input_tokens)} in / {_num(s.total_output_tokens)} out"
    if s.models and s.cost_usd is not None:
        lines.append(f"Cost: {_usd(s.cost_usd)} ({tokens} tokens)")
    elif s.models:
        priced = f"; {_usd(s.priced_usd)} for the priced models" if s.priced_usd else ""
        lines.append(f"Cost: unknown — no price for {', '.join(s.unpriced_models)}{priced}; "
                     f"tokens {tokens}")
    if s.limits or s.ceiling is not None:
        lines.append("Cost ceiling: " + (", ".join(
            f"{k.removeprefix('max_').replace('_', ' ')} {v}" for k, v in s.limits.items())
            or "none set in config"))
    if s.ceiling is not None:
        c = s.ceiling
        amount = (f"{_usd(c.spent)} of {_usd(c.limit)}" if c.unit == "usd" else
                  f"{_num(_int(c.spent))} of {_num(_int(c.limit))} tokens")
        lines.append(f"  last: {c.action} ({c.scope or '?'}: {amount}) at {_when(c.ts)}")
        if c.action in ("tripped", "refused"):
            lines.append("  /resume-after-cost-ceiling lets the next turn run")
    return lines


def _before_any_call(s: ContextStats, width: int) -> list[str]:
    window = (f"Window: {_num(s.window)} tokens." if s.window_known else
              f"Window size unknown; the thresholds assume {_num(s.window)} tokens.")
    return _wrap(f"No model call yet — nothing measured. {window} Every request will hold "
                 "the system prompt, the tool schemas, the skills index and the memory index "
                 "(fixed), then the conversation: your messages, the replies, tool results, "
                 "and later any summaries.", width, "")


def ruler_line(s: ContextStats) -> str:
    """Which tokenizer counted, and how far the provider's own count was from it."""
    what = "chars/4 (approximate)" if s.ruler == "approx" else f"the {s.ruler} tokenizer"
    if s.provider_ratio is None:
        return f"Counted with {what}; the provider reported no usage to check it against"

    low, high = CALIBRATION_BOUNDS
    used = min(high, max(low, s.provider_ratio))
    scaled = ("thresholds are scaled by it" if used == s.provider_ratio
              else f"thresholds are scaled by at most {used:.2f}x")
    return (f"Counted with {what}; the provider counted {s.provider_ratio:.2f}x that on "
            f"the last call ({scaled})")


def render_context(stats: ContextStats, width: int = 60) -> str:
    """The ``/context`` panel as plain text (no colours; the TUI adds styling)."""
    s = stats
    model = s.model_id or "model not recorded"
    tier = f" (tier {s.thresholds.tier})" if s.thresholds.tier else ""
    lines = [f"Context — {model}{tier}", ""]
    if s.no_calls and not s.estimated:
        lines += _before_any_call(s, width)
    else:
        lines += _headline(s)
        lines += ["", *_categories(s)]
        lines += _wrap(f"Last call: input {_num(s.last_input_tokens)} (cache read "
                       f"{_num(s.last_cache_read)}) · output {_num(s.last_output_tokens)} · "
                       f"{s.main_calls} main-agent call{'s' if s.main_calls != 1 else ''}",
                       width)
        lines += _wrap(ruler_line(s), width) if s.ruler else []
    lines += ["", *_thresholds(s)]
    if s.tools is not None:
        lines += ["", *(w for line in tools_lines(s.tools) for w in _wrap(line, width))]
    lines += ["", *_history(s, width)]
    lines += _tasks(s, width)
    rest = _models_and_cost(s, width)
    if rest:
        lines += ["", *(w for line in rest for w in
                        (_wrap(line, width) if line.startswith(("Cost", "  last")) else [line]))]
    if not s.no_calls:
        lines += ["", *_wrap("/compact [focus] summarizes now · /done [note] checkpoints a "
                             "finished task", width)]
    return "\n".join(lines) + "\n"
