"""A kernel whose port another process took between jupyter_client's pick and the
kernel's bind starts anyway, on fresh ports.

jupyter_client picks free TCP ports in this process and the kernel binds them a moment
later; two test workers, or a bench beside a session, can collide in that gap (seen as
``Address already in use`` in a clean-clone ``make test``). Here the clash is made
certain: the first pick is a port this test holds bound.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from jupyter_client.connect import LocalPortCache

from simagent.kernel import Kernel
from simagent.paths import SessionPaths

#: the kernel process is what these tests are about (make test-real)
pytestmark = pytest.mark.real


def test_a_taken_port_gives_fresh_ports_not_a_failure(session_paths: SessionPaths,
                                                       workspace: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    real = LocalPortCache.find_available_port
    handed: list[int] = []

    def first_pick_is_taken(self, ip: str) -> int:
        handed.append(port if not handed else real(self, ip))
        return handed[-1]

    monkeypatch.setattr(LocalPortCache, "find_available_port", first_pick_is_taken)
    try:
        with Kernel(session_paths, cwd=workspace) as k:
            assert k.execute("6 * 7").value == "42"
            assert k.generation == 1  # one kernel that answers, started on the second try
        assert handed[0] == port and len(handed) >= 10  # five ports a start, twice
        assert b"Address already in use" in session_paths.kernel_log.read_bytes()
    finally:
        taken.close()
