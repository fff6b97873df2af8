"""Replay selection (``kernel/replay.py``): which cells a restart re-runs, pinned on
records written by hand. Mutation testing showed the kernel-driven tests leave most of
these rules (display-only detection, budgets, lineages, the reasons given) unchecked."""

from __future__ import annotations

import json

import pytest

from simagent.kernel import replay as rp


@pytest.mark.parametrize("code", [
    "print(x)", "x", "len(a) == 3", "'a' in dir()", "plt.plot(t, np.sin(t))",
    "ax.set_title('t')", "df.head()", "sns.lineplot(x=1)", "display(df)", "pass",
    "%who", "!ls", "%timeit f()", "fig.savefig('a.png')", "print(x)\nplt.show()", "",
    "IPython.display.display(1)", "sorted(d)[:3]", "print(f())", "[x for x in y]",
])
def test_display_only_cells_define_no_state(code):
    assert not rp.defines_state(code)


@pytest.mark.parametrize("code", [
    "x = 1", "import numpy", "def f(): pass", "a.append(1)", "f()", "np.save('a', x)",
    "print(y := 3)", "%run script.py", "%cd /tmp", "%%writefile a.py\nx", "del x",
    "for i in range(3): pass", "x += 1", "plt.plot(t)\nx = 2", "get_ipython().foo()",
    "obj.method()", "(await g())", "def broken(:", "x + f()",
])
def test_cells_that_may_define_state(code):
    assert rp.defines_state(code)


def test_call_and_magic_names():
    import ast

    def call(src):
        return ast.parse(src).body[0].value

    assert rp._call_name(call("plt.gca().plot(1)")) == ("plt", "plot")
    assert rp._call_name(call("f(1)")) == ("f", "f")
    assert rp._call_name(call("a[0].b()")) == ("a", "b")
    assert rp._call_name(call("(lambda: 1)()")) == (None, None)
    assert rp._magic_name(call("get_ipython().run_line_magic('who', '')")) == "who"
    assert rp._magic_name(call("get_ipython().system('ls')")) == "system"
    assert rp._magic_name(call("get_ipython().getoutput('ls')")) == "system"
    assert rp._magic_name(call("get_ipython().run_cell_magic('x', '', '')")) == \
        "run_cell_magic"
    assert rp._magic_name(call("get_ipython().run_line_magic(name, '')")) == \
        "run_line_magic"
    assert rp._magic_name(call("other().run_line_magic('who', '')")) is None
    assert rp._magic_name(call("f()")) is None


def test_first_line():
    assert rp.first_line("\n\n  x = 1  \ny") == "x = 1"
    assert rp.first_line("") == ""
    assert rp.first_line("a" * 60) == "a" * 60
    assert rp.first_line("a" * 61) == "a" * 59 + "…"
    assert rp.first_line("abcdef", limit=4) == "abc…"


def rec(n, code="x = 1", status="ok", s=0.1, lineage=1, **kw):
    return {"n": n, "code": code, "status": status, "elapsed_s": s, "lineage": lineage, **kw}


def test_select_keeps_order_and_gives_each_reason():
    records = [rec(4, "print(x)"), rec(1, "a = 1"), rec(3, "b = 2", status="error"),
               rec(2, "c = 3", s=61), rec(5, "d = 4", secret=True), rec(6, "e = 5"),
               {"n": "x"}, rec(0, "f = 6", lineage=0)]
    plan = rp.select(records)
    assert [(c.n, c.code, c.seconds) for c in plan.run] == [(1, "a = 1", 0.1),
                                                            (6, "e = 5", 0.1)]
    assert [(s.n, s.kind, s.why) for s in plan.skipped] == [
        (2, "too-slow", "it took 61.0 s, over the 60 s per-cell replay limit"),
        (3, "failed", "it ended error"),
        (4, "display", "it only showed output"),
        (5, "secret", "it held a secret, which is not kept on disk")]
    assert [s.n for s in plan.listed] == [2, 5]
    assert plan.seconds == pytest.approx(0.2)
    assert plan.skipped[0].to_dict() == {"n": 2, "line": "c = 3", "seconds": 61.0,
                                         "kind": "too-slow", "why": plan.skipped[0].why}


def test_select_budgets_and_lineages():
    budget = rp.ReplayBudget(cell_s=5, total_s=10)
    records = [rec(1, s=4), rec(2, s=5), rec(3, s=5.01), rec(4, s=1), rec(5, s=0.5),
               rec(6, s=0)]
    plan = rp.select(records, budget)
    assert [c.n for c in plan.run] == [1, 2, 4]  # 4 + 5 + 1 = 10: exactly the budget
    assert [(s.n, s.kind) for s in plan.skipped] == [(3, "too-slow"), (5, "over-budget"),
                                                     (6, "over-budget")]  # then it stops
    assert plan.skipped[1].why == "replaying it would pass the 10 s total replay budget"
    exact = rp.select([rec(1, s=5), rec(2, s=5)], budget)
    assert [c.n for c in exact.run] == [1, 2]  # exactly the budget fits
    off = rp.select([rec(1)], rp.ReplayBudget(enabled=False))
    assert off.run == [] and [(s.kind, s.why) for s in off.skipped] == [
        ("off", "replay is off in config")]
    mixed = [rec(1, lineage=1), rec(2, lineage=2), rec(3, lineage=2)]
    assert [c.n for c in rp.select(mixed).run] == [2, 3]  # the last record's lineage
    assert [c.n for c in rp.select(mixed, lineage=1).run] == [1]
    assert rp.select([rec(1, lineage=None)]).run == []
    assert rp.select([]).run == []


def test_records_on_disk_and_the_lineage(tmp_path):
    out = tmp_path / "outputs"
    out.mkdir()
    for n in (2, 10, 1):
        (out / f"{n:04d}.json").write_text(json.dumps(rec(n, lineage=n)))
    (out / "0011.json").write_text("{torn")
    (out / "0012.json").write_text(json.dumps({"n": "x"}))
    (out / "notes.json").write_text("{}")
    assert [r["n"] for r in rp.load_records(out)] == [1, 2, 10]
    assert rp.read_lineage(tmp_path, out) == 10  # the newest readable record's
    rp.save_lineage(tmp_path, 12)
    assert (tmp_path / rp.LINEAGE_FILE).read_text() == "12\n"
    assert rp.read_lineage(tmp_path, out) == 12
    rp.save_lineage(tmp_path, 3)
    assert rp.read_lineage(tmp_path, out) == 10  # whichever is higher
    (tmp_path / rp.LINEAGE_FILE).write_text("junk")
    assert rp.read_lineage(tmp_path, out) == 10
    empty = tmp_path / "none"
    empty.mkdir()
    assert rp.read_lineage(tmp_path / "x", empty) == 1


def test_budget_from_config():
    assert rp.budget_from({}) == rp.ReplayBudget()
    b = rp.budget_from({"replay": False, "replay_cell_s": 2, "replay_total_s": 7.5})
    assert (b.enabled, b.cell_s, b.total_s) == (False, 2.0, 7.5)


MIB = 1 << 20


def test_select_leaves_out_cells_that_acted_outside_the_kernel():
    append = {"kind": "append", "path": "/w/results.csv"}
    records = [rec(1, "a = 1", effects=[append, {"kind": "write", "path": "/w/x"}]),
               rec(2, "b = 2", effects=[{"kind": "process", "command": "sim"}]),
               rec(3, "c = 3", effects=["junk"])]
    plan = rp.select(records, base="/w")
    assert [c.n for c in plan.run] == [3]  # a non-dict effect is no effect
    first, second = plan.skipped
    assert (first.n, first.kind, first.why, first.effects) == (
        1, "effects", "appends results.csv", (append,))
    assert (second.kind, second.why) == ("effects", "runs `sim`")
    assert first.to_dict() == {"n": 1, "line": "a = 1", "seconds": 0.1, "kind": "effects",
                               "why": "appends results.csv", "effects": [append]}
    assert "effects" not in rp.select([rec(1, status="error")]).skipped[0].to_dict()
    assert rp.Skip(1, "l", 0.12345, "display", "w").to_dict()["seconds"] == 0.123


def test_select_backs_up_rewritten_files_within_its_limit():
    w = lambda p: {"kind": "write", "path": p}  # noqa: E731
    folder = {"kind": "folder", "path": "/w/out"}
    records = [rec(1, "a = 1", effects=[w("/w/a"), folder, w("/w/a")]),
               rec(2, "b = 2", effects=[w("/w/a")]),  # already backed up: costs nothing
               rec(3, "c = 3", effects=[w("/w/big")]),
               rec(4, "d = 4", effects=[w("/w/new")]),  # absent now (None): nothing to keep
               rec(5, "e = 5", effects=[w("/w/unknown")])]  # size unknown: too big
    sizes = {"/w/a": 100 * MIB, "/w/big": 157 * MIB, "/w/new": None}
    plan = rp.select(records, sizes=sizes, base="/w")
    assert [(c.n, c.writes) for c in plan.run] == [(1, ("/w/out", "/w/a")), (2, ("/w/a",)),
                                                   (4, ("/w/new",))]
    assert plan.writes == ["/w/out", "/w/a", "/w/new"]
    big, unknown = plan.skipped
    assert (big.n, big.kind) == (3, "effects")
    assert big.why == "writes big, more than the 256 MiB a replay backs up"
    assert big.effects == ({"kind": "write", "path": "/w/big"},)
    assert (unknown.n, unknown.why) == (5, "writes unknown, more than the 256 MiB a replay "
                                           "backs up")
    fits = rp.select([rec(1, effects=[w("/w/a")]), rec(2, effects=[w("/w/b")])],
                     sizes={"/w/a": 100 * MIB, "/w/b": 156 * MIB})
    assert [c.n for c in fits.run] == [1, 2]  # exactly 256 MiB


@pytest.mark.parametrize("bad, key", [
    ({"replay_cell_s": -1}, "replay_cell_s"), ({"replay_total_s": True}, "replay_total_s"),
    ({"replay_cell_s": "5"}, "replay_cell_s")])
def test_budget_from_rejects_bad_seconds(bad, key):
    with pytest.raises(ValueError) as err:
        rp.budget_from(bad)
    assert str(err.value) == f"[kernel] {key} must be a number of seconds >= 0"


def test_budget_from_rejects_a_non_boolean_switch():
    with pytest.raises(ValueError) as err:
        rp.budget_from({"replay": "yes"})
    assert str(err.value) == "[kernel] replay must be true or false"
    assert rp.budget_from({"replay_cell_s": 0, "replay": True}) == rp.ReplayBudget(
        cell_s=0.0, enabled=True)
