"""Plots as a budgeted resource (issue 15, item 4).

Summaries are read from real matplotlib figures (Agg in this process, the inline backend in
a real ipykernel); figures flow through the real supervisor, the real deepagents graph with
the scripted model, and the TUI's pure renderer.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from langchain_core.messages import ToolMessage

from simagent.agent.builder import build_agent
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel, call_id
from simagent.context.counting import count_text
from simagent.kernel import Kernel
from simagent.kernel.capture import Capture
from simagent.kernel_api.figures import (
    FIGURE_MIME,
    MAX_SUMMARY_CHARS,
    figure_id,
    figure_title,
    parse_captions,
    render_caption,
    render_summary,
    summarize,
)
from simagent.models import image_support, resolve_model
from simagent.paths import SessionPaths
from simagent.session import Session
from simagent.tui.entries import ToolCard
from simagent.tui.render import INLINE_IMAGES_NOTE, render_card

#: A study-like plot: two panels, labelled axes with units, several kinds of series.
STUDY_PLOT = """
import numpy as np, matplotlib.pyplot as plt
t_h = np.linspace(0, 1.0, 200)
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
for c, drop in ((1, 0.9), (2, 1.2)):
    ax1.plot(t_h / c, 4.2 - drop * t_h ** 2, label=f"{c}C")
ax1.axhline(2.5, ls="--", label="cut-off")
ax1.set_xlabel("time t (h)"); ax1.set_ylabel("voltage V (V)"); ax1.set_title("Discharge")
ax1.legend()
ax2.bar(["0.5C", "1C", "2C"], [5.0, 4.8, 4.3], label="capacity")
ax2.set_ylabel("capacity Q (Ah)")
fig.suptitle("Rate study")
"""


# ----------------------------------------------------------------- pure: the summary
def test_a_summary_reads_titles_units_ranges_and_series() -> None:
    ns: dict = {}
    exec(STUDY_PLOT, ns)
    s = summarize(ns["fig"])
    plt.close("all")
    assert s["title"] == "Rate study" and figure_title(s) == "Rate study"
    ax1, ax2 = s["axes"]
    assert ax1["title"] == "Discharge"
    assert ax1["x"]["label"] == "time t (h)" and ax1["y"]["label"] == "voltage V (V)"
    one_c, two_c, cut = ax1["series"]
    assert one_c == {"kind": "line", "label": "1C", "n": 200, "x": [0, 1], "y": [3.3, 4.2],
                     "last": 3.3}
    assert two_c["x"] == [0, 0.5] and two_c["last"] == 3
    assert cut == {"kind": "hline", "label": "cut-off", "y": 2.5}
    assert ax2["x"]["categories"] == ["0.5C", "1C", "2C"]
    bar = ax2["series"][0]
    assert (bar["kind"], bar["label"], bar["n"], bar["y"]) == ("bar", "capacity", 3, [4.3, 5])
    text = render_summary(s)
    assert 'line "1C": 200 pts, x 0…1, y 3.3…4.2 last 3.3' in text
    assert 'axes 1 "Discharge": x "time t (h)"' in text and 'hline "cut-off" at y=2.5' in text
    assert 'axes 2: x -0.54…2.54 [0.5C, 1C, 2C], y "capacity Q (Ah)" 0…5.25' in text
    assert 'bar "capacity": 3 bars, x 0…2, value 4.3…5' in text


def test_fields_scatter_log_axes_and_colorbars_are_summarised() -> None:
    fig, ax = plt.subplots()
    field = np.arange(12.0).reshape(3, 4)
    im = ax.imshow(field, extent=(0, 4, 0, 3))
    fig.colorbar(im, ax=ax, label="temperature T (K)")
    ax.scatter([1, 10, 100], [2, 3, float("nan")], label="probes")
    ax.set_xscale("log")
    s = summarize(fig)
    plt.close(fig)
    (axes,) = s["axes"]  # the colour bar is not a plot of its own
    assert axes["x"]["scale"] == "log"
    scatter = next(x for x in axes["series"] if x["kind"] == "scatter")
    # the NaN point is not drawn, so neither of its coordinates counts in the ranges
    assert scatter["n"] == 3 and scatter["x"] == [1, 10] and scatter["y"] == [2, 3]
    image = next(x for x in axes["series"] if x["kind"] == "image")
    assert image["shape"] == [3, 4] and image["values"] == [0, 11]
    assert s["colorbars"] == [{"label": "temperature T (K)", "range": [0, 11]}]
    assert '  colorbar "temperature T (K)" 0…11' in render_summary(s)


def test_many_axes_and_series_are_bounded_with_counts() -> None:
    fig, axes = plt.subplots(4, 4)
    for ax in axes.flat:
        for k in range(9):
            ax.plot(np.arange(1000.0) * k, label=f"case {k} " + "x" * 80)
    s = summarize(fig)
    plt.close(fig)
    assert len(s["axes"]) == 8 and s["more_axes"] == 8
    assert len(s["axes"][0]["series"]) == 6 and s["axes"][0]["more_series"] == 3
    assert len(s["axes"][0]["series"][0]["label"]) == 60  # long labels are cut
    text = render_summary(s)
    assert len(text) < MAX_SUMMARY_CHARS + 60 and text.endswith("cut at 1500 chars)")


def test_captions_round_trip_and_name_duplicates() -> None:
    assert figure_id(b"abc") == "fig-ba7816bf"  # sha256("abc") starts ba7816bf
    first = render_caption("fig-ba7816bf", "/s/artifacts/fig-ba7816bf.png", (640, 480),
                           {"axes": [{"x": {"label": "t (s)"}, "series": []}]})
    assert first.splitlines() == ["[figure fig-ba7816bf 640x480: /s/artifacts/fig-ba7816bf.png]",
                                  '  axes: x "t (s)"']
    again = render_caption("fig-ba7816bf", "/s/artifacts/fig-ba7816bf.png", (640, 480),
                           {"axes": []}, same_as="_out[3]")
    assert again == ("[figure fig-ba7816bf 640x480 (same as fig-ba7816bf from _out[3], stored "
                     "once): /s/artifacts/fig-ba7816bf.png]")
    found = parse_captions(f"Out[2]: 1\n{first}\n{again}")
    assert [(f["id"], f["size"], f["duplicate"]) for f in found] == [
        ("fig-ba7816bf", (640, 480), False), ("fig-ba7816bf", (640, 480), True)]
    assert found[0]["path"] == "/s/artifacts/fig-ba7816bf.png"


def _png(fig) -> bytes:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def test_capture_stores_each_image_once_under_its_hash(tmp_path: Path) -> None:
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], label="y")
    blob, summary = _png(fig), summarize(fig)
    plt.close(fig)
    data = {"image/png": base64.b64encode(blob).decode(), "text/plain": "<Figure ...>",
            FIGURE_MIME: summary}
    fid = figure_id(blob)
    first = Capture(None, tmp_path, "0001")
    first.handle("display_data", {"data": data})
    first.handle("execute_result", {"data": data, "execution_count": 1})  # `fig` at the end
    r1 = first.result("ok", 0.1)
    assert len(r1.displays) == 1 and r1.value is None  # one image, not two
    d = r1.displays[0]
    assert (d.figure_id, d.path, d.duplicate) == (fid, tmp_path / f"{fid}.png", False)
    assert d.text.startswith(f"[figure {fid} ") and 'line "y": 3 pts' in d.text
    meta = json.loads((tmp_path / f"{fid}.json").read_text())
    assert meta["first"] == "_out[1]" and meta["summary"] == summary
    second = Capture(None, tmp_path, "0002")
    second.handle("display_data", {"data": data})
    d2 = second.result("ok", 0.1).displays[0]
    assert d2.duplicate and f"(same as {fid} from _out[1], stored once)" in d2.text
    assert "\n" not in d2.text  # the summary was given the first time
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{fid}.json", f"{fid}.png"]


# ------------------------------------------------------------------- the real kernel
@pytest.fixture
def kernel(session_paths: SessionPaths, workspace: Path) -> Iterator[Kernel]:
    with Kernel(session_paths, cwd=workspace) as k:
        yield k


def test_the_inline_backend_sends_the_summary_with_the_png(kernel: Kernel) -> None:
    r = kernel.execute(STUDY_PLOT)
    assert r.ok and len(r.displays) == 1
    d = r.displays[0]
    assert d.figure_id and d.path == kernel.paths.artifacts / f"{d.figure_id}.png"
    assert d.path.is_file() and d.title == "Rate study"
    text = r.model_text()
    assert f"[figure {d.figure_id} " in text and 'line "2C": 200 pts, x 0…0.5' in text
    assert 'y "voltage V (V)"' in text
    # the summary costs a fraction of the image (765 tokens: OpenAI's 512px-tile estimate)
    assert count_text(d.text) < 765 / 3
    # the same figure shown again: stored once, said once
    again = kernel.execute("fig")
    (d2,) = again.displays
    assert d2.duplicate and d2.path == d.path and "same as" in again.model_text()
    assert again.value is None
    assert len(list(kernel.paths.artifacts.glob("fig-*.png"))) == 1
    rec = kernel.execute("print(_out[-1].figures == [str(_out[1].figures[0])])")
    assert rec.stdout.strip() == "True"


@pytest.mark.real
def test_summaries_survive_a_restart_and_pyplot_reconfiguration(kernel: Kernel) -> None:
    kernel.restart()
    r = kernel.execute("%matplotlib inline\nimport matplotlib.pyplot as plt\n"
                       "plt.plot([0, 5], [1, 2], label='after restart')\nplt.xlabel('x (m)')")
    assert 'line "after restart": 2 pts, x 0…5, y 1…2 last 2' in r.model_text()


def test_a_kernel_started_by_name_sends_summaries_too(session_paths: SessionPaths,
                                                       workspace: Path) -> None:
    with Kernel(session_paths, cwd=workspace, kernel_name="python3") as k:
        r = k.execute("import matplotlib.pyplot as plt\nplt.plot([1, 4], label='named')")
        assert 'line "named": 2 pts' in r.model_text()
        assert k.execute("%who").stdout.strip() == "plt"  # the install left no names


# --------------------------------------------------------- the graph, with view_figure
PLOT_THEN_VIEW = [
    {"tool": "run_python", "args": {"code": "import matplotlib.pyplot as plt\n"
                                    "fig, ax = plt.subplots()\nax.plot([0, 1, 2], [3, 1, 2], "
                                    "label='v')\nax.set_xlabel('t (s)')"}},
    {"tool": "view_figure", "args": {"figure_id": "{out[-1]|(fig-[0-9a-f]+)}"}, "fill": True},
    {"final": "seen"}]


def _run(workspace: Path, steps: list[dict], multimodal: bool):
    session = Session.create(workspace, approval="auto")
    model = ScriptedChatModel.from_steps(steps)
    if multimodal:
        model.profile = {**model.profile, "image_inputs": True, "image_tool_message": True}
    result = TurnRunner(session, build_agent(session, model)).run("plot", lambda e: None)
    return session, model, result


def test_a_multimodal_model_gets_the_image_block(workspace: Path) -> None:
    session, model, result = _run(workspace, PLOT_THEN_VIEW, multimodal=True)
    try:
        assert result.status == "done"
        viewed = [m for m in model.requests[-1] if isinstance(m, ToolMessage)][-1]
        text, image = viewed.content
        path = next(session.paths.artifacts.glob("fig-*.png"))
        assert text == {"type": "text", "text": f"[figure {path.stem} {_dims(path)}: {path}]"}
        assert image == {"type": "image", "mime_type": "image/png",
                         "base64": base64.b64encode(path.read_bytes()).decode()}
        arts = [e.payload for e in session.trace.events(["artifact"])]
        first = call_id(model.cursor.tag, 0, 0)
        assert arts == [{"path": str(path), "mime": "image/png", "tool_call_id": first,
                         "id": path.stem}]
    finally:
        session.close()


def _dims(path: Path) -> str:
    from simagent.kernel.result import png_size

    w, h = png_size(path.read_bytes())
    return f"{w}x{h}"


def test_a_text_only_model_is_told_and_gets_the_summary(workspace: Path) -> None:
    session, model, _ = _run(workspace, PLOT_THEN_VIEW, multimodal=False)
    try:
        viewed = [m for m in model.requests[-1] if isinstance(m, ToolMessage)][-1]
        assert isinstance(viewed.content, str)
        assert viewed.content.startswith("view_figure: fig-")
        assert "was not sent: this model cannot be given images (it is not known to take " \
               "image input; set images = true in the [model] config" in viewed.content
        assert 'line "v": 3 pts, x 0…2, y 1…3 last 2' in viewed.content
    finally:
        session.close()


def test_an_unknown_figure_id_lists_the_known_ones(workspace: Path) -> None:
    steps = [PLOT_THEN_VIEW[0], {"tool": "view_figure", "args": {"figure_id": "fig-00000000"}},
             {"final": "ok"}]
    session, model, _ = _run(workspace, steps, multimodal=True)
    try:
        msg = [m for m in model.requests[-1] if isinstance(m, ToolMessage)][-1]
        known = next(session.paths.artifacts.glob("fig-*.png")).stem
        assert msg.content == ("view_figure: no figure 'fig-00000000' in this session. Ids "
                               f"look like fig-1a2b3c4d; the latest figures are: {known}")
    finally:
        session.close()


def test_image_support_reads_profiles_config_and_the_openai_endpoint(tmp_path: Path) -> None:
    keys = {"OPENAI_API_KEY": "k", "ANTHROPIC_API_KEY": "k"}
    assert image_support(resolve_model("anthropic:claude-sonnet-4-5", environ=keys)
                         .chat_model)[0] is True
    ok, why = image_support(resolve_model("openai:gpt-4.1", environ=keys).chat_model)
    assert not ok and "Chat Completions" in why
    local = "openai-compatible:llava@http://localhost:8000/v1"
    assert image_support(resolve_model(local, environ={}).chat_model)[0] is False
    assert image_support(resolve_model(local, model_config={"images": True},
                                       environ={}).chat_model)[0] is True
    script = tmp_path / "s.json"
    script.write_text('[{"final": "x"}]')
    assert image_support(resolve_model(f"scripted:{script}", model_config={"images": True})
                         .chat_model) == (True, "its profile accepts images in tool results")


# ------------------------------------------------------------------------- the TUI
def test_ctrl_o_on_a_figure_card_shows_the_png_path() -> None:
    caption = render_caption("fig-0123abcd", "/s/artifacts/fig-0123abcd.png", (556, 433),
                             {"axes": [{"x": {"label": "t (s)"}, "series": []}]})
    card = ToolCard("c1", "run_python", {"code": "plt.plot(x)"}, status="success",
                    elapsed_s=0.4, content=f"Out[1]: 3\n{caption}\n{caption}")

    def rows(expanded: bool) -> list[str]:
        return ["".join(t for _s, t in row) for row in render_card(card, 120, expanded, 0.0)]

    assert not any("▣" in r for r in rows(False))
    shown = rows(True)
    assert [r for r in shown if "▣" in r] == [
        "  ▣ fig-0123abcd 556x433  /s/artifacts/fig-0123abcd.png"]
    assert any(INLINE_IMAGES_NOTE[:40] in r for r in shown)


def test_a_large_figure_is_sent_scaled_to_the_provider_limit() -> None:
    from simagent.agent.tools import MAX_IMAGE_EDGE, _sendable_image
    from simagent.kernel.result import png_size

    fig, ax = plt.subplots(figsize=(8, 6), dpi=300)
    ax.plot([0, 1], [0, 1])
    big = _png(fig)
    plt.close(fig)
    assert png_size(big) == (2400, 1800)
    small, note = _sendable_image(big, "image/png")
    assert png_size(small) == (MAX_IMAGE_EDGE, 1176)
    assert note == f" (sent scaled to {MAX_IMAGE_EDGE}x1176)"
    assert _sendable_image(small, "image/png") == (small, "")  # small enough already
