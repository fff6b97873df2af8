"""Exit codes of every command (design.md §3); the one home, read by cli, run and models."""

import json

OK = 0
FAILED = 1  # an unexpected internal error (reported in one line)
USAGE = 2  # usage or configuration error (missing API key, read-only state folder)
APPROVAL = 3  # the turn paused for approval
PROVIDER = 4  # model/provider error (provider package, HTTP, unreachable endpoint)
COST_CEILING = 5  # cost ceiling reached
KERNEL = 6  # the kernel could not start, or --kernel names no running kernel
NOTEBOOK = 7  # --from-notebook: a cell of the notebook failed (ctrl+C there is 130)
KERNEL_CONSENT = 8  # an attached kernel needs a restart that only its owner may allow
CANCELLED = 130  # Ctrl+C


class CliError(Exception):
    """A one-line error for the person, with the exit code to leave with. It lives with the
    codes so that every front end (cli, headless, tui) raises it without importing ``cli``."""

    def __init__(self, message: str, code: int = USAGE) -> None:
        super().__init__(message)
        self.code = code


def json_error(message: str, code: int) -> str:
    """The one JSON object a ``--json`` command prints on stdout when it ends without a
    report of its own, so a script always has something to parse: ``{"error",
    "exit_code"}``, the code being the process's exit status."""
    return json.dumps({"error": message, "exit_code": code})
