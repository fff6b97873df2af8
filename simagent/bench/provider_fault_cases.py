"""The provider faults ``simagent bench faults`` runs: a real HTTP stub (``openai_stub``)
answers the model's calls with errors, cut streams, hangs and bad JSON; each case checks
that the turn goes on (or ends in one clear error) and that the next turn works.

Split from ``fault_cases`` (which lists every case) so each file stays readable.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from langchain_core.messages import AIMessage

from simagent.agent.builder import build_agent
from simagent.agent.provider_retry import MAX_RETRIES
from simagent.agent.runner import TurnRunner

# the kernel's side of a case (state set up, read back, lost) is the kernel cases' protocol
from simagent.bench import fault_bench as kernel_probe
from simagent.bench.fault_bench import Clock, FaultCase, Lab, Outcome
from simagent.bench.openai_stub import OpenAIStub, Reply, error_reply, fault_reply
from simagent.models import resolve_model

#: The client's read timeout in the provider cases (a "hang" reply outlasts it).
CLIENT_TIMEOUT_S = 3.0
PARTIAL_TEXT = "a reply the connection loses halfway"


def _call(code: str) -> Any:
    return Reply(tool_calls=[("run_python", json.dumps({"code": code}))])


def _stub_runner(lab: Lab, session: Any, stub: Any, **config: Any) -> Any:
    model = resolve_model(f"openai-compatible:stub-model@{stub.base_url}",
                          model_config={"timeout": CLIENT_TIMEOUT_S, "window": 64_000,
                                        **config})
    return TurnRunner(session, build_agent(session, model))


def _partial_in_checkpoint(runner: Any) -> bool:
    state = runner.agent.graph.get_state(runner.session.thread_config)
    return any(isinstance(m, AIMessage) and PARTIAL_TEXT[:12] in m.text
               for m in state.values.get("messages", []))


def provider_fault(lab: Lab, faults: list[Any], *, gives_up: bool = False,
                   **config: Any) -> Outcome:
    """Set up kernel state, then a turn whose first model calls meet ``faults`` over real
    HTTP; the turn must go on to read the state back (or, when ``gives_up``, end as one
    clear provider error), and a turn after it must work."""
    session = lab.session()
    with OpenAIStub([_call(kernel_probe.SETUP_CODE), Reply(text="ready")]) as stub:
        runner = _stub_runner(lab, session, stub, **config)
        first = runner.run("set up the model")
        before = kernel_probe.snapshot(session)
        after = [_call(kernel_probe.CHECK_CODE), Reply(text="checked")]
        stub.push(*faults, *([] if gives_up else after))
        clock = Clock()
        t0 = time.monotonic()
        second = runner.run("run the study", clock)
        t_second = time.monotonic() - t0
        stub.push(*([after[0]] if gives_up else []), _call(kernel_probe.ALIVE_CODE),
                  Reply(text="alive"))
        third_clock = Clock()
        third = runner.run("go on", third_clock)
        requests = len(stub.chat_requests)
    retries = [e for e in session.trace.events(["provider_retry"])
               if not e.payload.get("gave_up")]  # the give-up record is not a retry
    texts = [*clock.outputs, *third_clock.outputs]
    restored = any(kernel_probe.RESTORED in t for t in texts)
    lost, what = kernel_probe.lost_since(session, before)
    clean = kernel_probe.no_orphans(runner) and not _partial_in_checkpoint(runner)
    if gives_up:
        ok_second = second.status == "error" and second.provider_error and \
            "\n" not in (second.error or "")
        recover = t_second
    else:
        ok_second = second.status == "done"
        check = clock.order[0] if clock.order else ""
        recover = (clock.started[check] - t0) if check in clock.started else None
    survived = (first.status == "done" and ok_second and third.status == "done"
                and any(kernel_probe.ALIVE in t for t in third_clock.outputs) and clean)
    detail = (f"{len(retries)} retries, {requests} requests"
              + (f"; error: {second.error}" if second.error else ""))
    if not clean:
        detail += "; checkpoint holds a partial reply or an unanswered call"
    if what:
        detail = f"lost: {', '.join(what)}; {detail}"
    return Outcome(survived, restored, recover, lost, detail[:240])


def _status(code: int, **kw: Any) -> Callable[[Lab, bool], Outcome]:
    def run(lab: Lab, fast: bool) -> Outcome:
        return provider_fault(lab, [error_reply(code, f"stub {code}", **kw)])
    return run


def _wire(fault: str, **kw: Any) -> Callable[[Lab, bool], Outcome]:
    def run(lab: Lab, fast: bool) -> Outcome:
        return provider_fault(lab, [fault_reply(fault, PARTIAL_TEXT, **kw)])
    return run


def _bad_json(lab: Lab, fast: bool) -> Outcome:
    return provider_fault(lab, [Reply(tool_calls=[("run_python", '{"code": "print(1)"')])])


def _empty(lab: Lab, fast: bool) -> Outcome:
    return provider_fault(lab, [Reply(text="")])


def _down(lab: Lab, fast: bool) -> Outcome:
    return provider_fault(lab, [error_reply(503, "stub down")] * (MAX_RETRIES + 1),
                          gives_up=True)


PROVIDER_CASES = [
    FaultCase("provider-429-retry-after", "provider", "429 with retry-after: 1",
              _status(429, retry_after=1), fast=True),
    FaultCase("provider-429", "provider", "429 without retry-after", _status(429)),
    *(FaultCase(f"provider-{code}", "provider", f"HTTP {code}", _status(code))
      for code in (500, 502, 503, 529)),
    FaultCase("provider-reset", "provider", "connection reset before the reply",
              _wire("reset"), fast=True),
    FaultCase("provider-timeout", "provider",
              f"no answer past the client's {CLIENT_TIMEOUT_S:g} s read timeout",
              _wire("hang", hang_s=CLIENT_TIMEOUT_S + 3)),
    FaultCase("provider-cut-stream", "provider", "stream dropped mid-message",
              _wire("cut"), fast=True),
    FaultCase("provider-no-finish", "provider", "stream ends without finish_reason or [DONE]",
              _wire("no_finish")),
    FaultCase("provider-bad-tool-json", "provider", "tool call with invalid JSON arguments",
              _bad_json),
    FaultCase("provider-empty", "provider", "empty reply", _empty),
    FaultCase("provider-down", "provider",
              "503 on every retry: one clear error, then the next turn works", _down),
]
