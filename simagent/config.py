"""Configuration: workspace ``.simagent/config.toml`` over user ``<home>/config.toml``.

Settings are plain TOML tables; later layers (context thresholds, prices, bench) read
their own sections through :meth:`Config.section`, so this module never needs to know
them. The model is resolved in the order design.md §3 fixes: ``--model``,
``$SIMAGENT_MODEL``, workspace config, user config; the first that is set wins.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simagent import workspace_trust
from simagent.paths import state_home, trust_store_path, workspace_config_path

APPROVAL_MODES = ("ask", "workspace", "auto")
#: The default: work inside the workspace freely, ask before the shell and before
#: changing files elsewhere (``approval.MODE_HELP`` says what each mode gates).
DEFAULT_APPROVAL = "workspace"
MODEL_ENV = "SIMAGENT_MODEL"
#: ``[answers] check_numbers`` values, the default first (``agent/number_check.py``).
CHECK_NUMBERS = ("nudge", "mark", "off")
#: An existing Dask scheduler for ``ensemble`` (wins over ``[ensembles] scheduler``).
SCHEDULER_ENV = "SIMAGENT_DASK_SCHEDULER"
#: Workers of the session's local Dask cluster (wins over ``[ensembles] workers``).
WORKERS_ENV = "SIMAGENT_DASK_WORKERS"
#: The local Dask cluster's dashboard, off unless asked for (``[ensembles] dashboard``).
DASHBOARD_ENV = "SIMAGENT_DASK_DASHBOARD"


@dataclass
class SessionOptions:
    """The session flags every interface takes (``--model --sim --resume --continue
    --approval --workspace --kernel``), in one place for ``simagent run`` and the TUI."""

    workspace: Path
    model: str | None = None
    simulator: str | None = None
    resume: str | None = None
    continue_last: bool = False
    approval: str | None = None
    #: ``--from-notebook``: run this notebook's cells first (a new session only).
    from_notebook: Path | None = None
    notebook_writable: bool = False
    #: ``--kernel``: a running kernel to attach to (connection file, kernel id, ``latest``)
    kernel: str | None = None
    #: ``--trust-workspace``: trust the folder's config as it is now (``workspace_trust``)
    trust_workspace: bool = False

    @property
    def resuming(self) -> bool:
        return bool(self.resume or self.continue_last)


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the key."""


def user_config_path() -> Path:
    return state_home() / "config.toml"


def _read_bytes(path: Path) -> bytes | None:
    if not path.is_file():
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc


def _parse(content: bytes | None, path: Path) -> dict[str, Any]:
    if content is None:
        return {}
    try:
        return workspace_trust.parse(content, path)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _holds(data: Mapping[str, Any], path: tuple[str, ...]) -> bool:
    """Whether ``data`` sets the key ``path`` names, table by table."""
    for key in path:
        if not isinstance(data, Mapping) or key not in data:
            return False
        data = data[key]
    return True


@dataclass(frozen=True)
class Config:
    """Merged settings plus where each top-level layer came from."""

    data: dict[str, Any] = field(default_factory=dict)
    #: The workspace layer in force: empty while the folder's config is not trusted.
    workspace_data: dict[str, Any] = field(default_factory=dict)
    user_data: dict[str, Any] = field(default_factory=dict)
    #: Where the workspace's config stands (``workspace_trust``); its ``ignored_line`` is
    #: what a command prints while it runs without it.
    trust: workspace_trust.Trust | None = None

    @classmethod
    def load(cls, workspace: str | os.PathLike[str], *, trust: bool = False,
             record: bool = True) -> Config:
        """The user's config, with the workspace's over it once that folder is trusted
        with that content (``trust``: ``--trust-workspace``, recorded for later unless
        ``record`` is False)."""
        user_path = user_config_path()
        user = _parse(_read_bytes(user_path), user_path)
        ws_path = workspace_config_path(workspace)
        content = _read_bytes(ws_path)
        parsed = _parse(content, ws_path)
        try:
            state = workspace_trust.standing(workspace, parsed, content, trust_now=trust,
                                             record=record)
        except OSError as exc:  # the store could not be written
            raise ConfigError(f"{trust_store_path()}: cannot record the trust: "
                              f"{exc.strerror or exc}") from exc
        ws = {} if state.ignored else parsed
        return cls(_merge(user, ws), ws, user, state)

    @property
    def ignored_line(self) -> str | None:
        """One line for stderr while the workspace's config is ignored, else None."""
        return workspace_trust.ignored_line(self.trust) if self.trust and \
            self.trust.ignored else None

    def source(self, key: str, *inner: str) -> str:
        """The file a top-level ``key`` came from (the workspace's wins), for error lines
        that name the file to fix; with ``inner``, the file that set ``[key] inner...``,
        since a table merged from both files holds keys of each."""
        layers = ((self.workspace_data,
                   str(self.trust.path if self.trust else workspace_config_path("."))),
                  (self.user_data, str(user_config_path())))
        for path in ((key, *inner), (key,)):
            for layer, name in layers:
                if _holds(layer, path):
                    return name
        return "config"

    def where(self, section: str, key: str | None = None) -> str:
        """How an error line about ``[section] key`` starts: the file that set it, then
        the table (``models.resolve_model`` takes it for ``[model]``)."""
        return f"{self.source(section, *([key] if key else []))}: [{section}]"

    def section(self, name: str) -> dict[str, Any]:
        value = self.data.get(name, {})
        if not isinstance(value, dict):
            raise ConfigError(f"{self.source(name)}: [{name}] must be a table")
        return value

    def missing_model_line(self) -> str:
        """What to do when no ``--model``, ``$SIMAGENT_MODEL`` or config names a model."""
        untrusted = (" (this folder's .simagent/config.toml is not trusted, so its model is "
                     "not read: 'simagent trust' shows it)" if self.ignored_line else "")
        return (f"no model configured{untrusted}: pass --model provider:model (e.g. "
                "anthropic:claude-sonnet-4-5), set $SIMAGENT_MODEL, or put model = \"...\" in "
                ".simagent/config.toml; scripted:PATH plays a script without a key")

    def model_spec(self, cli_value: str | None = None,
                   environ: Mapping[str, str] | None = None) -> tuple[str | None, str]:
        """The model string and where it came from (for messages and `/model`)."""
        env = os.environ if environ is None else environ
        if cli_value:
            return cli_value, "--model"
        if env.get(MODEL_ENV):
            return env[MODEL_ENV], f"${MODEL_ENV}"
        for layer, where in ((self.workspace_data, "workspace config"),
                             (self.user_data, "user config")):
            model = layer.get("model")
            spec = model.get("id") if isinstance(model, dict) else model
            if spec:
                return str(spec), where
        return None, "unset"

    @property
    def model_settings(self) -> dict[str, Any]:
        """The ``[model]`` table (window, num_ctx, api_key_env ...), if ``model`` is a table."""
        model = self.data.get("model")
        return dict(model) if isinstance(model, dict) else {}

    def simulator(self, cli_value: str | None = None) -> str | None:
        return cli_value or self.data.get("simulator") or None

    def approval(self, cli_value: str | None = None) -> str:
        return self.approval_source(cli_value)[0]

    def approval_source(self, cli_value: str | None = None) -> tuple[str, str]:
        """The approval mode in force and where it came from (``simagent run`` says both):
        the flag, the trusted workspace config, the user config, or the default."""
        mode, where = cli_value, "--approval"
        for layer, name in ((self.workspace_data, f"trusted {workspace_config_path('.')}"),
                            (self.user_data, f"user config {user_config_path()}")):
            if not mode and layer.get("approval"):
                mode, where = layer["approval"], name
        if not mode:
            mode, where = DEFAULT_APPROVAL, "default"
        if mode not in APPROVAL_MODES:
            raise ConfigError(f"{self.source('approval')}: approval = {mode!r} is not one of "
                              f"{', '.join(APPROVAL_MODES)}")
        return mode, where

    def check_numbers(self, default: str = CHECK_NUMBERS[0]) -> str:
        """``[answers] check_numbers``: what a final answer's numbers that no source shows
        get (``agent/number_check.py``): ``nudge`` (the default), ``mark`` or ``off``."""
        value = self.section("answers").get("check_numbers", default)
        if value not in CHECK_NUMBERS:
            raise ConfigError(f"{self.where('answers', 'check_numbers')} check_numbers = "
                              f"{value!r} is not one of {', '.join(map(repr, CHECK_NUMBERS))}")
        return value

    def kernel_name(self) -> str | None:
        kernel = self.data.get("kernel")
        return kernel.get("name") if isinstance(kernel, dict) else None

    def kernel_existing(self, cli_value: str | None = None) -> str | None:
        """The running kernel to attach to: ``--kernel``, else ``[kernel] existing``
        (a connection file, a kernel id or ``latest``); None: simagent starts its own."""
        if cli_value:
            return cli_value
        value = self.section("kernel").get("existing")
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ConfigError(f'{self.where("kernel", "existing")} existing must be a connection '
                              'file, a kernel id or "latest"')
        return value or None

    def ensemble_scheduler(self, environ: Mapping[str, str] | None = None
                           ) -> tuple[str | None, str]:
        """The Dask scheduler address for ensembles and where it came from.

        ``$SIMAGENT_DASK_SCHEDULER`` wins over ``[ensembles] scheduler``; None means the
        session starts its own local cluster.
        """
        env = os.environ if environ is None else environ
        if env.get(SCHEDULER_ENV):
            return env[SCHEDULER_ENV], f"${SCHEDULER_ENV}"
        value = self.section("ensembles").get("scheduler")
        if value in (None, ""):
            return None, "unset"
        if not isinstance(value, str):
            raise ConfigError(f"{self.where('ensembles', 'scheduler')} scheduler must be an "
                              "address string such as \"tcp://host:8786\"")
        return value, "config [ensembles] scheduler"

    def ensemble_workers(self) -> int | None:
        """Workers of the local cluster (``[ensembles] workers``); None = one per core."""
        value = self.section("ensembles").get("workers")
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{self.where('ensembles', 'workers')} workers must be a positive "
                              "integer")
        return value

    def ensemble_dashboard(self) -> bool:
        """``[ensembles] dashboard``: serve the local cluster's dashboard (plain HTTP that
        any local user can read, hence off by default)."""
        value = self.section("ensembles").get("dashboard", False)
        if not isinstance(value, bool):
            raise ConfigError(f"{self.where('ensembles', 'dashboard')} dashboard must be true "
                              "or false")
        return value

    def ensemble_kernel_env(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment the kernel needs so ``ensemble`` follows this config.

        For both settings a variable already set in the environment wins over the
        config file, so one shell can override a workspace's config the same way.
        """
        env = os.environ if environ is None else environ
        out: dict[str, str] = {}
        scheduler, _where = self.ensemble_scheduler(env)
        if scheduler and not env.get(SCHEDULER_ENV):
            out[SCHEDULER_ENV] = scheduler
        workers = self.ensemble_workers()
        if workers is not None and not env.get(WORKERS_ENV, "").strip():
            out[WORKERS_ENV] = str(workers)
        if self.ensemble_dashboard() and not env.get(DASHBOARD_ENV, "").strip():
            out[DASHBOARD_ENV] = "1"
        return out

    def files_readable(self) -> tuple[Path, ...]:
        """``[files] readable``: folders the file tools read outside the workspace without
        asking (data folders), each absolute or ``~``-relative."""
        value = self.section("files").get("readable", [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ConfigError(f'{self.where("files", "readable")} readable must be a list of '
                              'folder paths, e.g. readable = ["/data/runs", "~/shared"]')
        paths = tuple(Path(v).expanduser() for v in value)
        if relative := [str(p) for p in paths if not p.is_absolute()]:
            raise ConfigError(f"{self.where('files', 'readable')} readable: "
                              f"{', '.join(relative)} is not an absolute path (start it with / "
                              "or ~)")
        return paths

    def mcp_servers(self) -> dict[str, McpServer]:
        """The ``[mcp.servers.NAME]`` tables, checked (see :func:`parse_mcp_servers`)."""
        mcp = self.section("mcp")
        return parse_mcp_servers(mcp.get("servers") or {}, self.source("mcp"))


#: A server's name becomes the prefix of its tools' names (``NAME__tool``), so it must
#: be a valid part of a provider's tool name and hold no ``__`` (the separator).
MCP_SERVER_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9-]|_(?!_))*"
#: Seconds one MCP tool call may take before the server counts as hung (and is restarted).
MCP_CALL_TIMEOUT_S = 120.0
#: Seconds an MCP server may take to start and list its tools before it counts as down.
MCP_START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class McpServer:
    """One ``[mcp.servers.NAME]`` entry: a stdio command or a streamable-HTTP URL."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = MCP_CALL_TIMEOUT_S
    start_timeout_s: float = MCP_START_TIMEOUT_S

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "streamable_http"


def parse_mcp_servers(tables: Any, source: str = "config") -> dict[str, McpServer]:
    """``[mcp.servers]`` -> servers by name; a bad entry is a ``ConfigError`` naming it
    (and ``source``, the file it came from)."""
    if not isinstance(tables, Mapping):
        raise ConfigError(f"{source}: [mcp.servers] must be a table of [mcp.servers.NAME] "
                          "tables")
    out: dict[str, McpServer] = {}
    for name, t in tables.items():
        where = f"{source}: [mcp.servers.{name}]"
        if not re.fullmatch(MCP_SERVER_NAME, name) or len(name) > 32:
            raise ConfigError(f"{where}: the name may hold letters, digits, '-' and single "
                              "'_' (at most 32), since it prefixes the tool names")
        if not isinstance(t, Mapping):
            raise ConfigError(f"{where} must be a table")
        unknown = sorted(set(t) - {"command", "args", "env", "url", "headers", "timeout_s",
                                   "start_timeout_s"})
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known: command, "
                              "args, env (stdio) or url, headers (HTTP), timeout_s and "
                              "start_timeout_s")
        command, url = t.get("command"), t.get("url")
        if bool(command) == bool(url):
            raise ConfigError(f"{where}: give either command (a stdio server) or url "
                              "(streamable HTTP), not both or neither")
        if command is not None and not isinstance(command, str):
            raise ConfigError(f"{where}: command must be a string (the program to run)")
        if url is not None and (not isinstance(url, str) or
                                not url.startswith(("http://", "https://"))):
            raise ConfigError(f"{where}: url must be an http:// or https:// address")
        args = t.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ConfigError(f"{where}: args must be a list of strings")
        for key in ("env", "headers"):
            value = t.get(key, {})
            if not isinstance(value, Mapping) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
                raise ConfigError(f"{where}: {key} must be a table of strings")
        if (command and t.get("headers")) or (url and (t.get("env") or t.get("args"))):
            raise ConfigError(f"{where}: env and args go with command, headers with url")
        timeouts = {key: t.get(key, default) for key, default in (
            ("timeout_s", MCP_CALL_TIMEOUT_S), ("start_timeout_s", MCP_START_TIMEOUT_S))}
        for key, value in timeouts.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                    0 < value < math.inf):  # nan and inf (TOML has both) are no bound
                raise ConfigError(f"{where}: {key} must be a positive number of seconds")
        out[name] = McpServer(name, command, tuple(args), dict(t.get("env", {})), url,
                              dict(t.get("headers", {})), float(timeouts["timeout_s"]),
                              float(timeouts["start_timeout_s"]))
    return out
