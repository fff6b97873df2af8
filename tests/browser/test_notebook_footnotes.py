"""An exported notebook's answer in JupyterLab (issue 38): clicking a number's footnote
in the answer cell scrolls to the cell the number came from. JupyterLab's sanitizer
turns the anchor's ``id`` into ``data-jupyter-id``, which its link handler looks up, so
this is checked in the page, not on the file."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from test_jupyterlab_chat import CHROMIUM, TOKEN, lab  # noqa: F401  (the fixture)

from simagent.notebooks import plan as nbplan
from simagent.notebooks.export import notebook
from simagent.presentation.footnotes import cited_cells, turn_answers
from simagent.trace.log import Event

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


def _exported(folder: Path) -> nbformat.NotebookNode:
    """A session of 40 cells; the answer cites the first, far above it."""
    (folder / "0001.txt").write_text("k_fit = 0.31647\n")
    events = [Event(1, "t", "session_start", {"workspace": str(folder)}),
              Event(2, "t", "message_user", {"content": "fit it", "turn": 1})]
    records = []
    for n in range(1, 41):
        code = "k = 0.31647\nprint('k_fit =', k)" if n == 1 else f"x{n} = {n}\nx{n}"
        events.append(Event(len(events) + 1, "t", "kernel_exec", {
            "code": code, "status": "ok", "raw_path": str(folder / f"{n:04d}.txt")}))
        records.append({"n": n, "code": code, "status": "ok", "lineage": 1, "effects": []})
    events.append(Event(len(events) + 1, "t", "message_assistant",
                        {"content": "k is 0.316.", "agent": "main"}))
    numbers = turn_answers(events)
    pl = nbplan.plan(events, records, "S", cited=cited_cells(numbers))
    pl.numbers = numbers
    return notebook(pl)


def test_a_footnote_link_scrolls_to_its_cell(lab, tmp_path):  # noqa: F811
    if not CHROMIUM.exists():
        pytest.skip(f"no {CHROMIUM} (make test-browser installs Debian's chromium)")
    from playwright.sync_api import sync_playwright  # the browser extra: only here

    nb = _exported(tmp_path)
    assert "k is 0.316[[1]](#cell-1)." in nb.cells[-1].source
    lab.api("PUT", "/api/contents/fit.ipynb", {"type": "notebook", "format": "json",
                                               "content": json.loads(nbformat.writes(nb))})
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                    args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            page.goto(f"{lab.url}/lab/tree/fit.ipynb?token={TOKEN}")
            link = page.locator('.jp-RenderedMarkdown a[href="#cell-1"]').first
            link.wait_for(timeout=90_000)
            target = page.locator('[data-jupyter-id="cell-1"], #cell-1').first

            def visible() -> bool:
                box, view = target.bounding_box(), page.viewport_size
                return box is not None and 0 <= box["y"] < view["height"]

            link.scroll_into_view_if_needed()
            assert not visible()  # 40 cells away
            link.click()
            page.wait_for_function(
                "() => { const e = document.querySelector('[data-jupyter-id=\"cell-1\"]');"
                " if (!e) return false; const r = e.getBoundingClientRect();"
                " return r.top >= 0 && r.top < window.innerHeight; }", timeout=20_000)
            assert visible()
        finally:
            browser.close()
