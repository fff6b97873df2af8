"""The command line: fast start-up, one-line errors, the kernel bench's JSON contract."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from simagent import __version__
from simagent.bench.kernel_bench import GOALS, format_table, run_kernel_bench

HEAVY = ("deepagents", "langchain", "langchain_core", "langgraph", "matplotlib", "jupyter_client")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    # A fresh interpreter, not cli_fork: these commands import nothing heavy (0.08 CPU-s),
    # less than a child forked from the warmed server costs (0.13).
    return subprocess.run([sys.executable, "-m", "simagent", *args],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["--help"], ["bench", "--help"], ["bench", "kernel", "--help"],
                                  ["run", "--help"], ["sessions", "--help"],
                                  ["transcript", "--help"], ["init", "--help"],
                                  ["simulators", "--help"], ["doctor", "--help"],
                                  ["memory", "--help"], ["bench", "run", "--help"],
                                  ["bench", "list", "--help"]])
def test_help_does_not_import_heavy_libraries(argv: list[str]) -> None:
    probe = (
        "import sys\nfrom simagent.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=120)
    assert "usage: simagent" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.slow
def test_version() -> None:
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"simagent {__version__}"


@pytest.mark.slow
def test_the_command_never_builds_jsonschemas_iri_grammar() -> None:
    """``rfc3987_syntax`` (installed beside jupyter_server) costs 1.3 s of CPU at every
    start when jsonschema, under the MCP SDK, finds it; the command marks it absent."""
    probe = ("import sys\nfrom simagent.cli import entry\nsys.argv = ['simagent', 'sessions']\n"
             "try:\n    entry()\nexcept SystemExit:\n    pass\n"
             "import mcp, jsonschema  # what run, the TUI, doctor and mcp load\n"
             "print(sorted(m for m in ('rfc3987_syntax', 'lark') if sys.modules.get(m)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.slow
def test_usage_errors_are_one_line_with_exit_2() -> None:
    r = run_cli("bench", "nonsense")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "invalid choice" in r.stderr


@pytest.mark.real  # the in-memory kernel cannot cut time.sleep short: 100 s, not 0.05
def test_kernel_bench_reports_exactly_the_contract_keys() -> None:
    results, detail = run_kernel_bench(roundtrip_runs=5, capture_sizes_mb=(1,), out_grep_mb=2)
    assert set(results) == {"roundtrip_ratio", "capture_mb_s", "peak_rss_growth_mb",
                            "interrupt_s", "restart_s", "out_grep_rss_growth_mb"} == set(GOALS)
    assert results["out_grep_rss_growth_mb"] >= 0
    assert results["roundtrip_ratio"] > 0 and results["capture_mb_s"]["1MB"] > 0
    assert set(results["interrupt_s"]) == {"busy_loop", "sleep"}
    assert results["restart_s"] > 0 and detail["p50_ms"]["simagent"] > 0
    json.dumps(results)
    table = format_table(results, detail)
    assert "roundtrip_ratio" in table and "capture_mb_s [1MB]" in table
