"""Packaged local models: parts joined once into the state home, checked against a pinned
sha256 (real files, real hashing; the last test joins the real 491 MB model when its
packages are installed, as ``make test`` installs them)."""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path

import pytest

from simagent.local_model.packaged import (
    PACKAGED,
    PackagedModel,
    assemble,
    assembled_path,
    part_files,
)
from simagent.models import ModelError


def parts(folder: Path) -> list[Path]:
    files = []
    for i, data in enumerate((b"GGUF" + b"a" * 1000, b"b" * 777, b"c" * 5)):
        files.append(folder / f"part{i}.bin")
        files[-1].write_bytes(data)
    return files


def test_parts_are_joined_once_when_the_sha256_matches(tmp_path: Path) -> None:
    files = parts(tmp_path)
    whole = b"".join(f.read_bytes() for f in files)
    dest = tmp_path / "models" / "m.gguf"
    assert assemble(files, dest, sha256=hashlib.sha256(whole).hexdigest(),
                    size=len(whole)) == dest
    assert dest.read_bytes() == whole
    files[1].write_bytes(b"changed")  # a verified file is reused as it is
    assert assemble(files, dest, sha256="0" * 64, size=len(whole)).read_bytes() == whole


def test_a_checksum_mismatch_is_one_line_and_leaves_no_file(tmp_path: Path) -> None:
    files = parts(tmp_path)
    dest = tmp_path / "models" / "m.gguf"
    with pytest.raises(ModelError) as info:
        assemble(files, dest, sha256="0" * 64, size=1782)
    assert info.value.code == 2 and "\n" not in str(info.value)
    assert str(info.value).startswith("checksum mismatch assembling m.gguf: sha256 ")
    assert list(dest.parent.iterdir()) == []  # neither the file nor its partial copy


def test_missing_part_packages_name_the_extra_to_install() -> None:
    absent = PackagedModel("nope", "", ("simagent-no-such-part1", "simagent-no-such-part2"),
                           "0" * 64, 1)
    with pytest.raises(ModelError) as info:
        part_files(absent)
    assert info.value.code == 2 and str(info.value) == (
        "local:nope needs its model packages: pip install 'simagent[local-model]' "
        "(missing simagent-no-such-part1, simagent-no-such-part2)")
    with pytest.raises(ModelError) as info:
        assembled_path("nope", Path("/nonexistent"))
    assert str(info.value) == ("unknown packaged model 'nope' (known: qwen2.5-coder-0.5b); "
                               "or give a path: local:PATH.gguf")


@pytest.mark.slow
def test_the_packaged_model_assembles_to_its_pinned_checksum(tmp_path: Path) -> None:
    model = PACKAGED["qwen2.5-coder-0.5b"]
    try:
        importlib.metadata.distribution(model.dists[0])
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("needs pip install 'simagent[local-model]' (make test installs it)")
    path = assembled_path(model.name, tmp_path)
    assert path == tmp_path / "models" / model.file_name and path.stat().st_size == model.size
    with path.open("rb") as fh:
        assert fh.read(4) == b"GGUF"
