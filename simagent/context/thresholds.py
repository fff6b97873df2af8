"""Every context number, and each threshold as a small pure function of the loaded window
and the settings (design.md §7).

One home: the middleware that acts and the ``/context`` panel that explains read the same
functions, so what the panel promises is what happens. Defaults start from the
seeds (eviction 20k tokens; clearing at 60 % keeping 6, or 3 below a 100k window;
summarization per model tier keeping 10 %) and are re-derived from the bench, measured
with the real tokenizer (``context.tokens``); every number can be overridden in the
``[context]`` table of ``.simagent/config.toml``, which ``context/settings.py`` reads and
checks (``ContextSettings``)::

    [context]
    clear_fraction = 0.5
    summary_fraction = 0.7            # for every tier
    [context.summary_tiers]
    small = 0.3
    [context.tool_caps]
    run_python = 20000                # chars; 0 disables the cap for that tool
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simagent.context.settings import ContextSettings

#: Window assumed when a model reports none (a cautious mid-size window).
FALLBACK_WINDOW = 128_000
#: A single tool result above this many real tokens is evicted to disk; deepagents also
#: cuts a ``read_file`` page at 4x this many characters. Half the seeds' 20k: on the
#: bench's long workflows (replay, 128k, real ruler, with the cap and trigger below) 10k
#: sends 4.93M input tokens vs 4.97M at 20k and 4.95M at 15k, and the peak request falls
#: from 74k to 59k (66k at 15k), with recall 1.0 at each.
EVICT_TOKENS = 10_000
#: ... and never more than this share of the window: at 16k a 10k-token result (a page of
#: source) is most of the request, and the turn that reads it would be refused. 0.08 keeps
#: 10k from a 125k window up and gives 1.3k at 16k, 2.6k at 32k.
EVICT_FRACTION = 0.08
#: Old tool results are cleared from the model's view once the request passes this share.
#: Lower than the stock 60 %: our placeholders name the raw output file, so clearing
#: loses nothing reachable, and epochs keep it rare. Re-derived with the real ruler on the
#: bench's long workflows (replay, 128k, old cap and eviction): 0.30 sends 0.123x raw
#: tokens vs 0.139x at 0.40, 0.145x at 0.50 and 0.176x at 0.60, recall 1.0 at each; 0.25
#: saves 2 % more at more epochs (cache rewrites) and a higher peak. (0.40 was tuned on
#: chars/4, which made it ~0.6-0.8 of the real window for numeric output.)
CLEAR_FRACTION = 0.30
#: Clearing always gets its chance before summarization: its trigger stays below this
#: share of the summary trigger (small-tier models summarize at 35 %).
CLEAR_BEFORE_SUMMARY = 0.80
#: Most recent tool results an epoch keeps verbatim: one, the result the model is reading
#: now. A result it has read costs a cached read on every request until the next epoch
#: (~0.1 x its tokens x the requests between epochs), which is about what paging it back
#: once costs (its pointer names ``_out[n]``), so an older one pays to keep only if it is
#: nearly sure to be needed again. Bench (replay, cost rule on, measured before
#: clear_words and clear_by_expected; README has today's figures), 1 against the seeds' 6
#: (3 below a 100k window), as multiples of stock's tokens and dollars (Anthropic/OpenAI):
#: tuned long 128k 0.41x, 0.61x/0.64x (6 before the cost rule: 0.52x, 0.68x/0.71x),
#: 32k 0.61x, 0.53x/0.70x (3: 0.64x, 0.54x/0.71x); held-out 128k 0.48x, 0.76x/0.77x
#: (6: 0.76x, 0.94x/0.93x), 32k 0.53x, 0.78x/0.80x (3: 0.57x, 0.86x/0.86x); 16k equal
#: within 1 %; recall 1.0 everywhere. Keeping 2 lies between at each.
CLEAR_KEEP = 1
#: ... while they fit in this share of the window (the newest one always stays).
CLEAR_KEEP_FRACTION = 0.10
#: A clearing epoch happens only when it frees at least this share of the window, so the
#: prompt prefix (and provider prompt caches / local KV caches) stays stable in between.
CLEAR_MIN_FREED_FRACTION = 0.10
#: Summarization trigger by model tier; unknown models use ``summary_fraction``.
SUMMARY_TIERS = {"frontier": 0.85, "mid": 0.65, "small": 0.35}
SUMMARY_FRACTION = 0.85
#: Share of the window kept verbatim after a summary.
SUMMARY_KEEP_FRACTION = 0.10
#: A model whose name places it in no tier but that is served with a window this small is
#: a small or local one (frontier APIs serve 128k and more; Ollama and llama.cpp default
#: to 4k-32k), so it gets the small tier's early summary.
SMALL_TIER_WINDOW = 32_000
#: Model-id patterns that place a model in a tier, tried small, then mid, then frontier
#: (substrings, plus parameter counts such as ``:8b`` matched as whole tokens).
TIER_PATTERNS = {
    "small": r"haiku|flash|(?<![a-z])mini|nano|lite|small|(?<![\d.])(0\.\d+|[1-9](\.\d+)?)b\b",
    "mid": r"sonnet|gemini-2\.5-pro|gpt-4o|gpt-4\.1|medium|(?<![\d.])[1-5]\d(\.\d+)?b\b",
    "frontier": r"opus|gpt-5|(?<![a-z0-9])o[134]\b|gemini-3|-pro\b|deepseek-r1|"
                r"(?<![\d.])([6-9]\d|\d{3,})(\.\d+)?b\b",
}
#: Models that get the small-model prompt and tool set (``agent/small_tier.py``): open
#: weights of under 10B parameters by the count in their id (``qwen2.5-coder-0.5b``,
#: ``qwen3:4b``). Small-tier API models (Haiku, Flash, mini) handle the full tool set.
SMALL_AGENT_PATTERN = r"(?<![\d.])(0\.\d+|[1-9](\.\d+)?)b\b"
#: Up to this window a small model sees ``run_python`` alone; above it, ``read_file`` too.
SMALL_AGENT_ONE_TOOL_WINDOW = 12_000
#: Per-tool output cap at execution time (head + tail chars reaching the model; the full
#: text stays on disk and the marker names it). Below Codex's 10 KiB shell limit and
#: Claude Code's 30k: with the real ruler, 4k chars of numeric output is ~1.5-2k tokens.
#: Dollars decided it (issue 31): every shown char is written to the prompt cache once
#: (Anthropic: 1.25x input) and the tuned group's bill is mostly those writes and the
#: output. Replay, long group at 128k, one run side by side (3b8c4dd placeholders),
#: as multiples of stock's dollars (Anthropic/OpenAI): tuned 0.593x/0.612x at 6k ->
#: 0.560x/0.587x at 4k, held-out 0.732x/0.730x -> 0.714x/0.715x (checked after; it
#: improves too), recall 1.0 at each. The cost the replay cannot see: a live model reads
#: a third less of a long output at first and pages more of it back (the cut marker names
#: the lines left out and the ``_out[n].slice`` that returns them; the digest sums up the
#: rest). Output under the cap, as a well-behaved cell prints, is not touched.
TOOL_CAP_CHARS = 4_000
#: MCP tool schemas are deferred (sent only after ``find_tools`` loads them) when all of
#: them together would take more than this share of the window: 2.6k tokens at 128k,
#: about 15-20 typical tool schemas. Below that, the extra ``find_tools`` round trip costs
#: more than sending them on every request saves (a provider measured 77k -> 8.7k
#: tokens with deferral at tool-heavy scale; simagent's own tools are ~17 % of a request).
DEFER_TOOLS_FRACTION = 0.02
#: Per-tool exceptions (0 = uncapped): ``read_file`` returns the lines the model asked
#: for (a skill, a page of source), bounded by its own limit and by eviction.
DEFAULT_TOOL_CAPS = {"read_file": 0}
#: Output reserved for the reply when the model reports no maximum.
MAX_OUTPUT_FALLBACK = 4_096
#: The longest reply asked of an OpenAI-compatible server when no ``max_output`` is
#: configured (tokens): without one it writes until the model ends or ``n_ctx`` is full.
REPLY_TOKENS = 2_048
#: A small model's (``agent/small_tier.py``): a code cell or a short answer fits; without
#: it a 0.5B model decoding a string under a grammar can write until the window is full
#: (at a few tokens a second on a loaded CPU, half an hour). A call cut here gets the
#: recovery nudge (``agent/recovery.py``).
SMALL_REPLY_TOKENS = 1_024
#: Emergency compaction keeps half of what the failed request held, never fewer messages.
EMERGENCY_MIN_MESSAGES = 4
#: Watchdog: this many identical consecutive tool calls (same name, same literal args).
WATCHDOG_REPEATS = 5
WATCHDOG_MODES = ("off", "warn", "enforce")
#: REPL watchdog (``context.repl_watch``): failing ``run_python`` cells in a row with the
#: same normalised error signature (exception type + message) ...
REPL_SAME_ERROR = 3
#: ... and failing cells in a row whatever the errors (0 switches a signal off). Three:
#: one failure is normal work, a fix that fails again is still normal, a third failure
#: in a row is where a person would stop and rethink.
REPL_FAILED_RUN = 3
#: Its mode when ``[context] repl_watchdog`` is unset, by front end: at the TUI a person
#: reads the warning and can step in; a headless run (``simagent run``, the bench) has
#: nobody to read it, so the turn ends instead of burning calls.
REPL_WATCHDOG_BY_FRONT_END = {"tui": "warn", "headless": "enforce"}
#: ... except for a small model (:func:`small_agent`), which does not act on a warning: in a
#: 20-turn TUI session the 0.5B model re-ran the same failing cell after the warning, in 9
#: of the 20 turns, until ctrl+C (issue 41). Stopping the turn hands it back to the person.
REPL_WATCHDOG_SMALL = "enforce"
#: Summaries: "auto" (the agent's model; a no-model extractive summary for scripted
#: models), "extractive", or a model spec for a cheaper summarizer.
SUMMARY_MODEL = "auto"
#: The ruler every threshold is measured with: "auto" (by model family, see
#: ``context.tokens``), an encoding name, or "approx" (chars/4, what peers count with).
TOKENIZER = "auto"
#: Most tokens the kernel state card may take after a compaction (0: no card). 1.5k holds
#: ~40 names with shapes plus imports, figures and files; a card is sent on every call
#: until the next compaction, so it must stay small next to what the compaction freed.
STATE_CARD_TOKENS = 1_500
#: ... and at most this share of the window (800 tokens at 16k, the full 1.5k from 30k up).
STATE_CARD_FRACTION = 0.05


def repl_watchdog_mode(settings: ContextSettings, front_end: str = "tui", *,
                       small: bool = False) -> str:
    """The REPL watchdog's mode: the ``[context]`` setting, else the small tier's, else the
    front end's default."""
    if settings.repl_watchdog is not None:
        return settings.repl_watchdog
    if small:
        return REPL_WATCHDOG_SMALL
    return REPL_WATCHDOG_BY_FRONT_END.get(front_end, "warn")


# ----------------------------------------------------------------- window and budget
def effective_window(model_window: int | None, settings: ContextSettings) -> int:
    """The window every threshold is a share of: config, else the model's, else a fallback."""
    return settings.window or model_window or FALLBACK_WINDOW


def max_output(model_max_output: int | None, settings: ContextSettings) -> int:
    return settings.max_output_tokens or model_max_output or MAX_OUTPUT_FALLBACK


def reply_limit(window: int | None, *, small: bool = False,
                reserved: int | None = None) -> int:
    """The reply limit a request carries when none is configured: a quarter of the
    window, at most :data:`REPLY_TOKENS` (:data:`SMALL_REPLY_TOKENS` for a small model;
    the cap alone when the window is unknown), and never more than ``reserved``, the
    output the budget set aside (a reply past it would not fit the window)."""
    limit = SMALL_REPLY_TOKENS if small else REPLY_TOKENS
    if window:
        limit = min(limit, window // 4)
    if reserved:
        limit = min(limit, reserved)
    return max(1, limit)


def history_budget(window: int, *, system: int, summary: int, tool_defs: int,
                   max_output_tokens: int) -> int:
    """Tokens left for the conversation: ``window - system - summary - tool_defs - max_output``."""
    return window - system - summary - tool_defs - max_output_tokens


# --------------------------------------------------------------------------- layers
def tool_cap(tool_name: str, settings: ContextSettings) -> int | None:
    """Chars of one tool result that reach the model (None: uncapped)."""
    return settings.tool_caps.get(tool_name, settings.tool_cap_chars) or None


def defer_tools_limit(window: int, settings: ContextSettings) -> int:
    """Tokens of deferrable (MCP) tool schemas above which they are deferred."""
    return int(window * settings.defer_tools_fraction)


def defer_tools(deferrable_tokens: int, window: int, settings: ContextSettings) -> bool:
    """Whether MCP tool schemas wait behind ``find_tools``: the ``[context] defer_tools``
    setting when given, else whether they exceed :func:`defer_tools_limit`."""
    if settings.defer_tools is not None:
        return settings.defer_tools
    return deferrable_tokens > defer_tools_limit(window, settings)


def evict_tokens(settings: ContextSettings, window: int | None = None) -> int | None:
    """Real tokens above which one tool result is evicted: the setting, capped by
    ``EVICT_FRACTION`` of the window when one is known."""
    if not settings.evict_tokens:
        return None
    if window:
        return min(settings.evict_tokens, max(500, int(EVICT_FRACTION * window)))
    return settings.evict_tokens


def state_card_tokens(window: int, settings: ContextSettings) -> int:
    """Most tokens the kernel state card may take (0: no card)."""
    if not settings.state_card_tokens:
        return 0
    return min(settings.state_card_tokens, max(200, int(STATE_CARD_FRACTION * window)))


def clear_trigger_tokens(window: int, settings: ContextSettings,
                         model_id: str | None = None) -> int | None:
    """Tokens at which clearing starts: the configured share, kept below summarization."""
    if not settings.clear_fraction:
        return None
    frac = settings.clear_fraction
    summary = summary_fraction(model_id, settings, window) if settings.summarize else None
    if summary:
        frac = min(frac, CLEAR_BEFORE_SUMMARY * summary)
    return int(window * frac)


def clear_keep(window: int, settings: ContextSettings) -> int:
    """Newest results an epoch keeps (the kept share of ``window`` may keep fewer)."""
    return CLEAR_KEEP if settings.clear_keep is None else settings.clear_keep


def clear_keep_tokens(window: int, settings: ContextSettings) -> int | None:
    return int(window * frac) if (frac := settings.clear_keep_fraction) else None


def clear_min_freed_tokens(window: int, settings: ContextSettings) -> int:
    return int(window * settings.clear_min_freed_fraction)


def tier_name(model_id: str | None) -> str:
    """The model's own name in a ``--model`` spec, the only part a tier is read from.

    A path or a URL says nothing of the model's size (``scripted:/data/runs-2b/demo.json``,
    ``openai-compatible:qwen3@http://gpu-7b:8080/v1``), so the kind's prefix, a server URL
    after ``@`` and the folders of a path are dropped: a file's name is the model's name
    (``local:PATH.gguf``), and so is a script's (``scripted:PATH``: a script has no size
    of its own; named like a model, it plays that model's tier, else the default one)."""
    kind, sep, rest = (model_id or "").strip().partition(":")
    name = rest if sep else kind
    model, at, url = name.rpartition("@")
    if at and re.match(r"\s*https?://", url):
        name = model
    return re.split(r"[/\\]", name)[-1].strip().lower()


def model_tier(model_id: str | None, window: int | None = None) -> str | None:
    """frontier | mid | small by substring of the model's name (:func:`tier_name`); an
    unplaced model with a window of at most :data:`SMALL_TIER_WINDOW` is small; None
    when unknown."""
    name = tier_name(model_id)
    for tier in ("small", "mid", "frontier"):
        if re.search(TIER_PATTERNS[tier], name):
            return tier
    return "small" if window and window <= SMALL_TIER_WINDOW else None


def small_agent(model_id: str | None, settings: ContextSettings) -> bool:
    """Whether this model gets the small-model prompt and tools (see
    :data:`SMALL_AGENT_PATTERN`); ``small_agent = false`` in ``[context]`` turns it off."""
    return settings.small_agent and bool(
        re.search(SMALL_AGENT_PATTERN, tier_name(model_id)))


def small_agent_tools(window: int) -> tuple[str, ...]:
    """The tools a small model is shown at ``window``: fewer at 8k."""
    if window <= SMALL_AGENT_ONE_TOOL_WINDOW:
        return ("run_python",)
    return ("run_python", "read_file")


def summary_fraction(model_id: str | None, settings: ContextSettings,
                     window: int | None = None) -> float | None:
    if settings.summary_fraction is not None:
        return settings.summary_fraction
    tier = model_tier(model_id, window)
    return settings.summary_tiers.get(tier, SUMMARY_FRACTION) if tier else SUMMARY_FRACTION


def summary_trigger_tokens(window: int, model_id: str | None, settings: ContextSettings,
                           fixed: int = 0) -> int | None:
    """Tokens at which the conversation is summarized: the tier's share of the room the
    ``fixed`` prompt (system prompt, indexes, tool schemas) leaves, on top of it.

    A share of the whole window would be meaningless where the fixed prompt is most of
    it: at 16k, simagent's ~5.5k fixed prompt is 35 % of the window, so the small tier's
    0.35 would summarize on every call. At 128k the difference is under 1 %. Without a
    measured request (``fixed=0``) it is the share of the window."""
    frac = summary_fraction(model_id, settings, window)
    if not frac or not settings.summarize:
        return None
    return room_share(window, fixed, frac)


def room_share(window: int, fixed: int, frac: float) -> int:
    """``fixed`` plus ``frac`` of what it leaves of ``window``."""
    fixed = min(max(0, fixed), window)
    return fixed + int((window - fixed) * frac)


def summary_keep_tokens(window: int, settings: ContextSettings) -> int:
    return int(window * settings.summary_keep_fraction)


def summary_grown(tokens: int, boundary: Mapping[str, Any] | None,
                  thresholds: Thresholds) -> bool:
    """Whether a summary at the trigger is worth its cost: the conversation has grown by
    at least the clearing epoch's minimum (``clear_min_freed``) since the last summary
    left it. Where the fixed prompt fills most of a small window, what a summary keeps
    (its text, the newest messages, the state card) can sit right at the trigger, and a
    summary on every call rewrites the prompt cache and, live, costs a model call each
    time for almost nothing. The budget check still compacts a request that would not
    fit, so this never risks an overflow."""
    last = (boundary or {}).get("tokens_after")
    return last is None or tokens - int(last) >= thresholds.clear_min_freed


@dataclass(frozen=True)
class Thresholds:
    """All thresholds for one window and model, as the panel shows them."""

    window: int
    tier: str | None
    evict_tokens: int | None
    clear_trigger: int | None
    clear_keep: int
    clear_keep_tokens: int | None
    clear_min_freed: int
    summary_trigger: int | None
    summary_keep: int
    max_output: int
    state_card: int = 0
    summary_fraction: float | None = None  # the tier's share (see summary_trigger_tokens)
    clear_by_cost: bool = True  # an epoch may come sooner, by the cache prices

    def for_prompt(self, fixed: int) -> Thresholds:
        """These thresholds for a request whose fixed prompt is ``fixed`` tokens: the
        summary trigger moves up by the fixed prompt's share (the middleware and
        ``/context`` both use this)."""
        if self.summary_fraction is None or self.summary_trigger is None:
            return self
        return replace(self, summary_trigger=room_share(self.window, fixed,
                                                        self.summary_fraction))


def thresholds_for(model_window: int | None, model_id: str | None,
                   settings: ContextSettings, model_max_output: int | None = None) -> Thresholds:
    window = effective_window(model_window, settings)
    frac = summary_fraction(model_id, settings, window) if settings.summarize else None
    return Thresholds(
        window=window, tier=model_tier(model_id, window), summary_fraction=frac,
        evict_tokens=evict_tokens(settings, window),
        state_card=state_card_tokens(window, settings),
        clear_trigger=clear_trigger_tokens(window, settings, model_id),
        clear_by_cost=settings.clear_by_cost,
        clear_keep=clear_keep(window, settings),
        clear_keep_tokens=clear_keep_tokens(window, settings),
        clear_min_freed=clear_min_freed_tokens(window, settings),
        summary_trigger=summary_trigger_tokens(window, model_id, settings),
        summary_keep=summary_keep_tokens(window, settings),
        max_output=max_output(model_max_output, settings))
