"""Every JSON Lines writer survives a kill of the writer before it.

A process killed mid-write leaves a torn last line (no newline). The next append must
start a line of its own; appended to the fragment, the new record would be glued to
it and lost with it when read back. Each writer is driven through its real entry point.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from simagent.bench.workflow_runs import append_record as append_bench_record
from simagent.context.ledger import Ledger
from simagent.context.task_records import append_record as append_task_record
from simagent.jsonl import append_jsonl, read_jsonl
from simagent.trace.attempts import AttemptLog

TORN = b'{"index": 1, "torn": "the writer was kil'


def _torn(path: Path) -> Path:
    path.write_bytes(b'{"index": 0, "whole": true}\n' + TORN)
    return path


def test_append_jsonl_starts_a_line_after_a_torn_tail(tmp_path):
    path = _torn(tmp_path / "x.jsonl")
    append_jsonl(path, json.dumps({"index": 2}))
    assert read_jsonl(path) == [{"index": 0, "whole": True}, {"index": 2}]
    assert path.read_bytes().endswith(b'{"index": 2}\n')


def test_append_jsonl_leaves_a_whole_file_alone(tmp_path):
    path = tmp_path / "x.jsonl"
    append_jsonl(path, "{}")  # missing file: created
    append_jsonl(path, '{"a": 1}')
    assert path.read_bytes() == b'{}\n{"a": 1}\n'


@pytest.mark.parametrize("writer", ["attempts", "tasks", "ledger", "bench"])
def test_each_writer_keeps_its_record_after_a_torn_line(tmp_path, writer):
    path = _torn(tmp_path / f"{writer}.jsonl")
    if writer == "attempts":
        AttemptLog(path).add(approach="fit in log space", outcome="failed")
        marker = "fit in log space"
    elif writer == "tasks":
        append_task_record(path, {"task": "tau from the decay", "key_values": []})
        marker = "tau from the decay"
    elif writer == "ledger":
        ledger = Ledger(path)
        assert ledger.record("summary", [HumanMessage("fit tau"),
                                         AIMessage("tau = 2.7 ms")]) is not None
        marker = '"kind": "summary"'
    else:
        append_bench_record(path, {"run": "r1", "workflow": "wf-after-the-kill"})
        marker = "wf-after-the-kill"
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == '{"index": 0, "whole": true}'
    assert len(lines) == 2 and marker in lines[1]
    json.loads(lines[1])  # the new record is a whole object, not glued to the fragment
