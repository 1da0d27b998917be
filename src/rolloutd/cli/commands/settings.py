"""``rolloutd settings``: every setting and its ``ROLLOUTD_*`` variable, as docs/settings.md."""

from __future__ import annotations

import argparse
from typing import Any

from rolloutd.cli.commands import add_command
from rolloutd.settings import CommonSettings


def register(sub: Any) -> None:
    """Add ``settings`` and its options."""
    settings = add_command(sub, "settings", "every setting and its ROLLOUTD_* variable", run)
    settings.add_argument(
        "--markdown",
        action="store_true",
        default=True,
        help="as the Markdown page docs/settings.md (the only format)",
    )


def run(args: argparse.Namespace, settings: CommonSettings) -> int:
    """Print :func:`rolloutd.settings.settings_markdown`."""
    from rolloutd.settings import settings_markdown

    print(settings_markdown(), end="")
    return 0
