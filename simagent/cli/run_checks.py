"""What ``simagent run`` and the TUI check before any heavy import: the workspace, the
prompt, the notebook paths, the config and the model spec's form.

``simagent.headless`` loads langchain and deepagents (seconds on a loaded machine), so a
typo answered after that import is answered late. Everything here reads only the standard
library and simagent's light base modules (``config``, ``models``, ``cli_input``), and
raises a one-line ``CliError`` (exit 2) before any session exists; ``tests/test_cli_errors_fast``
proves the path imports nothing heavy.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from simagent.cli.common import existing_workspace, writable_target
from simagent.cli_input import STDIN, read_prompt
from simagent.config import Config, ConfigError
from simagent.exit_codes import CliError
from simagent.models import ModelError, check_model_spec


def run_prompt(args: argparse.Namespace, decision: str | None) -> str:
    """The turn's prompt from ``PROMPT``, ``-``, piped standard input or ``--prompt-file``;
    refused when empty unless the run only decides a paused turn."""
    piped = not args.prompt and args.prompt_file is None and decision is None \
        and sys.stdin is not None and not sys.stdin.isatty()
    stdin = sys.stdin.buffer if sys.stdin is not None and (args.prompt == [STDIN] or piped) \
        else None
    prompt, source = read_prompt(args.prompt, args.prompt_file, stdin)
    if not prompt.strip() and decision is None:
        what = (f"an empty prompt from {source}" if source != "PROMPT"
                else "an empty PROMPT" if args.prompt else "no PROMPT")
        raise CliError(f"run got {what}: say what to do, e.g. simagent run 'plot sin(x)', "
                       "simagent run - < prompt.txt, or --prompt-file PATH "
                       "(or --approve/--reject with --resume)")
    return prompt


def session_config(args: argparse.Namespace, workspace: Path, *, need_model: bool) -> Config:
    """The config a session would load, with its approval and model spec checked (the
    model's form and the kind's light check: a ``scripted:`` file exists); ``need_model``:
    no model at all is an error too (the TUI lets one be chosen later)."""
    try:
        config = Config.load(workspace, trust=args.trust_workspace)
        config.approval_source(args.approval)
        config.check_numbers()
        spec, _where = config.model_spec(args.model)
    except ConfigError as exc:
        raise CliError(str(exc).splitlines()[0]) from exc
    if not spec:
        if need_model:
            raise CliError(config.missing_model_line())
        return config
    try:
        check_model_spec(spec)
    except ModelError as exc:
        raise CliError(str(exc), exc.code) from exc
    return config


def start_notebook(args: argparse.Namespace) -> Path | None:
    """The ``--from-notebook`` file, which must be a file (its content is validated after
    the heavy imports, by ``notebooks.load``)."""
    if args.notebook_writable and not args.from_notebook:
        raise CliError("--notebook-writable goes with --from-notebook PATH")
    if not args.from_notebook:
        return None
    path = Path(args.from_notebook).expanduser().absolute()
    if not path.exists():
        raise CliError(f"notebook {path} does not exist")
    if path.is_dir():
        raise CliError(f"notebook {path} is a folder, not a .ipynb file")
    return path


def check_session(args: argparse.Namespace, *, need_model: bool) -> Path:
    """The workspace (a folder), once the session's paths and config are checked."""
    workspace = existing_workspace(args.workspace)
    start_notebook(args)
    session_config(args, workspace, need_model=need_model)
    return workspace


def check_run(args: argparse.Namespace, decision: str | None) -> tuple[Path, str]:
    """``simagent run``'s workspace and prompt, every argument checked."""
    if decision and not (args.resume or args.continue_last):
        raise CliError("--approve/--reject continue a paused session: add --resume ID "
                       "or --continue")
    if args.reset_cost_ceiling and not (args.resume or args.continue_last):
        raise CliError("--reset-cost-ceiling clears the ceiling of an existing session: add "
                       "--resume ID or --continue")
    workspace = existing_workspace(args.workspace)
    prompt = run_prompt(args, decision)
    start_notebook(args)
    if args.notebook:
        writable_target(args.notebook)
    session_config(args, workspace, need_model=True)
    return workspace, prompt
