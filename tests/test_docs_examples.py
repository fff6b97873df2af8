"""The documentation cannot drift from the program (issue 37).

- Every shell or Python block marked ``title="runnable"`` in README.md and docs/ runs, in
  the order written, in one fresh workspace and state home per page, with the scripted
  model or replay: no key, no network.
- The site builds with ``mkdocs build --strict`` (broken links and anchors fail), and its
  generated pages (CLI reference, ``[context]`` settings) cover what they walk.
- Every configuration key docs/configuration.md names is read somewhere in simagent, and
  every key a reader lists itself is named there.
- The README stays a five-minute read: at most 250 lines, no measurement history.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import cli_fork
import pytest

from simagent.config import ConfigError, McpServer, parse_mcp_servers
from simagent.context.settings import ContextSettings
from simagent.local_model.kind import LOCAL_KEYS
from simagent.provider_errors import RETRY_KEYS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BIN = Path(sys.executable).parent
RUNNABLE = re.compile(r'^```(bash|python) title="runnable"\n(.*?)^```$', re.M | re.S)
#: One block's bound: a kernel start, a turn, an export or one attack row.
BLOCK_TIMEOUT_S = 180


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def runnable_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of each block marked runnable, in order."""
    return [(m.group(1), m.group(2)) for m in RUNNABLE.finditer(text)]


def _pages_with_examples() -> list[Path]:
    return [p for p in _pages() if runnable_blocks(p.read_text())]


def _load_hook():
    spec = importlib.util.spec_from_file_location(
        "generated_pages", DOCS / "hooks" / "generated_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_marker_finds_blocks_and_only_marked_ones():
    text = ('```bash title="runnable"\necho one\n```\n```bash\necho two\n```\n'
            '```python title="runnable"\nprint(3)\n```\n')
    assert runnable_blocks(text) == [("bash", "echo one\n"), ("python", "print(3)\n")]
    pages = {p.relative_to(ROOT).as_posix() for p in _pages_with_examples()}
    # the tour's no-key turn, a notebook out and in, an attack row, an MCP client at least
    assert {"README.md", "docs/getting-started.md", "docs/mcp.md"} <= pages
    readme = (ROOT / "README.md").read_text()
    for command in ("simagent run --model scripted:", "simagent notebook",
                    "--from-notebook", "simagent bench attacks --only"):
        assert any(command in code for _lang, code in runnable_blocks(readme)), command


@pytest.mark.slow
@pytest.mark.parametrize("page", _pages_with_examples(),
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_runnable_example_runs(page: Path, tmp_path: Path):
    workspace, home = tmp_path / "workspace", tmp_path / "home"
    workspace.mkdir()
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIMAGENT_")}
    # the page's `simagent` is the CLI forked from the suite's warmed server (tests/cli_fork.py):
    # a real process each, without the interpreter's start
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "simagent").write_text(f'#!/bin/sh\nexec {shlex.join(cli_fork.command([]))} "$@"\n')
    (shim / "simagent").chmod(0o755)
    env.update(SIMAGENT_HOME=str(home),
               PATH=os.pathsep.join([str(shim), str(BIN), env.get("PATH", "")]))
    for n, (language, code) in enumerate(runnable_blocks(page.read_text()), 1):
        command = (["bash", "-euo", "pipefail", "-c", code] if language == "bash"
                   else [sys.executable, "-c", code])
        proc = subprocess.run(command, cwd=workspace, env=env, text=True,
                              capture_output=True, timeout=BLOCK_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, (f"{page.name} runnable block {n} exited "
                                      f"{proc.returncode}:\n{code}\n--- stdout\n"
                                      f"{proc.stdout[-2000:]}\n--- stderr\n{proc.stderr[-3000:]}")
        assert "internal error" not in proc.stderr
        if page.name == "README.md" and n == 1:  # the tour's first answer, as quoted
            quoted = re.search(r"The answer, `([^`]+)`, goes to stdout", page.read_text())
            assert proc.stdout.strip().splitlines()[0] == quoted.group(1)


def test_the_site_builds_strict(tmp_path: Path):
    proc = subprocess.run([str(BIN / "mkdocs"), "build", "--strict", "--quiet",
                           "--site-dir", str(tmp_path / "site")], cwd=ROOT, text=True,
                          capture_output=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()


def test_the_cli_reference_has_every_command_and_option():
    from simagent.cli import build_parser

    hook = _load_hook()
    page = hook.cli_reference()
    for command, parser in hook.parsers(build_parser()):
        assert f"## `{command}`" in page
        for action in parser._actions:
            for flag in action.option_strings:
                assert flag in page, (command, flag)
    assert "## `simagent bench run`" in page  # nested subcommands are walked


def test_the_context_reference_has_every_setting_with_its_default():
    page = _load_hook().context_settings_reference()
    for f in dataclasses.fields(ContextSettings):
        assert re.search(rf"^\| `{f.name}` \|", page, re.M), f.name
    assert "| `clear_inputs` | `bool` | `True` | clear a run_python call's code" in page


def test_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.glob("*.md")}
    pages |= set(_load_hook().PAGES)
    missing = sorted(p for p in pages if f" {p}" not in nav)
    assert not missing, missing


# ---------------------------------------------------------------- configuration keys
def _documented_keys() -> dict[str, set[str]]:
    text = (DOCS / "configuration.md").read_text()
    section = text.split("## Every key", 1)[1].split("\n## ", 1)[0]
    keys: dict[str, set[str]] = {}
    for table, key in re.findall(r"^\| (\S+(?: level\))?) \| `(\w+)` \|", section, re.M):
        keys.setdefault(table.strip("`"), set()).add(key)
    return keys


def _string_literals() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "simagent").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)
    return found


def test_every_documented_config_key_is_read_somewhere():
    keys = _documented_keys()
    assert {"(top level)", "[model]", "[kernel]", "[mcp.servers.NAME]"} <= set(keys)
    literals = _string_literals()
    unread = sorted(f"{t} {k}" for t, ks in keys.items() for k in ks if k not in literals)
    assert not unread, f"docs/configuration.md names keys no code reads: {unread}"


def test_every_key_a_reader_lists_is_documented():
    keys = _documented_keys()
    assert set(RETRY_KEYS) | set(LOCAL_KEYS) <= keys["[model]"]
    # a server's table: McpServer's fields but its name (the table's own name)
    server_keys = {f.name for f in dataclasses.fields(McpServer)} - {"name"}
    assert server_keys == keys["[mcp.servers.NAME]"]
    for key in server_keys:  # and the parser takes each (an unknown one is an error)
        with pytest.raises(ConfigError) as err:
            parse_mcp_servers({"x": {key: 1, "bogus": 1}})
        assert "unknown key(s) bogus;" in str(err.value)
    from simagent.kernel.replay import budget_from

    for key in ("replay", "replay_cell_s", "replay_total_s"):
        with pytest.raises(ValueError, match=key):
            budget_from({key: "not a value"})
        assert key in keys["[kernel]"]


# ---------------------------------------------------------------------- the README
def test_the_readme_is_a_five_minute_read():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    prose = re.sub(r"^```.*?^```$", "", text, flags=re.M | re.S)
    prose = re.sub(r"<!-- attacks:begin.*?<!-- attacks:end -->", "", prose, flags=re.S)
    assert len(prose.split()) <= 5 * 230  # five minutes at 230 words a minute
    # the generated table names the run's commit; typed text names none
    assert not re.search(r"\b(at|since|before) [0-9a-f]{7}\b", prose), "a commit hash"
    for heading in ("## Install", "## Two commands", "## A 5-minute tour",
                    "## Attacks it holds", "## Documentation"):
        assert heading in text
