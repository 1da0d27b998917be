"""``rolloutd codec-key``: a new payload codec key to add to the fleets' keys."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from rolloutd.cli.commands import add_command
from rolloutd.settings import CommonSettings


def register(sub: Any) -> None:
    """Add ``codec-key``."""
    add_command(
        sub,
        "codec-key",
        "print a new payload codec key (`id:key`, 256-bit, base64) to add "
        "to ROLLOUTD_CODEC_KEYS or ROLLOUTD_CODEC_KEY_FILE",
        run,
    )


def run(args: argparse.Namespace, settings: CommonSettings) -> int:
    """Print ``key-{date}-{4 hex}:{key}``."""
    from rolloutd.security.codec import generate_key

    print(f"key-{time.strftime('%Y%m%d')}-{os.urandom(2).hex()}:{generate_key()}")
    return 0
