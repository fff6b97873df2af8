"""State card updates (``context/card_updates.py``): a clearing epoch whose kernel did
not restart sends what changed, after the newest result it cleared, and the card before
it stays byte for byte (issue 31 §2). Pure parts here; the real graph and kernel in
``tests/test_state_card.py``."""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from simagent.context import card_updates as cu
from simagent.context.counting import is_state_card
from simagent.context.prefix import pin_index
from simagent.context.state_card import card_parts, render_card, with_card


class Chars:
    def count(self, text: str) -> int:
        return len(text)


def call(cid: str, *ids: str) -> AIMessage:
    return AIMessage("", id=f"ai-{cid}", tool_calls=[
        {"name": "run_python", "args": {"code": "x"}, "id": i, "type": "tool_call"}
        for i in (ids or (cid,))])


def res(cid: str, text: str = "out") -> ToolMessage:
    return ToolMessage(text, tool_call_id=cid, id=f"t-{cid}")


THREAD = [HumanMessage("go", id="q"), call("a", "a", "b"), res("a"), res("b"),
          call("c"), res("c"), call("d"), res("d")]


def test_a_clearing_card_goes_after_the_group_of_the_newest_cleared_result():
    assert cu.anchor_after_cleared(THREAD, {"a"}) == "t-b"  # not between a and b
    assert cu.anchor_after_cleared(THREAD, {"a", "b", "c"}) == "t-c"
    assert cu.anchor_after_cleared(THREAD, set()) is None
    assert cu.anchor_newest(THREAD) == "t-d"
    assert cu.anchor_newest([*THREAD, HumanMessage("next", id="q2")]) == "t-d"
    assert cu.anchor_newest([]) is None


def snapshot(names: dict[str, str], gen: int = 1, execs: int = 5, files=(), figures=(),
             imports=("np=numpy",)) -> dict:
    return {"kernel": {"status": "idle", "generation": gen, "executions": execs},
            "probe": {"names": [{"name": n, "type": "int", "desc": d}
                                for n, d in names.items()],
                      "imports": list(imports), "functions": []},
            "figures": [{"id": f} for f in figures],
            "files": [{"path": p, "bytes": 10} for p in files], "base": "/w"}


def full(snap: dict, previous: dict | None = None, budget: int = 10_000) -> dict:
    return render_card(snap, reason="clear", budget=budget, previous=previous, ruler=Chars())


def test_an_update_says_only_what_changed():
    told = full(snapshot({"a": "= 1", "b": "= 2"}, files=["x.csv"]))["state"]
    now = full(snapshot({"a": "= 1", "c": "= 3"}, execs=9, files=["x.csv", "y.csv"],
                        figures=["fig-1"], imports=("np=numpy", "pd=pandas")))
    diff = cu.changes(told, now["state"], now["names"])
    text = cu.render_update(diff, "clear")
    assert text.splitlines() == [
        '<kernel_state_update after="clear">',
        "Read from the live kernel just now: what changed since the kernel state above; "
        "the rest of it still holds.",
        "kernel: idle, 9 executions so far",
        "new or changed names:", "- c = 3 (int)",
        "names gone: b",
        "imports added: pd=pandas",
        "figures added:", "- fig-1",
        "files written, new or changed:", "- y.csv (10 B)",
        "</kernel_state_update>"]
    same = cu.changes(now["state"], now["state"], now["names"])
    assert cu.render_update(same, "clear").splitlines()[3] == "nothing else changed."
    # a name the full card left out for room is not gone (it is still in the kernel),
    # and the update says it was not re-read rather than that it still holds
    room = cu.changes({"names": {"a": "- a = 1 (int)"}}, {"names": {}, "kernel": "k"}, ["a"])
    assert room["gone"] == [] and room["unread"] == ["a"]
    assert "not re-read for room (may have changed): a" in cu.render_update(room, "clear")
    told = cu.merged({"names": {"a": "- a = 1 (int)"}}, {"names": {}})
    assert told["names"] == {}  # said once: the next update does not repeat it
    assert cu.changes(told, {"names": {}}, ["a"])["unread"] == []
    # a function deleted since is gone, and the merged state forgets it
    dropped = cu.changes({"functions": ["f", "g"]}, {"functions": ["g"]}, [])
    assert dropped["gone"] == ["f"]
    assert cu.merged({"functions": ["f", "g"]}, {"functions": ["g"]})["functions"] == ["g"]


def test_next_card_appends_updates_and_a_restart_or_summary_sends_a_full_card():
    first = cu.next_card(full(snapshot({"a": "= 1"})), None, reason="clear",
                         anchor="t-a", updates=True, ruler=Chars())
    assert [p["after_id"] for p in first["parts"]] == ["t-a"] and not first["update"]
    assert first["parts"][0]["text"] == first["text"] and first["n"] == 1
    second = cu.next_card(full(snapshot({"a": "= 2"}, execs=7), first), first,
                          reason="clear", anchor="t-c", updates=True, ruler=Chars())
    assert second["update"] and second["n"] == 2
    assert second["parts"][0] == first["parts"][0]  # the card itself is untouched
    assert second["parts"][1]["after_id"] == "t-c"
    assert "- a = 2 (int)" in second["parts"][1]["text"]
    assert second["tokens"] == len(second["parts"][1]["text"])  # what this epoch added
    assert second["told"]["names"] == {"a": "- a = 2 (int)"}
    assert second["update_tokens"] == second["tokens"]
    third = cu.next_card(full(snapshot({"a": "= 2"}, execs=8), second), second,
                         reason="clear", anchor="t-d", updates=True, ruler=Chars())
    assert len(third["parts"]) == 3 and "a = 2" not in third["parts"][2]["text"]
    for reason in ("summary", "emergency", "compact", "checkpoint"):
        again = cu.next_card(full(snapshot({"a": "= 2"})), second, reason=reason,
                             anchor="t-d", updates=True, ruler=Chars())
        assert not again["update"] and len(again["parts"]) == 1
    restarted = full(snapshot({}, gen=2), second)
    assert restarted["restarted"]
    after = cu.next_card(restarted, second, reason="clear", anchor="t-d",
                         updates=True, ruler=Chars())
    assert not after["update"] and "RESTARTED" in after["parts"][0]["text"]
    off = cu.next_card(full(snapshot({"a": "= 2"}, execs=7), first), first,
                       reason="clear", anchor="t-c", updates=False, ruler=Chars())
    assert not off["update"] and len(off["parts"]) == 1
    assert off["parts"][0]["after_id"] == "t-c"


def test_every_part_is_placed_after_its_message_in_order():
    card = {"text": "C", "parts": [{"text": "C", "after_id": "t-b", "id": "card-1"},
                                   {"text": "U1", "after_id": "t-c", "id": "card-2"},
                                   {"text": "U2", "after_id": "t-c", "id": "card-3"},
                                   {"text": "U3", "after_id": "gone", "id": "card-4"}]}
    view = with_card(THREAD, card, boundary=True)
    assert [m.id for m in view] == ["q", "card-4", "ai-a", "t-a", "t-b", "card-1", "ai-c",
                                    "t-c", "card-2", "card-3", "ai-d", "t-d"]
    assert all(is_state_card(m) for m in view if m.id.startswith("card"))
    again = with_card(view, card, boundary=True)  # the old parts are replaced, not doubled
    assert [m.id for m in again] == [m.id for m in view]
    assert card_parts({"text": "T", "n": 3, "after_id": "q"}) == [
        {"text": "T", "after_id": "q", "id": "simagent-state-card-3"}]


def test_the_cache_pin_reaches_over_the_card_after_the_newest_old_placeholder():
    placeholder = res("a", "[result cleared; full output: _out[1]]")
    placeholder.response_metadata = {"context_editing": {"cleared": True}}
    cleared = [SystemMessage("s"), HumanMessage("go", id="q"), call("a"), placeholder,
               call("c"), res("c")]
    card = {"parts": [{"text": "C", "after_id": "t-a", "id": "card-1"}]}
    view = with_card(cleared, card, boundary=False)
    assert pin_index(view, {"a"}) == 4 and view[4].id == "card-1"
    assert pin_index(cleared, {"a"}) == 3  # no card: the placeholder itself
