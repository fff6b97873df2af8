"""``simagent bench tool-schemas``: what deferring MCP tool schemas saves (issue 28.3).

One workflow, played twice through the real graph by the scripted model against a real
MCP server (the test suite's 40-tool server by default): once with every schema sent on
every request (``[context] defer_tools = false``), once with deferral on (the schemas
wait behind ``find_tools``; the script calls it before each tool it needs). The scripted
model counts the request it receives, so the figures are what the harness sends. The
verdict (the final answer holds the values the server returned) must be the same both
ways; the figure is input tokens per request, deferred over all loaded.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from simagent.agent.builder import build_agent
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.config import Config
from simagent.context.settings import ContextSettings
from simagent.session import Session

#: The test suite's server (a source checkout); ``--server`` names another.
DEFAULT_SERVER = Path(__file__).resolve().parents[2] / "tests" / "mcp_servers" / "forty_tools.py"
SERVER_NAME = "lab"
#: Lab values the workflow needs, by tool: the answer must quote both.
_NEEDS = [("molar_mass", "molar mass", {"subject": "H2O", "temperature_k": 350}),
          ("boiling_point", "normal boiling point", {"subject": "H2O"})]
_VALUE = r"= ([\d.]+)"


def workflow(deferred: bool) -> list[dict[str, Any]]:
    """Compute with two looked-up values: kernel work, two lookups, more kernel work."""
    steps: list[dict[str, Any]] = [
        {"tool": "run_python", "args": {"code": "import math\nT = 350.0\nprint('T', T)"}}]
    if deferred:  # one reply asks for both capabilities: one extra request
        steps.append({"tools": [{"tool": "find_tools", "args": {"query": q}}
                                for _t, q, _a in _NEEDS]})
    steps += [{"tool": f"{SERVER_NAME}__{tool}", "args": args} for tool, _q, args in _NEEDS]
    steps += [{"tool": "run_python", "args": {"code": "print('ratio', round(T / 373.15, 4))"}},
              {"final": f"Molar mass {{out[-3]|{_VALUE}}} g/mol; boiling point "
                        f"{{out[-2]|{_VALUE}}} K; {{out[-1]}}"}]
    return steps


def _config(workspace: Path, server: Path, defer: bool) -> None:
    cfg = workspace / ".simagent"
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "config.toml").write_text(
        f"[context]\ndefer_tools = {'true' if defer else 'false'}\n\n"
        f"[mcp.servers.{SERVER_NAME}]\ncommand = {_toml(sys.executable)}\n"
        f"args = [{_toml(str(server))}]\n", encoding="utf-8")


def _toml(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def play(server: Path, deferred: bool, workspace: Path) -> dict[str, Any]:
    """One run: per-request input tokens of the main agent, and the verdict."""
    _config(workspace, server, deferred)
    session = Session.create(workspace, approval="auto",  # the bench wrote that config
                             config=Config.load(workspace, trust=True, record=False))
    try:
        built = build_agent(session, ScriptedChatModel.from_steps(workflow(deferred)),
                            context_settings=ContextSettings.from_config(session.config),
                            front_end="headless")
        result = TurnRunner(session, built).run("Look up water's molar mass at 350 K and "
                                                "its boiling point, then compute T/Tb.")
        usage = [e.payload for e in session.trace.events(["model_usage"])
                 if (e.payload.get("agent") or "main") == "main"]
        results = [e.payload for e in session.trace.events(["tool_result"])]
    finally:
        session.close()
    inputs = [int(u.get("input_tokens") or 0) for u in usage]
    schemas = [int((u.get("request") or {}).get("tool_schemas") or 0) for u in usage]
    found = re.findall(r"Molar mass ([\d.]+) g/mol; boiling point ([\d.]+) K", result.final)
    ok = result.status == "done" and bool(found) and "(no match" not in result.final
    return {"deferred": deferred, "requests": len(inputs), "input_tokens": sum(inputs),
            "per_request": round(sum(inputs) / max(1, len(inputs)), 1),
            "schema_tokens_per_request": round(sum(schemas) / max(1, len(schemas)), 1),
            "tool_calls": len(results), "verdict": "pass" if ok else "fail",
            "answer": result.final}


def run_tool_schema_bench(server: Path | None = None) -> dict[str, Any]:
    """Both runs side by side, and the ratios (deferred / all loaded)."""
    server = Path(server or DEFAULT_SERVER)
    if not server.is_file():
        raise FileNotFoundError(f"no MCP server script at {server} (give --server PATH)")
    with tempfile.TemporaryDirectory(prefix="simagent-tool-bench-") as tmp:
        runs = {}
        for deferred in (False, True):
            ws = Path(tmp) / ("deferred" if deferred else "loaded")
            ws.mkdir()
            runs["deferred" if deferred else "loaded"] = play(server, deferred, ws)
    loaded, deferred = runs["loaded"], runs["deferred"]
    return {"server": str(server), "loaded": loaded, "deferred": deferred,
            "per_request_ratio": round(deferred["per_request"] / loaded["per_request"], 3),
            "total_ratio": round(deferred["input_tokens"] / loaded["input_tokens"], 3),
            "verdict_unchanged": loaded["verdict"] == deferred["verdict"] == "pass"
            and loaded["answer"] == deferred["answer"]}


def format_table(r: dict[str, Any]) -> str:
    rows = [("", "all loaded", "deferred")]
    for key, label in (("requests", "requests"), ("per_request", "input tokens / request"),
                       ("schema_tokens_per_request", "schema tokens / request"),
                       ("input_tokens", "input tokens, total"), ("verdict", "verdict")):
        rows.append((label, str(r["loaded"][key]), str(r["deferred"][key])))
    w = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [f"{a.ljust(w[0])}  {b.rjust(w[1])}  {c.rjust(w[2])}" for a, b, c in rows]
    lines += ["", f"per request: deferred = {r['per_request_ratio']}x all loaded; "
              f"in total: {r['total_ratio']}x; verdict unchanged: "
              f"{'yes' if r['verdict_unchanged'] else 'NO'}"]
    return "\n".join(lines)
