"""What the container image tests need here (tests/deploy)."""

from __future__ import annotations

import shutil


def no_podman() -> str | None:
    """Why the deploy tests cannot run here (None: podman is installed).

    They build what they need with scripts/build_images.sh: about 23 minutes cold on 2 cores
    (docs/images.md), seconds when every image's inputs are unchanged; that is why they belong
    to the acceptance tier.
    """
    if shutil.which("podman") is None:
        return "podman is not installed (scripts/setup.sh installs it)"
    return None
