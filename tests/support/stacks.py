"""``rolloutd up``'s stack for tests that bring their own engine (no supervisor)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from rolloutd.stack import free_port
from rolloutd.stack.local import LocalStack


def stack_on_engine(engine_url: str, host_id: str, **extra_env: str) -> LocalStack:
    """A :class:`LocalStack` (not started) on ``engine_url`` in a fresh home under /tmp.

    The home's path is short: the runtimes' unix sockets live under it (108 bytes at most).
    Free ports, no metrics port, no supervisor (a test stops what it broke), plain-text logs,
    ``ROLLOUTD_HOST_ID`` set to ``host_id``; ``extra_env`` goes to every child on top.
    """
    home = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))
    (home / "logs").mkdir()
    return LocalStack(
        home=home,
        engine_url=engine_url,
        temporal_port=free_port(),
        ui_port=free_port(),
        gateway_port=free_port(),
        metrics_port=0,
        supervise=False,
        extra_env={"ROLLOUTD_LOG_JSON": "false", "ROLLOUTD_HOST_ID": host_id, **extra_env},
    )
