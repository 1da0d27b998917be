"""``rolloutd codec-server``: Temporal's remote codec protocol with the payload codec's keys,
so the Temporal UI and CLI can show encrypted payloads (docs/security.md)."""

from __future__ import annotations

import argparse
from typing import Any

from rolloutd.cli.commands import add_command
from rolloutd.settings import CommonSettings


def register(sub: Any) -> None:
    """Add ``codec-server`` and its options."""
    codec = add_command(
        sub,
        "codec-server",
        "serve Temporal's remote codec protocol (POST /decode, "
        "/encode) with the payload codec's keys, so the Temporal UI and CLI can show "
        "encrypted payloads (docs/security.md)",
        run,
        extras=("server",),
    )
    codec.add_argument("--host", default="127.0.0.1", help="bind address")
    codec.add_argument("--port", type=int, default=8888, help="bind TCP port")


def run(args: argparse.Namespace, settings: CommonSettings) -> int:
    """Serve until interrupted.

    Raises:
        SystemExit: no codec keys, or no ``ROLLOUTD_CODEC_SERVER_TOKEN`` (exit 1).
    """
    from rolloutd.errors import RolloutdError

    try:
        _serve_codec(args.host, args.port)
    except RolloutdError as e:
        raise SystemExit(f"rolloutd codec-server: {e}") from None
    return 0


def _serve_codec(host: str, port: int) -> None:
    """The codec server on ``host:port`` until interrupted.

    Raises:
        ConfigError: no codec keys, or no ``ROLLOUTD_CODEC_SERVER_TOKEN``.
    """
    import uvicorn

    from rolloutd.errors import ConfigError
    from rolloutd.security.codec_server import create_codec_app
    from rolloutd.security.connection import payload_codec
    from rolloutd.settings import CodecServerSettings

    settings = CodecServerSettings()
    codec = payload_codec(settings)
    if codec is None:
        raise ConfigError(
            "no codec keys: set ROLLOUTD_CODEC_KEYS or ROLLOUTD_CODEC_KEY_FILE (the fleets' keys)"
        )
    if not settings.codec_server_token:
        raise ConfigError(
            "set ROLLOUTD_CODEC_SERVER_TOKEN: whoever holds it reads every payload in clear"
        )
    origins = [o.strip() for o in settings.codec_server_origins.split(",") if o.strip()]
    app = create_codec_app(codec, settings.codec_server_token, origins=origins)
    print(
        f"codec server on http://{host}:{port} (keys {', '.join(codec.key_ids)}; "
        f"CORS {', '.join(origins)})",
        flush=True,
    )
    uvicorn.run(app, host=host, port=port, log_level="warning")
