"""Whether the container images can be had here cheaply (tests/deploy)."""

from __future__ import annotations

import os
import shutil
import subprocess

from rolloutd.settings import default_cache


def no_image_cache() -> str | None:
    """Why the deploy tests would skip here (None: podman is installed and the image build
    cache is here, or ``ROLLOUTD_BUILD_IMAGES=1`` asks for the build).

    A cold build takes about 23 minutes on 2 cores (docs/images.md), which a cold CI run cannot
    add to its budget (docs/decisions.md, "Images cached by their inputs"); with the
    base image and the build context cached, a changed ``src/`` rebuilds in about 36 s.
    """
    if shutil.which("podman") is None:
        return "podman is not installed (scripts/setup.sh installs it)"
    if os.environ.get("ROLLOUTD_BUILD_IMAGES") == "1":
        return None
    cache = default_cache()
    base = subprocess.run(
        ["podman", "images", "--format", "{{.Repository}}"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    if "rolloutd-base" in base and any((cache / "images").glob("context-*")):
        return None
    return (
        "no image build cache on this machine (a cold build takes ~23 min): run "
        "scripts/build_images.sh once, or set ROLLOUTD_BUILD_IMAGES=1"
    )
