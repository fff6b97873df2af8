"""``simagent doctor``: environment checks, each with a one-line fix.

Checks are small functions returning :class:`Check`; :func:`run_checks` runs them in
order and never raises, because a doctor that crashes on the broken thing it should
diagnose is useless. The rendering is a pure function of the checks.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from simagent import workspace_trust
from simagent.config import Config, ConfigError
from simagent.context.tokens import REAL_ENCODINGS, EncodingFileError, encoding
from simagent.kernel import Kernel, KernelStartError
from simagent.kernel.connection import running_kernels, runtime_dir
from simagent.models import ModelError, resolve_model
from simagent.paths import SessionPaths, private_dir, state_home, write_private
from simagent.simulators import SimulatorError, discover, package_found
from simagent.workspace_init import check_in_kernel, install_hint


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    #: "warn" checks do not fail the doctor (e.g. no model chosen yet).
    level: str = "error"

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def check_python() -> Check:
    v = sys.version_info
    ok = v >= (3, 11)
    return Check("python", ok, f"{sys.version.split()[0]} at {sys.executable}",
                 "" if ok else "install Python 3.11 or newer and reinstall simagent")


def check_state_home() -> Check:
    home = state_home()
    try:
        private_dir(home)
        probe = home / ".doctor-probe"
        write_private(probe, "ok")
        probe.unlink()
    except OSError as exc:
        return Check("state home", False, f"{home}: {exc.strerror or exc}",
                     "set SIMAGENT_HOME to a writable folder")
    return Check("state home", True, str(home))


def check_tokenizer() -> Check:
    """The shipped encodings load and count offline (every token figure depends on them)."""
    try:
        counts = {name: len(encoding(name).encode("hello world")) for name in REAL_ENCODINGS}
    except EncodingFileError as exc:
        return Check("tokenizer", False, str(exc).splitlines()[0], "reinstall simagent")
    return Check("tokenizer", all(n == 2 for n in counts.values()),
                 f"{', '.join(REAL_ENCODINGS)} load offline (sha256 checked)",
                 "reinstall simagent")


def check_config(workspace: Path, trust: bool = False) -> tuple[Check, Config]:
    """The config the other checks read, and whether the workspace's own is in force:
    an untrusted ``.simagent/config.toml`` is ignored here too, so the doctor never runs
    its MCP commands or calls its endpoints."""
    try:
        config = Config.load(workspace, trust=trust)
    except ConfigError as exc:
        return Check("config", False, str(exc).splitlines()[0], "fix the file named"), Config()
    state = config.trust
    if state is None or state.status == workspace_trust.ABSENT:
        return Check("config", True, "no workspace config (.simagent/config.toml)"), config
    if state.ignored:
        return Check("config", False, workspace_trust.ignored_reason(state),
                     workspace_trust.HOW_TO_TRUST, level="warn"), config
    return Check("config", True, f"{state.path} (trusted)"), config


def check_model(config: Config) -> Check:
    try:
        spec, where = config.model_spec()
    except ConfigError as exc:
        return Check("model", False, str(exc).splitlines()[0], "fix the config file named")
    if not spec:
        return Check("model", False, "no model chosen", "pass --model provider:model, set "
                     "SIMAGENT_MODEL, or add model = \"...\" to .simagent/config.toml "
                     "(scripted:PATH and the bench's replay need no key)", level="warn")

    try:
        resolved = resolve_model(spec, model_config=config.model_settings,
                                 settings_at=partial(config.where, "model"))
    except ModelError as exc:
        return Check("model", False, f"{spec} ({where}): {str(exc).splitlines()[0]}",
                     "set the API key variable or install the provider package named")
    window = f", window {resolved.window:,}" if resolved.window else ", window unknown"
    return Check("model", True, f"{spec} ({where}){window}")


def check_kernel(workspace: Path, config: Config) -> tuple[Check, float | None]:
    name = config.kernel_name()
    with tempfile.TemporaryDirectory(prefix="simagent-doctor-") as tmp:
        kernel = Kernel(SessionPaths(Path(tmp) / "s"), cwd=workspace, kernel_name=name)
        started = time.monotonic()
        try:
            kernel.start()
            res = kernel.execute("1 + 1", timeout=60)
        except KernelStartError as exc:
            return Check("kernel", False, str(exc).splitlines()[0],
                         "pip install ipykernel (or fix [kernel] name in config)"), None
        finally:
            kernel.shutdown()
    seconds = time.monotonic() - started
    ok = res.ok and (res.value or "").strip() == "2"
    return Check("kernel", ok, f"{name or 'python3 (simagent)'} started and ran 1+1 in "
                 f"{seconds:.1f} s" if ok else f"1+1 gave {res.status}",
                 "" if ok else "reinstall ipykernel"), seconds


def check_attachable() -> list[Check]:
    """The running Jupyter kernels ``--kernel`` can attach to (one line each, newest
    first), from the connection files in the Jupyter runtime directory."""
    folder = runtime_dir()
    kernels = running_kernels(folder)
    live = [k for k in kernels if k.running]
    stale = len(kernels) - len(live)
    note = f"; {stale} stale connection file(s) (their kernels stopped)" if stale else ""
    if not live:
        return [Check("attach", True, f"no running kernel in {folder}{note}", level="warn")]
    return [Check("attach", True, f"--kernel {k.kernel_id}  ({k.path}"
                  f"{', the newest: --kernel latest' if i == 0 else ''})")
            for i, k in enumerate(live)] + ([Check("attach", True, note[2:])] if note else [])


def check_simulators(workspace: Path, config: Config, *, in_kernel: bool = True
                     ) -> list[Check]:
    """One check per discovered simulator: packages import (in a real kernel)."""
    try:
        sims = discover()
    except SimulatorError as exc:
        return [Check("simulators", False, str(exc), "fix or remove the simulator folder")]
    chosen = config.simulator()
    checks = []
    present = [s for s in sims.values() if s.installed()]
    results = check_in_kernel(present, workspace=workspace, kernel_name=config.kernel_name(),
                              warmup=False) if in_kernel and present else {}
    for sim in sims.values():
        label = f"sim {sim.name}" + (" (workspace)" if sim.name == chosen else "")
        if sim not in present:
            missing = [p for p in sim.packages if not package_found(p)]
            checks.append(Check(label, False, "not installed: " + ", ".join(missing),
                                install_hint(sim),
                                level="error" if sim.name == chosen else "warn"))
            continue
        res = results.get(sim.name)
        if res is None:
            checks.append(Check(label, True, "packages found"))
        elif res.ok:
            versions = ", ".join(f"{c.package} {c.detail}" for c in res.imports)
            checks.append(Check(label, True, versions))
        elif res.start_failed:
            checks.append(Check(label, False, res.error or "kernel could not start",
                                "see the kernel check above"))
        else:
            bad = next((f"{c.package}: {c.detail}" for c in res.imports if not c.ok),
                       res.error or "import failed")
            checks.append(Check(label, False, bad, install_hint(sim),
                                level="error" if sim.name == chosen else "warn"))
    if chosen and chosen not in sims:
        checks.append(Check("workspace simulator", False, f"unknown simulator {chosen!r}",
                            f"simagent init --sim NAME (one of {', '.join(sorted(sims))})"))
    return checks


def check_tmux() -> Check:
    path = shutil.which("tmux")
    return Check("tmux", bool(path), path or "not found (only the TUI end-to-end tests "
                 "need it)", "" if path else "apt install tmux", level="warn")


def check_mcp(workspace: Path, config: Config) -> list[Check]:
    """Each ``[mcp.servers.NAME]``: reachable, and how many tools it offers."""
    from simagent.agent.mcp_tools import probe_servers  # the MCP SDK: only when asked

    try:
        servers = config.mcp_servers()
    except ConfigError as exc:
        return [Check("mcp", False, str(exc), "fix the entry in .simagent/config.toml "
                      "(README: Using MCP servers)")]
    def fix(name: str) -> str:
        how = ("check that the server listens at its url" if servers[name].url else
               "run its command by hand to see it start")
        return f"check [mcp.servers.{name}] in .simagent/config.toml; {how}"

    return [Check(f"mcp {name}", ok, detail, "" if ok else fix(name))
            for name, (ok, detail) in probe_servers(servers, workspace).items()]


def run_checks(workspace: Path, *, in_kernel: bool = True, trust: bool = False,
               progress: Callable[[str], None] | None = None) -> list[Check]:
    """Every check in order; ``trust``: ``--trust-workspace``."""
    config_check, config = check_config(workspace, trust)
    checks: list[Check] = [config_check]
    steps: list[tuple[str, Callable[[], list[Check]]]] = [
        ("python", lambda: [check_python()]),
        ("state home", lambda: [check_state_home()]),
        ("tokenizer", lambda: [check_tokenizer()]),
        ("kernel", lambda: [check_kernel(workspace, config)[0]]),
        ("attach", check_attachable),
        ("model", lambda: [check_model(config)]),
        ("simulators", lambda: check_simulators(workspace, config, in_kernel=in_kernel)),
        ("tmux", lambda: [check_tmux()]),
        ("mcp servers", lambda: check_mcp(workspace, config)),
    ]
    for name, step in steps:
        if progress:
            progress(f"checking {name}")
        try:
            checks.extend(step())
        except Exception as exc:  # the doctor reports, it does not crash
            checks.append(Check(name, False, f"check crashed: {type(exc).__name__}: {exc}",
                                "report this with SIMAGENT_DEBUG=1 output"))
    return checks


def failed(checks: list[Check]) -> bool:
    return any(not c.ok and c.level == "error" for c in checks)


def render(checks: list[Check]) -> str:
    width = max((len(c.name) for c in checks), default=0)
    lines = []
    for c in checks:
        mark = "ok  " if c.ok else ("FAIL" if c.level == "error" else "warn")
        lines.append(f"{mark} {c.name.ljust(width)}  {c.detail}")
        if not c.ok and c.fix:
            lines.append(f"     {''.ljust(width)}  fix: {c.fix}")
    return "\n".join(lines) + "\n"


__all__ = ["Check", "failed", "render", "run_checks"]
