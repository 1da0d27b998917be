"""A task set's build contexts, checked where the task set is read.

A row whose image is built from a folder (``runtime.build.context``) fails on the sandbox host
when its Dockerfile copies a file the folder lacks: every sample of the task then fails at
provisioning with the builder's own error. A context made by a script (SWE-bench-format
instances made from sdists, a Harbor task whose ``environment/`` is generated) is the usual
case: the check names the missing path when the task set is read, before anything runs.
"""

from __future__ import annotations

import glob
from pathlib import Path

from rolloutd.dockerfile import UnresolvableError, context_sources
from rolloutd.errors import ConfigError


def check_build_context(context: Path, *, what: str, hint: str = "") -> None:
    """Refuse a build context its ``Dockerfile`` cannot be built from.

    Args:
        context: the build context folder (holding ``Dockerfile``).
        what: the row, for the message (``instance 'kjd__idna-3.10'``).
        hint: how the context is made, appended to the message.

    Raises:
        ConfigError: a path ``COPY``/``ADD`` reads (:func:`rolloutd.dockerfile.context_sources`)
            is not in the context, or matches nothing there.
    """
    dockerfile = context / "Dockerfile"
    try:
        sources = context_sources(dockerfile.read_text(encoding="utf-8", errors="replace"))
    except (OSError, UnresolvableError) as exc:
        raise ConfigError(f"{what}: cannot read {dockerfile}: {exc}") from exc
    missing = []
    for source in sources:
        path = str(context / source.lstrip("/"))
        found = glob.glob(path) if glob.has_magic(source) else [path] if Path(path).exists() else []
        if not found:
            missing.append(source)
    if missing:
        listed = ", ".join(repr(m) for m in missing)
        raise ConfigError(
            f"{what}: its image's build context {context} lacks {listed}, which its Dockerfile "
            f"copies; the build would fail on every sandbox host{'; ' + hint if hint else ''}"
        )
