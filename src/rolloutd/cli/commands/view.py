"""``rolloutd view ID``: the trace viewer's page of a session or a task."""

from __future__ import annotations

import argparse
from typing import Any

from rolloutd.cli.commands import add_command
from rolloutd.settings import CommonSettings


def register(sub: Any) -> None:
    """Add ``view`` and its options."""
    view = add_command(
        sub,
        "view",
        "open the trace viewer's page of a session or a task (prints "
        "its URL; serves the viewer itself when no REST facade answers at --url)",
        run,
        extras=("server",),
    )
    view.add_argument("id", metavar="ID", help="a session id ({task_id}/{index}) or a task id")
    view.add_argument(
        "--url", default="http://127.0.0.1:8080", help="base URL of a running `rolloutd rest`"
    )
    view.add_argument(
        "--address",
        default=None,
        help="Temporal address host:port, when serving; None: "
        "$ROLLOUTD_TEMPORAL_ADDRESS or localhost:7233",
    )
    view.add_argument(
        "--store-url",
        default=None,
        help="fsspec URL of the blob store, when serving; None: "
        "$ROLLOUTD_STORE_URL or ~/.rolloutd/store",
    )


def run(args: argparse.Namespace, settings: CommonSettings) -> int:
    """Print the page's URL, serving the viewer when nothing answers (``rolloutd.viewer``)."""
    from rolloutd.settings import RestSettings
    from rolloutd.viewer.command import main as view_main

    return view_main(
        args.id,
        url=args.url,
        address=args.address or settings.temporal_address,
        store_url=args.store_url or settings.store_url,
        namespace=settings.temporal_namespace,
        viewer_model=RestSettings().viewer_model,
    )
