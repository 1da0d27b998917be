"""What the container image tests need here (tests/deploy, tests/sandbox)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def no_podman() -> str | None:
    """Why the deploy tests cannot run here (None: podman is installed).

    They build what they need with scripts/build_images.sh: about 23 minutes cold on 2 cores
    (docs/images.md), seconds when every image's inputs are unchanged; that is why they belong
    to the acceptance tier.
    """
    if shutil.which("podman") is None:
        return "podman is not installed (scripts/setup.sh installs it)"
    return None


@contextmanager
def fresh_podman_store(folder: Path) -> Iterator[str]:
    """A podman image and container store of its own below ``folder``, as on a machine where no
    image was ever made: yields a ``storage.conf`` for ``CONTAINERS_STORAGE_CONF``
    (containers-storage.conf(5): ``graphroot`` and ``runroot``), which every podman the
    process starts then reads. The host's own store is never read or changed.

    At exit the store's containers and images are removed (``podman rm``/``rmi --all``, never
    ``system reset``: that also removes the host's networks, which are not per store) and
    ``folder`` is deleted.
    """
    folder.mkdir(parents=True, exist_ok=True)
    conf = folder / "storage.conf"
    conf.write_text(
        '[storage]\ndriver = "overlay"\n'
        f'graphroot = "{folder / "graph"}"\nrunroot = "{folder / "run"}"\n'
    )
    env = {**os.environ, "CONTAINERS_STORAGE_CONF": str(conf)}
    try:
        yield str(conf)
    finally:
        for args in (["rm", "--all", "--force"], ["rmi", "--all", "--force"]):
            subprocess.run(["podman", *args], env=env, capture_output=True, timeout=300)
        shutil.rmtree(folder, ignore_errors=True)
