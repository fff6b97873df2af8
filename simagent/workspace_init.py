"""``simagent init``: choose a workspace's simulator and prove its packages import in the kernel.

The config file is the workspace's, so init edits only the top-level ``simulator`` (and,
when given, ``model``) line and keeps everything else the user wrote. The import check
runs in a real kernel started the way sessions start it (same kernel name, same
simulator environment), because "importable by simagent's Python" is not the question a
scientist has; "will my session's kernel import it" is.
"""

from __future__ import annotations

import json
import re
import shlex
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from simagent import workspace_trust
from simagent.kernel import Kernel, KernelStartError
from simagent.paths import SessionPaths, content_dir, workspace_config_path
from simagent.simulators import Simulator

_PROBE = """
import importlib, importlib.metadata, json
_simagent_out = {}
for _name in %r:
    try:
        _mod = importlib.import_module(_name)
        _ver = getattr(_mod, "__version__", None)
        _simagent_out[_name] = {"ok": True, "detail": str(_ver or "imported")}
    except Exception as _exc:
        _simagent_out[_name] = {"ok": False, "detail": f"{type(_exc).__name__}: {_exc}"[:300]}
print("SIMAGENT-PROBE " + json.dumps(_simagent_out))
"""


@dataclass(frozen=True)
class ImportCheck:
    package: str
    ok: bool
    detail: str


@dataclass
class KernelCheck:
    """What the kernel said about a simulator's packages and its warm-up."""

    imports: list[ImportCheck] = field(default_factory=list)
    warmup_ok: bool | None = None
    warmup_output: str = ""
    error: str | None = None
    #: The kernel itself did not start (``error`` says why); nothing was imported.
    start_failed: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and all(c.ok for c in self.imports) and \
            self.warmup_ok is not False


def install_hint(sim: Simulator) -> str:
    """The one-line fix for a simulator whose packages are missing (paste-safe)."""
    names = " ".join(shlex.quote(p) for p in (sim.pip or sim.packages))
    if sim.root.resolve().is_relative_to(content_dir("simulators").resolve()):
        return f"pip install 'simagent[{sim.name}]'  (or: pip install {names})"
    return f"pip install {names}"  # a plug-in: no simagent extra exists for it


def _set_key(text: str, key: str, value: str) -> str:
    """Set a top-level ``key = "value"`` line, keeping every other line as written."""
    line = f"{key} = {json.dumps(value)}"
    lines = text.splitlines()
    first_table = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("[")),
                       len(lines))
    pattern = re.compile(rf"^\s*{re.escape(key)}\s*=")
    for i in range(first_table):
        if pattern.match(lines[i]):
            lines[i] = line
            return "\n".join(lines) + "\n"
    return "\n".join([*lines[:first_table], line, *lines[first_table:]]).strip("\n") + "\n"


def write_workspace_config(workspace: Path, simulator: str, model: str | None = None, *,
                           trust: bool = True) -> Path:
    """Write (or update) ``<workspace>/.simagent/config.toml``; returns its path.

    ``trust``: the person wrote it through simagent, so the folder is trusted with the new
    content; the caller passes False when the file kept lines of an untrusted one."""
    path = workspace_config_path(workspace)
    text = path.read_text(encoding="utf-8") if path.exists() else (
        "# simagent workspace config (see README: Configuration)\n")
    text = _set_key(text, "simulator", simulator)
    if model:
        try:
            existing = tomllib.loads(text).get("model")
        except tomllib.TOMLDecodeError:
            existing = None
        if isinstance(existing, dict):  # a [model] table: set its id, not a top-level key
            raise ValueError(f"{path}: model is a table; set its id = {model!r} by hand")
        text = _set_key(text, "model", model)
    try:
        tomllib.loads(text)  # never leave a file the next command cannot read
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: cannot update it safely ({exc}); edit it by hand") from exc
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    if trust:
        workspace_trust.trust(workspace, text.encode("utf-8"))
    return path


def check_in_kernel(sims: list[Simulator], *, workspace: Path, kernel_name: str | None = None,
                    warmup: bool = True) -> dict[str, KernelCheck]:
    """Import every simulator's packages (and run their warm-ups) in one real kernel."""
    env: dict[str, str] = {}
    for sim in sims:
        env.update(dict(sim.env))
    results = {sim.name: KernelCheck() for sim in sims}
    with tempfile.TemporaryDirectory(prefix="simagent-init-") as tmp:
        kernel = Kernel(SessionPaths(Path(tmp) / "session"), cwd=workspace,
                        kernel_name=kernel_name, env=env)
        try:
            kernel.start()
        except KernelStartError as exc:
            for check in results.values():
                check.error = f"kernel could not start: {str(exc).splitlines()[0]}"
                check.start_failed = True
            return results
        try:
            for sim in sims:
                check = results[sim.name]
                res = kernel.execute(_PROBE % (list(sim.packages),), timeout=300)
                found = re.search(r"SIMAGENT-PROBE (\{.*\})", res.stdout)
                if not found:
                    check.error = f"import probe failed: {res.status}"
                    continue
                for name, info in json.loads(found.group(1)).items():
                    check.imports.append(ImportCheck(name, info["ok"], info["detail"]))
                if warmup and sim.warmup and all(c.ok for c in check.imports):
                    res = kernel.execute(sim.warmup, timeout=600)
                    check.warmup_ok = res.ok
                    check.warmup_output = (res.stdout.strip() or (
                        res.error.text() if res.error else res.status))[-500:]
        finally:
            kernel.shutdown()
    return results
