"""simagent as a jupyter-ai 3 persona: ``simagent acp`` in JupyterLab's chat, working in
the kernel of the notebook beside the chat.

jupyter-ai-acp-client runs the agent (one process per persona, one ACP session per chat,
cwd = the chat's folder) and renders its updates. What this module adds:

* the kernel: jupyter-ai tells a persona nothing of notebooks, so at each message the
  persona reads the server's session manager, picks the notebook's kernel
  (``kernel_choice.choose``), and names its connection file in the prompt's ``_meta``
  (``simagent.kernel``); ``simagent acp`` attaches to it as ``--kernel`` does, so the
  person's variables and the agent's share one namespace. The client library has no
  hook for a prompt's ``_meta``; :class:`KernelMetaClient` wraps the one call that sends
  ``session/prompt`` and leaves every other call untouched.
* ``/notebook`` (no argument): the session's cells with their outputs go into that
  notebook below its active cell. Without real-time collaboration the notebook's live
  model is the browser's, so the persona saves it through JupyterLab's commands
  (jupyterlab-commands-toolkit, which jupyter-ai ships), inserts the cells in the file
  through the server's contents manager, and has JupyterLab reload it from disk (no
  "file changed" warning: the reload comes after a save). ``/notebook PATH`` goes to the
  agent, which writes the session as a notebook file of its own.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from acp.schema import (
    AgentMessageChunk,
    AgentPlanUpdate,
    AgentThoughtChunk,
    ToolCallProgress,
    ToolCallStart,
    UserMessageChunk,
)
from jupyter_ai_acp_client.base_acp_persona import BaseAcpPersona
from jupyter_ai_acp_client.default_acp_client import JaiAcpClient
from jupyter_ai_persona_manager import PersonaDefaults, PersonaRequirementsUnmet
from jupyter_server.serverapp import ServerApp
from jupyter_server.utils import ensure_async
from jupyterlab_chat.models import Message
from jupyterlab_commands_toolkit.tools import emit_and_wait_for_result

from simagent.jupyter.kernel_choice import KernelChoice, choose
from simagent.jupyter.notebook_cells import agent_cells, insert_below
from simagent.kernel.connection import KERNEL_META
from simagent.notebooks.export import ExportError, build
from simagent.paths import SessionPaths

AVATAR = Path(__file__).with_name("static") / "simagent.svg"
#: The updates a session's history is replayed as on ``session/load``.
REPLAYED = (UserMessageChunk, AgentMessageChunk, AgentThoughtChunk, ToolCallStart,
            ToolCallProgress, AgentPlanUpdate)
#: How long a JupyterLab command may take to answer (no browser, or one without the
#: commands extension, answers never).
LAB_WAIT_S = 3.0
#: Tries at having JupyterLab reload a notebook /notebook changed, and the pause between
#: making it current and reloading it.
RELOAD_TRIES = 3
RELOAD_SETTLE_S = 0.3
#: How long ``simagent acp --help`` may take when the server loads the persona.
_CHECK_S = 30.0
NOTEBOOK = "/notebook"


def agent_command() -> list[str]:
    """``simagent acp`` of the interpreter the server runs on: its venv's ``simagent``
    script, else ``python -m simagent``."""
    script = Path(sys.executable).with_name("simagent")
    base = [str(script)] if os.access(script, os.X_OK) else [sys.executable, "-m", "simagent"]
    return [*base, "acp"]


def _check() -> None:
    """Hide the persona (jupyter-ai logs one warning) when ``simagent acp`` cannot run."""
    try:
        done = subprocess.run([*agent_command(), "--help"], capture_output=True, text=True,
                              timeout=_CHECK_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PersonaRequirementsUnmet(f"simagent acp does not run: {exc}") from exc
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise PersonaRequirementsUnmet(f"simagent acp does not run: {why}")


_check()


class _MetaPrompt:
    """A client connection whose ``prompt`` adds the session's ``_meta``; everything
    else is the connection's own."""

    def __init__(self, conn: Any, meta: dict[str, dict[str, str]]) -> None:
        self._conn = conn
        self._meta = meta

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> Any:
        extra = {**self._meta.get(session_id, {}), **kwargs}
        return await self._conn.prompt(session_id=session_id, prompt=prompt, **extra)


class KernelMetaClient(JaiAcpClient):
    """jupyter-ai's ACP client, with a ``_meta`` per session on each ``session/prompt``,
    and a loaded session's history kept out of the chat that already shows it.

    ``session/load`` (a chat reopened, a page reloaded) has the agent send the session's
    history again, as ACP asks. jupyter-ai keeps the chat itself and means to drop those
    updates while the load runs, but acp 0.11's client can finish the load's request
    before it handles the notifications sent ahead of its answer, and the history then
    lands in the chat a second time. Between a load and the session's next prompt the
    agent sends nothing of its own but commands and modes, so the conversation's updates
    of that span are the replay, and are dropped here."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.prompt_meta: dict[str, dict[str, str]] = {}
        self._replaying: set[str] = set()
        super().__init__(*args, **kwargs)

    async def get_connection(self) -> Any:
        return _MetaPrompt(await super().get_connection(), self.prompt_meta)

    async def load_session(self, persona: Any, session_id: str) -> Any:
        self._replaying.add(session_id)
        return await super().load_session(persona, session_id)

    async def prompt_and_reply(self, session_id: str, *args: Any, **kwargs: Any) -> Any:
        self._replaying.discard(session_id)
        return await super().prompt_and_reply(session_id, *args, **kwargs)

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        if session_id in self._replaying and isinstance(update, REPLAYED):
            return
        await super().session_update(session_id, update, **kwargs)


async def lab_command(name: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run a JupyterLab command in the browser and return its answer (``success``,
    ``result`` or ``error``); a browser that does not answer is an error after
    :data:`LAB_WAIT_S`."""
    answer = await emit_and_wait_for_result({"name": name, "args": args or {}},
                                            timeout=LAB_WAIT_S)
    return answer if isinstance(answer, dict) else {"success": False, "error": str(answer)}


async def notebook_info(path: str) -> dict[str, Any]:
    """What JupyterLab says of the notebook at ``path`` (active cell, cell count, unsaved
    changes); empty when it does not answer."""
    info = await lab_command("jupyterlab-ai-commands:get-notebook-info", {"notebookPath": path})
    result = info.get("result") if info.get("success") else None
    return result if isinstance(result, dict) else {}


def first_line(choice: KernelChoice) -> str | None:
    """What the chat is told of its kernel at the first prompt; None when simagent says
    it itself (no notebook runs in the folder: it starts its own and says so)."""
    if choice.kernel_id:
        return f"simagent works in the kernel of {choice.why}"
    if choice.notebook or choice.ambiguous:
        return (f"simagent: {choice.why}, so it works in a kernel of its own; to work in a "
                "notebook's kernel, name the notebook in the first message of a new chat")
    return None


class SimagentPersona(BaseAcpPersona):
    """simagent in JupyterLab's chat (the ``jupyter`` extra's entry point)."""

    acp_client_class = KernelMetaClient

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, executable=agent_command(), **kwargs)
        self._first: KernelChoice | None = None  # the kernel choice of the first prompt
        self._moved: str | None = None  # the other notebook last pointed out

    @property
    def defaults(self) -> PersonaDefaults:
        return PersonaDefaults(
            name="simagent",
            description=("A simulation assistant that runs Python in the kernel of the "
                         "notebook beside this chat; /notebook puts its cells there."),
            avatar_path=str(AVATAR),
            # simagent acp brings its own system prompt; jupyter-ai's is not sent
            system_prompt="unused: simagent acp has its own",
        )

    async def process_message(self, message: Message) -> None:
        choice = await self.kernel_choice(message)
        if message.body.strip() == NOTEBOOK:
            first = self._first
            await self.insert_cells(first if first is not None and first.notebook else choice)
            return
        if self._first is None:  # the session's kernel is settled at its first prompt
            self._first = choice
            client = await self.get_client()
            session_id = await self.get_session_id()
            if choice.kernel_id is not None and \
                    (path := self._connection_file(choice.kernel_id)):
                client.prompt_meta[session_id] = {KERNEL_META: path}
            if line := first_line(choice):
                self.send_message(line)
        elif choice.kernel_id and choice.kernel_id != self._first.kernel_id \
                and choice.notebook != self._moved:
            self._moved = choice.notebook
            now = (f"the kernel of {self._first.notebook}" if self._first.kernel_id
                   else "a kernel of its own")
            self.send_message(f"simagent: this chat stays in {now} (a session keeps the "
                              f"kernel of its first prompt); a new chat beside "
                              f"{choice.notebook} works in its kernel")
        await super().process_message(message)

    async def kernel_choice(self, message: Message) -> KernelChoice:
        """The notebook kernel for ``message`` (:func:`kernel_choice.choose`): JupyterLab
        is asked for its active notebook only when the folder alone does not decide."""
        sessions = await ensure_async(ServerApp.instance().session_manager.list_sessions())
        chat = self.get_chat_path(relative=True)
        attached = self._attached(message)
        choice = choose(sessions, chat, attached=attached, message=message.body)
        if choice.ambiguous and not attached:
            active = await self.active_notebook()
            if active:
                choice = choose(sessions, chat, attached=attached, message=message.body,
                                active=active)
        return choice

    async def active_notebook(self) -> str | None:
        """The notebook JupyterLab has current (the last one focused), if it says."""
        info = await lab_command("jupyterlab-ai-commands:get-notebook-info")
        result = info.get("result") if info.get("success") else None
        path = result.get("notebookPath") if isinstance(result, dict) else None
        return str(path) if path else None

    def _attached(self, message: Message) -> list[str]:
        found = self.chat.get_attachments() if message.attachments else {}
        paths = []
        for aid in message.attachments or []:
            att = found.get(aid)
            value = getattr(att, "value", None) if att is not None else None
            if value is None and isinstance(att, dict):
                value = att.get("value")
            if value:
                paths.append(str(value))
        return paths

    @staticmethod
    def _connection_file(kernel_id: str) -> str | None:
        try:
            return str(ServerApp.instance().kernel_manager.get_kernel(kernel_id)
                       .connection_file) or None
        except KeyError:  # ended since list_sessions
            return None

    async def insert_cells(self, choice: KernelChoice) -> None:
        """``/notebook``: the session's cells, with their outputs, below the active cell
        of the chat's notebook (the one whose kernel the session works in)."""
        target = choice.notebook or await self.active_notebook()
        if not target:
            self.send_message(f"/notebook: no notebook to put the cells in ({choice.why}); "
                              "open one beside the chat, or name it")
            return
        try:
            session_id = await self.get_session_id()
            folder = SessionPaths.for_session(self.get_chat_dir(), session_id).root
            export, _plan = await asyncio.to_thread(build, folder)
        except (ExportError, OSError, AssertionError) as exc:
            self.send_message(f"/notebook: nothing to insert yet ({exc})")
            return
        cells = agent_cells(export)
        # revealed first: JupyterLab answers for the notebook's live widget only then
        await lab_command("docmanager:open", {"path": target})
        info = await notebook_info(target)
        if info.get("isDirty"):  # the person's unsaved edits go to disk first
            await lab_command("jupyterlab-ai-commands:save-notebook", {"notebookPath": target})
        contents = ServerApp.instance().contents_manager
        model = await ensure_async(contents.get(target, content=True, type="notebook"))
        nb = model["content"]
        added = insert_below(nb, cells, info.get("activeCellId"))
        shown = True
        if added:
            await ensure_async(contents.save({"type": "notebook", "format": "json",
                                              "content": nb}, target))
            shown = await self._reload(target, len(nb["cells"]))
        where = "below the active cell" if info.get("activeCellId") else "at the end"
        self.send_message(
            f"/notebook: {added} cell{'s' * (added != 1)} of session {session_id} put into "
            f"{target} {where}, with {'its output' if added == 1 else 'their outputs'}"
            + (f" ({len(cells) - added} already there)" if len(cells) > added else "")
            + ("" if shown else "; JupyterLab did not reload it: File > Reload Notebook "
                                "from Disk shows them"))

    @staticmethod
    async def _reload(target: str, cells: int) -> bool:
        """Have JupyterLab reload ``target`` from disk, and check it did (its cell count).
        ``docmanager:reload`` acts on the current widget, which ``docmanager:open``
        makes the notebook once the browser's focus follows; hence the check and tries.
        A notebook edited meanwhile is left to the person (JupyterLab asks before it
        reloads one with unsaved changes)."""
        for attempt in range(RELOAD_TRIES):
            if attempt:
                await lab_command("docmanager:open", {"path": target})
                await asyncio.sleep(RELOAD_SETTLE_S)
            await lab_command("docmanager:reload")
            info = await notebook_info(target)
            if info.get("cellCount") == cells:
                return True
            if info.get("isDirty"):
                return False
        return False
