"""``rolloutd rest``: the REST facade (POLAR / ProRL-compatible), :mod:`rolloutd.rest`."""

from __future__ import annotations

import argparse
from typing import Any

from rolloutd.cli.commands import ADDRESS_HELP, STORE_URL_HELP, add_command
from rolloutd.settings import CommonSettings


def register(sub: Any) -> None:
    """Add ``rest`` and its options."""
    rest = add_command(
        sub, "rest", "serve the REST facade (POLAR / ProRL-compatible)", run, extras=("server",)
    )
    rest.add_argument("--host", default="127.0.0.1", help="bind address")
    rest.add_argument("--port", type=int, default=8080, help="bind TCP port")
    rest.add_argument("--address", default=None, help=ADDRESS_HELP)
    rest.add_argument("--store-url", default=None, help=STORE_URL_HELP)
    rest.add_argument(
        "--gateway-url",
        default=None,
        help="gateway base URL for backend admin calls; None: those routes answer 503",
    )


def run(args: argparse.Namespace, settings: CommonSettings) -> int:
    """Serve until interrupted.

    Raises:
        SystemExit: a setting refused at start, with its message (exit 1).
    """
    from rolloutd.errors import RolloutdError
    from rolloutd.rest import serve

    try:
        serve(
            args.address or settings.temporal_address,
            args.store_url or settings.store_url,
            args.host,
            args.port,
            args.gateway_url,
        )
    except RolloutdError as e:
        raise SystemExit(f"rolloutd rest: {e}") from None
    return 0
