"""The slow pool's order (``tests/longest_first.py``): longest module first, a module's
tests together and in their file's order, unknown tests as short ones, the same order
each time."""

from __future__ import annotations

from longest_first import DEFAULT_S, order


def test_the_longest_module_runs_first_with_its_tests_together_in_file_order():
    ids = ["a.py::x", "a.py::y", "b.py::small", "c.py::p", "b.py::big", "c.py::q"]
    durations = {"a.py::x": 3.0, "a.py::y": 4.0, "b.py::big": 30.0, "b.py::small": 0.5,
                 "c.py::p": 9.0, "c.py::q": 8.0}
    got = [ids[i] for i in order(ids, durations)]
    assert got == ["b.py::small", "b.py::big", "c.py::p", "c.py::q", "a.py::x", "a.py::y"]


def test_a_test_the_file_does_not_name_counts_as_short_and_ties_keep_their_order():
    ids = ["new.py::t1", "new.py::t2", "old.py::long", "z.py::t"]
    got = [ids[i] for i in order(ids, {"old.py::long": 10 * DEFAULT_S})]
    assert got == ["old.py::long", "new.py::t1", "new.py::t2", "z.py::t"]
    assert order(ids, {}) == [0, 1, 2, 3]
