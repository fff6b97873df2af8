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
from simagent.models import ModelError, resolve_model


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


def fake_part_packages(site: Path, *datas: bytes) -> tuple[str, ...]:
    """Part packages as pip installs them: a module folder with the part and a dist-info
    whose RECORD lists it (what ``part_files`` reads through importlib.metadata)."""
    names = []
    for i, data in enumerate(datas, 1):
        (site / f"fakepart{i}").mkdir(parents=True)
        (site / f"fakepart{i}" / "model.bin").write_bytes(data)
        info = site / f"simagent_fake_part{i}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: simagent-fake-part{i}\nVersion: 1.0\n")
        (info / "RECORD").write_text(f"fakepart{i}/model.bin,,\n{info.name}/METADATA,,\n")
        names.append(f"simagent-fake-part{i}")
    return tuple(names)


def test_a_checksum_mismatch_of_a_packaged_model_is_one_line_before_any_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _state_home: Path) -> None:
    """``local:NAME`` as the CLI resolves it: installed parts whose joined bytes do not
    match the pinned sha256 (a damaged download) stop it before llama.cpp is started."""
    dists = fake_part_packages(tmp_path / "site", b"GGUF" + b"a" * 100, b"b" * 50)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setitem(PACKAGED, "fake", PackagedModel("fake", "a test", dists, "0" * 64, 155))
    with pytest.raises(ModelError) as info:
        resolve_model("local:fake", environ={})
    assert info.value.code == 2 and "\n" not in str(info.value)
    assert str(info.value).startswith("checksum mismatch assembling fake-000000000000.gguf: ")
    assert "pip install --force-reinstall" in str(info.value)
    assert list((_state_home / "models").iterdir()) == []  # nothing a later run would trust


def test_the_first_use_says_the_parts_are_being_joined_and_a_later_one_does_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _state_home: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Joining 491 MB takes a while: a front end that passes ``progress`` is told, before
    it starts, and only then (the joined file is reused after)."""
    data = (b"GGUF" + b"a" * 100, b"b" * 50)
    dists = fake_part_packages(tmp_path / "site", *data)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    whole = b"".join(data)
    model = PackagedModel("fake", "a test", dists, hashlib.sha256(whole).hexdigest(),
                          len(whole))
    monkeypatch.setitem(PACKAGED, "fake", model)
    dest = _state_home / "models" / model.file_name
    for run in range(2):
        said: list[str] = []
        with pytest.raises(ModelError, match=r"not a GGUF model file|damaged GGUF"):
            resolve_model("local:fake", environ={}, progress=said.append)  # parts, not a model
        assert said == ([f"joining the 2 parts of local:fake into {dest} (first use only; "
                         "0 MB, checked against its sha256)…"] if run == 0 else [])
        assert dest.read_bytes() == whole
    dest.unlink()
    capsys.readouterr()
    with pytest.raises(ModelError, match="GGUF"):
        resolve_model("local:fake", environ={})  # no progress asked for: nothing said
    assert capsys.readouterr() == ("", "") and dest.is_file()


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
    assert str(info.value) == ("unknown packaged model 'nope' (known: qwen2.5-coder-0.5b, "
                               "qwen2.5-coder-1.5b); or give a path: local:PATH.gguf")
    larger = PackagedModel("big", "", ("simagent-no-such-part1",), "0" * 64, 1,
                           extra="local-model-1.5b")
    with pytest.raises(ModelError, match=r"pip install 'simagent\[local-model-1.5b\]'"):
        part_files(larger)


def test_each_packaged_models_parts_are_its_extra_in_pyproject() -> None:
    """The 1.5B model's 22 parts are an extra of their own, which ``make`` does not
    install (1.1 GB); each extra pins exactly the distributions its model joins."""
    import tomllib

    extras = tomllib.loads(Path(__file__).parents[1].joinpath("pyproject.toml").read_text())[
        "project"]["optional-dependencies"]
    for model in PACKAGED.values():
        pinned = [req.split("==")[0] for req in extras[model.extra]]
        assert pinned == list(model.dists), model.name
    assert PACKAGED["qwen2.5-coder-1.5b"].extra == "local-model-1.5b"
    assert len(PACKAGED["qwen2.5-coder-1.5b"].dists) == 22
    makefile = Path(__file__).parents[1].joinpath("Makefile").read_text()
    (install,) = [line for line in makefile.splitlines() if "-e \".[dev," in line]
    extras_installed = install.split('".[')[1].split("]")[0].split(",")
    assert "local-model" in extras_installed and "local-model-1.5b" not in extras_installed


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_the_packaged_model_assembles_to_its_pinned_checksum(tmp_path: Path,
                                                              name: str) -> None:
    model = PACKAGED[name]
    try:
        importlib.metadata.distribution(model.dists[0])
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"needs pip install 'simagent[{model.extra}]' (make test installs only "
                    "local-model)")
    path = assembled_path(model.name, tmp_path)
    assert path == tmp_path / "models" / model.file_name and path.stat().st_size == model.size
    with path.open("rb") as fh:
        assert fh.read(4) == b"GGUF"
