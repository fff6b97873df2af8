"""The state card's renderer (``context/state_card.py``), output pinned exactly: what
mutation testing showed the behavioural tests let change unseen (sizes, list clipping,
each restart wording, budget trimming order). Expected texts follow the docstrings."""

from __future__ import annotations

from simagent.context import state_card as sc


class Chars:
    """A ruler of one token per character: budgets become exact character counts."""

    def count(self, text: str) -> int:
        return len(text)


def test_sizes_and_clipped_lists():
    assert [sc._size(n) for n in (0, None, 1023, 1024, 1536, 1 << 20, 3 << 30)] == [
        "0 B", "0 B", "1023 B", "1.0 kB", "1.5 kB", "1.0 MB", "3.0 GB"]
    assert sc._joined(["a", "b"]) == "a, b"
    assert sc._joined(["aaaa", "bbbb", "cccc"], limit=6) == "aaaa, … (+2 more)"
    assert sc._joined(["aaaa", "bbbb", "cccc"], limit=10) == "aaaa, bbbb, … (+1 more)"
    assert sc._joined(["a" * 20], limit=5) == "a" * 20  # the first always shows
    assert sc._joined(["x", "y"], sep="; ") == "x; y"
    assert sc._joined(["aaaa", "bbbb"], limit=4, sep="; ") == "aaaa; … (+1 more)"


def test_name_lines():
    assert sc.name_line({"name": "n", "type": "int", "desc": "= 3"}) == "- n = 3 (int)"
    assert sc.name_line({"name": "df", "type": "DataFrame", "desc": "(2, 3)",
                         "bytes": 2048}) == "- df: DataFrame (2, 3), 2.0 kB"
    assert sc.name_line({"name": "s", "type": "Sol", "registry": "pybamm",
                         "fields": [("t", 1), ("v", "x")], "bytes": 1023}) == \
        "- s: Sol [pybamm] — t=1; v=x"
    assert sc.name_line({"name": "q"}) == "- q: ?"


def snap(gen: int = 1, names=("a", "b"), **kernel) -> dict:
    return {"kernel": {"status": "idle", "generation": gen, "executions": 5, **kernel},
            "probe": {"names": [{"name": n, "type": "int", "desc": "= 1"} for n in names]}}


def test_kernel_lines_for_each_restart_story():
    line, restarted, lost = sc._kernel_line(snap(), None)
    assert (line, restarted, lost) == ("kernel: idle, 5 executions so far", False, [])
    assert sc._kernel_line({}, None)[0] == "kernel: unknown, 0 executions so far"
    prev = {"generation": 1, "names": ["a", "b", "c"]}
    line, restarted, lost = sc._kernel_line(snap(2, ("a",)), prev)
    assert restarted and lost == ["b", "c"]
    assert line.endswith("THE KERNEL WAS RESTARTED since the last card: state from before "
                         "is gone; lost: b, c. Re-run the cells that defined what you "
                         "still need.")
    line, _, lost = sc._kernel_line(snap(2, ("a",), replayed={"cells": 3}), prev)
    assert line.endswith("THE KERNEL WAS RESTARTED since the last card; 3 cells were "
                         "replayed but these names are gone: b, c. Re-run the cells that "
                         "defined what you still need.")
    line, _, lost = sc._kernel_line(snap(2, ("a", "b", "c"), replayed={"cells": 3}), prev)
    assert lost == [] and line.endswith("The kernel was restarted since the last card and "
                                        "its state was replayed (3 cells): every listed "
                                        "name is back.")
    line, restarted, _ = sc._kernel_line(snap(2, ("a", "b", "c")), prev)
    assert restarted and "lost: none of the listed names." in line
    assert not sc._kernel_line(snap(1), prev)[1]  # same generation
    assert not sc._kernel_line(snap(2), {"generation": 0, "names": ["x"]})[1]
    assert sc._kernel_line(snap(3), None)[0].endswith(
        "; it was restarted 2 time(s) this session, so names defined before the last "
        "restart are gone")
    assert sc._kernel_line(snap(2, replayed={"restored": True}), None)[0].endswith(
        "; it was restarted 1 time(s) this session and its state was replayed after the "
        "last restart")


def full_snapshot() -> dict:
    s = snap(names=())
    s["probe"] = {"names": [
        {"name": "big", "type": "ndarray", "desc": "(100,)", "bytes": 800},
        {"name": "sol", "type": "Solution", "registry": "pybamm"},
        {"name": "small", "type": "int", "desc": "= 2"}],
        "imports": ["numpy", "pybamm"], "functions": ["f"], "more_names": 1}
    s["figures"] = [{"id": "fig1", "title": "V(t)", "path": "artifacts/1.png"},
                    {"id": "fig2", "path": "artifacts/2.png"}]
    s["files"] = [{"path": "out.csv", "bytes": 2048}, {"path": "b.txt", "bytes": 3}]
    return s


def test_render_card_lists_everything_in_order():
    card = sc.render_card(full_snapshot(), reason="summary", budget=10_000, ruler=Chars())
    assert card["text"].splitlines() == [
        '<kernel_state after="summary">',
        "Read from the live kernel just now (exact, not remembered); names, types and shapes "
        "below exist in the kernel as listed.",
        "kernel: idle, 5 executions so far",
        "names (3 of 4, largest first; the smaller ones are not shown):",
        "- sol: Solution [pybamm]",
        "- big: ndarray (100,)",
        "- small = 2 (int)",
        "imports: numpy, pybamm",
        "functions/classes: f",
        "figures (2):",
        '- fig1 "V(t)"',
        "- fig2",
        "files written in the workspace this session (2):",
        "- out.csv (2.0 kB)",
        "- b.txt (3 B)",
        "Earlier outputs stay queryable in the kernel: _out[n].tail(k), _out[n].grep(pattern),"
        " _out[n].code.",
        "</kernel_state>"]
    assert card["tokens"] == len(card["text"])
    assert card["names"] == ["sol", "big", "small"] and card["shown"] == 3
    assert (card["reason"], card["generation"], card["restarted"], card["lost"]) == (
        "summary", 1, False, [])


def test_render_card_trims_names_then_files_then_figures():
    full = sc.render_card(full_snapshot(), reason="clear", budget=10_000, ruler=Chars())
    size = full["tokens"]
    one_less = sc.render_card(full_snapshot(), reason="clear", budget=size - 1, ruler=Chars())
    assert one_less["shown"] == 2 and "- small = 2 (int)" not in one_less["text"]
    assert one_less["tokens"] <= size - 1 and "- b.txt (3 B)" in one_less["text"]
    tiny = sc.render_card(full_snapshot(), reason="clear", budget=10, ruler=Chars())
    assert tiny["shown"] == 0
    assert "files written in the workspace this session (2, 0 shown):" in tiny["text"]
    assert "figures (2, newest 0 shown):" in tiny["text"]
    assert "fig1" not in tiny["text"] and "out.csv" not in tiny["text"]
    # between: every name gone, then the files, the figures last
    same = sc.render_card(full_snapshot(), reason="clear", budget=size, ruler=Chars())
    assert same["text"] == full["text"]
    names = ("- sol: Solution [pybamm]", "- big: ndarray (100,)", "- small = 2 (int)")
    no_names = size - sum(len(x) + 1 for x in names)  # the header keeps its length
    files_go = sc.render_card(full_snapshot(), reason="clear", budget=no_names - 1,
                              ruler=Chars())
    assert files_go["shown"] == 0 and "b.txt" not in files_go["text"]  # the older one
    assert "(2, 1 shown):\n- out.csv (2.0 kB)\n" in files_go["text"]  # the files' header
    assert '\n- fig1 "V(t)"\n' in files_go["text"]  # figures go last
    assert "\n- fig2\n" in files_go["text"]
    fits = sc.render_card(full_snapshot(), reason="clear", budget=no_names, ruler=Chars())
    assert fits["shown"] == 0 and fits["tokens"] == no_names and "b.txt" in fits["text"]


def test_render_card_with_nothing_or_an_unreadable_kernel():
    empty = sc.render_card({"kernel": {}, "probe": {}}, reason="compact", budget=999,
                           ruler=Chars())
    assert "names: none defined" in empty["text"] and empty["generation"] == 0
    broken = sc.render_card({"probe": {"error": "busy"}}, reason="compact", budget=999,
                            ruler=Chars())
    assert "(the kernel could not be read: busy)" in broken["text"]
    assert "names" not in broken["text"].split("\n", 3)[3].split("Earlier")[0]


def test_figure_lines_effects_and_the_message():
    # the id is what view_figure takes; the path only stands in for a missing id
    assert sc._figure_line({"id": "f", "title": "", "path": "p.png"}) == "- f"
    assert sc._figure_line({"title": "", "path": "p.png"}) == "- p.png"
    assert sc._figure_line({}) == "- "
    assert sc.effects_line([]) == ""
    assert sc.effects_line([{"n": 1, "effects": []}]) == ""
    msg = sc.card_message(sc.card_parts({"text": "T", "n": 4})[0])
    assert (msg.content, msg.id) == ("T", "simagent-state-card-4")
    assert msg.additional_kwargs == {"lc_source": sc.STATE_CARD_SOURCE}
    assert sc.card_message({"text": "T"}).id == "simagent-state-card-0"


def test_card_event_payload():
    card = {"reason": "summary", "tokens": 120, "names": ["a", "b", "c"], "shown": 2,
            "generation": 3, "restarted": True, "lost": [f"n{i}" for i in range(50)]}
    assert sc.card_event(card, "main") == {
        "reason": "summary", "tokens": 120, "names": 3, "shown": 2, "generation": 3,
        "restarted": True, "lost": [f"n{i}" for i in range(40)], "agent": "main",
        "update": False}
    del card["shown"]
    assert sc.card_event(card, "sub")["shown"] == 0
    assert sc.card_event({**card, "update": True}, "main")["update"] is True


def test_with_card_places_it_after_its_message_or_the_boundary():
    from langchain_core.messages import AIMessage, HumanMessage

    view = [HumanMessage("s", id="s"), AIMessage("a", id="a"), HumanMessage("q", id="q")]
    card = {"text": "CARD", "n": 1, "after_id": "a"}
    assert [m.id for m in sc.with_card(view, card, boundary=False)] == [
        "s", "a", "simagent-state-card-1", "q"]
    gone = {**card, "after_id": "behind"}
    assert [m.id for m in sc.with_card(view, gone, boundary=True)] == [
        "s", "simagent-state-card-1", "a", "q"]
    assert [m.id for m in sc.with_card(view, gone, boundary=False)] == [
        "simagent-state-card-1", "s", "a", "q"]
    assert [m.id for m in sc.with_card([], gone, boundary=True)] == ["simagent-state-card-1"]
    assert sc.with_card(view, {"text": ""}, boundary=True) == view
    old = sc.with_card(view, card, boundary=False)
    again = sc.with_card(old, {**card, "n": 2, "text": "NEW"}, boundary=False)
    assert [m.content for m in again] == ["s", "a", "NEW", "q"]  # the old card goes
    no_ids = [HumanMessage("x"), AIMessage("y")]
    assert [m.content for m in sc.with_card(no_ids, {**card, "after_id": None},
                                            boundary=True)] == ["x", "CARD", "y"]


def test_a_file_a_cell_wrote_says_so_on_its_line_and_not_again_in_the_effects():
    """The files list and the effects line named the same writes twice; a listed file's
    line now names the cells that wrote it, and the effects line keeps the rest."""
    snap = full_snapshot()
    snap["base"] = "/w"
    snap["effects"] = [
        {"n": 2, "effects": [{"kind": "folder", "path": "/w/logs"},
                             {"kind": "write", "path": "/w/out.csv"}]},
        {"n": 4, "effects": [{"kind": "append", "path": "/w/out.csv"},
                             {"kind": "write", "path": "/w/gone.txt"}]}]
    text = sc.render_card(snap, reason="clear", budget=10_000, ruler=Chars())["text"]
    assert "- out.csv (2.0 kB; appended by _out[4]; written by _out[2])" in text
    assert "- b.txt (3 B)" in text
    assert ("cells' effects outside the kernel (newest first): _out[4] wrote gone.txt; "
            "_out[2] created folder logs") in text
    assert text.count("out.csv") == 1
    # a file trimmed from the list keeps its writes in the effects line
    tiny = sc.render_card(snap, reason="clear", budget=10, ruler=Chars())["text"]
    assert "_out[4] appended out.csv, wrote gone.txt" in tiny


def test_numbered_files_are_one_line_and_their_writes_are_said_there():
    """A sweep's files (one per case) are one line with the pattern, count, total size,
    first and last names and the cells that wrote them; the effects line drops those
    writes, and two files of one pattern stay listed by name."""
    snap = full_snapshot()
    snap["base"] = "/w"
    logs = [f"logs/newton_{x:.2f}.log" for x in (3.6, 3.5, 0.1, 1.0, 0.9)]
    snap["files"] = ([{"path": p, "bytes": 1024} for p in logs[:2]]
                     + [{"path": "fit.json", "bytes": 2}]
                     + [{"path": p, "bytes": 1024} for p in logs[2:]]
                     + [{"path": "a_1.csv", "bytes": 5}, {"path": "a_2.csv", "bytes": 5}])
    snap["effects"] = [{"n": n, "effects": [{"kind": "write", "path": f"/w/{p}"}]}
                       for n, p in zip((3, 5, 6, 7, 8), reversed(logs), strict=True)]
    snap["effects"].append({"n": 9, "effects": [{"kind": "write", "path": "/w/fit.json"},
                                                {"kind": "delete", "path": "/w/tmp.txt"}]})
    text = sc.render_card(snap, reason="clear", budget=10_000, ruler=Chars())["text"]
    files = text.split("this session (8):\n")[1].split("\ncells'")[0].splitlines()
    assert files == [
        "- logs/newton_*.log (5 files, 5.0 kB: newton_0.10.log … newton_3.60.log; "
        "written by _out[3]…_out[8])",
        "- fit.json (2 B; written by _out[9])",
        "- a_1.csv (5 B)", "- a_2.csv (5 B)"]
    assert "cells' effects outside the kernel (newest first): _out[9] deleted tmp.txt" in text
    assert "newton_1.00" not in text
    # trimmed away, the group's writes go back to the effects line
    tiny = sc.render_card(snap, reason="clear", budget=10, ruler=Chars())["text"]
    assert "this session (8, 0 shown):" in tiny
    assert "_out[8] wrote logs/newton_3.60.log; _out[7] wrote logs/newton_3.50.log" in tiny


def test_file_groups_pure_parts():
    from simagent.context import file_groups as fg

    assert fg.pattern_of("runs/7/case_017.csv") == "runs/7/case_*.csv"
    assert fg.pattern_of("T_3.50_P_10.out") == "T_*_P_*.out"
    assert fg.pattern_of("notes.txt") == "notes.txt"
    assert sorted(["c_10", "c_2", "c_1.5"], key=fg.natural_key) == ["c_1.5", "c_2", "c_10"]
    assert fg.cells_phrase([5, 3, 5]) == "_out[3], _out[5]"
    assert fg.cells_phrase([4, 9, 6, 14]) == "_out[4]…_out[14]"
    items = fg.group_files([{"path": f"r{i}.txt", "bytes": i} for i in (3, 1)]
                           + [{"path": "x.txt"}, {"path": "r2.txt", "bytes": 2}])
    assert [(i.paths, i.bytes, i.pattern) for i in items] == [
        (("r3.txt", "r1.txt", "r2.txt"), 6, "r*.txt"), (("x.txt",), 0, None)]
    assert items[0].ends == ("r1.txt", "r3.txt")
    assert len(fg.group_files([{"path": "r1.txt"}, {"path": "r2.txt"}])) == 2
