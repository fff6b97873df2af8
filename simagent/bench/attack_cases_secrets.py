"""Secrets at rest: a value that reached the kernel (a variable, a printed key, a key
split by a colour code, an attached kernel's own token, an MCP server's stderr) must not
be found in plain text under the state home, the workspace's ``.simagent/`` or an
export; every file simagent writes is private.

The lab reads every planted value after each row (``attack_bench``); these rows make
the value travel, and check that it did reach what they test (a card was sent, an
export was written), so a row cannot hold by not trying.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from jupyter_client import BlockingKernelClient

from simagent import exit_codes
from simagent.bench.attack_bench import AttackCase
from simagent.bench.attack_cases_reach import hostile_server, mcp_log
from simagent.bench.attack_lab import (
    CELL_PASSWORD,
    DSN_PASSWORD,
    FAKE_KEY,
    FAKE_KEY_VAR,
    FINAL,
    KERNEL_TOKEN,
    KERNEL_TOKEN_VAR,
    PASSWORD_VAR,
    Lab,
    Verdict,
    cell,
    stop_group,
    verdict,
)

#: A window and settings that make the kernel results of a short run clear, so a state
#: card is sent (every card in full).
CARD_CONFIG = """[model]
window = 30000

[context]
summarize = false
state_card_updates = false
"""
#: Cells of long output that fill the 30k window.
FILLER_CELLS, FILLER_CHARS = 20, 3000
#: The cell that takes a password and a database URL into variables from files (the
#: values are in no cell's code and no environment simagent reads).
CELL_SECRETS_CODE = ("db_password = open(r'{root}/pgpass').read().strip()\n"
                     "dsn = 'postgresql://lab:' + open(r'{root}/dsnpass').read().strip() + "
                     "'@db.example/runs'\nprint('connected')")
PRINT_SECRETS = (f"import os\nprint('key', os.environ[{FAKE_KEY_VAR!r}], 'password', "
                 f"os.environ[{PASSWORD_VAR!r}])")
#: The key split by an ANSI colour code: whole on a terminal, two pieces in the bytes.
PRINT_SPLIT = (f"import os\nk = os.environ[{FAKE_KEY_VAR!r}]\n"
               "print('key', k[:9] + '\\x1b[31m' + k[9:] + '\\x1b[0m')")
#: ``jupyter kernel``, as a person starts a kernel beside their notebook.
JUPYTER_KERNEL = "from jupyter_client.kernelapp import main; main()"
#: Seconds an attached kernel gets to start and answer.
KERNEL_START_S = 90


def _card(lab: Lab) -> Verdict:
    """A cell reads a password and a database URL with one into variables, never
    printing them; long results then clear and a state card is sent."""
    lab.user_config(CARD_CONFIG)
    (lab.root / "pgpass").write_text(CELL_PASSWORD + "\n")
    (lab.root / "dsnpass").write_text(DSN_PASSWORD + "\n")
    fill = [cell(f"print('R{i}', 'v' * {FILLER_CHARS})") for i in range(FILLER_CELLS)]
    ran = lab.run([cell(CELL_SECRETS_CODE), *fill, FINAL],
                  approval="auto")
    cards = len(lab.events("context_state_card"))
    return verdict({"a state card was sent": cards > 0, "the run ends": ran.rc == 0},
                   [f"{cards} state card(s) sent", ran.said])


def _printed(lab: Lab) -> Verdict:
    """A key in the prompt, printed by a cell and quoted back; then the session is
    exported as a notebook and as transcripts."""
    ran = lab.run([cell(PRINT_SECRETS), {"final": "the key is {out[-1]}"}],
                  prompt=f"use my key {FAKE_KEY} and print the keys you see")
    exports = {name: lab.simagent(command, "-o", str(lab.exports / name))
               for name, command in (("session.ipynb", "notebook"),
                                     ("session.md", "transcript"),
                                     ("session.html", "transcript"))}
    made = [n for n in exports if (lab.exports / n).is_file()]
    return verdict({"the run ends": ran.rc == 0, "every export was written": len(made) == 3},
                   [f"printed and quoted ({ran.said})",
                    f"exported {', '.join(made) or 'nothing'}"])


def _ansi(lab: Lab) -> Verdict:
    ran = lab.run([cell(PRINT_SPLIT), {"final": "{out[-1]}"}])
    shown = FAKE_KEY in ran.out or FAKE_KEY in ran.err
    return verdict({"the run ends": ran.rc == 0, "the terminal gets no key": not shown},
                   [ran.said, "the key " + ("SHOWN" if shown else "not shown") +
                    " on the terminal"])


@contextlib.contextmanager
def attached_kernel(lab: Lab) -> Iterator[Path | None]:
    """A kernel the person runs (``jupyter kernel``) with a token in its own environment
    only; its connection file, or None when it did not answer in time."""
    path = lab.root / "runtime" / "kernel-attack.json"
    path.parent.mkdir()
    env = {**lab.env, KERNEL_TOKEN_VAR: KERNEL_TOKEN, "JUPYTER_RUNTIME_DIR": str(path.parent)}
    for var in (FAKE_KEY_VAR, PASSWORD_VAR):  # the kernel's secret is its own
        env.pop(var, None)
    log = open(lab.root / "jupyter-kernel.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-c", JUPYTER_KERNEL,
                             f"--KernelManager.connection_file={path}"], env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield path if _answers(path, proc) else None
    finally:
        stop_group(proc)
        log.close()


def _answers(path: Path, proc: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + KERNEL_START_S
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if not path.exists():
        return False
    kc = BlockingKernelClient(connection_file=str(path))
    kc.load_connection_file()
    kc.start_channels()
    try:
        while time.monotonic() < deadline:
            try:
                kc.wait_for_ready(timeout=max(1.0, deadline - time.monotonic()))
                return True
            except RuntimeError:  # its file is written before it binds: try again
                time.sleep(0.2)
        return False
    finally:
        kc.stop_channels()


def _kernel_env(lab: Lab) -> Verdict:
    with attached_kernel(lab) as connection:
        if connection is None:
            return Verdict(False, "the attached kernel did not start: " +
                           (lab.root / "jupyter-kernel.log").read_text()[-160:])
        ran = lab.run([cell(f"import os\nprint('token', os.environ[{KERNEL_TOKEN_VAR!r}])"),
                       {"final": "{out[-1]}"}], "--kernel", str(connection),
                      approval="auto")
    shown = KERNEL_TOKEN in ran.out or KERNEL_TOKEN in ran.err
    return verdict({"the run ends": ran.rc == exit_codes.OK,
                    "the terminal gets no token": not shown},
                   [ran.said, "the token " + ("SHOWN" if shown else "not shown") +
                    " on the terminal"])


def _private_files(lab: Lab) -> Verdict:
    """A session that writes every kind of file: an MCP server's log and image, a
    figure, a long raw output, an exported notebook."""
    hostile_server(lab, "--stderr-key")
    figure = ("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()\n"
              "for i in range(3000):\n    print('row', i)")
    ran = lab.run([{"tool": "lab__picture", "args": {}}, cell(figure), FINAL],
                  "--notebook", str(lab.exports / "session.ipynb"), approval="auto")
    loose = lab.loose_modes()
    files = sum(1 for p in lab.state.rglob("*") if p.is_file())
    return verdict({"the run ends": ran.rc == 0,
                    "no file has group/other bits, every folder is 0700": not loose},
                   [f"{len(loose)} of {files} entries loose" +
                    (f": {', '.join(loose[:4])}" if loose else ""), ran.said])


CASES = [
    AttackCase("secret-card", "secrets",
               "a cell reads a password and a database URL with one into variables, never "
               "printing them; a state card is sent",
               "the card names the variables, not their values", _card, fast=True),
    AttackCase("secret-printed", "secrets",
               "a key in the prompt, printed by a cell, quoted in the answer; the session "
               "exported (`simagent notebook -o`, `simagent transcript -o`)",
               "no key in plain text at rest or in an export", _printed),
    AttackCase("secret-ansi", "secrets", "a cell prints a key split by an ANSI colour code",
               "redacted after the escape codes are read, on the terminal and at rest",
               _ansi, fast=True),
    AttackCase("secret-kernel-env", "secrets",
               f"an attached kernel (`--kernel`) whose own environment holds "
               f"{KERNEL_TOKEN_VAR}; a cell prints it",
               "redacted: no token on the terminal or at rest", _kernel_env, fast=True),
    AttackCase("secret-mcp-log", "secrets",
               "an MCP tool server writes a key to its stderr",
               "its log (mcp-NAME.log) is redacted and 0600",
               mcp_log),
    AttackCase("permissions", "permissions",
               "a session writes an MCP log and image, a figure, a long output and a notebook",
               "every file under the state home is 0600, every folder 0700",
               _private_files, fast=True),
]
