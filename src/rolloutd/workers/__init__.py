"""Workers of the four fleets (:mod:`~rolloutd.workers.fleets`: ``run_fleet(fleet, ...)``)
and the ``rolloutd worker`` process (:mod:`~rolloutd.workers.process`: ``connect``,
``run_process``); each process's gRPC health (:mod:`~rolloutd.workers.health`), its place in
the fleet registry (:mod:`~rolloutd.workers.registry`), its drain on SIGTERM
(:mod:`~rolloutd.workers.drain`) and its slot suppliers (:mod:`~rolloutd.workers.capacity`).
"""

from rolloutd.workers.fleets import (
    FLEETS,
    HEARTBEAT_THROTTLE,
    HOST_QUEUE_SLOTS,
    TASK_POLLS,
    FleetHandle,
    every_workflow,
    run_fleet,
)
from rolloutd.workers.process import (
    CONNECT_BACKOFF,
    connect,
    freeze_startup_objects,
    loop_factory,
    run_forever,
    run_process,
)

__all__ = [
    "CONNECT_BACKOFF",
    "FLEETS",
    "HEARTBEAT_THROTTLE",
    "HOST_QUEUE_SLOTS",
    "TASK_POLLS",
    "FleetHandle",
    "connect",
    "every_workflow",
    "freeze_startup_objects",
    "loop_factory",
    "run_fleet",
    "run_forever",
    "run_process",
]
