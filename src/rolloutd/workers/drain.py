"""The drain of one fleet's process on SIGTERM or SIGINT: one drain for a pod that Kubernetes
stops and for ``rolloutd up``'s orderly Ctrl-C, which sends its fleets SIGTERM
(docs/decisions.md, "One drain"; docs/faults.md, "Drain").

Every fleet stops polling at once; activities already running get ``graceful_shutdown_s``
(Temporal's ``graceful_shutdown_timeout``) to finish, then the SDK cancels them. A sandbox
host does more, because a harness run may last far longer than any grace period:

1. it hands each running harness back within a heartbeat (the harness's process group is
   stopped, its runtime torn down, and the activity fails with ``HostDrainingError``, which
   the session treats as a lost host: a new attempt on another host, replaying the calls
   already recorded; no session ends because of a drain);
2. it stops polling the shared ``rolloutd-sandbox`` queue (a provisioning that ends during
   the drain tears its runtime down and is retried by Temporal on another host);
3. it keeps polling its own queue ``rolloutd-sandbox@{host}`` while it still holds runtimes,
   up to the grace period, so that collects and teardowns of sessions whose harness had
   already finished run here instead of waiting for a host that is gone;
4. runtimes still held after the grace period are torn down, then its own queue stops.

An activity of any fleet that is still running when the grace period ends is cancelled by the
SDK and fails with a retryable ``ApplicationError`` of type ``WorkerShutdown`` (not as
cancelled: tests/workers/test_drain_shutdown.py): Temporal retries it on another worker, and
for a host-pinned one the session counts a lost host
(:data:`rolloutd.workflows.session.ending.HOST_LOST_ERRORS`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from temporalio.worker import Worker

    from rolloutd.activities.sandbox import SandboxActivities

log = structlog.get_logger(__name__)

#: how often the drain looks whether a sandbox host still holds runtimes, s
RUNTIMES_CHECK_EVERY_S = 0.1


@dataclass
class DrainReport:
    """What one fleet's drain did.

    Attributes:
        fleet: the fleet's name.
        duration_s: from the start of the drain until every worker stopped, s.
        num_handed_back: harness runs handed back to their sessions (sandbox only).
        num_runtimes_left: runtimes still held when the grace period ran out, torn down by
            the drain itself (sandbox only).
    """

    fleet: str
    duration_s: float
    num_handed_back: int = 0
    num_runtimes_left: int = 0


async def drain_fleet(
    fleet: str, workers: list[Worker], grace_s: float, sandbox: SandboxActivities | None = None
) -> DrainReport:
    """Drain a fleet's workers (the module docstring says how) and wait until they stopped.

    Args:
        fleet: the fleet's name (for logs).
        workers: the fleet's workers, each built with ``graceful_shutdown_timeout`` =
            ``grace_s``; for a sandbox host, ``[shared queue worker, host queue worker]``.
        grace_s: the grace period, s (``ROLLOUTD_GRACEFUL_SHUTDOWN_S``).
        sandbox: the sandbox host's activities (None for the other fleets).

    Returns:
        A :class:`DrainReport`. Bounded: about ``grace_s`` plus the teardown of the runtimes
        still held then.
    """
    t0 = time.monotonic()
    log.info("fleet_draining", fleet=fleet, grace_s=grace_s)
    report = DrainReport(fleet=fleet, duration_s=0.0)
    if sandbox is None:
        await asyncio.gather(*(w.shutdown() for w in workers))
    else:
        shared, own = workers
        sandbox.start_drain()
        shared_down = asyncio.ensure_future(shared.shutdown())
        deadline = t0 + grace_s
        while (sandbox.runtimes or not shared_down.done()) and time.monotonic() < deadline:
            await asyncio.sleep(RUNTIMES_CHECK_EVERY_S)
        report.num_runtimes_left = len(sandbox.runtimes)
        if sandbox.runtimes:
            log.warning("drain_grace_exceeded", fleet=fleet, num_runtimes=len(sandbox.runtimes))
            await sandbox.stop_all()
        await asyncio.gather(shared_down, own.shutdown())
        report.num_handed_back = sandbox.num_handed_back
    report.duration_s = time.monotonic() - t0
    log.info(
        "fleet_drained",
        fleet=fleet,
        duration_s=round(report.duration_s, 3),
        num_handed_back=report.num_handed_back,
        num_runtimes_left=report.num_runtimes_left,
    )
    return report
