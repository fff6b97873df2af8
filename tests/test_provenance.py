"""The provenance engine (``simagent/context/provenance``): each number of an answer is
sourced (execution, line, excerpt), derived (named), input or unsourced, and what is no
claim is ignored with its reason; the sources come from the trace before the answer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from simagent.context.provenance import sources as prov_sources
from simagent.context.provenance.engine import Source, trace
from simagent.context.provenance.sources import (
    raw_sources,
    sources_from_events,
    trace_final,
)


def out(text: str, n: int) -> Source:
    return Source("output", text, n)


def status_of(answer: str, *sources: Source) -> dict[str, str]:
    return {t.text: t.status if t.status != "ignored" else f"ignored:{t.reason}"
            for t in trace(answer, sources).numbers}


def test_a_printed_number_is_sourced_with_its_cell_line_and_excerpt():
    p = trace("The lattice constant is 3.5898 Å.",
              [out("fit done\nCu_a0_A=3.5898 B=134.27\n", 4)])
    (t,) = p.claims
    assert t.status == "sourced"
    assert (t.source.execution, t.source.line, t.source.excerpt) == \
        (4, 2, "Cu_a0_A=3.5898 B=134.27")
    assert p.summary() == "1 sourced, 0 derived, 0 input, 0 unsourced"


@pytest.mark.parametrize(("answer", "printed"), [
    ("B is 134.3 GPa", "B_GPa=134.27"),        # rounding to the shown digits
    ("a drop of 350 mV", "dV = -0.35 V"),      # unit prefix and sign
    ("a yield of 12.5 %", "yield 0.125"),      # percent and fraction
    ("about 2000 steps", "1987 steps run"),    # a hedged round number
    ("rate 1.2×10^-3 per s", "k=0.0012"),      # scientific notation
    ("| Cu | 3.59 |", "a0 3.5898"),            # a markdown table cell
])
def test_the_reading_rules_find_the_source(answer, printed):
    assert "sourced" in status_of(answer, out(printed, 1)).values()


def test_digits_no_source_shows_are_unsourced():
    assert status_of("B is 134.42 GPa", out("B=134.3", 1))["134.42 GPa"] == "unsourced"
    assert status_of("B is 141.2 GPa", out("B=134.27", 1))["141.2 GPa"] == "unsourced"


def test_what_is_no_claim_is_ignored_with_a_reason():
    answer = ("Step 12: ran with numpy version 1.26 in 2019 (see `dt = 0.0523`).\n"
              "```python\nk = 4.5678\n```\n1. first\nDone 3 times with v2.1 and 1.2.3.")
    got = status_of(answer)
    assert got == {"12": "ignored:step", "1.26": "ignored:version", "2019": "ignored:year",
                   "0.0523": "ignored:code", "4.5678": "ignored:code", "1": "ignored:marker",
                   "3": "ignored:small", "2.1": "ignored:version", "1.2": "ignored:date",
                   ".3": "ignored:date"}


def test_the_persons_own_numbers_are_input_exactly():
    msg = Source("input", "Run it at 300 K for 250 ps.", label="message 1")
    p = trace("At 300 K the energy was 12.5 eV over 250.0 ps.", [msg, out("E=12.5", 2)])
    got = {t.text: t.status for t in p.claims}
    assert got == {"300 K": "input", "12.5 eV": "sourced", "250.0 ps": "input"}
    assert p.claims[0].source.label == "message 1"


@pytest.mark.parametrize(("answer", "op"), [
    ("A is 3.61 and B is 3.59, a gap of 0.0202", "difference"),
    ("A is 3.61 and B is 3.59, a ratio of 1.0056", "ratio"),
    ("from 120.0 to 150.0, up 25 %", "percent change"),
    ("runs of 120.0 and 150.0 average 135.0", "mean"),
])
def test_a_simple_operation_on_two_sourced_numbers_is_derived(answer, op):
    p = trace(answer, [out("A=3.6102 B=3.5900 first=120.0 second=150.0", 1)])
    derived = [t for t in p.claims if t.status == "derived"]
    assert [t.derivation.op for t in derived] == [op]


def test_the_same_digits_beat_a_rounding_and_the_later_cell_wins():
    p = trace("T = 0.32", [out("T=0.32", 2), out("T=0.3165", 5), out("T=0.32", 7)])
    assert p.claims[0].source.execution == 7
    p = trace("T = 0.32", [out("T=0.32", 2), out("T=0.3165", 5)])
    assert p.claims[0].source.execution == 2


def test_only_events_before_the_answer_are_sources(tmp_path):
    raw = tmp_path / "0001.txt"
    raw.write_text("warming\nE0=-3.7041\n")
    later = tmp_path / "0002.txt"
    later.write_text("E1=-4.5551\n")

    def ev(i, kind, **payload):
        return SimpleNamespace(id=i, kind=kind, payload=payload)

    events = [ev(1, "message_user", content="Fit it.", turn=1),
              ev(2, "kernel_exec", code="fit()", raw_path=str(raw)),
              ev(3, "tool_result", name="run_python", content="E0=-3.7041"),
              ev(4, "message_assistant", content="E0 is -3.704 eV; E1 is -4.555 eV.",
                 agent="main"),
              ev(5, "kernel_exec", code="more()", raw_path=str(later))]
    p = trace_final(events)
    got = {t.text: (t.status, t.source and (t.source.execution, t.source.line))
           for t in p.claims}
    assert got == {"3.704 eV": ("sourced", (1, 2)), "4.555 eV": ("unsourced", None)}
    assert [s.kind for s in sources_from_events(events)] == \
        ["input", "code", "output", "code", "output"]


def test_a_huge_raw_output_is_read_head_and_tail_with_true_line_numbers(tmp_path,
                                                                        monkeypatch):
    monkeypatch.setattr(prov_sources, "RAW_HEAD_TAIL_BYTES", 64)
    path = tmp_path / "0003.txt"
    lines = [f"step {i} x={i}.5" for i in range(100)] + ["RESULT k=7.77125"]
    path.write_text("\n".join(lines) + "\n")
    found = raw_sources(path, 3)
    assert len(found) == 2 and len(found[0].text) <= 64
    p = trace("k is 7.771", found)
    assert p.claims[0].source.line == 101


@pytest.mark.parametrize("answer", [
    "Raising the rate constant by 25 % lifts the peak.",
    "With k at +25 % the peak moves forward.",
    "k is 25 % higher in the second run.",
    "With the load 15 % lower the peak falls.",
    "The load was cut by 15 %.",
    "The rate constant changed by 25 % between the runs.",
])
def test_a_percent_change_is_sourced_where_a_cell_shows_its_factor(answer):
    code = Source("code", "run(k=0.42 * 1.25)\nrun(load=0.85)", 2)
    (t,) = trace(answer, [code]).claims
    assert (t.status, t.source.kind, t.source.execution) == ("sourced", "code", 2)


@pytest.mark.parametrize("answer", [
    "k is 25 % lower in the second run.",      # the other direction: 0.75, not shown
    "The load is a 25 % share of the budget.",  # no change at all
    "Raising k by 35 % lifts the peak.",        # no cell shows 1.35
])
def test_a_percentage_no_factor_backs_stays_unsourced(answer):
    code = Source("code", "run(k=0.42 * 1.25)", 2)
    assert [t.status for t in trace(answer, [code]).claims] == ["unsourced"]


def test_a_percentage_is_derived_from_a_ratio_or_percentages_not_from_other_units():
    got = status_of("A peaks at 612.44 K and B at 597.06 K; 15 % of runs failed.",
                    out("T_a=612.44 K\nT_b=597.06 K\n", 1))
    assert got["15 %"] == "unsourced"  # 612.44 K - 597.06 K is no percentage
    got = status_of("Yields were 25 % and 15 %, 14.75 % for C, 10.0 % apart.",
                    out("yield_a=0.25\nyield_b=0.15\n", 1))
    assert got["14.75 %"] == "unsourced"  # 0.25 less 15: the two read differently
    assert got["10.0 %"] == "derived"


def _log(rows: list[str], n: int = 300) -> str:
    """A per-step log of ``n`` rows (a long log: ``engine.LOG_LINES``) with ``rows`` in it."""
    lines = [f"step {i:5d} t={i * 0.37:.4f} e={-1.5 - i * 1e-4:.6f} k={i % 7}" for i in range(n)]
    return "\n".join(lines[:150] + rows + lines[150:]) + "\n"


def test_a_long_logs_row_backs_a_value_only_with_the_numbers_around_it_in_the_answer():
    # the row shows 4.5678 and 12.3456, but 12.3456 is in another part of the answer
    log = out(_log(["step   151 t=4.5678 e=-9.8765 k=12.3456"]), 3)
    answer = "The cell's capacity is 12.3456 A.h.\n\nRun B reached 4.5678 at -9.9 eV."
    assert status_of(answer, log)["4.5678"] == "unsourced"
    # the same row beside the answer's own neighbour (-9.8765) is the line it reports from
    answer = "The cell's capacity is 12.3456 A.h.\n\nRun B reached 4.5678 at -9.8765 eV."
    assert status_of(answer, log)["4.5678"] == "sourced"


def test_a_short_outputs_row_backs_a_telling_value_only_with_its_neighbours_or_a_word():
    row = out("fit table\n2   3.7700   -7.239   13.3958\n", 5)
    assert status_of("| Cu | 3.770 | 134.27 |", row)["3.770"] == "unsourced"
    # the row shows the answer line's other telling number, or a word of it (Cu, a unit)
    assert status_of("| Cu | 3.770 | 13.3958 |", row)["3.770"] == "sourced"
    named = out("fit table\nCu   3.7700   -7.239   13.3958\n", 5)
    assert status_of("| Cu | 3.770 | 134.27 |", named)["3.770"] == "sourced"
    # a row that shows another of the answer's telling numbers anywhere is reported from
    assert status_of("| Cu | 3.770 |\n\nThe energy is -7.239 eV.", row)["3.770"] == "sourced"
    # a value of one or two digits and a line of one or two numbers are read as before
    assert status_of("| Cu | 0.5 | 134.27 |", out("2   0.5   -7.239   13.3958", 5))["0.5"] \
        == "sourced"
    assert status_of("The fit gives 3.770 here.", out("x 3.7700", 5))["3.770"] == "sourced"


def test_an_identifiers_digits_make_no_row_of_numbers():
    shape = out("(20001, 5) columns: ['t_s', 'y1', 'y2', 'y3']\n", 20)
    pager = Source("tool", "@@ lines 20001-20060 of 40201 | next offset 20060 @@",
                   label="read_file")
    (t,) = trace("- `reference.csv`: 20 001 times", [shape, pager]).claims
    assert (t.status, t.source.execution) == ("sourced", 20)


def test_a_minus_the_answer_writes_needs_a_minus_in_the_source():
    assert status_of("The adsorption energy is -0.87 eV.", out("yield = 0.875", 1)) \
        == {"0.87 eV": "unsourced"}
    assert status_of("The adsorption energy is -0.87 eV.", out("E_ads = -0.8712", 1)) \
        == {"0.87 eV": "sourced"}
    # a magnitude written without a sign, or the dash of a range, needs none
    assert status_of("a drop of 0.87 eV", out("dE = -0.8712", 1)) == {"0.87 eV": "sourced"}
    assert set(status_of("from 0.5-0.87 eV", out("lo=0.5 hi=0.8712", 1)).values()) \
        == {"sourced"}


def _parameters(n: int = 40) -> Source:
    """A listing of many parameters of one or two digits (a library's defaults)."""
    return out("\n".join(f"Parameter {chr(65 + i % 26)}{i} coefficient    "
                         f"{0.1 * (i % 20) + 0.1:.2f}" for i in range(n)), 2)


def test_a_one_or_two_digit_setting_needs_a_word_of_its_sentence_where_values_are_dense():
    # a plan's C-rates against a listing with dozens of values near 0.5: chance
    plan = "I'll sweep the discharge over 0.5C and 1.5C, first with SPM."
    assert status_of(plan, _parameters()) == {"0.5C": "unsourced", "1.5C": "unsourced"}
    # a line that names the setting backs it there too
    named = out("sweep C_rates = [0.5, 1.5] discharge", 3)
    assert set(status_of(plan, _parameters(), named).values()) == {"sourced"}
    # and where few values are near it, a bare match backs it as before
    assert status_of("a rate of 1.2e-3 per s", out("k=0.0012", 1)) == {"1.2e-3": "sourced"}


def test_a_one_digit_figure_is_not_derived():
    sources = [out("a=0.2 b=0.75 c=4.2817 d=0.9834", 1)]
    got = status_of("a is 0.2, b 0.75; c is 4.2817 ms and d 0.9834 ms. Then 0.5 and 3.2983 ms.",
                    *sources)
    assert got["0.5"] == "unsourced"  # 0.75 - 0.2 = 0.55 rounds to it: no derivation
    assert got["3.2983 ms"] == "derived"


def test_a_capital_alone_names_a_quantity_a_setting_shares():
    dense = out("\n".join(f"Parameter X{i} coefficient    {290 + i % 20}.0" for i in range(300)),
                2)
    answer = "The run held T at 300 K."
    assert status_of(answer, dense) == {"300 K": "unsourced"}
    assert status_of(answer, dense, Source("code", "T = 300", 3)) == {"300 K": "sourced"}


def test_a_proposed_grid_is_no_source_where_an_unrelated_listing_shows_a_member():
    params = out("Negative electrode porosity  0.25\n"
                 "Negative electrode active material volume fraction  0.75\n"
                 "Bruggeman coefficient (electrolyte) -> 1.5\n", 2)
    plan = "Sweep the rates over 0.2C, 0.5C, 0.75C, 1.5C and 2.5C, first with SPM."
    assert status_of(plan, params) == {t: "unsourced" for t in
                                       ("0.2C", "0.5C", "0.75C", "1.5C", "2.5C")}
    # a grid a cell printed, on one line or one member per line, stays sourced
    printed = out("rates = [0.2, 0.5, 0.75, 1.5, 2.5]", 3)
    assert set(status_of(plan, printed).values()) == {"sourced"}
    per_line = out("".join(f"rate {r}C: capacity {4.9 - r / 10:.3f} A.h\n"
                           for r in (0.2, 0.5, 0.75, 1.5, 2.5)), 3)
    assert set(status_of(plan, per_line).values()) == {"sourced"}
    # most of the list sourced: the members keep their places
    most = out("runs done: 0.2C 0.5C 2.5C", 4)
    assert status_of(plan, params, most)["0.75C"] == "sourced"


def test_a_named_setting_is_no_source_where_the_line_gives_the_name_another_value():
    docs = Source("tool", "Default values are 1e-3 for `rtol` and 1e-6 for `atol`.",
                  label="read_file")
    answer = "For the tolerances, rtol = 1e-6 and a first step of 1e-3."
    assert status_of(answer, docs)["1e-6"] == "unsourced"
    assert status_of("Tolerances: atol = 1e-6.", docs)["1e-6"] == "sourced"
    assert status_of(answer, out("solve_ivp(rtol=1e-06, atol=1e-9)", 3))["1e-6"] == "sourced"
