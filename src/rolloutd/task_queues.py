"""Task-queue names of the fleets, and the host-specific queue of a runtime's host.

docs/architecture.md, "Processes", lists each fleet's queues and what runs there.
"""

from __future__ import annotations

from typing import Literal

Fleet = Literal["workflows", "sandbox", "gateway", "eval"]

WORKFLOWS = "rolloutd-workflows"
SANDBOX = "rolloutd-sandbox"
GATEWAY = "rolloutd-gateway"
EVAL = "rolloutd-eval"
#: the eval fleet's judgings (LLM judges), with slots of their own apart from evaluations
JUDGE = "rolloutd-judge"
#: a session's first open waits here until a gateway's backends have room (each gateway host
#: polls it only while its pool takes one more open session)
GATEWAY_ADMIT = "rolloutd-gateway-admit"

FLEET_QUEUES: dict[str, str] = {
    "workflows": WORKFLOWS,
    "sandbox": SANDBOX,
    "gateway": GATEWAY,
    "eval": EVAL,
}


def host_queue(fleet: Fleet, host_id: str) -> str:
    """The worker-specific task queue of one host of a fleet.

    Args:
        fleet: ``sandbox`` or ``gateway`` (the fleets that own host-bound state).
        host_id: the host's id, unique in the cluster.

    Returns:
        ``"{fleet queue}@{host_id}"``, e.g. ``rolloutd-sandbox@node-3``
        (samples-python worker_specific_task_queues/ pattern).
    """
    return f"{FLEET_QUEUES[fleet]}@{host_id}"
