"""``presentation/footnotes``: an answer's numbers drawn with their sources (pure). The
statuses are the provenance engine's; these tests check where the markers go and what the
sources block says, over the formats answers use."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from simagent.context.provenance.engine import Source, trace
from simagent.presentation.footnotes import (
    UNSOURCED,
    final_numbers,
    footnote,
    superscript,
    turn_answers,
)

OUT = Source("output", "k_fit = 0.31647\ntau_ms = 2.6753\nT range 300 400\nE = 2.51 +- 0.12\n"
             "yield 0.125", 3)
ASKED = Source("input", "fit the 250 points", label="message 1")


def _footnoted(answer: str, marker=None):
    prov = trace(answer, [OUT, ASKED])
    return footnote(answer, prov) if marker is None else footnote(answer, prov, marker)


def test_each_sourced_number_gets_its_cells_footnote_and_the_block_names_the_line():
    f = _footnoted("k is 0.316 and tau is 2.68 ms.")
    assert f.text == "k is 0.316[1] and tau is 2.68 ms[2]."
    assert f.block() == ["[1] cell 3, output line 1: k_fit = 0.31647",
                         "[2] cell 3, output line 2: tau_ms = 2.6753"]
    assert [n.anchor for n in f.notes] == ["cell-3", "cell-3"]
    assert f.statuses == ("sourced", "sourced")


def test_a_table_cell_a_range_a_plus_minus_and_a_percentage_each_get_a_marker():
    f = _footnoted("| run | k |\n|---|---|\n| a | 0.316 |\n\nT from 300–400 K; "
                   "E = 2.51 ± 0.12 eV; a yield of 12.5%.")
    assert "| a | 0.316[1] |" in f.text
    assert "300[2]–400 K[2]" in f.text  # both ends of the range, one line printed both
    assert "2.51[3] ± 0.12 eV[3]" in f.text
    assert "12.5%[4]" in f.text
    assert f.statuses == ("sourced",) * 6


def test_the_same_value_cited_twice_is_one_footnote():
    f = _footnoted("k = 0.316; again, k = 0.3165.")
    assert f.text.count("[1]") == 2 and len(f.notes) == 1


def test_derived_names_its_operands_footnotes_in_the_order_that_gives_it():
    f = _footnoted("k is 0.316 and tau 2.68, so tau - k = 2.36 and tau/k = 8.45.")
    assert f.text.endswith("2.36[3] and tau/k = 8.45[4].")
    assert f.block()[2:] == ["[3] = [2] - [1] (difference)", "[4] = [2] / [1] (ratio)"]
    assert f.statuses == ("sourced", "sourced", "derived", "derived")


def test_input_is_from_your_message_and_unsourced_is_marked_and_said_once():
    f = _footnoted("Of the 250 points, R0 is 3.9 and Q is 7.77.")
    assert f.text == f"Of the 250[1] points, R0 is 3.9{UNSOURCED} and Q is 7.77{UNSOURCED}."
    assert f.block() == ["[1] from your message: fit the 250 points",
                         f"{UNSOURCED} no cell printed this number and it is no simple "
                         "operation on numbers that were printed: unsourced"]
    assert f.statuses == ("input", "unsourced", "unsourced")
    assert f.notes[0].anchor is None


def test_ignored_numbers_are_left_as_written():
    text = "In 2024, step 3 ran `k = 0.9` with numpy 1.26; k is 0.316."
    f = _footnoted(text)
    assert f.text == text.replace("0.316.", "0.316[1].")
    assert f.statuses == ("sourced",)


def test_the_terminal_marks_with_superscripts_and_links_are_the_callers():
    f = _footnoted("k is 0.316 and tau is 2.68 ms.", superscript)
    assert f.text == "k is 0.316¹ and tau is 2.68 ms²."
    linked = _footnoted("k is 0.316, R0 3.9.",
                        lambda n: f"[[{n.key}]](#{n.anchor})")
    assert linked.text == f"k is 0.316[[1]](#cell-3), R0 3.9{UNSOURCED}."


def test_no_numbers_no_block():
    f = _footnoted("Nothing to report.")
    assert (f.text, f.notes, f.block()) == ("Nothing to report.", (), [])


@dataclass
class Ev:
    id: int
    kind: str
    payload: dict[str, Any]


def test_turn_answers_are_each_turns_last_answer_traced_against_what_came_before(
        tmp_path: Path):
    raw = tmp_path / "0001.txt"
    raw.write_text("k_fit = 0.31647\n")
    events = [Ev(1, "message_user", {"content": "fit"}),
              Ev(2, "message_assistant", {"content": "Running it: 0.5 first.", "agent": "main"}),
              Ev(3, "kernel_exec", {"code": "print(1)", "raw_path": str(raw)}),
              Ev(4, "message_assistant", {"content": "k is 0.316.", "agent": "main"}),
              Ev(5, "message_assistant", {"content": "sub 0.316", "agent": "helper"}),
              Ev(6, "message_user", {"content": "and?"}),
              Ev(7, "message_assistant", {"content": "still 0.316, and 4.44.", "agent": "main"})]
    answers = turn_answers(events)
    assert sorted(answers) == [4, 7]
    assert [t.status for t in answers[4].claims] == ["sourced"]
    assert answers[4].claims[0].source.execution == 1
    assert [t.status for t in answers[7].claims] == ["sourced", "unsourced"]
    done = SimpleNamespace(final="still 0.316, and 4.44.", status="done")
    assert [n["status"] for n in final_numbers(events, done)] == ["sourced", "unsourced"]
    assert final_numbers(events, SimpleNamespace(final="", status="cancelled")) == []
    assert final_numbers(events, SimpleNamespace(final="x", status="error")) == []
