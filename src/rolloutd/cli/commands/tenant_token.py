"""``rolloutd tenant-token TENANT``: a new tenant token and its entry for the tokens file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rolloutd.cli.commands import add_command
from rolloutd.settings import CommonSettings


def register(sub: Any) -> None:
    """Add ``tenant-token`` and its options."""
    tenant = add_command(
        sub,
        "tenant-token",
        "make a tenant token: prints the token (give it to the tenant) and its entry for "
        "ROLLOUTD_TENANT_TOKENS_FILE (only the token's hash is kept)",
        run,
    )
    tenant.add_argument("tenant", help="the tenant the token names")
    tenant.add_argument(
        "--max-priority",
        type=int,
        default=3,
        choices=range(1, 6),
        help="the highest priority the tenant may ask for (1 first ... 5 last)",
    )
    tenant.add_argument(
        "--max-fairness-weight",
        type=float,
        default=1.0,
        help="the largest fairness weight the tenant may ask for (its share among tasks of "
        "equal priority; > 0, at most 1000)",
    )
    tenant.add_argument(
        "--file",
        type=Path,
        default=None,
        help="add the entry to this tokens file (created, mode 0600) instead of printing it",
    )


def run(args: argparse.Namespace, settings: CommonSettings) -> int:
    """Print the token on stdout; the entry goes to ``--file`` or to stderr."""
    from pydantic import ValidationError

    from rolloutd.security.tenants import add_tenant_token, new_tenant_token

    try:
        token, entry = new_tenant_token(args.tenant, args.max_priority, args.max_fairness_weight)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
        raise SystemExit(f"rolloutd tenant-token: {problems}") from None
    if args.file is not None:
        add_tenant_token(args.file, entry)
        print(f"added tenant {entry.tenant} to {args.file}", file=sys.stderr)
    else:
        print(entry.model_dump_json(), file=sys.stderr)
    print(token)
    return 0
