"""The provenance engine reads a session's outputs once (``context/provenance/read_cache``):
what a raw output shows is kept in memory (bounded by bytes) and on disk beside the
session's files, read again when the file changed, and a cache file that cannot be read
is ignored and written again."""

from __future__ import annotations

import os
import stat

import pytest

from simagent.context.provenance import read_cache
from simagent.context.provenance.engine import read_text, trace
from simagent.context.provenance.read_cache import ByteLRU, cache_file, load
from simagent.context.provenance.sources import raw_sources
from simagent.paths import SessionPaths

LINES = "".join(f"step {i} energy={-3.5 + i * 1e-4:.6f} eV\n" for i in range(60))


@pytest.fixture(autouse=True)
def memory(monkeypatch):
    """A fresh memory cache for each test (the process's own is shared)."""
    lru = ByteLRU(read_cache.MEMORY_BYTES)
    monkeypatch.setattr(read_cache, "MEMORY", lru)
    return lru


@pytest.fixture
def session(tmp_path):
    paths = SessionPaths(tmp_path / "session").ensure()
    paths.trace.touch()
    return paths


def write_output(session: SessionPaths, n: int, text: str):
    path = session.outputs / f"{n:04d}.txt"
    path.write_text(text)
    return path


def no_reading(text):
    raise AssertionError("read again, not from a cache")


def test_an_output_is_read_once_then_loaded_from_disk_by_a_later_process(session, memory,
                                                                         monkeypatch):
    path = write_output(session, 3, LINES + "RESULT E0=-4.71234 eV\n")
    first = raw_sources(path, 3)
    cache = session.number_cache / "0003.bin"
    assert cache_file(path) == cache and cache.exists()
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600
    assert stat.S_IMODE(session.number_cache.stat().st_mode) == 0o700
    monkeypatch.setattr(read_cache, "read_text", no_reading)
    assert raw_sources(path, 3)[0].read is first[0].read  # this process: memory
    memory.clear()  # a later process: the disk
    again = raw_sources(path, 3)
    assert again[0].read == first[0].read == read_text(first[0].text)
    got = trace("E0 is -4.712 eV", again).claims[0]
    assert (got.status, got.source.execution, got.source.line) == ("sourced", 3, 61)


def test_a_changed_file_is_read_again(session, memory):
    path = write_output(session, 1, LINES + "k=0.31647\n")
    assert trace("k = 0.3165", raw_sources(path, 1)).claims[0].status == "sourced"
    with open(path, "a") as fh:  # grew: another size
        fh.write("k=0.52210\n")
    assert trace("k = 0.5221", raw_sources(path, 1)).claims[0].status == "sourced"
    before = path.stat()
    path.write_text(LINES + "k=0.77777\nk=0.66666\n")  # the same size, another time
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    assert path.stat().st_size == before.st_size
    for _where in ("memory", "disk"):
        found = raw_sources(path, 1)
        assert trace("k = 0.7778", found).claims[0].status == "sourced"
        assert trace("k = 0.5221", found).claims[0].status == "unsourced"
        memory.clear()


def test_memory_is_bounded_by_bytes_least_recently_used_out_first():
    lru = ByteLRU(100)
    lru.put("a", 1, "A", 40)
    lru.put("b", 1, "B", 40)
    assert lru.get("a", 1) == "A"  # a is now the most recent
    lru.put("c", 1, "C", 40)
    assert (lru.get("b", 1), lru.get("a", 1), lru.get("c", 1)) == (None, "A", "C")
    assert lru.bytes == 80
    lru.put("huge", 1, "H", 101)  # larger than the bound: not kept, nothing dropped
    assert lru.get("huge", 1) is None and len(lru) == 2
    assert lru.get("a", 2) is None and lru.bytes == 40  # another key: stale, dropped


def test_the_outputs_of_a_session_stay_within_the_memory_bound(session, monkeypatch):
    one = len(raw_sources(write_output(session, 1, LINES), 1)[0].text)
    bound = ByteLRU(3 * (one + 4000))
    monkeypatch.setattr(read_cache, "MEMORY", bound)
    for n in range(1, 9):
        raw_sources(write_output(session, n, LINES + f"n={n}.5\n"), n)
        assert bound.bytes <= bound.max_bytes
    assert 1 <= len(bound) < 8


@pytest.mark.parametrize("damage", [
    b"not a cache",
    b'{"format": 1}\n\x00\x01',
    "truncated",
    "other rules",
])
def test_a_corrupt_cache_file_is_ignored_and_written_again(session, memory, damage):
    path = write_output(session, 2, LINES + "B=134.27 GPa\n")
    expected = raw_sources(path, 2)[0].read
    cache = session.number_cache / "0002.bin"
    data = cache.read_bytes()
    if damage == "truncated":
        cache.write_bytes(data[:-40])
    elif damage == "other rules":
        cache.write_bytes(data.replace(read_cache.rules().encode(), b"0" * 16, 1))
    else:
        cache.write_bytes(damage)
    memory.clear()
    assert raw_sources(path, 2)[0].read == expected
    st = path.stat()
    assert load(cache, (st.st_size, st.st_mtime_ns), [(path.read_text(), 0)]) == [expected]


def test_a_huge_output_keeps_its_head_and_tail_parts_on_disk(session, memory, monkeypatch):
    from simagent.context.provenance import sources as prov_sources
    monkeypatch.setattr(prov_sources, "RAW_HEAD_TAIL_BYTES", 600)
    path = write_output(session, 5, LINES * 3 + "RESULT k=7.77125\n")
    first = raw_sources(path, 5)
    memory.clear()
    monkeypatch.setattr(read_cache, "read_text", no_reading)
    again = raw_sources(path, 5)
    assert [(s.text, s.line_offset, s.read) for s in again] == \
        [(s.text, s.line_offset, s.read) for s in first] and len(again) == 2
    assert trace("k is 7.771", again).claims[0].source.line == 181


def test_nothing_is_kept_on_disk_outside_a_session_or_for_a_short_output(tmp_path, session):
    loose = tmp_path / "case" / "outputs" / "0001.txt"  # a labelled case: no trace beside
    loose.parent.mkdir(parents=True)
    loose.write_text(LINES)
    assert cache_file(loose) is None
    raw_sources(loose, 1)
    assert not (tmp_path / "case" / "numbers").exists()
    raw_sources(write_output(session, 1, "42\n"), 1)
    assert not (session.number_cache / "0001.bin").exists()


def test_a_cache_that_cannot_be_written_keeps_nothing_and_answers_all_the_same(session,
                                                                             memory):
    session.number_cache.write_text("a file where the folder would be")
    path = write_output(session, 4, LINES)
    assert raw_sources(path, 4)[0].read == read_text(path.read_text())
    assert list(session.root.glob("**/.*.bin.*")) == []
