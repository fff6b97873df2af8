"""Replay never repeats a side effect (issue 26, "Replay side effects").

Pure tests of the folding of audit events and of the replay rule; then the real kernel:
what its audit hook records for each kind of open, delete, rename and process (and the
noise it leaves out), and the acceptance case: a cell appends a line to results.csv,
the kernel is SIGKILLed, the next call restores, the file still has one line and the
recovery account names the skipped cell and its effect.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from simagent.kernel import Kernel, backup
from simagent.kernel.ladder import Recovery
from simagent.kernel.replay import BACKUP_MAX_BYTES, Skip, load_records, select
from simagent.kernel_api import effects as fx
from simagent.paths import SessionPaths

#: the kernel process is what these tests are about (make test-real)
pytestmark = pytest.mark.real

W = "/ws"


def rec(n: int, code: str, effects: list[dict] | None = None, status: str = "ok") -> dict:
    return {"n": n, "code": code, "status": status, "elapsed_s": 0.01, "lineage": 1,
            "effects": effects or []}


# ------------------------------------------------------------------ folding (pure)
def test_fold_one_effect_per_path_in_first_touch_order() -> None:
    ev = [("append", f"{W}/results.csv", {}),
          ("write", f"{W}/fig.png", {"existed": True}),
          ("append", f"{W}/fig.png", {}),  # after its own truncation: still a whole write
          ("modify", f"{W}/data.h5", {}),
          ("delete", f"{W}/old.csv", {}),
          ("process", "", {"command": "sim --out x"}),
          ("process", "", {"command": "a fork of the kernel"}),
          ("process", "", {"command": "a fork of the kernel"})]
    assert fx.fold(ev) == [
        {"kind": "append", "path": f"{W}/results.csv"},
        {"kind": "write", "path": f"{W}/fig.png"},
        {"kind": "modify", "path": f"{W}/data.h5"},
        {"kind": "delete", "path": f"{W}/old.csv"},
        {"kind": "process", "command": "sim --out x"},
        {"kind": "process", "command": "a fork of the kernel", "times": 2}]


def test_fold_scratch_files_vanish_and_atomic_writes_become_writes() -> None:
    # made, read back and removed in the same cell: nothing outside changed
    assert fx.fold([("write", f"{W}/s.txt", {"existed": False}),
                    ("delete", f"{W}/s.txt", {})]) == []
    # an existing file rewritten and removed: it is gone
    assert fx.fold([("write", f"{W}/s.txt", {"existed": True}),
                    ("delete", f"{W}/s.txt", {})]) == [{"kind": "delete", "path": f"{W}/s.txt"}]
    # write a temporary name whole, rename onto the target
    assert fx.fold([("write", f"{W}/o.tmp", {"existed": False}),
                    ("rename", f"{W}/o.tmp", {"to": f"{W}/o.json"})]) == [
        {"kind": "write", "path": f"{W}/o.json"}]
    # a rename of a file the cell did not write is a rename
    assert fx.fold([("rename", f"{W}/a", {"to": f"{W}/b"})]) == [
        {"kind": "rename", "path": f"{W}/a", "to": f"{W}/b"}]
    # a folder made and removed with its files: nothing
    assert fx.fold([("folder", f"{W}/d", {}), ("write", f"{W}/d/f", {"existed": False}),
                    ("tree", f"{W}/d", {})]) == []


def test_past_the_cap_the_rest_is_one_more_effect_that_never_replays() -> None:
    many = [{"kind": "write", "path": f"{W}/f{i}"} for i in range(fx.MAX_EFFECTS + 5)]
    kept = fx.finish(many)[fx.KEY]
    assert len(kept) == fx.MAX_EFFECTS and kept[-1] == {"kind": "more", "count": 6}
    plan = select([rec(1, "for ...", kept)], sizes={e["path"]: 0 for e in many})
    assert plan.run == [] and plan.skipped[0].kind == "effects"
    assert "does more file operations (6 not recorded)" in plan.skipped[0].why


def test_describe_in_both_tenses_relative_to_the_workspace() -> None:
    e = {"kind": "append", "path": f"{W}/results.csv"}
    assert fx.describe(e, W) == "appends results.csv"
    assert fx.describe(e, W, past=True) == "appended results.csv"
    assert fx.describe({"kind": "write", "path": "/elsewhere/x"}, W, True) == "wrote /elsewhere/x"
    assert fx.describe({"kind": "process", "command": "ls", "times": 2}) == "runs `ls` (2 times)"
    assert fx.describe_all([e, {"kind": "delete", "path": f"{W}/a"}], W) == \
        "appends results.csv, deletes a"


# ------------------------------------------------------------ the replay rule (pure)
def test_cells_with_unrepeatable_effects_are_skipped_and_listed_with_the_effect() -> None:
    never = [{"kind": k, "path": f"{W}/f"} for k in
             ("append", "modify", "delete", "database")]
    never += [{"kind": "rename", "path": f"{W}/a", "to": f"{W}/b"},
              {"kind": "process", "command": "sim"}, {"kind": "signal", "pid": "12"},
              {"kind": "link", "path": f"{W}/l", "to": f"{W}/f"}]
    records = [rec(1, "x = 1")] + [rec(i + 2, f"y{i} = 1", [e]) for i, e in enumerate(never)]
    plan = select(records, base=W)
    assert [c.n for c in plan.run] == [1]
    assert [s.kind for s in plan.skipped] == ["effects"] * len(never)
    assert all(s.loses_state for s in plan.skipped)  # listed: their names are missing
    assert plan.skipped[0].why == "appends f" and plan.skipped[0].effects == (never[0],)
    assert Skip(2, "l", 0.0, "effects", "appends f", (never[0],)).to_dict()["effects"] == \
        [never[0]]


def test_whole_file_writes_and_folders_replay_under_a_bounded_backup() -> None:
    w = {"kind": "write", "path": f"{W}/data.txt"}
    big = {"kind": "write", "path": f"{W}/big.h5"}
    records = [rec(1, "open('data.txt','w').write(s)", [w, {"kind": "folder", "path": W}]),
               rec(2, "save(big)", [big]), rec(3, "open('data.txt','w').write(t)", [w])]
    plan = select(records, sizes={f"{W}/data.txt": 10, f"{W}/big.h5": BACKUP_MAX_BYTES},
                  base=W)
    assert [c.n for c in plan.run] == [1, 3]  # data.txt is backed up once: 10 bytes
    assert plan.writes == [W, f"{W}/data.txt"]  # the folder too: removed if it was absent
    assert [(s.n, s.kind) for s in plan.skipped] == [(2, "effects")]
    assert plan.skipped[0].why == "writes big.h5, more than the 256 MiB a replay backs up"
    # a file whose size is unknown (not measured) is never rewritten
    assert [c.n for c in select(records[:1]).run] == []
    # an absent file costs no backup: replay may make it (and removes it afterwards)
    assert [c.n for c in select(records[:1], sizes={f"{W}/data.txt": None}).run] == [1]


def test_records_without_effects_replay_as_before() -> None:
    old = {"n": 1, "code": "x = 1", "status": "ok", "elapsed_s": 0.1, "lineage": 1}
    assert [c.n for c in select([old]).run] == [1]


def test_recovery_account_names_the_skipped_cell_and_its_effect() -> None:
    r = Recovery("died", "the kernel was killed by SIGKILL", restarted=True, replayed=[1],
                 skipped=[Skip(2, "with open('results.csv', 'a') as f:", 0.01, "effects",
                               "appends results.csv")])
    text = r.message()
    assert "skipped _out[2] `with open('results.csv', 'a') as f:`: appends results.csv" in text
    assert "re-run one only if that should happen again" in text
    assert not r.state_restored and [s.n for s in r.offered] == [2]


# ------------------------------------------------------------------- backup
def test_backup_puts_files_back_and_removes_the_ones_that_were_absent(tmp_path: Path) -> None:
    kept, absent = tmp_path / "kept.txt", tmp_path / "new.txt"
    kept.write_text("one\n")
    os.utime(kept, ns=(1_000_000_000, 1_000_000_000))
    folder = tmp_path / "bk"
    backup.save(folder, [str(kept), str(absent)])
    kept.write_text("two\n")
    absent.write_text("made by the replay\n")
    assert backup.put_back(folder) == []
    assert kept.read_text() == "one\n" and kept.stat().st_mtime_ns == 1_000_000_000
    assert not absent.exists() and not folder.exists()


def test_backup_removes_folders_the_replay_made_but_keeps_ones_with_other_files(
        tmp_path: Path) -> None:
    made, busy = tmp_path / "made" / "deep", tmp_path / "busy"
    folder = tmp_path / "bk"
    backup.save(folder, [str(tmp_path / "made"), str(made), str(made / "f.txt"), str(busy)])
    made.mkdir(parents=True)
    (made / "f.txt").write_text("by the replay")
    busy.mkdir()
    (busy / "theirs.txt").write_text("someone else's")
    assert backup.put_back(folder) == []
    assert not (tmp_path / "made").exists()
    assert (busy / "theirs.txt").exists()


def test_a_backup_left_by_a_killed_replay_is_restored_first(tmp_path: Path) -> None:
    f = tmp_path / "r.csv"
    f.write_text("a\n")
    folder = tmp_path / "bk"
    backup.save(folder, [str(f)])
    f.write_text("half-replayed\n")  # the process died here
    assert backup.put_back_leftover(folder) == [] and f.read_text() == "a\n"
    assert backup.put_back_leftover(folder) == []  # nothing left: nothing to do


# --------------------------------------------------------------------- real kernel
@pytest.fixture
def kernel(session_paths: SessionPaths, workspace: Path) -> Iterator[Kernel]:
    with Kernel(session_paths, cwd=workspace, interrupt_grace_s=1.2,
                heartbeat_grace_s=1.0) as k:
        yield k


def effects_of(kernel: Kernel, code: str) -> list[dict]:
    r = kernel.execute(code)
    assert r.ok, (code, r.notice, r.error and r.error.text())
    record = json.loads((kernel.paths.outputs / f"{kernel.executions:04d}.json").read_text())
    return record["effects"]


def short(effects: list[dict], ws: Path) -> list[tuple]:
    return [(e["kind"], fx.shown_path(e["path"], ws) if e.get("path") else e.get("command"))
            for e in effects]


def test_the_kernel_records_writes_by_open_mode(kernel: Kernel, workspace: Path) -> None:
    (workspace / "r.csv").write_text("h\n")
    cases = {
        "open('w.txt', 'w').write('x')": [("write", "w.txt")],
        "open('r.csv', 'a').write('1\\n')": [("append", "r.csv")],
        "open('r.csv', 'r+').write('H')": [("modify", "r.csv")],
        "open('x.bin', 'xb').close()": [("write", "x.bin")],
        "import os\nos.close(os.open('o.txt', os.O_WRONLY | os.O_CREAT | os.O_APPEND))":
            [("append", "o.txt")],
        "import pathlib\npathlib.Path('p.txt').write_text('x')": [("write", "p.txt")],
        "open('r.csv').read(); open('r.csv', 'rb').read()": [],  # reads are not effects
        "import os\nos.truncate('w.txt', 0)": [("modify", "w.txt")],
    }
    for code, want in cases.items():
        assert short(effects_of(kernel, code), workspace) == want, code


def test_the_kernel_records_deletes_renames_and_processes(kernel: Kernel,
                                                          workspace: Path) -> None:
    for name in ("a.txt", "b.txt", "c.txt"):
        (workspace / name).write_text(name)
    (workspace / "tree").mkdir()
    (workspace / "tree" / "f").write_text("f")
    cases = {
        "import os\nos.remove('a.txt')": [("delete", "a.txt")],
        "import os\nos.unlink('b.txt')": [("delete", "b.txt")],
        "import shutil\nshutil.rmtree('tree')": [("delete", "tree")],
        "import os\nos.rename('c.txt', 'd.txt')": [("rename", "c.txt")],
        "import subprocess\nsubprocess.run(['true'], check=True)": [("process", "true")],
        "import os\nos.system('true')": [("process", "true")],
        "!echo hi": [("process", "echo hi")],
        "import os\nos.makedirs('out/a', exist_ok=True)": [("folder", "out"),
                                                          ("folder", "out/a")],
        "import sqlite3\nsqlite3.connect('r.db').close()": [("database", "r.db")],
        "import sqlite3\nsqlite3.connect('file:r.db?mode=ro', uri=True).close()": [],
        "import sqlite3\nsqlite3.connect(':memory:').close()": [],
    }
    for code, want in cases.items():
        assert short(effects_of(kernel, code), workspace) == want, code


def test_a_library_writing_at_import_is_not_an_effect_but_a_user_module_is(
        kernel: Kernel, workspace: Path, tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "somelib.py").write_text(f"import subprocess\nsubprocess.run(['true'])\n"
                                    f"open({str(tmp_path / 'cache.bin')!r}, 'w').close()\n")
    (workspace / "mymod.py").write_text("open('imported.txt', 'a').write('x')\n")
    assert effects_of(kernel, f"import sys\nsys.path.insert(0, {str(lib)!r})\n"
                              "import somelib") == []
    assert (tmp_path / "cache.bin").exists()
    assert short(effects_of(kernel, "import mymod"), workspace) == [("append", "imported.txt")]


def test_the_kernels_own_files_caches_temp_files_and_imports_are_not_effects(
        kernel: Kernel, workspace: Path) -> None:
    cases = [
        "import json, email.mime.text, matplotlib.pyplot as plt\nx = 1",
        "import tempfile\nwith tempfile.NamedTemporaryFile('w') as f:\n    f.write('x')\n"
        "d = tempfile.mkdtemp()\nopen(d + '/a', 'w').close()",
        "import os\nopen(os.devnull, 'w').write('x')",
        "print(_out[-1])",  # reads simagent's own records
        "open('s.txt', 'w').write('a')\nopen('s.txt').read()\nimport os\nos.remove('s.txt')",
        "import os\nos.kill(os.getpid(), 0)",
    ]
    for code in cases:
        assert effects_of(kernel, code) == [], code
    # a temp file moved into the workspace is a write of its new name
    assert short(effects_of(kernel, "import tempfile, os\nfd, p = tempfile.mkstemp(dir='.')"
                                    "\nos.write(fd, b'x'); os.close(fd)\n"
                                    "os.replace(p, 'final.bin')"), workspace) == \
        [("write", "final.bin")]


def test_the_state_card_says_what_cells_wrote_from_the_same_record(
        kernel: Kernel, workspace: Path, tmp_path: Path) -> None:
    from simagent.context.state_card import render_card
    from simagent.context.tokens import active_ruler
    from simagent.kernel import snapshot
    from simagent.trace.log import TraceLog

    assert kernel.execute("x = 1").ok
    assert kernel.execute("open('results.csv', 'a').write('1\\n')").ok
    assert kernel.execute("import pathlib\npathlib.Path('fit.json').write_text('{}')").ok
    trace = TraceLog(tmp_path / "t.sqlite")
    snap = snapshot.take(kernel, [], workspace, trace, 0.0)
    assert snap["effects"] == [
        {"n": 2, "effects": [{"kind": "append", "path": str(workspace / "results.csv")}]},
        {"n": 3, "effects": [{"kind": "write", "path": str(workspace / "fit.json"),
                              "bytes": 2}]}]
    text = render_card(snap, reason="summary", budget=2000, ruler=active_ruler())["text"]
    # the files the cells wrote are listed, each saying which cell wrote it, once
    assert "- fit.json (2 B; written by _out[3])" in text
    assert "- results.csv (2 B; appended by _out[2])" in text
    assert "effects outside the kernel" not in text


def test_a_cell_with_more_operations_than_recorded_is_marked(kernel: Kernel) -> None:
    code = (f"import os\nos.makedirs('many', exist_ok=True)\n"
            f"for i in range({fx.MAX_EVENTS + 10}):\n    open(f'many/{{i}}', 'w').close()")
    got = effects_of(kernel, code)
    assert len(got) == fx.MAX_EFFECTS and got[-1]["kind"] == "more"
    # every operation is either listed or counted: a folder and the opens
    assert got[-1]["count"] == 1 + fx.MAX_EVENTS + 10 - (fx.MAX_EFFECTS - 1)


def test_a_kernel_started_by_name_records_effects_too(session_paths: SessionPaths,
                                                      workspace: Path) -> None:
    with Kernel(session_paths, cwd=workspace, kernel_name="python3") as k:
        assert short(effects_of(k, "open('r.csv', 'a').write('1')"), workspace) == [
            ("append", "r.csv")]


def test_the_hand_over_file_is_private_and_a_key_in_a_command_is_redacted(
        session_paths: SessionPaths, workspace: Path) -> None:
    key = "kernel-only-secret-value-1234"
    with Kernel(session_paths, cwd=workspace, env={"MY_API_KEY": key}) as k:
        got = effects_of(k, "import os, subprocess\n"
                            "subprocess.run(['true', os.environ['MY_API_KEY']])")
    # simagent's own process never saw this key: only the kernel side can redact it
    assert got == [{"kind": "process", "command": "true [redacted:MY_API_KEY]"}]
    assert key not in (session_paths.outputs / "0001.json").read_text()
    rec_ = fx.Recorder(str(session_paths.root), [])
    rec_.write(1, {fx.KEY: []})
    assert (session_paths.root / fx.EFFECTS_FILE).stat().st_mode & 0o777 == 0o600


def _kill(kernel: Kernel) -> None:
    pid = kernel.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while kernel.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not kernel.is_alive()


def test_sigkill_then_restore_does_not_append_twice(kernel: Kernel, workspace: Path) -> None:
    """The acceptance case of issue 26."""
    assert kernel.execute("x = 41").ok
    cell = "with open('results.csv', 'a') as f:\n    f.write('1,2\\n')\nrows = 1"
    assert kernel.execute(cell).ok
    assert (workspace / "results.csv").read_text() == "1,2\n"
    _kill(kernel)
    r = kernel.execute("x + 1")
    assert r.ok and r.value == "42", r.notice
    assert (workspace / "results.csv").read_text() == "1,2\n"  # one line, not two
    assert "skipped _out[2] `with open('results.csv', 'a') as f:`: appends results.csv" \
        in r.notice
    assert r.state_lost  # rows is missing, and the account says so
    assert r.recovery is not None and r.recovery["replayed"] == [1]
    skipped = r.recovery["skipped"]
    assert [(s["n"], s["kind"], s["why"]) for s in skipped] == [
        (2, "effects", "appends results.csv")]
    assert skipped[0]["effects"][0]["path"] == str(workspace / "results.csv")


def test_a_cell_that_writes_and_reads_a_file_replays_and_the_file_ends_unchanged(
        kernel: Kernel, workspace: Path) -> None:
    """Whole-file writes are replayed under a backup: state from the file comes back,
    and a later append (skipped) is not lost when the replay rewrites the file."""
    write = ("import time\nopen('data.txt', 'w').write('row\\n')\n"
             "data = open('data.txt').read()\nstamp = time.time_ns()\n"
             "open('stamp.txt', 'w').write(str(stamp))")
    assert kernel.execute(write).ok
    assert kernel.execute("open('data.txt', 'a').write('more\\n')").ok
    before = {p: (workspace / p).read_bytes() for p in ("data.txt", "stamp.txt")}
    _kill(kernel)
    r = kernel.execute("data, stamp > 0")
    assert r.ok and r.value == "('row\\n', True)", r.notice
    assert r.recovery["replayed"] == [1]
    assert "skipped _out[2]" in r.notice and "appends data.txt" in r.notice
    # the replay wrote data.txt without the append and a new stamp: both put back
    assert {p: (workspace / p).read_bytes() for p in before} == before
    assert not (kernel.paths.root / "replay-backup").exists()


# --------------------------------------------------------------------------- TUI
def test_tui_restore_shows_what_a_skipped_cell_would_write_and_asks(workspace, tmp_path):
    """``/restore`` replays without the appending cell, shows what it would do, asks
    y/n: "n" leaves the file alone, "y" runs it (the person chose the second line)."""
    from test_tui_app import Driver, drive, script

    cell = "with open('results.csv', 'a') as f:\n    f.write('1,2\\n')"
    model = script(tmp_path / "s.json", [{"tool": "run_python", "args": {"code": "x = 41"}},
                                         {"tool": "run_python", "args": {"code": cell}},
                                         {"final": "done"}])
    results = workspace / "results.csv"

    def notes(d: Driver) -> list[str]:
        return [e.text for e in d.ctl.conversation.entries
                if isinstance(getattr(e, "text", None), str)]

    async def restore(d: Driver) -> None:
        asked = sum("Run them now? (y/n)" in t for t in notes(d))
        await d.type("/restore")
        await d.enter()
        await d.expect(lambda: sum("Run them now? (y/n)" in t for t in notes(d)) > asked, 120)
        await d.until(lambda: not d.ctl.busy, 60)

    async def scenario(d: Driver) -> None:
        await d.type("append a row")
        await d.enter()
        await d.idle()
        assert results.read_text() == "1,2\n"
        n = next(r["n"] for r in load_records(d.ctl.session.kernel.paths.outputs)
                 if r["code"] == cell)
        await restore(d)
        offer = next(t for t in reversed(notes(d)) if "running them again repeats" in t)
        assert f"_out[{n}] `with open('results.csv', 'a') as f:`: appends results.csv" \
            in offer
        assert any(f"skipped _out[{n}]" in t for t in notes(d))
        screen = d.text()
        assert "appends results.csv" in screen and "(y/n)" in screen
        assert results.read_text() == "1,2\n"
        await d.type("n")
        await d.enter()
        await d.expect(lambda: "not run" in d.text())
        assert results.read_text() == "1,2\n"
        await restore(d)
        assert results.read_text() == "1,2\n"
        await d.type("y")
        await d.enter()
        await d.expect(lambda: "`with open('results.csv', 'a') as f:`: ok" in d.text(), 60)
        assert results.read_text() == "1,2\n1,2\n"

    drive(workspace, scenario, model=model)


def test_the_docs_state_the_backup_limit_the_code_uses() -> None:
    import re

    page = Path(__file__).resolve().parents[1] / "docs" / "faults.md"
    text = " ".join(page.read_text().split())
    found = re.search(r"files over (\d+) MiB in all are not backed up", text)
    assert found and int(found.group(1)) == BACKUP_MAX_BYTES >> 20


def test_a_backup_that_cannot_be_put_back_is_kept_and_blocks_rewrites(
        kernel: Kernel, workspace: Path) -> None:
    """A killed replay's backup that cannot be restored is never overwritten by the next
    replay's: the cells that would rewrite files are listed instead, and the account
    says loudly which files were not put back."""
    assert kernel.execute("open('data.txt', 'w').write('a')\nx = 1").ok
    (workspace / "blocker").write_text("a file where a folder should be")
    spare = kernel.paths.root / "replay-backup"
    spare.mkdir()
    (spare / "0000").write_text("saved")
    (spare / backup.MANIFEST).write_text(json.dumps({str(workspace / "blocker" / "f"): "0000"}))
    _kill(kernel)
    r = kernel.execute("1 + 1")
    assert r.ok and r.recovery is not None
    assert "files a replay rewrote COULD NOT be put back (their copies stay in the " \
        f"session's replay-backup folder): {workspace / 'blocker' / 'f'} (" in r.notice
    assert r.recovery["replayed"] == []
    assert [(s["n"], s["kind"]) for s in r.recovery["skipped"]] == [(1, "effects")]
    assert "earlier replay's backup of 1 file(s) could not be put back" in \
        r.recovery["skipped"][0]["why"]
    assert (spare / "0000").read_text() == "saved" and (spare / backup.MANIFEST).exists()
