"""The line simagent says once attached to a person's kernel names everything it added
there (issue 37, defect 17: it named only ``_out``, while a figure summary formatter goes
in too), and ``_out.remove()`` takes all of it away, as the line says.

A real ``jupyter kernel`` as a person starts it (``test_attach``'s fixtures), the
supervisor's ``Kernel`` attached to it, the person's own client reading what is there.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_attach import FIGURE_MIME, jupyter_kernel, run, runtime  # noqa: F401 - fixtures

from simagent.kernel import Kernel
from simagent.paths import SessionPaths

#: the kernel process is what these tests are about (make test-real)
pytestmark = pytest.mark.real

#: What the person's client sees of simagent's helpers: (the banner's name, the check).
ADDED = {"`_out`": "'_out' in globals()",
         "figure summary formatter":
             f"{FIGURE_MIME!r} in get_ipython().display_formatter.formatters"}


def test_the_attach_line_names_what_simagent_added_and_remove_takes_it_all(
        jupyter_kernel, workspace: Path) -> None:  # noqa: F811 - the fixture
    kc = jupyter_kernel.kc
    check = "print(" + ", ".join(ADDED.values()) + ")"
    assert run(kc, check) == "False False\n"  # the person's kernel, before simagent
    kernel = Kernel(SessionPaths.for_session(workspace, "s1"), cwd=workspace,
                    existing=str(jupyter_kernel.path))
    kernel.start()
    try:
        assert kernel.execute("print('ready')", timeout=60).stdout.strip() == "ready"
        line = kernel.attached_line()
        added = run(kc, check)
    finally:
        kernel.shutdown()
    assert added == "True True\n"
    for name in ADDED:  # each thing added is named
        assert name in line, line
    assert "`_out.remove()` takes both away" in line
    run(kc, "_out.remove()")
    assert run(kc, check) == "False False\n"
