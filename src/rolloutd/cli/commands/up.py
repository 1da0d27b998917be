"""``rolloutd up``: the embedded stack (Temporal, engine, every fleet) until Ctrl-C; on an
engine the user already runs with ``--engine-url`` (:mod:`rolloutd.cli.engine_options`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rolloutd.cli.commands import HOME_HELP, add_command, add_port_options
from rolloutd.cli.engine_options import DEFAULT_MODEL, add_engine_options
from rolloutd.settings import CommonSettings


def register(sub: Any) -> None:
    """Add ``up`` and its options."""
    up = add_command(
        sub,
        "up",
        "run the embedded stack (Temporal, engine, every fleet)",
        run,
        extras=("server",),
    )
    add_engine_options(up)
    add_port_options(up)
    up.add_argument("--home", type=Path, default=None, help=HOME_HELP)
    up.add_argument(
        "--metrics-port",
        type=int,
        default=9300,
        help="first of the fleets' Prometheus metrics ports (workflows, sandbox, "
        "gateway, eval: this port + 0..3; docs/metrics.md); 0: off",
    )


def run(args: argparse.Namespace, settings: CommonSettings) -> int:
    """Start the stack, print where each part answers, serve until Ctrl-C (which drains).

    Raises:
        SystemExit: bad codec keys or a refused engine (before anything starts), or a child's
            restart limit.
    """
    from rolloutd.cli import tables
    from rolloutd.cli.engine_options import external_engine
    from rolloutd.cli.engines import engine_view
    from rolloutd.errors import RolloutdError
    from rolloutd.security.connection import payload_codec
    from rolloutd.settings import (
        GatewaySettings,
        admin_token_file,
        codec_server_token_file,
        default_home,
    )
    from rolloutd.stack.local import LocalStack
    from rolloutd.stack.status import check_engines

    try:  # the fleets inherit these settings: refuse bad keys before starting anything
        codec = payload_codec(settings)
    except RolloutdError as e:
        raise SystemExit(f"rolloutd up: {e}") from None
    engine = external_engine(args, GatewaySettings().backend_api_key)
    with LocalStack(
        home=args.home or default_home(),
        model=args.model or DEFAULT_MODEL,
        external_engine=engine,
        temporal_port=args.temporal_port,
        ui_port=args.ui_port,
        gateway_port=args.gateway_port,
        metrics_port=args.metrics_port,
    ) as stack:
        assert stack.temporal is not None
        if stack.codec_key_file is not None:
            codec = payload_codec(
                CommonSettings(codec_keys=None, codec_key_file=str(stack.codec_key_file))
            )
        codec_line = (
            f"on, payloads encrypted with key {codec.key_id}"
            + (f" ({stack.codec_key_file}, generated)" if stack.codec_key_file else "")
            if codec
            else 'off (ROLLOUTD_CODEC_KEYS="": payloads stored in clear; docs/security.md)'
        )
        codec_server = (
            f"{stack.codec_url} (the Temporal UI decodes through it; token in "
            f"{codec_server_token_file(stack.home)})"
            if stack.codec_url
            else "the operator's (ROLLOUTD_UI_CODEC_ENDPOINT)"
            if stack.ui_codec_endpoint
            else "off"
        )
        metrics = (
            "  ".join(
                f"{fleet} http://127.0.0.1:{port}/metrics"
                for fleet, port in stack.metrics_ports().items()
            )
            or "off"
        )
        admin_line = (
            f"{admin_token_file(stack.home)} (generated; the trainer client "
            "and `rolloutd rest` read it)"
            if stack.admin_token
            else "from ROLLOUTD_ADMIN_TOKEN"
        )
        weight_sync = (
            "the gateway pauses and drains, your engine loads the weights through its own "
            "API, the gateway sets the version and resumes (docs/own_engine.md)"
            if engine is not None
            else "the gateway reloads this stack's llama-server (docs/rl_loop.md)"
        )
        tables.show(*engine_view(stack.state, check_engines(stack.state, stack.home)))
        print(
            f"Weight sync: {weight_sync}\n"
            f"Codec:       {codec_line}\n"
            f"Codec server: {codec_server}\n"
            f"Temporal UI: {stack.temporal.ui_url}\n"
            f"Metrics:     {metrics}\n"
            f"Temporal:    {stack.temporal.address}\n"
            f"Gateway:     {stack.gateway_url}\n"
            f"Admin token: {admin_line}\n"
            f"Store:       {stack.store_url}\n"
            f"Logs:        {stack.logs}\n"
            f"Status:      rolloutd status --home {stack.home}\n"
            f"Ctrl-C drains the fleets (no session ends) and stops everything.",
            flush=True,
        )
        if (failure := stack.serve_forever()) is not None:  # a child's restart limit
            raise SystemExit(f"rolloutd up: {failure}")
    return 0
