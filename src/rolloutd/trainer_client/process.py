"""Running and ending a process that uses a Temporal client (``rolloutd`` commands, trainer
scripts, benchmarks)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def end_process(code: int) -> None:
    """End a process that used a Temporal client, skipping interpreter finalization.

    temporalio's Rust runtime (Tokio threads in ``temporal_sdk_bridge``) can call into Python
    while the interpreter finalizes; the process then dies with SIGABRT ("PyGILState_Release:
    thread state ... must be current when releasing") or SIGSEGV after its work is done, and
    its exit code is lost (temporalio/sdk-python#300, open). Measured on this project's
    machine: 3 of 40 runs of a five-line client script, 6 of 40 ``rolloutd quota`` runs.

    Call it last, once every ``async with``/``with`` has closed: it flushes logging and the
    standard streams, then leaves with ``os._exit(code)`` (``atexit`` handlers do not run).
    In a process that never loaded the bridge it returns, and the caller exits normally.

    Args:
        code: the exit status, 0-255.
    """
    if "temporalio.bridge.temporal_sdk_bridge" not in sys.modules:
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_until_sigterm(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, with SIGTERM cancelling ``main`` like Ctrl-C does.

    ``main``'s ``finally`` blocks and ``async with`` exits then run (servers it started are
    stopped, fleets drain) and the process exits 143 (128 + SIGTERM). A ``sys.exit`` from a
    plain ``signal.signal`` handler does not do that under asyncio: it is raised inside the
    event loop's ``select``, breaks the loop, and the servers' clean-up never runs (measured:
    ``benchmarks/replay_coverage.py`` hung past 100 s with its llama-server alive).

    Returns:
        What ``main`` returns.

    Raises:
        SystemExit: 143, after ``main`` unwound on SIGTERM.
    """

    async def guarded() -> T:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await main

    try:
        return asyncio.run(guarded())
    except asyncio.CancelledError:
        raise SystemExit(128 + signal.SIGTERM) from None
