"""Structural digests of simulator logs (issue 15, item 3), on logs the simulators write.

Each simulator test runs PyBaMM, Cantera or ASE for real in a subprocess (stdout and
stderr into one log, as a kernel's raw output holds them), digests the log with the
simulator's declared digester, and checks the acceptance: at most 10 % of the raw tokens
(the project's ruler), and every warning, error and final value found in the raw log by
the test's own scan is in the digest verbatim. Then the real tool path: a capped
``run_python`` result in a real kernel carries the digest beside head/tail, and a
digester that fails or hangs leaves plain head/tail.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from langchain_core.messages import ToolMessage

from simagent.context.capping import MARKER_SLACK
from simagent.context.tokens import resolve_ruler
from simagent.kernel import digest as core
from simagent.kernel import digesters as host
from simagent.kernel.terminal import ESC_SEQ_RE
from simagent.simulators import SimulatorError, discover, parse_simulator

RATIO = 0.10


def run_log(tmp_path: Path, name: str, code: str) -> Path:
    """Run ``code`` in a fresh interpreter; its stdout and stderr, interleaved, as a log."""
    script = tmp_path / f"make_{name}_log.py"  # not {name}.py: it would shadow the package
    script.write_text(textwrap.dedent(code))
    log = tmp_path / f"{name}.log"
    with open(log, "w") as out:
        proc = subprocess.run([sys.executable, "-u", str(script)], stdout=out,
                              stderr=subprocess.STDOUT, cwd=tmp_path, timeout=600,
                              env={"PYBAMM_DISABLE_TELEMETRY": "true", "PATH": "/usr/bin:/bin",
                                   "HOME": str(tmp_path)})
    assert proc.returncode == 0, log.read_text()[-3000:]
    return log


def digest_of(sim: str, log: Path, max_chars: int = core.DEFAULT_MAX_CHARS) -> str:
    name, fn = host.load_digester(discover()[sim])
    assert name == sim
    text, lines = host.run_digester(fn, log, max_chars)
    assert lines == len(log.read_text().split("\n")) - 1
    return text


def lines_matching(text: str, pattern: str) -> list[str]:
    return [ln.strip() for ln in text.split("\n") if re.search(pattern, ln)]


def survives(line: str, digest: str) -> bool:
    """Verbatim, or (a long line) with its start and its end verbatim around the cut."""
    return line in digest or (len(line) > 200 and line[:120] in digest
                               and line[-60:] in digest)


def assert_acceptance(raw: str, digest: str, warnings: list[str], errors: list[str],
                      finals: list[str], *, require_all: bool = True) -> float:
    """At most :data:`RATIO` of the raw tokens, and every listed line kept: verbatim, or,
    for a kind of line (one shape) repeated past ``KEEP_PER_SHAPE``, its first and latest
    verbatim and the rest counted."""
    ruler = resolve_ruler(None)
    ratio = ruler.count(digest) / ruler.count(raw)
    assert ratio <= RATIO, (ratio, digest)
    if require_all:  # the logs are built to have all three
        assert warnings and errors and finals
    for kind, wanted in (("warning", warnings), ("error", errors), ("final", finals)):
        groups: dict[str, list[str]] = {}
        for line in wanted:
            groups.setdefault(core.split_numbers(line)[0], []).append(line)
        for group in groups.values():
            must = group if len(group) <= core.KEEP_PER_SHAPE else [group[0], group[-1]]
            for item in must:
                assert survives(item, digest), \
                    f"{kind} lost: {item!r}\n--- digest ---\n{digest}"
            if len(group) > core.KEEP_PER_SHAPE:
                assert re.search(r"\[×[\d,]+ more lines like the one above", digest)
    return ratio


# ---------------------------------------------------------------------------- pybamm
PYBAMM_LOG = """
    import traceback
    import pybamm
    pybamm.set_logging_level("DEBUG")
    model = pybamm.lithium_ion.SPM()
    pv = pybamm.ParameterValues("Chen2020")
    cycle = ("Discharge at 1C until 2.5 V", "Rest for 10 minutes",
             "Charge at C/2 until 4.2 V", "Hold at 4.2 V until C/50")
    exp = pybamm.Experiment([cycle] * 3 + [("Discharge at 8C for 2 hours",)])
    sim = pybamm.Simulation(model, parameter_values=pv, experiment=exp)
    sol = sim.solve()
    pybamm.set_logging_level("WARNING")
    t, V = sol["Time [s]"].entries, sol["Voltage [V]"].entries
    Q = sol["Discharge capacity [A.h]"].entries
    for i in range(len(t)):
        print(f"[SPM] step {i:05d} t={t[i]:10.3f}s V={V[i]:.5f} Q={Q[i]:+.6f}")
    try:
        sol["Voltag [V]"]
    except KeyError:
        traceback.print_exc()
    print(f"FINAL termination={sol.termination!r} cycles={len(sol.cycles)} "
          f"V_end={V[-1]:.5f} V Q_end={Q[-1]:+.6f} A.h")
"""


@pytest.mark.slow
def test_pybamm_experiment_log_digests_to_a_tenth_keeping_warnings_errors_finals(tmp_path):
    log = run_log(tmp_path, "pybamm", PYBAMM_LOG)
    raw = log.read_text()
    digest = digest_of("pybamm", log)
    warnings = lines_matching(raw, r"\[WARNING\]|Experiment is infeasible")
    errors = lines_matching(raw, r"^\w+Error\b|^KeyError")
    rows = lines_matching(raw, r"^\[SPM\] step")
    finals = [*lines_matching(raw, r"^FINAL |Finish experiment simulation"), rows[-1]]
    assert len(rows) > 300 and any("infeasible" in w for w in warnings)
    assert_acceptance(raw, digest, warnings, errors, finals)
    # the chatter is counted by level, and the experiment's table is collapsed
    debug = len(lines_matching(raw, r" - \[DEBUG\] (?!.*Newton iter)"))
    assert f"DEBUG ×{debug:,}" in digest
    assert f"[table: {len(rows):,} rows" in digest
    # deterministic: the bench replays it
    assert digest_of("pybamm", log) == digest


# --------------------------------------------------------------------------- cantera
CANTERA_LOG = """
    import cantera as ct
    gas = ct.Solution("h2o2.yaml")
    for T0 in (1000.0, 1100.0):
        gas.TPX = T0, ct.one_atm, "H2:2, O2:1, N2:3.76"
        r = ct.IdealGasConstPressureReactor(gas)   # no clone=: Cantera warns
        net = ct.ReactorNet([r])
        print(f"{'t [s]':>13} {'T [K]':>10} {'P [Pa]':>11} {'X_OH':>11} {'X_H2O':>11}")
        t_prev, T_prev, rise = 0.0, r.T, (0.0, 0.0)
        while net.time < 1e-3:
            net.step()
            dTdt = (r.T - T_prev) / (net.time - t_prev)
            rise = max(rise, (dTdt, net.time))
            t_prev, T_prev = net.time, r.T
            print(f"{net.time:13.6e} {r.T:10.3f} {r.phase.P:11.1f} "
                  f"{r.phase['OH'].X[0]:11.4e} {r.phase['H2O'].X[0]:11.4e}")
        print(f"ignition T0={T0:.0f} K: tau={rise[1]:.6e} s, T_final={r.T:.2f} K")
    net.max_steps = 25
    gas.TPX = 900.0, ct.one_atm, "H2:2, O2:1, N2:3.76"
    net = ct.ReactorNet([ct.IdealGasConstPressureReactor(gas, clone=True)])
    net.max_steps = 25
    try:
        net.advance(1.0)
    except ct.CanteraError as exc:
        print(f"integration failed: {exc}")
"""


def test_cantera_reactor_log_digests_to_a_tenth_keeping_warnings_errors_finals(tmp_path):
    log = run_log(tmp_path, "cantera", CANTERA_LOG)
    raw = log.read_text()
    digest = digest_of("cantera", log)
    warnings = lines_matching(raw, r"Warning:")
    errors = lines_matching(raw, r"CanteraError|Maximum number of timesteps|integration failed")
    rows = lines_matching(raw, r"^\s*\d\.\d{6}e[-+]\d\d\s+\d")
    ignition = lines_matching(raw, r"^ignition ")
    # the last row of each table (one per initial temperature) is a final state
    ends = [raw_rows[-1].strip() for raw_rows in _tables(raw)]
    assert len(rows) > 500 and len(ignition) == 2 and len(ends) == 2
    assert_acceptance(raw, digest, warnings, errors, [*ignition, *ends])
    # the columns are named from the header (not quoted as a warning's continuation)
    assert re.search(r"· T \[K\] 1000\.000→", digest) and re.search(r"· X_OH \d", digest)
    assert "2 runs" in digest and "header: t [s]" in digest


def _tables(raw: str) -> list[list[str]]:
    tables: list[list[str]] = []
    for line in raw.split("\n"):
        if line.strip().startswith("t [s]"):
            tables.append([])
        elif tables and re.match(r"^\s*\d\.\d{6}e[-+]\d\d\s+\d", line):
            tables[-1].append(line)
    return tables


# ------------------------------------------------------------------------------- ase
ASE_LOG = """
    import traceback
    import numpy as np
    from ase import units
    from ase.build import bulk, fcc111
    from ase.calculators.emt import EMT
    from ase.constraints import FixAtoms
    from ase.filters import FrechetCellFilter
    from ase.md import MDLogger
    from ase.md.langevin import Langevin
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
    from ase.optimize import BFGS, FIRE

    for el, a in (("Cu", 3.7), ("Ag", 4.2), ("Au", 4.2)):
        atoms = bulk(el, "fcc", a=a, cubic=True)
        atoms.calc = EMT()
        ok = BFGS(FrechetCellFilter(atoms), logfile="-").run(fmax=1e-4)
        print(ok)
        print(f"relaxed {el}: a0={atoms.cell[0, 0]:.5f} A E={atoms.get_potential_energy():.6f} eV")
    slab = fcc111("Cu", (2, 2, 4), vacuum=6.0)
    slab.set_constraint(FixAtoms(indices=[i for i, z in enumerate(slab.positions[:, 2])
                                          if z < slab.positions[:, 2].min() + 1.0]))
    slab.calc = EMT()
    slab.rattle(0.08, seed=3)
    print(FIRE(slab, logfile="-").run(fmax=1e-3, steps=40))
    md = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
    md.calc = EMT()
    MaxwellBoltzmannDistribution(md, temperature_K=600, rng=np.random.default_rng(7))
    dyn = Langevin(md, 2 * units.fs, temperature_K=600, friction=0.02 / units.fs,
                   rng=np.random.default_rng(7))
    dyn.attach(MDLogger(dyn, md, "-", header=True, peratom=True), interval=1)
    dyn.run(1000)
    try:
        bad = bulk("Fe", "bcc", a=2.87)
        bad.calc = EMT()
        bad.get_potential_energy()
    except NotImplementedError:
        traceback.print_exc()
    print(f"MD final: Epot={md.get_potential_energy() / len(md):.6f} eV/atom "
          f"T={md.get_temperature():.2f} K")
"""


@pytest.mark.slow
def test_ase_optimizer_and_md_logs_digest_to_a_tenth_keeping_warnings_errors_finals(tmp_path):
    log = run_log(tmp_path, "ase", ASE_LOG)
    raw = log.read_text()
    digest = digest_of("ase", log)
    warnings = lines_matching(raw, r"Warning:")
    errors = lines_matching(raw, r"^NotImplementedError")
    bfgs = lines_matching(raw, r"^BFGS:")
    ends = [prev for prev, nxt in itertools.pairwise(bfgs)
            if int(nxt.split()[1]) <= int(prev.split()[1])] + [bfgs[-1]]
    fire = lines_matching(raw, r"^FIRE:")
    md_rows = [ln.strip() for ln in raw.split("\n")
               if re.fullmatch(r"\s*\d+\.\d{4}(\s+-?\d+\.\d+){4}\s*", ln)]
    finals = [*lines_matching(raw, r"^relaxed |^MD final"), *ends, fire[-1], md_rows[-1],
              "True", "False"]
    assert len(ends) == 3 and len(md_rows) > 300 and warnings
    assert_acceptance(raw, digest, warnings, errors, finals)
    # the optimizer's columns are named, MDLogger's from its header
    assert re.search(r"· fmax \d", digest) and re.search(r"· T\[K\] \d+\.\d→", digest)
    assert "3 runs" in digest  # three relaxations, each step counter from 0


# ------------------------------------------------------------------ bench's longest
BENCH = {"pybamm": "pybamm-rate-capability", "cantera": "cantera-ignition-map",
         "ase": "ase-eos-md"}


@pytest.mark.slow
@pytest.mark.parametrize("sim", [  # cantera's and ase's take half a minute each: test-deep
    pytest.param("ase", marks=pytest.mark.deep), pytest.param("cantera", marks=pytest.mark.deep),
    "pybamm"])
def test_longest_bench_output_digests_to_a_tenth_keeping_every_notable_line(tmp_path, sim):
    """Replays the simulator's long bench workflow in a real kernel (as ``simagent bench``
    records it) and digests its longest output."""
    from simagent.bench.kernel_recording import record
    from simagent.bench.workflow import bundled_workflows, load_workflow

    wf = load_workflow(bundled_workflows()[BENCH[sim]])
    rec = record(wf, tmp_path / "rec")
    raw_path = max((r.raw_path for _, r in rec.results if r.raw_path),
                   key=lambda p: p.stat().st_size)
    # what a terminal shows: colours gone, a progress bar apart from the print after it
    raw = "\n".join(core.PROGRESS_RE.sub("", ln)
                    for ln in ESC_SEQ_RE.sub("", raw_path.read_text()).split("\n"))
    digest = digest_of(sim, raw_path)
    last = next(ln.strip() for ln in reversed(raw.split("\n")) if ln.strip())
    assert_acceptance(raw, digest, lines_matching(raw, r"(?i)warn"),
                      lines_matching(raw, r"(?i)error|infeasible|fail"),
                      [*lines_matching(raw, r"(?i)^#|^===|final|terminat|ignition"), last],
                      require_all=False)


# ----------------------------------------------------------------------- tool path
def test_capped_run_python_result_carries_the_digest_beside_head_and_tail(workspace):
    from simagent.agent.builder import build_agent
    from simagent.agent.runner import TurnRunner
    from simagent.agent.scripted import ScriptedChatModel
    from simagent.session import Session

    code = textwrap.dedent("""
        import cantera as ct
        gas = ct.Solution("h2o2.yaml")
        gas.TPX = 1000.0, ct.one_atm, "H2:2, O2:1, N2:3.76"
        r = ct.IdealGasConstPressureReactor(gas, clone=True)
        net = ct.ReactorNet([r])
        print("         t [s]      T [K]")
        n = 0
        while net.time < 1e-3:
            net.step(); n += 1
            print(f"{net.time:14.6e} {r.T:10.3f}")
            if n == 200:
                print(f"WARNING at step {n}: T={r.T:.3f} K, still below 1100 K")
        print(f"done: {n} steps, T_final={r.T:.3f} K")
    """)
    session = Session.create(workspace, simulator="cantera", approval="auto")
    try:
        model = ScriptedChatModel.from_steps([
            {"tool": "run_python", "args": {"code": code}}, {"final": "ok"}])
        TurnRunner(session, build_agent(session, model)).run("ignite", lambda e: None)
        tool = next(m for m in model.requests[-1] if isinstance(m, ToolMessage))
        text = tool.text
        raw = Path(tool.artifact["raw_path"]).read_text()
    finally:
        session.close()
    cap = session.context_settings.tool_caps.get("run_python",
                                                 session.context_settings.tool_cap_chars)
    # within the cap the plain head/tail had (the marker rides on top of it, as before)
    assert len(raw) > 5 * cap and len(text) <= cap + MARKER_SLACK
    assert "[digest of " in text and "by the cantera digester" in text
    # the marker still names the handle, with the call returning the lines it left out
    assert re.search(r"not shown: _out\[\d+\]\.slice\(\d+, \d+\)", text)
    digest = text[text.index("[digest of "):text.index("[end of digest")]
    # the warning in the middle (not in head or tail) is in the digest, verbatim
    warning = lines_matching(raw, r"^WARNING at step")[0]
    rows = lines_matching(raw, r"^\s*\d\.\d{6}e[-+]\d\d\s")
    assert warning in digest and warning not in text.replace(digest, "")
    # with its line in the raw output, for ``_out[n].slice`` around it
    assert f"{warning}  [line {raw.split(chr(10)).index(warning) + 1:,}]" in digest
    # the table is collapsed (one table, the warning between its rows does not split it)
    assert f"[table: {len(rows):,} rows" in digest and rows[-1] in digest
    assert lines_matching(raw, r"^done: ")[0] in text


class _Sim:
    """A simulator record as the loader makes it, for a digester written by the test."""

    def __init__(self, root: Path, digest: str) -> None:
        self.root, self.digest, self.name = root, digest, f"t{abs(hash(root)) % 10**8}"


@pytest.mark.parametrize("body", [
    "def digest(lines, max_chars):\n    raise RuntimeError('broken digester')\n",
    "import time\ndef digest(lines, max_chars):\n"
    "    for _ in lines:\n        time.sleep(0.01)\n    return 'never'\n",
    "import time\ndef digest(lines, max_chars):\n    time.sleep(3)\n    return 'late'\n",
], ids=["raises", "slow-reader", "hangs"])
def test_a_failing_digester_leaves_plain_head_and_tail(tmp_path, monkeypatch, body):
    from simagent.kernel.result import ExecResult
    from simagent.trace.log import TraceLog

    monkeypatch.setattr(host, "DIGEST_TIMEOUT_S", 0.5)
    (tmp_path / "mine.py").write_text(body)
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    raw = outputs / "0003.txt"
    # a real solver table: scipy's adaptive steps of a stiff decay
    from scipy.integrate import solve_ivp

    sol = solve_ivp(lambda t, y: -50 * (y - 1), (0, 5), [0.0], method="BDF", rtol=1e-8)
    raw.write_text("".join(f"step {i:5d} t={t:.6e} y={y:.9f}\n"
                           for i, (t, y) in enumerate(zip(sol.t, sol.y[0], strict=True))) * 3)
    result = ExecResult(status="ok", stdout=raw.read_text(), raw_path=raw,
                        raw_chars=len(raw.read_text()))
    trace = TraceLog(tmp_path / "trace.sqlite")
    digest = host.output_digester(_Sim(tmp_path, "mine:digest"), raw, trace)
    assert result.model_text(2000, digest=digest) == result.model_text(2000)
    [event] = trace.events(["error"])
    assert "output digest" in event.payload["where"]
    # the generic digester on the same output does add a digest
    generic = host.output_digester(None, raw, trace)
    assert "[digest of " in result.model_text(2000, digest=generic)
    # ... but not to an output of a few (long) lines: head and tail show most of it
    rows = raw.read_text().split("\n")
    short = outputs / "0004.txt"  # 20 lines of 9 rows each: a table, yet only 20 lines
    short.write_text("".join(" ".join(rows[i:i + 9]) + "\n" for i in range(0, 180, 9)))
    assert core.digest_text(short.read_text())  # the core alone would digest it
    assert host.output_digester(None, short, trace)(2000) is None


# ------------------------------------------------------------------------ the core
def test_generic_core_keeps_short_result_tables_verbatim_and_collapses_step_logs():
    from scipy.integrate import solve_ivp

    sol = solve_ivp(lambda t, y: [y[1], -y[0] - 0.1 * y[1]], (0, 60), [1.0, 0.0],
                    method="RK45", rtol=1e-9, atol=1e-12)
    lines = ["   step          t          x          v"]
    lines += [f"{i:7d} {t:10.5f} {x:10.6f} {v:10.6f}"
              for i, (t, x, v) in enumerate(zip(sol.t, *sol.y, strict=True))]
    lines += ["damping  x_final", *(f"zeta={z:.2f} {x:.6f}" for z, x in
                                    ((0.05, sol.y[0, -1]), (0.1, sol.y[0, -1] / 2)))]
    text = core.digest_text("\n".join(lines))
    assert f"[table: {len(sol.t):,} rows" in text
    assert f"t {0:.5f}→{sol.t[-1]:.5f}" in text and "x " in text and "v " in text
    assert lines[-1] in text and lines[-2] in text and lines[len(sol.t)].strip() in text
    assert len(text) <= core.DEFAULT_MAX_CHARS
    # under a tight budget the digest degrades but stays bounded and keeps the table
    tight = core.digest_text("\n".join(lines), max_chars=300)
    assert len(tight) <= 300 and "rows" in tight


@pytest.mark.parametrize("prefix", ["/w", "/check/work/main/a/much/longer/checkout/path"])
def test_a_records_message_survives_every_budget_whatever_the_paths(prefix):
    """A WARNING record's message sits on its continuation line; as the budget shrinks
    the digest drops detail, yet the message stays verbatim at every level (CI once
    lost it: a longer checkout path pushed the digest one level down, and that level
    clipped continuation lines shorter than the line they continue)."""
    message = ("\tExperiment is infeasible: 'event: Minimum voltage [V]' was triggered during "
               "'Discharge at 8C for 2 hours'. The returned solution only contains up to "
               "step 1 of cycle 4.")
    lines = [f"[SPM] step {i:05d} t= {10.0 * i:9.3f}s V={4.2 - i / 1e3:.5f}" for i in range(400)]
    lines += ["2026-11-25 17:49:21.105 - [WARNING] callbacks.on_experiment_infeasible_event(245):",
              message, "Traceback (most recent call last):",
              *(f'  File "{prefix}/.venv/lib/python3.11/site-packages/pybamm/m{i}.py", '
                f'line {i}, in f' for i in range(12)), "KeyError: 'Voltag [V]'"]
    _, fn = host.load_digester(discover()["pybamm"])
    seen = set()
    for budget in range(6000, 200, -50):
        text = fn(iter(lines), budget)
        if "[digest cut at" in text:
            break
        seen.add(text)
        assert len(text) <= budget, (budget, text)
        if "lines 1-400] last:" in text:  # the barest level: its start and end, cut
            assert message[:100] in text and message[-50:] in text, (budget, text)
        else:
            assert message.strip() in text, (budget, text)
        assert "KeyError: 'Voltag [V]'" in text
    assert len(seen) >= 3  # the budgets walked through several levels


def test_raw_lines_stream_with_bounded_lines_and_terminal_rewrites(tmp_path):
    path = tmp_path / "0001.txt"
    with open(path, "w") as f:
        f.write("x" * (3 * core._READ_CHUNK) + "\n")  # one enormous line
        f.write("progress  10%\rprogress  50%\rprogress 100%\n\x1b[31mWarning: red\x1b[0m\n")
    lines = list(host.iter_raw_lines(path))
    assert len(lines) == 3 and len(lines[0]) == core._READ_CHUNK
    d = core.Digester().feed(lines)
    assert [k.text for k in d.kept] == ["Warning: red"]
    assert any(t == "progress 100%" for f in d.families.values() for _, t in f.rows)


def test_bundled_digesters_are_declared_and_others_get_the_generic_one():
    sims = discover()
    for name in ("pybamm", "cantera", "ase"):
        assert sims[name].digest == "digest:digest"
        assert host.load_digester(sims[name])[0] == name
    assert host.load_digester(sims["scipy"])[0] == "generic"
    assert host.load_digester(None)[0] == "generic"


def test_a_bad_digest_declaration_names_the_file(tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    base = 'name = "bad"\ndisplay_name = "Bad"\ndescription = "x"\n'
    for spec in ("nomodule:digest", "digest.py:digest", "digest"):
        (folder / "simulator.toml").write_text(base + f'digest = "{spec}"\n')
        with pytest.raises(SimulatorError, match=r"bad/simulator.toml: digest must be"):
            parse_simulator(folder)
    (folder / "mine.py").write_text("def digest(lines, max_chars):\n    return ''\n")
    (folder / "simulator.toml").write_text(base + 'digest = "mine:digest"\n')
    assert parse_simulator(folder).digest == "mine:digest"
