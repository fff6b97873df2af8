"""Which notebook's kernel a JupyterLab chat works in (simagent/jupyter/kernel_choice.py):
the server's sessions list as ``SessionManager.list_sessions()`` gives it, pure."""

from __future__ import annotations

from simagent.jupyter.kernel_choice import choose, running_notebooks


def session(path: str, kid: str | None, kind: str = "notebook") -> dict:
    return {"id": f"s-{path}", "path": path, "name": path.rsplit("/", 1)[-1], "type": kind,
            "kernel": {"id": kid, "name": "python3"} if kid else None,
            "notebook": {"path": path, "name": path.rsplit("/", 1)[-1]}}


SESSIONS = [session("fit.ipynb", "k-fit"), session("lab/a.ipynb", "k-a"),
            session("lab/b.ipynb", "k-b"), session("other/a.ipynb", "k-oa"),
            session("console-1", "k-con", kind="console"), session("lab/dead.ipynb", None)]


def test_running_notebooks_keeps_notebooks_with_a_kernel():
    assert [(r.path, r.kernel_id) for r in running_notebooks(SESSIONS)] == [
        ("fit.ipynb", "k-fit"), ("lab/a.ipynb", "k-a"), ("lab/b.ipynb", "k-b"),
        ("other/a.ipynb", "k-oa")]


def test_the_chat_folders_single_notebook():
    c = choose(SESSIONS, "chat.chat")
    assert (c.notebook, c.kernel_id) == ("fit.ipynb", "k-fit")
    assert "the one notebook running in the chat's folder" in c.why


def test_several_in_the_folder_is_no_choice_and_says_which():
    c = choose(SESSIONS, "lab/x.chat")
    assert (c.notebook, c.kernel_id) == (None, None)
    assert "2 notebooks run" in c.why and "lab/a.ipynb, lab/b.ipynb" in c.why
    assert c.ambiguous and "none is named or open beside the chat" in c.why


def test_none_running_in_the_folder():
    c = choose(SESSIONS, "empty/x.chat")
    assert c.kernel_id is None and not c.ambiguous
    assert "no notebook runs a kernel in the chat's folder (empty)" in c.why
    assert choose([], "x.chat").why == "no notebook runs a kernel in the chat's folder (the root)"


def test_an_attached_notebook_wins():
    c = choose(SESSIONS, "lab/x.chat", attached=["other/a.ipynb"], message="use b.ipynb",
               active="lab/a.ipynb")
    assert (c.notebook, c.kernel_id) == ("other/a.ipynb", "k-oa")
    assert c.why == "other/a.ipynb: attached to the message"


def test_an_attached_notebook_without_a_kernel_is_no_kernel():
    c = choose(SESSIONS, "lab/x.chat", attached=["lab/dead.ipynb"])
    assert (c.notebook, c.kernel_id) == ("lab/dead.ipynb", None)
    assert "runs no kernel" in c.why
    # a file attachment is not a notebook: the folder rule decides
    assert choose(SESSIONS, "x.chat", attached=["data.csv"]).kernel_id == "k-fit"


def test_named_by_file_name_prefers_the_chats_folder():
    c = choose(SESSIONS, "lab/x.chat", message="what is k in a.ipynb?")
    assert (c.notebook, c.kernel_id) == ("lab/a.ipynb", "k-a")
    c = choose(SESSIONS, "lab/x.chat", message="look at other/a.ipynb please")
    assert c.kernel_id == "k-oa" and c.why == "other/a.ipynb: named in the message"


def test_named_file_name_shared_outside_the_folder_is_ambiguous():
    c = choose(SESSIONS, "elsewhere/x.chat", message="a.ipynb")
    assert c.kernel_id is None and c.ambiguous and "without its folder" in c.why


def test_active_notebook_counts_in_the_chats_folder_only():
    c = choose(SESSIONS, "lab/x.chat", active="lab/b.ipynb")
    assert (c.notebook, c.kernel_id, c.why) == ("lab/b.ipynb", "k-b",
                                               "lab/b.ipynb: open beside the chat")
    # active elsewhere: the folder rule (two here: none)
    assert choose(SESSIONS, "lab/x.chat", active="fit.ipynb").kernel_id is None
    # active without a kernel: the folder rule
    assert choose(SESSIONS, "lab/x.chat", active="lab/dead.ipynb").kernel_id is None


def test_paths_are_normalised():
    c = choose([session("/lab/a.ipynb", "k")], "./lab/x.chat", message="")
    assert (c.notebook, c.kernel_id) == ("lab/a.ipynb", "k")
