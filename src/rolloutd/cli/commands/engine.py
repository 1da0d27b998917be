"""``rolloutd engine``: llama-server on a catalog model, with its control interface."""

from __future__ import annotations

import argparse
import contextlib
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rolloutd.cli.commands import add_command
from rolloutd.settings import CommonSettings


def register(sub: Any) -> None:
    """Add ``engine`` and its options."""
    engine = add_command(
        sub, "engine", "run llama-server on a catalog model", run, extras=("engine",)
    )
    engine.add_argument(
        "--model", default="qwen2.5-coder-0.5b", help="catalog model (rolloutd models list)"
    )
    engine.add_argument(
        "--host",
        default="127.0.0.1",
        help="bind address of llama-server and of the control port (0.0.0.0 in a container)",
    )
    engine.add_argument("--port", type=int, default=8400, help="llama-server's TCP port")
    engine.add_argument(
        "--control-port",
        type=int,
        default=0,
        help="serve the engine control interface (GET /engine, POST "
        "/engine/load; rolloutd.engine.control) on this port, with bearer "
        "$ROLLOUTD_ENGINE_CONTROL_TOKEN; 0, or the variable unset: off",
    )
    engine.add_argument(
        "--parallel", type=int, default=4, help="llama-server slots: requests decoded at once"
    )
    engine.add_argument(
        "--ctx-size", type=int, default=32768, help="context window shared by all slots, tokens"
    )


def _wait_for_signal() -> None:
    stop = False

    def handler(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    while not stop:
        time.sleep(0.5)


@contextlib.contextmanager
def _key_file(key: str | None, path: Path | None) -> Iterator[Path | None]:
    """``path``, or ``key`` written to a 0600 file in a 0700 folder of its own for as long as
    llama-server runs (``--api-key-file``: a key on its command line is every local user's to
    read in /proc), or None (no key)."""
    if key is None:
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="rolloutd-engine-") as folder:
        file = Path(folder) / "api-key"
        file.touch(mode=0o600)
        file.write_text(key)
        yield file


def run(args: argparse.Namespace, settings: CommonSettings) -> int:
    """Serve llama-server (and the control interface when asked) until SIGINT or SIGTERM."""
    from rolloutd.engine.control import EngineControlServer
    from rolloutd.engine.server import LlamaServer
    from rolloutd.settings import EngineSettings

    engine = EngineSettings()
    token = engine.control_token
    with (
        _key_file(engine.api_key, engine.api_key_file) as key_file,
        LlamaServer(
            args.model,
            host=args.host,
            port=args.port,
            parallel=args.parallel,
            ctx_size=args.ctx_size,
            api_key_file=key_file,
        ) as srv,
    ):
        print(f"llama-server on {srv.url} serving {srv.files.served_name}", flush=True)
        if args.control_port and token:
            with EngineControlServer(
                srv, token=token, host=args.host, port=args.control_port
            ) as control:
                print(f"engine control on {control.url}", flush=True)
                _wait_for_signal()
        else:
            print(
                "engine control off (needs --control-port and ROLLOUTD_ENGINE_CONTROL_TOKEN)",
                flush=True,
            )
            _wait_for_signal()
    return 0
