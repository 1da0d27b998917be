"""``rolloutd quota TENANT [N|none]``: show or set a tenant's quota of sessions in flight."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from rolloutd.cli.commands import ADDRESS_HELP, add_command
from rolloutd.settings import CommonSettings


def register(sub: Any) -> None:
    """Add ``quota`` and its options."""
    quota = add_command(
        sub, "quota", "show or set a tenant's quota of sessions in flight (docs/tenancy.md)", run
    )
    quota.add_argument("tenant", help="the tenant (TaskRequest.tenant)")
    quota.add_argument(
        "max_sessions",
        nargs="?",
        default=None,
        help="the bound (>= 1), or 'none' to lift it; omitted: show only",
    )
    quota.add_argument("--address", default=None, help=ADDRESS_HELP)


def run(args: argparse.Namespace, settings: CommonSettings) -> int:
    """Print the tenant's state as JSON (after setting its bound, when one is given)."""
    return asyncio.run(_quota(args, settings))


async def _quota(args: argparse.Namespace, settings: CommonSettings) -> int:
    from rolloutd.trainer_client import RolloutClient

    bound: int | None = None
    if args.max_sessions is not None and args.max_sessions.lower() != "none":
        try:
            bound = int(args.max_sessions)
        except ValueError:
            bound = 0
        if bound < 1:
            raise SystemExit(
                f"rolloutd quota: MAX_SESSIONS must be a number >= 1 or 'none', "
                f"not {args.max_sessions!r}"
            )
    client = await RolloutClient.connect(
        args.address or settings.temporal_address, namespace=settings.temporal_namespace
    )
    try:
        state = (
            await client.set_tenant_quota(args.tenant, bound)
            if args.max_sessions is not None
            else await client.tenant_state(args.tenant)
        )
    except ValueError as e:
        raise SystemExit(f"rolloutd quota: {e}") from None
    print(
        state.model_dump_json(indent=2)
        if state is not None
        else f"tenant {args.tenant} has no quota"
    )
    return 0
