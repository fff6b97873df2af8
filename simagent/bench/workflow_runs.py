"""Run workflows x policies x epochs and write one record per run (design.md §9.5).

A record holds what the harness sent (tokens by request layer, peak, calls), what the
context layers did, recall of the workflow's probes, and each scorer's verdict. Rows are
appended to ``records.jsonl`` as they finish, so an interrupted bench resumes without
redoing finished rows (same workflow, policy, epoch and mode).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from langchain.agents.middleware import ModelCallLimitMiddleware

from simagent.agent.builder import build_agent, numbers_mode
from simagent.agent.events import ToolFinished
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.bench.caching import cache_fields
from simagent.bench.kernel_recording import ReplaySession, policy_workspace, record
from simagent.bench.live import (
    RequestTap,
    call_limit,
    final_view,
    live_config,
    live_verdict,
    number_fields,
    server_timings,
)
from simagent.bench.policies import Policy
from simagent.bench.recall_record import kernel_outputs, recall_fields, recall_roots
from simagent.bench.row_pool import WorkflowJob, locked_append, run_jobs
from simagent.bench.scorers import RunView, grade, step_results
from simagent.bench.workflow import Workflow
from simagent.context.prices import cost_usd
from simagent.context.recall import STATUSES as split
from simagent.jsonl import append_jsonl, read_jsonl
from simagent.models import resolve_model
from simagent.session import Session
from simagent.trace.redact import redact

#: Cost of replayed tokens is shown at this model's list price (the scripted model is free).
REFERENCE_MODEL = "anthropic:claude-sonnet-4-5"
CONTEXT_KINDS = {"context_eviction": "evictions", "context_clear": "clears",
                 "context_summary": "summaries", "context_checkpoint": "checkpoints",
                 "context_emergency": "emergencies"}


def git_commit(*, mark_dirty: bool = False) -> str | None:
    """The checkout's short HEAD; ``mark_dirty`` adds ``+dirty`` when tracked files differ
    from it, so a result quoted from a run says whether that commit alone made it."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5, cwd=here)
        dirty = mark_dirty and bool(subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
            text=True, timeout=10, cwd=here).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return (commit + ("+dirty" if dirty else "")) if commit else None


def row_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """Rows are reused on resume only for the same code (commit), mode and window."""
    return (row["workflow"], row["policy"], int(row["epoch"]), row.get("mode", "replay"),
            row.get("commit"), row.get("window"), bool(row.get("enforced")))


def window_tag(window: int) -> str:
    """``128k``, ``16k``, ``12.5k``: how a window is named in labels and folder names."""
    k = window / 1000
    return f"{k:g}k"


def run_label(row: dict[str, Any]) -> str:
    """The policy as the report names it: ``simagent``, or ``simagent @16k`` for a run at an
    enforced window (a sweep), so every table and plot carries the window."""
    if row.get("enforced") and row.get("window"):
        return f"{row['policy']} @{window_tag(int(row['window']))}"
    return row["policy"]


def sweep_order(summary: dict[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Summary lines (see :func:`summarize`) largest window first (unenforced runs first of
    all), simagent first within a window, then by policy name: how the sweep tables read."""
    return sorted(summary.items(), key=lambda kv: (-(kv[1]["window"] or 10**9),
                                                   kv[1]["policy"] != "simagent",
                                                   kv[1]["policy"]))


def provider_refused(row: dict[str, Any]) -> bool:
    """The run ended on a provider error (the window refused a request), not a verdict."""
    return bool(row.get("provider_error"))


def load_records(path: Path) -> list[dict[str, Any]]:
    return read_jsonl(path)  # a torn last line from a killed run costs that line


@dataclass
class BenchPlan:
    workflows: list[Workflow]
    policies: list[Policy]
    epochs: int = 1
    mode: str = "replay"
    model: str | None = None  # live mode
    #: ``--window``: replay every workflow at each of these windows, enforced (a sweep)
    windows: list[int] | None = None

    def windows_for(self, wf: Workflow) -> list[tuple[int, bool]]:
        """(window, enforced) runs of ``wf``: ``--window`` alone (enforced, as a provider
        refuses an over-long request), else its declared window not enforced (the classic
        run, where ``raw`` is the unbounded reference) followed by its ``windows``, each
        enforced (the sweep ``make run`` includes)."""
        if self.windows:
            return [(w, True) for w in self.windows]
        return [(wf.window, False), *((w, True) for w in wf.windows)]

    def keys(self) -> list[tuple[Workflow, Policy, int, int, bool]]:
        return [(w, p, e, win, enf) for w in self.workflows for win, enf in self.windows_for(w)
                for p in self.policies for e in range(self.epochs)]


def measure_run(wf: Workflow, policy: Policy, epoch: int, *, session: Any, model: Any,
                result: Any, wall: float, mode: str, model_id: str,
                commit: str | None = None, enforced: bool = False) -> dict[str, Any]:
    """The record of one finished run, from its trace and the model's last request."""
    events = session.trace.events()
    usage = [e.payload for e in events if e.kind == "model_usage"]
    main = [u for u in usage if u.get("agent") == "main"]
    view = RunView(final=result.final or "", events=events,
                   step_texts=step_results(wf.steps, events), workspace=session.workspace)
    verdicts = grade(wf.scorers, view)
    tokens_in = sum(int(u.get("input_tokens", 0)) for u in usage)
    tokens_out = sum(int(u.get("output_tokens", 0)) for u in usage)
    cache = sum(int(u.get("cache_read", 0) or 0) for u in usage)
    failed = [v.scorer for v in verdicts if not v.ok] + over_budget(wf, len(usage),
                                                                    tokens_in, wall)
    if result.status != "done":
        failed.append(f"status:{result.status}")
    price_model = REFERENCE_MODEL if mode == "replay" else model_id
    totals = SimpleNamespace(input_tokens=tokens_in, output_tokens=tokens_out, cache_read=cache)
    return {
        "run": f"{wf.id}/{policy.name}/{epoch}" + (f"/{window_tag(wf.window)}"
                                                     if enforced else ""),
        "workflow": wf.id, "policy": policy.name,
        "model": model_id, "mode": mode, "epoch": epoch, "long": wf.long,
        "held_out": wf.held_out,
        "window": wf.window, "enforced": enforced,
        "provider_error": bool(getattr(result, "provider_error", False)),
        "error": (getattr(result, "error", None) or "")[:300] or None,
        "verdict": "pass" if not failed else "fail", "failed_scorers": failed,
        "scorers": [{"scorer": v.scorer, "ok": v.ok, "detail": v.detail} for v in verdicts],
        "tokens_in": tokens_in, "tokens_out": tokens_out, "tokens_cache_read": cache,
        "peak_tokens": max((int(u.get("input_tokens", 0)) for u in main), default=0),
        # subagents included: what an enforced window is checked against
        "max_request_tokens": max((int(u.get("input_tokens", 0)) for u in usage), default=0),
        "per_call_tokens": [int(u.get("input_tokens", 0)) for u in main],
        "model_calls": len(usage),
        "tool_calls": sum(1 for e in events if e.kind == "tool_call"),
        **{name: sum(1 for e in events if e.kind == kind)
           for kind, name in CONTEXT_KINDS.items()},
        **recall_fields(wf, session, model, events),
        "layers": request_layers(usage), "wall_s": round(wall, 2),
        "cost_usd": cost_usd(price_model, totals), "cost_model": price_model,
        # provider prompt caching per family: simulated in replay, reported when live
        **cache_fields(model, usage, mode=mode, price_model=price_model,
                       pinned=policy.settings.cache_pin),
        "final": (result.final or "")[:2000], "commit": commit,
        # numbers in the final answer that nothing the run saw backs (support.py)
        **view.support.record_fields(),
    }


def over_budget(wf: Workflow, calls: int, tokens_in: int, wall: float) -> list[str]:
    """The workflow's budgets this run exceeded, as failed-scorer names."""
    over = []
    if wf.budgets.get("model_calls") and calls > wf.budgets["model_calls"]:
        over.append("budget:model_calls")
    if wf.budgets.get("tokens") and tokens_in > wf.budgets["tokens"]:
        over.append("budget:tokens")
    if wf.budgets.get("seconds") and wall > wf.budgets["seconds"]:
        over.append("budget:seconds")
    return over


def request_layers(usage: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Input tokens by request layer, summed over every request of the run."""
    layers: dict[str, int] = {}
    for u in usage:
        for cat, n in (u.get("request") or {}).items():
            layers[cat] = layers.get(cat, 0) + int(n)
    return layers


def _step_counter(wf: Workflow, label: str,
                  progress: Callable[[str], None] | None) -> Callable[[Any], None]:
    """A TurnRunner event callback that reports ``label step k/N`` as tool calls finish."""
    done = [0]

    def on_event(event: Any) -> None:
        if progress and isinstance(event, ToolFinished):
            done[0] += 1
            progress(f"{label}  step {done[0]}/{wf.tool_steps}")

    return on_event


@contextmanager
def replayed(wf: Workflow, policy: Policy, recording: Any, run_dir: Path,
             on_event: Callable[[Any], None] | None = None,
             model_class: Any = None, enforce: bool = False) -> Iterator[SimpleNamespace]:
    """Replay ``wf`` under ``policy`` through the real graph in a session that stays open
    inside the block: ``.session``, ``.model`` (every request it received), ``.result``,
    ``.wall``. The bench run, ``bench counting`` and the accuracy tests share it.
    ``enforce``: the model refuses a request over ``wf.window`` as a provider does."""
    session = ReplaySession(policy_workspace(recording, run_dir / "workspace"), recording, wf)
    session.extra_roots = [recording.session_dir, recording.workspace]
    try:
        model = (model_class or ScriptedChatModel).from_steps(
            wf.steps, window=wf.window, name=f"replay:{wf.id}", enforce_window=enforce)
        # the bench stands for a frontier model (its prices), which takes images in tool
        # results: view_figure sends the picture and it counts in the images layer
        model.profile = {**(model.profile or {}), "image_inputs": True}
        middleware = policy.middleware(wf.window, wf, lambda: recall_roots(session),
                                       lambda: kernel_outputs(session))
        # ... and clearing decides by that model's cache prices, as it would live
        settings = replace(policy.context_settings(wf.window), cost_model=REFERENCE_MODEL)
        agent = build_agent(session, model, middleware=middleware, context_settings=settings)
        started = time.monotonic()
        result = TurnRunner(session, agent).run(wf.prompt, on_event)
        yield SimpleNamespace(session=session, model=model, result=result,
                              wall=time.monotonic() - started, middleware=middleware)
    finally:
        session.close()


def run_replay(wf: Workflow, policy: Policy, epoch: int, recording: Any,
               out_dir: Path, progress: Callable[[str], None] | None = None,
               label: str = "", commit: str | None = None,
               enforced: bool = False) -> dict[str, Any]:
    """One replayed run of ``wf`` under ``policy``: the real graph, recorded kernel results;
    ``enforced``: at ``wf.window``, refused above it like a provider."""
    run_dir = out_dir / "runs" / (f"{wf.id}--{policy.slug}--{epoch}"
                                  + (f"--{window_tag(wf.window)}" if enforced else ""))
    with replayed(wf, policy, recording, run_dir, _step_counter(wf, label, progress),
                  enforce=enforced) as run:
        row = measure_run(wf, policy, epoch, session=run.session, model=run.model,
                          result=run.result, wall=run.wall, mode="replay",
                          model_id=f"replay:{wf.id}", commit=commit, enforced=enforced)
        return policy.reprice(row, run) if policy.reprice else row


def run_live(wf: Workflow, policy: Policy, epoch: int, model_spec: str,
             out_dir: Path, commit: str | None = None,
             enforced: bool = False) -> dict[str, Any]:
    """One live run: a real model, a real kernel, the workflow's prompt (no script), in a
    session configured as ``simagent run`` would be there (``bench.live``); the policy
    shapes the context. ``enforced`` (``--window``): the model is configured with
    ``wf.window``, so a ``local:`` server loads that ``n_ctx``. The model is closed after
    the run (its server stops); its server's timings come from its log."""
    run_dir = out_dir / "runs" / (f"{wf.id}--{policy.slug}--{epoch}--live"
                                  + (f"--{window_tag(wf.window)}" if enforced else ""))
    workspace = run_dir / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    wf.write_fixtures(workspace)
    config = live_config(workspace, wf.window if enforced else None)
    resolved = resolve_model(model_spec, model_config=config.model_settings,
                             settings_at=partial(config.where, "model"))
    try:
        session = Session.create(workspace, simulator=wf.simulator, approval="auto",
                                 model=resolved.id, config=config)
        resolved.keep_logs_in(session.paths.root)
        limit = call_limit(wf)
        try:
            agent = build_agent(
                session, resolved, front_end="headless",
                middleware=[*policy.middleware(wf.window),
                            *([ModelCallLimitMiddleware(run_limit=limit)] if limit else [])],
                context_settings=policy.context_settings(resolved.window or wf.window))
            session.start_kernel()
            started = time.monotonic()
            result = TurnRunner(session, agent).run(wf.prompt)
            wall = time.monotonic() - started
            row = measure_run(wf, policy, epoch, session=session,
                              model=RequestTap([final_view(agent, session)]), result=result,
                              wall=wall, mode="live", model_id=resolved.id, commit=commit,
                              enforced=enforced)
            row.update(number_fields(agent, session, result,
                                     numbers_mode(session, resolved.chat_model)))
        finally:
            session.close()
    finally:
        resolved.close()
    # the window the model really loaded (llama.cpp rounds n_ctx up to 256)
    return {**live_verdict(row), "model_window": resolved.window, "call_limit": limit,
            "server": server_timings((resolved.info or {}).get("log"))}


def unrefused_at(row: dict[str, Any], window: int) -> bool:
    """A replayed run at ``window``, not enforced, that sent no request over it (subagents
    included): enforcing the window would have refused nothing."""
    return (row.get("mode", "replay") == "replay" and not row.get("enforced")
            and row.get("window") == window and not provider_refused(row)
            and "max_request_tokens" in row and row["max_request_tokens"] <= window)


def enforced_twin(row: dict[str, Any]) -> dict[str, Any]:
    """The enforced run at the window of ``row`` (see :func:`unrefused_at`), without
    replaying it again: replay is deterministic (recorded kernel results and snapshots,
    the scripted model, extractive summaries), and the scripted model's only use of an
    enforced window is to refuse a request over it, which this run never sent. Replayed,
    it differs only by its run folder's name in the paths the requests show (a few tokens
    a request). The record says so (``same_as``); a test replays both and compares them."""
    return {**row, "run": f"{row['run']}/{window_tag(int(row['window']))}",
            "enforced": True, "same_as": row["run"]}


def run_bench(plan: BenchPlan, out_dir: Path, progress: Callable[[str], None] | None = None,
              jobs: int = 1, notebooks: bool = False) -> list[dict[str, Any]]:
    """Run every missing row of ``plan``; returns all rows for the plan (old and new), in
    plan order. ``jobs``: processes replaying workflows side by side (``bench.row_pool``;
    the rows are the same for any number); a live bench runs one row at a time.
    ``notebooks``: each workflow's notebook check runs in its worker after its rows."""
    out_dir.mkdir(parents=True, exist_ok=True)
    commit = git_commit(mark_dirty=True)  # the summary names it: uncommitted code says so
    done = {row_key(r): r for r in load_records(out_dir / "records.jsonl")}
    total, n = len(plan.keys()), 0
    rows: list[list[dict[str, Any]]] = []  # per workflow: finished rows, then new ones
    work: list[tuple[int, WorkflowJob]] = []
    for wf in plan.workflows:
        runs = [(win, enf, p, e) for win, enf in plan.windows_for(wf) for p in plan.policies
                for e in range(plan.epochs)]
        keys = {(win, enf, p.name, e): (wf.id, p.name, e, plan.mode, commit, win, enf)
                for win, enf, p, e in runs}
        todo = [r for r in runs if keys[(r[0], r[1], r[2].name, r[3])] not in done]
        rows.append([done[k] for k in keys.values() if k in done])
        n += len(keys) - len(todo)
        labelled = []
        for win, enforced, policy, epoch in todo:
            n += 1
            labelled.append((win, enforced, policy, epoch, f"[{n}/{total}] {wf.id} / "
                             f"{policy.name}" + (f" @{window_tag(win)}" if enforced else "")
                             + (f" / epoch {epoch}" if plan.epochs > 1 else "")))
        if todo:
            work.append((len(rows) - 1, WorkflowJob(wf, labelled, rows[-1])))
    run = partial(run_workflow, mode=plan.mode, model=plan.model, out_dir=out_dir,
                  commit=commit, notebooks=notebooks and plan.mode == "replay")
    new = run_jobs(run, [job for _, job in work], jobs if plan.mode == "replay" else 1,
                   progress or (lambda _m: None))
    for (slot, _), got in zip(work, new, strict=True):
        rows[slot] = [*rows[slot], *got]
    return [r for wf_rows in rows for r in wf_rows]


def run_workflow(job: Any, say: Callable[[str], None], *, mode: str, model: str | None,
                 out_dir: Path, commit: str | None, notebooks: bool = False
                 ) -> list[dict[str, Any]]:
    """One workflow's missing rows (``job``: a ``row_pool.WorkflowJob``): its kernel
    recorded once per epoch, then each row, appended to ``records.jsonl`` as it finishes;
    then, with ``notebooks``, its notebook check.

    Each epoch replays its own recording: the kernel's text (timings, paths) differs
    between recordings, and with it the tokens, so epochs are repeated runs, as two
    ``make run`` would be, and the summary gives each figure's spread over them."""
    wf, rows, new = job.wf, list(job.done), []
    recordings: dict[int, Any] = {}

    def recording_of(epoch: int) -> Any:
        if epoch not in recordings:
            recordings[epoch] = record(wf, out_dir / "recordings" / (
                wf.id + (f"--{epoch}" if epoch else "")), progress=say)
        return recordings[epoch]

    for win, enforced, policy, epoch, label in job.runs:
        say(label)
        twin = next((r for r in rows if r["workflow"] == wf.id and r["policy"] == policy.name
                     and r["epoch"] == epoch and r.get("commit") == commit
                     and unrefused_at(r, win)), None) if enforced and mode == "replay" \
            else None
        at = replace(wf, window=win)
        if twin is not None:
            row = enforced_twin(twin)
        else:
            row = run_replay(at, policy, epoch, recording_of(epoch), out_dir, say, label,
                             commit, enforced) if mode == "replay" else \
                run_live(at, policy, epoch, model or "", out_dir, commit, enforced)
        locked_append(append_record, out_dir / "records.jsonl", row)
        rows.append(row)
        new.append(row)
    if notebooks:
        rerun_notebook(wf, out_dir, commit, say)
    return new


def rerun_notebook(wf: Workflow, out_dir: Path, commit: str | None,
                   say: Callable[[str], None]) -> None:
    """``bench.notebook_rerun``'s check of ``wf`` unless done at ``commit`` (in a worker)."""
    from simagent.bench import notebook_rerun as nb  # nbclient: only a replay bench needs it

    path = out_dir / nb.RESULTS
    if any(r.get("workflow") == wf.id and r.get("commit") == commit for r in read_jsonl(path)):
        return
    session = nb.policy_session(out_dir, wf.id)
    if session is None:
        return
    say(f"notebook of {wf.id}: export and re-run")
    row = nb.rerun_workflow(wf, session, out_dir / "notebook-runs" / wf.id) | {"commit": commit}
    locked_append(lambda p, r: append_jsonl(p, json.dumps(r, default=str)), path, row)


def append_record(path: Path, row: dict[str, Any]) -> None:
    """One bench record, redacted: a key a workflow printed or quoted never reaches the
    records file (it is shared and committed with bench results)."""
    append_jsonl(path, redact(json.dumps(row)))


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per policy (and window, in a sweep: keyed by :func:`run_label`): totals over long
    workflows, ratios to raw and to stock at the same window, recall and pass counts.

    Recall is also split (in view / by pointer / lost, sums and means over long runs) and
    the long token total is also given with the recovery cost added: a policy that sends
    little but leaves every fact behind a long read is cheaper only on paper. Long totals
    and the split cover every long run; ratios to raw only the workflows raw ran on (a
    tuning run may leave raw out). Rows written before the split had no such keys; they
    count in the old totals, not in the split.
    """
    out: dict[str, dict[str, Any]] = {}

    def at(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["workflow"], r.get("window"), bool(r.get("enforced")))

    # references at the same window; a run the provider refused sent only part of the work,
    # so it is no reference
    raw_long = {at(r): r["tokens_in"] for r in rows
                if r["policy"] == "raw" and r.get("long") and not provider_refused(r)}
    stock_long = {at(r): r["tokens_in"] for r in rows
                  if r["policy"] == "stock" and r.get("long") and not provider_refused(r)}

    for r in rows:
        s = out.setdefault(run_label(r), _zero_totals(r, split))
        s["runs"] += 1
        s["passed"] += r["verdict"] == "pass"
        s["provider_errors"] += provider_refused(r)
        s["emergencies"] += int(r.get("emergencies") or 0)
        s["max_emergencies"] = max(s.get("max_emergencies", 0), int(r.get("emergencies") or 0))
        s["summaries"] = s.get("summaries", 0) + int(r.get("summaries") or 0)
        s["tokens_in"] += r["tokens_in"]
        s["recall"].append(r["recall"])
        if not r.get("long"):
            continue
        s["long_runs"] += 1
        s["long_tokens_in"] += r["tokens_in"]
        s["long_recall"].append(r["recall"])
        s["long_recovery_tokens"] += int(r.get("recovery_tokens") or 0)
        s["long_recovery_search_tokens"] += int(r.get("recovery_search_tokens") or 0)
        if "recall_in_view" in r:
            s["long_split_runs"] += 1
            for k in split:
                s[f"long_{k}_sum"] += float(r.get(f"recall_{k}") or 0.0)
        if at(r) in raw_long:
            s["long_tokens_vs_raw"] += r["tokens_in"]
            s["long_raw_tokens_in"] += raw_long[at(r)]
        if at(r) in stock_long and not provider_refused(r):  # a refused run did part of it
            s["long_tokens_vs_stock"] += r["tokens_in"]
            s["long_stock_tokens_in"] += stock_long[at(r)]
    for s in out.values():
        _ratios_and_means(s, split)
    return out


def _zero_totals(r: dict[str, Any], split: Sequence[str]) -> dict[str, Any]:
    """A policy's (and window's) totals before its first row ``r`` is added."""
    return {"runs": 0, "passed": 0, "tokens_in": 0, "long_runs": 0, "long_tokens_in": 0,
            "long_tokens_vs_raw": 0, "long_raw_tokens_in": 0, "long_recall": [],
            "recall": [], "long_split_runs": 0, **{f"long_{k}_sum": 0.0 for k in split},
            "long_recovery_tokens": 0, "long_recovery_search_tokens": 0,
            "long_tokens_vs_stock": 0, "long_stock_tokens_in": 0, "provider_errors": 0,
            "emergencies": 0, "window": r.get("window") if r.get("enforced") else None,
            "policy": r["policy"]}


def _ratios_and_means(s: dict[str, Any], split: Sequence[str]) -> None:
    """Turn one policy's totals ``s`` into its ratios and means (the recall lists go)."""
    s["long_ratio_to_raw"] = (s["long_tokens_vs_raw"] / s["long_raw_tokens_in"]
                              if s["long_raw_tokens_in"] else None)
    s["long_ratio_to_stock"] = (s["long_tokens_vs_stock"] / s["long_stock_tokens_in"]
                                if s["long_stock_tokens_in"] else None)
    s["min_long_recall"] = min(s["long_recall"]) if s["long_recall"] else None
    s["mean_long_recall"] = (sum(s["long_recall"]) / len(s["long_recall"])
                             if s["long_recall"] else None)
    s["mean_recall"] = sum(s["recall"]) / len(s["recall"]) if s["recall"] else None
    for k in split:
        s[f"long_{k}_sum"] = round(s[f"long_{k}_sum"], 4)
        s[f"long_{k}_mean"] = (round(s[f"long_{k}_sum"] / s["long_split_runs"], 4)
                               if s["long_split_runs"] else None)
    s["long_tokens_with_recovery"] = s["long_tokens_in"] + s["long_recovery_tokens"]
    s["long_ratio_with_recovery"] = (
        (s["long_tokens_vs_raw"] + s["long_recovery_tokens"]) / s["long_raw_tokens_in"]
        if s["long_raw_tokens_in"] and s["long_tokens_vs_raw"] == s["long_tokens_in"]
        else None)
    del s["long_recall"], s["recall"]
