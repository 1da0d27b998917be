"""Ending a process that used a Temporal client (``rolloutd`` commands, trainer scripts)."""

from __future__ import annotations

import logging
import os
import sys


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
