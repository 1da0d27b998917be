"""Apptainer images built from definition templates, with ProRL Agent's three cache modes.

A template is a base image plus install steps; spython's ``Recipe`` and ``SingularityWriter``
render it as an Apptainer definition file (``Bootstrap: docker`` / ``From:`` / ``%post`` /
``%labels``; Apptainer user guide, "Definition Files"), built with
``apptainer build [--fakeroot] OUT.sif DEF`` (apptainer_build.html).

Cache modes (ProRL Agent, arXiv 2603.18815, its Singularity runtime):

- ``always``: rebuild every time;
- ``base_version``: reuse the SIF while the base image and the template's ``version`` are the
  same;
- ``lockfile``: reuse the SIF while the lockfile's content (e.g. ``requirements.lock``) is the
  same (and the base image too).

The SIF is stored as ``{cache_dir}/{name}-{key}.sif`` next to ``{name}-{key}.json`` (what the
key was computed from); a build writes to a temporary name and renames, so a half-built image
is never reused.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

CacheMode = Literal["always", "base_version", "lockfile"]


class ImageTemplate(BaseModel):
    """A definition template.

    Attributes:
        name: image name (file stem), letters, digits, '.', '_' and '-'.
        base_image: the Docker base image (``python:3.11-slim``).
        version: the template's version, bumped when ``post`` changes meaningfully.
        post: shell lines of ``%post`` (run as root at build time).
        environment: ``%environment`` variables.
        lockfile: host path of the lockfile of mode ``lockfile``.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
    base_image: str
    version: str = "1"
    post: list[str] = Field(default_factory=list)
    environment: dict[str, str] = Field(default_factory=dict)
    lockfile: str | None = None


def definition(template: ImageTemplate) -> str:
    """The Apptainer definition file of ``template``, written by spython's SingularityWriter."""
    from spython.main.parse.recipe import Recipe
    from spython.main.parse.writers import SingularityWriter

    recipe = Recipe()
    recipe.fromHeader = template.base_image
    recipe.install = list(template.post)
    recipe.environ = [f"{k}={v}" for k, v in template.environment.items()]
    recipe.labels = [["rolloutd.template", template.name], ["rolloutd.version", template.version]]
    return SingularityWriter({"spython-base": recipe}).convert()


def cache_key(template: ImageTemplate, mode: CacheMode) -> dict[str, str]:
    """What the cached image depends on in ``mode`` (``always``: a fresh nonce).

    Raises:
        ValueError: ``lockfile`` mode without a readable lockfile.
    """
    if mode == "always":
        return {"nonce": os.urandom(8).hex()}
    key = {"base_image": template.base_image}
    if mode == "base_version":
        key["version"] = template.version
    else:
        if not template.lockfile:
            raise ValueError("cache mode 'lockfile' needs template.lockfile")
        key["lockfile_sha256"] = hashlib.sha256(Path(template.lockfile).read_bytes()).hexdigest()
    return key


def build_argv(
    definition_path: Path, sif_path: Path, *, fakeroot: bool, binary: str = "apptainer"
) -> list[str]:
    """``apptainer build [--fakeroot] --force SIF DEF``."""
    return [
        binary,
        "build",
        *(["--fakeroot"] if fakeroot else []),
        "--force",
        str(sif_path),
        str(definition_path),
    ]


async def ensure_image(
    template: ImageTemplate,
    cache_dir: Path,
    mode: CacheMode,
    *,
    build: Callable[[list[str]], Awaitable[int]],
    fakeroot: bool = False,
) -> tuple[Path, bool]:
    """The SIF for ``template``, built only when ``mode`` says the cache is stale.

    Args:
        template: the definition template.
        cache_dir: folder of cached SIFs.
        mode: ``always``, ``base_version`` or ``lockfile`` (see the module docstring).
        build: runs a command line and returns its exit code (the worker passes a subprocess
            runner; tests pass a fake).
        fakeroot: build with ``--fakeroot``.

    Returns:
        (path of the SIF, whether it was built now).

    Raises:
        RuntimeError: the build failed.
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = cache_key(template, mode)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    sif = cache_dir / f"{template.name}-{digest}.sif"
    if mode != "always" and sif.exists():
        return sif, False
    def_path = cache_dir / f"{template.name}-{digest}.def"
    def_path.write_text(definition(template))
    partial = sif.with_suffix(".sif.partial")
    code = await build(build_argv(def_path, partial, fakeroot=fakeroot))
    if code != 0 or not partial.exists():
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"apptainer build of {template.name} exited {code}")
    partial.replace(sif)
    sif.with_suffix(".json").write_text(json.dumps(key, sort_keys=True))
    return sif, True
