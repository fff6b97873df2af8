"""Unsupported numbers (``simagent/bench/support.py``): extraction, tolerant backing, the
exclusions, bounded raw reads, and one scripted run through the real graph and kernel."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from simagent.bench.scorers import RunView, grade
from simagent.bench.support import Corpus, check
from simagent.bench.support_sources import check_run, file_values
from simagent.bench.workflow import load_workflow
from simagent.context.provenance.numbers import (
    _NAME_UNIT,
    _NUM,
    _SPACES,
    _parse,
    extract,
    seen_readings,
    seen_values,
    unit_factor,
)


def corpus(*texts: str, kind: str = "output") -> Corpus:
    c = Corpus()
    for t in texts:
        c.add(kind, t)
    return c


def backed(answer: str, *seen: str) -> bool:
    (n,) = extract(answer)
    return corpus(*seen).backing(n) is not None


def statuses(final: str, *seen: str, prompt: str = "") -> dict[str, str]:
    report = check(final, corpus(*seen), extract(prompt))
    return {f.text: f.status if f.status != "ignored" else f"ignored:{f.why}"
            for f in report.findings}


# -------------------------------------------------------------------- extraction
@pytest.mark.parametrize(("text", "value", "written"), [
    ("x = 3.1416", 3.1416, "3.1416"),
    ("rate 1.2e-3 per s", 1.2e-3, "1.2e-3"),
    ("rate 1.2E+05", 1.2e5, "1.2E+05"),
    ("rate 1.2×10^-3 now", 1.2e-3, "1.2×10^-3"),
    ("rate 1.2 x 10⁻³ now", 1.2e-3, "1.2 x 10⁻³"),
    ("rate 1.2·10^{-3} now", 1.2e-3, "1.2·10^{-3}"),
    ("rate 1.2*10**-3 now", 1.2e-3, "1.2*10**-3"),
    ("down to 10⁻¹² here", 1e-12, "10⁻¹²"),
    ("12,345 cases", 12345, "12,345"),
    ("a town of 50 000 people", 50000, "50 000"),
    ("a share of 12.5 %", 12.5, "12.5 %"),
    ("a share of 12.5%", 12.5, "12.5%"),
    ("at 350 mV", 350, "350 mV"),
    ("at 1.2 kPa", 1.2, "1.2 kPa"),
    ("lasting 30 ms.", 30, "30 ms"),
    ("clocked at 2.5 GHz", 2.5, "2.5 GHz"),
    ("3.5 A.h cell", 3.5, "3.5 A.h"),
])
def test_extract_reads_the_written_forms(text, value, written):
    (n,) = extract(text)
    assert math.isclose(n.value, value, rel_tol=1e-12)
    assert n.text == written


def test_extract_keeps_words_after_a_number_out_of_its_unit():
    (n,) = extract("over 12 minutes")  # `min...` is not milli-in
    assert n.text == "12" and n.scales == ()
    (n,) = extract("took 12 steps")
    assert n.text == "12" and n.scales == ()


def test_a_range_gives_its_unit_to_the_bare_number_before_it():
    lo, hi = extract("widths of 0.5–10 % and more")
    assert lo.scales == hi.scales == (0.01,)


# ------------------------------------------------------------------ the tolerance
values = st.floats(min_value=1e-9, max_value=1e9, allow_nan=False, allow_infinity=False)


@given(x=values, k=st.integers(1, 8))
def test_a_seen_value_rounded_to_k_significant_digits_is_backed(x, k):
    assert backed(f"v = {x:.{k}g} here", f"value {x!r}")


@given(x=values, k=st.integers(1, 6))
def test_rounding_survives_unit_prefixes_and_percentages(x, k):
    assert backed(f"at {x * 1e3:.{k}g} mV here", f"U = {x!r} V")       # answer prefixed
    assert backed(f"at {x:.{k}g} V here", f"U = {x * 1e6!r} µV")        # source prefixed
    assert backed(f"share {100 * x:.{k}g} % here", f"fraction {x!r}")  # percent vs fraction


@given(x=values, d=st.floats(0.011, 0.5), sign=st.sampled_from([1, -1]), k=st.integers(3, 8))
def test_a_value_off_by_more_than_one_percent_is_not_backed(x, d, sign, k):
    answer = x * (1 + sign * d)
    written = f"{answer:#.{k}g}"  # `#` keeps trailing zeros: k digits shown
    # the far-away neighbours make sure an unrelated corpus does not back it either
    assert not backed(f"v = {written} here", f"value {x!r}", f"{x * 10!r} {x / 10!r}")


@given(x=values, k=st.integers(2, 5), r=st.floats(2e-4, 5e-3), sign=st.sampled_from([1, -1]))
def test_digits_the_source_never_showed_are_not_backed(x, k, r, sign):
    """An answer more precise than its source backs nothing once it differs by more than
    REL_TOL: the extra digits came from nowhere."""
    shown = float(f"{x:.{k}g}")
    invented = shown * (1 + sign * r)
    assume(f"{invented:.{k}g}" == f"{shown:.{k}g}")  # it still rounds to what was shown
    assert not backed(f"v = {invented:.9g} here", f"value {shown!r}")


@pytest.mark.parametrize(("answer", "seen"), [
    ("350 mV", "U = 0.35 V"),
    ("0.35 V", "U = 350 mV"),
    ("1.2 kPa", "p = 1200 Pa"),
    ("2.5 GHz", "f = 2.5e9 Hz"),
    ("4.2 µs", "dt = 4.2e-6"),
    ("4.2 us", "dt = 4.2e-6"),
    ("12.5 %", "share 0.125"),
    ("0.125", "share 12.5 %"),
    ("22.0 ms", "tau_ms=21.99"),      # rounding
    ("0.02199 s", "tau_ms=21.99"),    # the unit in the printed name
    ("about 2000 steps", "n = 1987"),  # a hedged round number
    ("1.00", "x = 0.9996"),            # just below a power of ten still rounds up
])
def test_units_percent_and_rounding_back_equal_quantities(answer, seen):
    assert backed(answer, seen)


@pytest.mark.parametrize(("answer", "seen"), [
    ("350 mV", "U = 0.36 V"),
    ("2000 steps", "n = 1987"),        # a bare round number is exact
    ("1.0", "x = 0.94"),               # 0.94 rounds to 0.9, not 1.0
    ("1e-8", "err 6e-9"),              # 6e-9 at one digit is 6e-9, not 1e-8
    ("0.3166", "x = 0.32"),            # digits the source never showed
])
def test_near_misses_are_not_backed(answer, seen):
    assert not backed(answer, seen)


# -------------------------------------------------------------------- exclusions
def test_exclusions_each_have_their_reason():
    final = ("1. First, Cu(111) with H2O2 and y2_max: 123.4 K.\n"
             "(12) Attempts #14-#15 ran with SciPy 1.17.0 in 2019 at 00:00-08:00.\n"
             "We used 3 restarts and 50 000 people; 2024 steps gave 77.7 and 8.25 (Chen, "
             "(2020)) over (2030 steps).")
    got = statuses(final, "T = 123.41", "p = 8.249", prompt="a town of 50 000 people")
    assert got["123.4 K"] == "supported" and got["8.25"] == "supported"
    assert got["77.7"] == "unsupported"
    assert got["1"] == "ignored:marker"
    assert got["111"] == "unsupported"                        # a Miller index is checked
    assert got["2"] == "ignored:identifier"                   # H2O2, y2_max
    assert got["12"] == "ignored:marker"
    assert got["14"] == "ignored:marker" and got["15"] == "ignored:marker"
    assert got["1.17"] == "ignored:date"                      # a version string
    assert got["2019"] == "ignored:date"
    assert got["00"] == "ignored:date" and got["08"] == "ignored:date"
    assert got["3"] == "ignored:small"
    assert got["50 000"] == "ignored:prompt"
    assert got["2024"] == "unsupported"                       # a count, not a year
    assert got["2020"] == "ignored:date" and got["2030"] == "unsupported"


def test_only_the_prompts_own_numbers_are_excluded():
    got = statuses("Waits grew by about 30 %, 20 % are VIPs, 0.50 of 120 calls.",
                   "wait change +31.2 %", prompt="120 calls/h, 20 % VIPs, answer within 30 s "
                   "at 0.5 load; see Chen2020")
    assert got == {"30 %": "supported", "20 %": "ignored:prompt", "0.50": "ignored:prompt",
                   "120": "ignored:prompt"}


def test_a_number_the_agent_only_said_itself_does_not_back_it():
    events = [SimpleNamespace(kind="message_user", payload={"content": "fit it"}),
              SimpleNamespace(kind="message_assistant", payload={"content": "R0 is 3.27"}),
              SimpleNamespace(kind="tool_result", payload={"content": "R0=3.19"}),
              SimpleNamespace(kind="tool_result", payload={"content": "R0=3.27",
                                                           "dropped": True})]
    report = check_run("R0 = 3.27, not 3.19", events)
    assert [f.text for f in report.unsupported] == ["3.27"]
    assert len(report.checked) == 2


# -------------------------------------------------------------------- raw files
def test_raw_outputs_stream_in_chunks_without_splitting_numbers(tmp_path):
    text = "".join(f"step {i} loss={i * 0.0137:.6f} lr=3.5e-4\n" for i in range(400))
    path = tmp_path / "out.txt"
    path.write_text(text)
    assert set(file_values(path, chunk=7)) == set(seen_values(text))


def test_raw_outputs_are_read_head_and_tail_only(tmp_path):
    path = tmp_path / "big.txt"
    path.write_text("head 11.111\n" + "filler 22.222\n" * 5000 + "tail 33.333\n")
    got = set(file_values(path, limit=2000, chunk=512))
    assert {11.111, 33.333} <= got and len(got) == 3  # the filler is there, once


def test_a_number_only_in_a_raw_file_is_reported_apart(tmp_path):
    raw = tmp_path / "3.txt"
    raw.write_text("progress 61.25 %\n" * 3 + "done: result=42.42\n")
    events = [SimpleNamespace(kind="kernel_exec", payload={"code": "run()",
                                                           "raw_path": str(raw)}),
              SimpleNamespace(kind="tool_result", payload={"content": "done: result=42.42"})]
    report = check_run("result 42.42 after 61.25 % of the run, then 99.5", events)
    assert {f.text: f.status for f in report.findings} == {
        "42.42": "supported", "61.25 %": "raw_only", "99.5": "unsupported"}
    fields = report.record_fields()
    assert fields == {"numbers_checked": 3, "numbers_unsupported": 1,
                      "unsupported_numbers": ["99.5"], "numbers_raw_only": 1,
                      "raw_only_numbers": ["61.25 %"], "support_power": 1.0}
    # the model never saw the raw file: a raw-only number fails the scorer too
    run = RunView(final="result 42.42 after 61.25 % of the run", events=events,
                  step_texts={}, workspace=tmp_path)
    (verdict,) = grade([{"kind": "supported_numbers"}], run)
    assert not verdict.ok and verdict.detail.endswith(": 61.25 % (raw only)")


def test_power_says_how_much_support_means_in_a_dense_corpus():
    final = "the mean temperature is 294.63 K"
    sparse = check(final, corpus("T_mean = 294.63"))
    log = "\n".join(f"step {i} T = {280 + i * 0.01:.2f}" for i in range(4000))  # 280..320 K
    dense = check(final, corpus("T_mean = 294.63", log))
    assert [f.status for f in sparse.findings] == [f.status for f in dense.findings] == [
        "supported"]
    assert sparse.power == 1.0
    assert dense.power is not None and dense.power < 0.5  # +-1-3 % are all in the log
    assert check("nothing to check here", corpus("x")).power is None


# --------------------------------------------------------------------- scorer
def test_the_scorer_passes_up_to_max_unsupported(tmp_path):
    events = [SimpleNamespace(kind="tool_result", payload={"content": "x=1.234"})]
    run = RunView(final="x is 1.23 and y is 45.6", events=events, step_texts={},
                  workspace=tmp_path)
    strict, lenient = grade([{"kind": "supported_numbers"},
                             {"kind": "supported_numbers", "max": 1}], run)
    assert not strict.ok and "45.6" in strict.detail and "1 of 2" in strict.detail
    assert lenient.ok


def test_the_report_table_merges_policies_that_fare_alike():
    from simagent.bench.report import support_table

    base = {"workflow": "w", "numbers_checked": 5, "numbers_unsupported": 1,
            "unsupported_numbers": ["4.73 V"], "numbers_raw_only": 0, "support_power": 0.9}
    rows = [{**base, "policy": "raw"}, {**base, "policy": "simagent"},
            {**base, "policy": "stock", "numbers_unsupported": 0, "unsupported_numbers": []},
            {"workflow": "old", "policy": "raw"}]  # a record from before the check
    lines = support_table(rows).splitlines()
    assert lines[2:] == ["| w | raw, simagent | 5 | 1 | 0 | 0.90 | `4.73 V` |",
                         "| w | stock | 5 | 0 | 0 | 0.90 | - |"]
    assert support_table([{"workflow": "old", "policy": "raw"}]) == ""


# ------------------------------------------------------------ real graph + kernel
WORKFLOW = '''
id = "support-demo"
title = "a decay constant"
prompt = "Compute the decay constant of the relaxation and give it in ms."
[[steps]]
tool = "run_python"
args = {{ code = "import math\\nprint(f'tau = {{math.pi * 7:.4f}} ms')" }}
[[steps]]
final = """The decay constant is {{out[-1]|tau = ([\\\\d.]+) ms}} ms (0.02199 s); \\
the amplitude is 4.73 V."""
[[scorers]]
kind = "supported_numbers"
'''


@pytest.mark.slow
def test_a_replayed_run_flags_only_the_fabricated_number(tmp_path):
    from simagent.bench.kernel_recording import record
    from simagent.bench.policies import resolve_policies
    from simagent.bench.workflow_runs import measure_run, replayed

    folder = tmp_path / "workflows"
    folder.mkdir()
    path = folder / "support-demo.toml"
    path.write_text(WORKFLOW.format())
    wf = load_workflow(path)
    (policy,) = resolve_policies("simagent")
    recording = record(wf, tmp_path / "recording")  # the real kernel runs the step
    with replayed(wf, policy, recording, tmp_path / "run") as run:
        row = measure_run(wf, policy, 0, session=run.session, model=run.model,
                          result=run.result, wall=run.wall, mode="replay",
                          model_id="replay:support-demo")
    assert row["final"].startswith("The decay constant is 21.9911 ms")
    assert row["numbers_checked"] == 3
    assert row["unsupported_numbers"] == ["4.73 V"] and row["numbers_unsupported"] == 1
    assert row["raw_only_numbers"] == []
    assert row["failed_scorers"] == ["supported_numbers"]
    (verdict,) = row["scorers"]
    assert verdict["detail"] == "1 of 3 number(s) unsupported (max 0): 4.73 V"



#: Pieces of what outputs print: figures in every notation the reader knows, units,
#: names that carry a unit, grouping and odd characters.
_PIECES = [*"0123456789.,:=_ -+eE%x×^{}()[]/\n\t", "\u00a0", "\u2009", "\u2212", "µ", "k",
           "m", "MPa", "K", "V", "10", "**", "⁻³", "²", "tau_ms", " percent", "pct=",
           "[ms]: ", "1e400", "10^400", "9" * 400, "٣"]


@given(st.lists(st.sampled_from(_PIECES), max_size=30).map("".join))
def test_reading_an_output_sees_what_reading_each_number_sees(text):
    """``seen_readings`` reads a long output's plain figures on a fast path; it must see
    exactly what the one reading of a number (``_parse``) sees, in the same order, and
    no figure (``10^400`` included) may stop it."""
    want = []
    for m in _NUM.finditer(text):
        if (n := _parse(m, text)) is None:
            continue
        want += [(v, n.start, n.end) for v, _q in n.readings()]
        if named := _NAME_UNIT.search(text, max(0, m.start() - 24), m.start()):
            f = 0.01 if named.group(1) in ("pct", "percent") else unit_factor(named.group(1))
            if f is not None and f != 1.0:
                want.append((n.value * f, n.start, n.end))
        if any(sp in m.group("m") for sp in (",", *_SPACES)):
            want += [(float(p), n.start, n.end)
                     for p in re.split(r"[, \u00a0\u202f\u2009]", m.group("m")) if p]
    assert list(seen_readings(text)) == want
