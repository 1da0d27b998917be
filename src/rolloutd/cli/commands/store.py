"""``rolloutd store gc``: prune the blob store by its retention (:mod:`rolloutd.cli.retention`)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from rolloutd.cli.commands import ADDRESS_HELP, add_command
from rolloutd.settings import CommonSettings


def register(sub: Any) -> None:
    """Add ``store`` and its action ``gc``."""
    store = add_command(sub, "store", "the blob store", run)
    store_sub = store.add_subparsers(
        dest="store_command", required=True, metavar="ACTION", help="what to do"
    )
    gc = add_command(
        store_sub,
        "gc",
        "delete each task's sessions, stored request and group older than the retention, "
        "except what a running task or an unacknowledged buffer batch holds",
    )
    gc.add_argument(
        "--retention-days",
        type=float,
        default=None,
        help="age to pass, days; None: $ROLLOUTD_STORE_RETENTION_DAYS (30)",
    )
    gc.add_argument("--dry-run", action="store_true", help="report only, delete nothing")
    gc.add_argument("--store-url", default=None, help="None: $ROLLOUTD_STORE_URL")
    gc.add_argument("--address", default=None, help=ADDRESS_HELP)


def run(args: argparse.Namespace, settings: CommonSettings) -> int:
    """Print what was deleted and kept.

    Returns:
        0.

    Raises:
        temporalio.service.RPCError: Temporal could not say what is held; nothing was
            deleted (the process exits 1).
    """
    from rolloutd.cli import tables
    from rolloutd.cli.retention import gc
    from rolloutd.store import BlobStore
    from rolloutd.trainer_client import RolloutClient

    days = args.retention_days or settings.store_retention_days

    async def main() -> int:
        client = (
            await RolloutClient.connect(
                args.address or settings.temporal_address, namespace=settings.temporal_namespace
            )
        ).client
        report = await gc(
            client,
            BlobStore(args.store_url or settings.store_url),
            retention_s=days * 86_400,
            dry_run=args.dry_run,
        )
        verb = "would delete" if report.dry_run else "deleted"
        tables.show(
            tables.table(
                "objects",
                tables.num("count"),
                tables.num("MiB"),
                title=f"store gc (retention {days:g} days)",
                rows=[
                    (verb, len(report.deleted), tables.cell(report.num_bytes / 2**20, 1)),
                    ("kept: younger", report.kept_young, None),
                    (
                        "kept: held by a running task or an unacknowledged batch",
                        len(report.kept_held),
                        None,
                    ),
                ],
            ),
            *(f"  {verb}: {key}" for key in report.deleted),
        )
        return 0

    return asyncio.run(main())
