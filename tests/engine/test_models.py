"""The model catalog trusts weights by sha256: a changed part or assembled file is refused.

Each test works in its own cache folder and on copies; the real model cache is only read.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from rolloutd.engine import models
from rolloutd.engine.models import CATALOG, ModelEntry, ModelPart, pull_model
from rolloutd.errors import ConfigError


def _flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def _fake_package(root: Path, name: str, chunks: list[bytes]) -> list[ModelPart]:
    package = root / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    parts = []
    for i, chunk in enumerate(chunks):
        (package / f"part{i}.bin").write_bytes(chunk)
        parts.append(ModelPart(name, f"part{i}.bin", hashlib.sha256(chunk).hexdigest()))
    return parts


def test_a_part_with_one_byte_changed_is_refused(tmp_path: Path, monkeypatch) -> None:
    chunks = [b"GGUF" + bytes(range(256)) * 64, bytes(4096)]
    parts = _fake_package(tmp_path / "site", "rolloutd_fake_weights", chunks)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    whole = b"".join(chunks)
    entry = ModelEntry(
        name="fake",
        served_name="Fake",
        parts=tuple(parts),
        size_bytes=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
    )
    monkeypatch.setitem(CATALOG, "fake", entry)
    bad = tmp_path / "site" / "rolloutd_fake_weights" / "part1.bin"
    _flip_byte(bad, 100)

    with pytest.raises(ConfigError) as refused:
        pull_model("fake", cache=tmp_path / "cache")
    actual = hashlib.sha256(bad.read_bytes()).hexdigest()
    assert str(bad) in refused.value.message
    assert parts[1].sha256 in refused.value.message and actual in refused.value.message
    # nothing half-assembled is left for a later start to trust
    assert list((tmp_path / "cache" / "models" / "fake").iterdir()) == []


def test_an_assembled_file_is_verified_once_and_refused_once_changed(
    tmp_path: Path, monkeypatch
) -> None:
    real = models.model_files("smollm2-135m")
    if not real.gguf.is_file():
        pytest.skip("smollm2-135m is not pulled (rolloutd models pull smollm2-135m)")
    files = models.model_files("smollm2-135m", cache=tmp_path)
    files.folder.mkdir(parents=True)
    shutil.copyfile(real.gguf, files.gguf)
    shutil.copytree(real.tokenizer, files.tokenizer)

    assert pull_model("smollm2-135m", cache=tmp_path).gguf == files.gguf
    # verified once: a second pull trusts the record and does not hash 98 MB again
    hashed: list[Path] = []
    monkeypatch.setattr(models, "file_sha256", lambda path: hashed.append(path) or "")
    pull_model("smollm2-135m", cache=tmp_path)
    assert hashed == []
    monkeypatch.undo()

    _flip_byte(files.gguf, 1_000_000)
    with pytest.raises(ConfigError) as refused:
        pull_model("smollm2-135m", cache=tmp_path)
    assert str(files.gguf) in refused.value.message
    assert CATALOG["smollm2-135m"].sha256 in refused.value.message


def test_catalog_pins_every_part_and_the_assembled_file() -> None:
    for entry in CATALOG.values():
        for sha in (entry.sha256, *(part.sha256 for part in entry.parts)):
            assert len(sha) == 64 and int(sha, 16) >= 0
