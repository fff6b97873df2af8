"""``simagent bench attacks``: the fast subset runs for real and every row must hold.

The full run (``simagent bench attacks``, ``make bench-attacks``) is the figure for the
README's security table; here each fast attack runs against the real CLI, kernel, MCP
servers and listener, one test per attack so a broken one is named. The lab's readings
(planted values at rest, ANSI-split ones too, loose permissions, requests carrying a
key) are checked on their own, so a bench that cannot see a leak is caught.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request

import cli_fork
import pytest

from simagent.bench import attack_cases
from simagent.bench.attack_bench import (
    AttackCase,
    AttackRow,
    as_json,
    format_table,
    markdown_table,
    readme_table,
    rows_of,
    run_attacks,
)
from simagent.bench.attack_lab import (
    FAKE_KEY,
    OPENAI_KEY,
    PASSWORD,
    Verdict,
    lab,
    listening,
    skip,
)

#: the kernel process is what these tests are about (make test-real)
pytestmark = pytest.mark.real

#: The attack classes of issue 40 the catalogue must cover.
CLASSES = {"trust", "notebook", "paths", "links", "reads", "memory", "mcp-client", "mcp-http",
           "dask", "secrets", "permissions"}


def test_unknown_attack_ids_are_an_error_naming_the_known_ones():
    with pytest.raises(ValueError, match="trust-run"):
        attack_cases.select(["no-such-attack"])


def test_the_catalogue_covers_every_class_and_the_fast_subset_is_a_proper_subset():
    ids = [c.id for c in attack_cases.CASES]
    assert len(ids) == len(set(ids))
    assert {c.cls for c in attack_cases.CASES} == CLASSES
    fast = attack_cases.select(fast=True)
    assert 0 < len(fast) < len(attack_cases.CASES)
    assert all(c.attack and c.expected and "\n" not in c.attack + c.expected
               for c in attack_cases.CASES)


# ------------------------------------------------------------------- the lab's readings
def test_the_leak_scan_finds_a_value_whole_split_by_ansi_or_json_escaped():
    with lab() as made:
        session = made.state / "workspaces" / "w" / "sessions" / "s"
        session.mkdir(parents=True)
        (session / "plain.txt").write_text(f"key {FAKE_KEY}\n")
        split = FAKE_KEY[:9] + "\x1b[31m" + FAKE_KEY[9:] + "\x1b[0m"
        (session / "0001.txt").write_text(f"key {split}\n")
        (session / "trace.json").write_text(json.dumps({"text": split}))  # \u001b[31m
        (made.ws / ".simagent").mkdir()
        (made.ws / ".simagent" / "notes.md").write_text(PASSWORD)
        (made.exports / "t.md").write_text("[redacted:FAKE_API_KEY]\n")
        (made.outside / "elsewhere.txt").write_text(FAKE_KEY)  # not simagent's to keep
        (made.scripts / "script01.json").write_text(FAKE_KEY)  # the model's side
        found = made.leaks()
    assert sorted(f.split("/")[-1] for f in found) == [
        "0001.txt (FAKE_API_KEY)", "notes.md (LAB_DB_PASSWORD)", "plain.txt (FAKE_API_KEY)",
        "trace.json (FAKE_API_KEY)"]


def test_loose_modes_names_an_open_file_and_an_open_folder():
    with lab() as made:
        made.state.mkdir(mode=0o700)
        (made.state / "ok.txt").write_text("x")
        os.chmod(made.state / "ok.txt", 0o600)
        (made.state / "open.txt").write_text("x")
        os.chmod(made.state / "open.txt", 0o644)
        (made.state / "folder").mkdir(mode=0o755)
        os.chmod(made.state / "folder", 0o755)
        loose = made.loose_modes()
    assert loose == ["state/folder 755", "state/open.txt 644"]


def test_the_listener_counts_a_request_carrying_a_key_and_answers_401():
    with listening() as listener:
        request = urllib.request.Request(f"{listener.url}/v1/chat/completions", data=b"{}",
                                         headers={"Authorization": f"Bearer {OPENAI_KEY}"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401
    assert listener.connections == 1 and len(listener.requests) == 1
    assert listener.with_key == 1


def test_a_planted_value_at_rest_breaks_a_row_that_otherwise_held():
    def leaves_a_key(made):
        made.state.mkdir()
        (made.state / "trace.txt").write_text(FAKE_KEY)
        return Verdict(True, "all quiet")

    def crashes(made):
        raise RuntimeError("the harness broke")

    cases = [AttackCase("leaky", "secrets", "a", "b", leaves_a_key),
             AttackCase("clean", "secrets", "a", "b", lambda made: Verdict(True, "quiet")),
             AttackCase("crash", "secrets", "a", "b", crashes),
             AttackCase("none", "dask", "a", "b", lambda made: skip("no second uid"))]
    leaky, clean, crash, none = run_attacks(cases)
    assert leaky.held is False and "state/trace.txt (FAKE_API_KEY)" in leaky.evidence
    assert clean.held is True and "no planted value in 0 files" in clean.evidence
    assert crash.held is False and "bench error: RuntimeError" in crash.evidence
    assert none.held is None and none.skipped == "no second uid"


# -------------------------------------------------------------------------- reports
ROWS = [AttackRow("trust-run", "trust", "a cloned folder's config", "nothing runs", True, None,
                  "marker absent; exit 3", 12.5),
        AttackRow("secret-ansi", "secrets", "a key | split", "redacted", False, None,
                  "NOT: redacted; key in outputs/0001.txt", 9.0),
        AttackRow("dask-other-uid", "dask", "uid 65534 connects", "refused", None,
                  "not root", "not root", 0.1)]


def test_the_table_json_and_markdown_say_held_broken_and_skipped():
    text = format_table(ROWS)
    assert "trust-run" in text and " held " in text and "BROKEN" in text and "skipped" in text
    assert text.splitlines()[-1] == "1/2 attacks held, 1 skipped; broken: secret-ansi"
    data = as_json(ROWS, "abc1234")
    assert data["commit"] == "abc1234"
    assert [r["result"] for r in data["rows"]] == ["held", "BROKEN", "skipped"]
    assert set(data["rows"][0]) >= {"id", "cls", "attack", "expected", "held", "skipped",
                                    "evidence"}
    assert rows_of(json.loads(json.dumps(data))) == ROWS
    md = markdown_table(ROWS)
    assert md.count("\n| `") == 3 and "a key \\| split" in md


def test_the_readme_table_renders_the_same_text_from_the_same_results():
    data = as_json(ROWS, "abc1234")
    slower = json.loads(json.dumps(data))
    for row in slower["rows"]:
        row["wall_s"] *= 3  # timings never reach the README
    assert readme_table(data) == readme_table(slower) == (
        "| attack | what is tried | what holds | result |\n"
        "|---|---|---|---|\n"
        "| `trust-run` | a cloned folder's config | nothing runs | held |\n"
        "| `secret-ansi` | a key \\| split | redacted | BROKEN |\n"
        "| `dask-other-uid` | uid 65534 connects | refused | skipped (not root) |\n"
        "\n"
        "1/2 attacks held, 1 skipped; broken: secret-ansi (`simagent bench attacks` at "
        "abc1234).\n")


# ------------------------------------------------------------------- the real attacks
@pytest.mark.parametrize("case", attack_cases.select(fast=True), ids=lambda c: c.id)
def test_the_fast_attacks_hold(case):
    """Each fast attack, for real; it fails until the defect it proves is fixed."""
    (row,) = run_attacks([case], popen=cli_fork.popen)
    if row.skipped:
        pytest.skip(row.skipped)
    assert row.held is not False, f"{row.id}: {row.evidence}"


def test_the_command_prints_json_writes_the_tables_and_exits_zero_when_all_hold(tmp_path):
    out = tmp_path / "out"
    proc = cli_fork.run([sys.executable, "-m", "simagent", "bench", "attacks", "--json",
                         "--only", "mcp-http-token", "--out", str(out)],
                        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    (row,) = data["rows"]
    assert row["id"] == "mcp-http-token" and row["held"] is True, row
    assert json.loads((out / "attacks.json").read_text())["rows"] == data["rows"]
    assert "| `mcp-http-token` |" in (out / "attacks.md").read_text()
