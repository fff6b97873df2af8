"""Confinement: the approval decision and the act resolve a path the same way.

The property (issue 26): for every file tool and every spelling of a path (``~``,
``~user``, ``..``, ``//``, absolute, links inside the workspace pointing out, unicode
lookalikes, trailing dots), the decision "goes ahead unasked" holds exactly when the path
the tool touches lies inside the workspace, and in ``workspace`` mode nothing outside
changes without approval. Many spellings run against the pure decision and the real
file back end; a representative set runs through the real graph (scripted model), for
the main agent and the general-purpose subagent.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from deepagents.backends.utils import validate_path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simagent.agent import confine
from simagent.agent.approval import FILE_WRITE_TOOLS, waits
from simagent.agent.backend import WorkspaceBackend, resolved_call
from simagent.agent.builder import build_agent
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.session import Session

TEXT = "alpha\n"
HEADS = ["", "./", "~/", "~/../", "{ws}/", "{ws}//", "/{ws}/", "{root}/", "{root}/out/",
         "{ws}/../", "../", "sub/../", "linkdir/", "linkdir/../", "//{root}/out/"]
MIDDLES = ["", "sub/", "linkdir/", "./", "../", "\uff53ub/", "\uff0e\uff0e/", "sub./",
           ".../", "sub//", "ws/"]
LASTS = ["new.txt", "a.txt", "f.txt", ".bashrc", "linkfile", "inlink", "x.",
         "\uff0e\uff0e", "", ".", "a.txt."]
SPELLING = st.builds(lambda h, m, last: h + m + last, st.sampled_from(HEADS),
                     st.sampled_from(MIDDLES), st.sampled_from(LASTS))


def make_tree(root: Path) -> tuple[Path, Path]:
    """root/{ws,out,home}: links inside the workspace point out (and in)."""
    ws, out, home = root / "ws", root / "out", root / "home"
    for d in (ws / "sub", out, home):
        d.mkdir(parents=True)
    for f in (ws / "sub" / "a.txt", ws / "a.txt", out / "f.txt", out / "a.txt",
              home / ".bashrc"):
        f.write_text(TEXT)
    (ws / "linkdir").symlink_to(out, target_is_directory=True)
    (ws / "linkfile").symlink_to(out / "f.txt")
    (ws / "inlink").symlink_to(ws / "sub" / "a.txt")
    return ws, home


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root``, links not followed: what it is and holds."""
    seen: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            if p.is_symlink():
                seen[str(p)] = "link:" + os.readlink(p)
            elif p.is_dir():
                seen[str(p)] = "dir"
            else:
                seen[str(p)] = "file:" + p.read_text(errors="replace")
    return seen


def changed(before: dict[str, str], after: dict[str, str]) -> set[Path]:
    return {Path(k) for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


def expected_target(raw: str, ws: Path, follow_last: bool) -> Path | None:
    """The spec, written apart from the code: shell tilde, the workspace for relative
    paths, links resolved; ``delete`` keeps a link in the last component."""
    if not raw or "\x00" in raw:
        return None
    p = os.path.expanduser(raw)
    if p.startswith("~"):
        return None  # an unknown ~user names no place
    p = p if os.path.isabs(p) else os.path.join(ws, p)
    head, last = os.path.split(p)
    if follow_last or last in ("", ".", ".."):
        return Path(os.path.realpath(p))
    return Path(os.path.realpath(head), last)


def act(tool: str, raw: str, ws: Path) -> None:
    """What the tool does with ``raw``: the path rewrite, deepagents' own check, the
    back end (errors are results, as the tool returns them)."""
    try:
        call = resolved_call({"name": tool, "args": {"file_path": raw}}, ws)
        path = validate_path(call["args"]["file_path"])
    except (OSError, ValueError):
        return
    backend = WorkspaceBackend(ws)
    if tool == "write_file":
        backend.write(path, "written\n")
    elif tool == "edit_file":
        backend.edit(path, "alpha", "edited")
    else:
        backend.delete(path)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spelling=SPELLING, tool=st.sampled_from(FILE_WRITE_TOOLS))
def test_the_decision_is_where_the_act_lands(tmp_path_factory, monkeypatch, spelling, tool):
    root = tmp_path_factory.mktemp("c").resolve()
    ws, home = make_tree(root)
    monkeypatch.setenv("HOME", str(home))
    raw = spelling.format(ws=ws, root=root)
    follow = confine.WRITE_TOOLS[tool][1]
    target = expected_target(raw, ws, follow)
    inside = target is not None and ws in target.parents
    args = {"file_path": raw}
    assert waits("workspace", tool, args, ws) is (not inside), (raw, target)
    assert waits("ask", tool, args, ws) and not waits("auto", tool, args, ws)
    if target is None or root not in target.parents:
        return  # never act outside this test's own folder
    before = snapshot(root)
    act(tool, raw, ws)
    moved = changed(before, snapshot(root))
    # the act touched the spec's path (and the folders a write creates), nothing else
    assert all(p == target or target in p.parents or p in target.parents for p in moved), \
        (raw, target, moved)
    if inside:  # it would have gone ahead unasked: nothing outside changed
        assert all(ws in p.parents for p in moved), (raw, moved)


@pytest.mark.parametrize("raw", ["~", "~/", "~root/x", "~nosuchuser-simagent/x", "",
                                 "a\x00b"])
def test_tilde_means_a_home_folder_and_an_unknown_user_names_no_place(raw, tmp_path,
                                                                      monkeypatch):
    ws, home = make_tree(tmp_path)
    monkeypatch.setenv("HOME", str(home))
    for tool in FILE_WRITE_TOOLS:
        assert waits("workspace", tool, {"file_path": raw}, ws)
    if raw.startswith("~nosuch") or not raw or "\x00" in raw:
        with pytest.raises(confine.PathError):
            confine.resolve(raw, ws)
    else:
        assert confine.resolve(raw, ws) == Path(os.path.expanduser(raw)).resolve()


def test_resolving_twice_changes_nothing(tmp_path, monkeypatch):
    """The decision reads the model's spelling, the act the rewritten path: both land
    on the same place because resolving a resolved path is a no-op."""
    ws, home = make_tree(tmp_path)
    monkeypatch.setenv("HOME", str(home))
    for head in HEADS:
        for mid in MIDDLES:
            for follow in (True, False):
                raw = (head + mid + "x.txt").format(ws=ws, root=tmp_path)
                once = confine.resolve(raw, ws, follow_last=follow)
                assert confine.resolve(str(once), ws, follow_last=follow) == once


# --------------------------------------------------------------- the real graph
def graph_cases(ws: Path, root: Path, tag: str) -> list[tuple[str, str, bool]]:
    """(tool, spelling, inside) for a representative set; file names unique per case."""
    cases: list[tuple[str, str, bool]] = []
    for tool in FILE_WRITE_TOOLS:
        n = f"{tag}-{tool}"
        if tool == "write_file":
            cases += [(tool, f"~/{n}.txt", False), (tool, f"~root/{n}-simagent-test.txt", False),
                      (tool, f"../out/{n}.txt", False), (tool, f"//{root}/out/{n}.txt", False),
                      (tool, f"linkdir/{n}.txt", False), (tool, "linkfile", False),
                      (tool, f"sub/../{n}.txt", True), (tool, f"\uff0e\uff0e/{n}.txt", True),
                      (tool, f"{ws}//sub/{n}.txt.", True)]
        else:
            for name in ("e1", "e2", "e3", "e4"):
                (root / "home" / f"{n}-{name}").write_text(TEXT)
                (root / "out" / f"{n}-{name}").write_text(TEXT)
                (ws / "sub" / f"{n}-{name}").write_text(TEXT)
            (ws / f"{n}-link").symlink_to(root / "out" / f"{n}-e4")
            cases += [(tool, f"~/{n}-e1", False), (tool, f"~/../out/{n}-e2", False),
                      (tool, f"linkdir/{n}-e3", False), (tool, f"sub/{n}-e1", True),
                      (tool, f"{ws}/sub/./{n}-e2", True),
                      # a link pointing out: edit changes its target, delete the link
                      (tool, f"{n}-link", tool == "delete")]
    return cases


def step(tool: str, raw: str) -> dict:
    args: dict = {"file_path": raw}
    if tool == "write_file":
        args["content"] = "written\n"
    elif tool == "edit_file":
        args.update(old_string="alpha", new_string="edited")
    return {"tool": tool, "args": args}


@pytest.mark.parametrize("agent", ["main", "general-purpose"])
def test_through_the_graph_outside_waits_and_nothing_outside_changes(agent, tmp_path,
                                                                     monkeypatch):
    root = tmp_path.resolve()
    ws, home = make_tree(root)
    monkeypatch.setenv("HOME", str(home))
    cases = graph_cases(ws, root, agent)
    calls = {"tools": [step(t, raw) for t, raw, _ in cases]}
    if agent == "main":
        steps = [calls, {"final": "done"}]
    else:
        steps = [{"tool": "task", "args": {"description": "change files",
                                           "subagent_type": "general-purpose"},
                  "steps": [calls, {"final": "sub done"}]}, {"final": "done"}]
    session = Session.create(ws, approval="workspace")
    stray = [Path(os.path.expanduser(raw)) for _t, raw, _i in cases if raw.startswith("~root")]
    try:
        runner = TurnRunner(session, build_agent(session, ScriptedChatModel.from_steps(steps)))
        outside_before = {k: v for k, v in snapshot(root).items()
                          if ws not in Path(k).parents}
        result = runner.run("change files")
        assert result.status == "paused"
        requests = [r for i in runner.pending_interrupts() for r in i.action_requests]
        shown = [(r["name"], r["args"]["file_path"]) for r in requests]
        want = [(t, str(expected_target(raw, ws, confine.WRITE_TOOLS[t][1])))
                for t, raw, inside in cases if not inside]
        # exactly the outside calls wait, each showing the real path it would touch
        assert shown == want
        pending = runner.pending_interrupts()
        decisions = {p.interrupt_id: [{"type": "reject", "message": "no"}
                                      for _ in p.action_requests] for p in pending}
        assert runner.resume(decisions if len(pending) > 1 else
                             next(iter(decisions.values()))).status == "done"
        after = snapshot(root)
        assert {k: v for k, v in after.items() if ws not in Path(k).parents} == outside_before
        assert not any(p.exists() for p in stray)
        # ... while the inside ones went ahead unasked
        for tool, raw, inside in cases:
            if not inside:
                continue
            target = expected_target(raw, ws, confine.WRITE_TOOLS[tool][1])
            if tool == "write_file":
                assert target.read_text() == "written\n", raw
            elif tool == "edit_file":
                assert target.read_text() == "edited\n", raw
            else:
                assert not target.exists() and not target.is_symlink(), raw
    finally:
        session.close()
        for p in stray:
            p.unlink(missing_ok=True)
