"""Tokens an MCP host receives from ``simagent mcp`` per call vs the cell's whole output.

``python -m simagent.mcp_server.token_table [--json] [--only NAME,...]`` starts the real
server (``simagent mcp`` over stdio, a fresh workspace and state home in a temporary
folder), runs each case's cell through the SDK's client, and counts with simagent's own
ruler (:mod:`simagent.context.tokens`, o200k): the text ``run_python`` returned, against
the whole output a server that returns everything would send (the raw output file, every
progress-bar redraw included). A figure's image is counted as providers bill it,
``width x height / 750`` tokens (Anthropic's published estimate) after the same
1568-pixel scaling ``figure`` applies; the figure case's "whole" is that image, which is
what a Jupyter server returns for a plotting cell.

The numbers in the README's table came from this module; it needs pybamm and cantera
for those two cases (a missing package is reported as a skipped row).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sqlite3
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

from simagent.context.tokens import Ruler

#: (name, description, package it needs, code).
CASES: list[tuple[str, str, str | None, str]] = [
    ("print_50mb", "50 MB print (500,000 lines)", None,
     "import sys\nfor i in range(0, 500_000, 1000):\n"
     "    sys.stdout.write(''.join(f'row {j} value={j * 0.37:.3f} ' + 'x' * 78 + '\\n' "
     "for j in range(i, i + 1000)))"),
    ("tqdm", "tqdm loop, 3,000 steps", None,
     "from tqdm import tqdm\nimport time\ntotal = 0\n"
     "for i in tqdm(range(3000), mininterval=0.01):\n    time.sleep(0.001); total += i\n"
     "print('total', total)"),
    ("pybamm", "PyBaMM DFN 3C solve, per-step log with warnings", "pybamm",
     "import pybamm, warnings, numpy as np\npybamm.set_logging_level('INFO')\n"
     "pv = pybamm.ParameterValues('Chen2020')\n"
     "sim = pybamm.Simulation(pybamm.lithium_ion.DFN(), parameter_values=pv)\n"
     "cap = pv['Nominal cell capacity [A.h]']\n"
     "pv['Current function [A]'] = 3 * cap\n"
     "sol = sim.solve([0, 3600], t_interp=np.linspace(0, 3600, 2001))\n"
     "t, V = sol['Time [s]'].entries, sol['Voltage [V]'].entries\n"
     "ce = sol['Electrolyte concentration [mol.m-3]'].entries\n"
     "for k in range(len(t)):\n"
     "    print(f'step {k:05d} t={t[k]:9.3f}s V={V[k]:.5f} ce_min={ce[:, k].min():8.3f} '\n"
     "          f'ce_max={ce[:, k].max():8.3f}')\n"
     "    if ce[:, k].min() < 50:\n"
     "        warnings.warn(f'electrolyte nearly depleted at t={t[k]:.1f} s')\n"
     "print('termination', sol.termination, 'Q', sol['Discharge capacity [A.h]'].entries[-1])"),
    ("cantera", "Cantera ignition log (GRI-Mech 3.0, every step)", "cantera",
     "import cantera as ct\ngas = ct.Solution('gri30.yaml')\n"
     "gas.TPX = 1100, ct.one_atm, 'CH4:1, O2:2, N2:7.52'\n"
     "r = ct.IdealGasConstPressureReactor(gas)\nnet = ct.ReactorNet([r])\n"
     "print(f\"{'t [s]':>12s} {'T [K]':>9s} {'X_CH4':>10s} {'X_OH':>10s} {'X_CO2':>10s}\")\n"
     "while net.time < 0.2:\n    net.step()\n"
     "    print(f'{net.time:12.6e} {r.T:9.2f} {r.thermo[\"CH4\"].X[0]:10.3e} '\n"
     "          f'{r.thermo[\"OH\"].X[0]:10.3e} {r.thermo[\"CO2\"].X[0]:10.3e}')\n"
     "print('final T', round(r.T, 1))"),
    ("figure", "matplotlib figure (two series)", None,
     "import numpy as np, matplotlib.pyplot as plt\nt = np.linspace(0, 10, 500)\n"
     "plt.plot(t, np.sin(t), label='sin'); plt.plot(t, np.cos(t), label='cos')\n"
     "plt.xlabel('t [s]'); plt.ylabel('y [-]'); plt.legend(); plt.show()"),
]


def image_tokens(width: int, height: int, max_edge: int = 1568) -> int:
    """Tokens a provider bills for an image (``w*h/750`` after scaling to ``max_edge``)."""
    scale = min(1.0, max_edge / max(width, height))
    return -(-round(width * scale) * round(height * scale) // 750)


def _latest_raw(home: Path) -> Path | None:
    for trace in home.glob("workspaces/*/sessions/*/trace.sqlite"):
        db = sqlite3.connect(f"file:{trace}?mode=ro", uri=True)
        try:
            row = db.execute("SELECT payload FROM events WHERE kind = 'kernel_exec' "
                             "ORDER BY id DESC LIMIT 1").fetchone()
        finally:
            db.close()
        raw = json.loads(row[0]).get("raw_path") if row else None
        return Path(raw) if raw else None
    return None


async def _measure(names: list[str]) -> list[dict[str, Any]]:
    ruler = Ruler("o200k_base")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mcp-tokens-") as tmp:
        home, ws = Path(tmp) / "home", Path(tmp) / "ws"
        ws.mkdir()
        env = {**os.environ, "SIMAGENT_HOME": str(home)}
        params = StdioServerParameters(command=sys.executable, env=env,
                                       args=["-m", "simagent", "mcp", "--workspace", str(ws)])
        with open(Path(tmp) / "server.err", "w") as err:
            async with stdio_client(params, errlog=err) as (read, write), ClientSession(
                    read, write, read_timeout_seconds=timedelta(seconds=900)) as s:
                await s.initialize()
                for name, what, package, code in CASES:
                    if name not in names:
                        continue
                    if package and importlib.util.find_spec(package) is None:
                        rows.append({"case": name, "what": what, "skipped": f"no {package}"})
                        continue
                    result = await s.call_tool("run_python", {"code": code})
                    text = "\n".join(c.text for c in result.content
                                     if isinstance(c, types.TextContent))
                    raw = _latest_raw(home)
                    whole_text = raw.read_text(encoding="utf-8", errors="replace") \
                        if raw and raw.exists() else ""
                    row = {"case": name, "what": what, "host_tokens": ruler.count(text),
                           "host_chars": len(text), "whole_tokens": ruler.count(whole_text),
                           "whole_bytes": len(whole_text.encode())}
                    if name == "figure":
                        m = re.search(r"\[figure (fig-\w+) (\d+)x(\d+)", text)
                        img = image_tokens(int(m[2]), int(m[3])) if m else 0
                        shown = await s.call_tool("figure", {"n": m[1] if m else "-1"})
                        caption = "\n".join(c.text for c in shown.content
                                            if isinstance(c, types.TextContent))
                        row.update(whole_tokens=row["whole_tokens"] + img,
                                   figure_call_tokens=ruler.count(caption) + img)
                    rows.append(row)
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    """The README's Markdown table."""
    out = ["| cell | whole output | `simagent mcp` run_python | ratio |", "|---|---:|---:|---:|"]
    for r in rows:
        if r.get("skipped"):
            out.append(f"| {r['what']} | skipped: {r['skipped']} | | |")
            continue
        ratio = r["whole_tokens"] / max(1, r["host_tokens"])
        extra = f" (`figure()` call: {r['figure_call_tokens']:,})" \
            if "figure_call_tokens" in r else ""
        out.append(f"| {r['what']} | {r['whole_tokens']:,} | {r['host_tokens']:,}{extra} | "
                   f"{ratio:,.0f}x |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simagent.mcp_server.token_table",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--only", help="comma-separated case names: "
                   + ", ".join(c[0] for c in CASES))
    args = p.parse_args(argv)
    names = args.only.split(",") if args.only else [c[0] for c in CASES]
    rows = anyio.run(_measure, names)
    print(json.dumps(rows, indent=1) if args.json else render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
