"""A workflow's watch of a fleet through the fleet registry (:mod:`rolloutd.workflows.fleets`):
told by a signal when the fleet dies or lives again, so a workflow that waits on a fleet
records no event while it waits (no poll in workflow code). Deterministic code only.
"""

from __future__ import annotations

from datetime import datetime

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from rolloutd.capabilities import (
        REGISTRY_WORKFLOW_ID,
        UNWATCH_SIGNAL,
        WATCH_SIGNAL,
        FleetState,
        FleetWatch,
        PublishingFleet,
    )
    from rolloutd.workflows import signals

#: ``ApplicationError.type`` of a signal to a workflow that does not run
EXTERNAL_NOT_FOUND = "ExternalWorkflowExecutionNotFound"


class FleetStates:
    """The ``fleet_state`` signals a workflow received, by watch tag (the workflow's signal
    handler adds them; its waits read them)."""

    def __init__(self) -> None:
        self.by_tag: dict[str, FleetState] = {}

    def add(self, state: FleetState) -> None:
        """Keep ``state`` (the newest of a tag wins)."""
        self.by_tag[state.tag] = state

    def told(self, tag: str) -> bool:
        """Whether the registry answered the watch ``tag``."""
        return tag in self.by_tag


async def watch_fleet(
    fleet: PublishingFleet,
    until: str,
    *,
    tag: str,
    after_s: float = 0.0,
    since: datetime | None = None,
) -> bool:
    """Ask the registry to signal ``fleet_state`` to this workflow when ``fleet`` has been
    dead for ``after_s`` since ``since`` (``until="dead"``) or once it lives
    (``until="alive"``) (:class:`rolloutd.capabilities.FleetWatch`).

    Returns:
        True when the registry has the watch; False when no registry runs (no worker process
        of any fleet ever started in this namespace).

    Raises:
        temporalio.exceptions.ApplicationError: the signal failed for another reason.
    """
    try:
        await signals.send(
            REGISTRY_WORKFLOW_ID,
            WATCH_SIGNAL,
            FleetWatch(
                workflow_id=workflow.info().workflow_id,
                fleet=fleet,
                until=until,  # type: ignore[arg-type]
                after_s=after_s,
                since=since,
                tag=tag,
            ),
        )
    except ApplicationError as e:
        if e.type == EXTERNAL_NOT_FOUND:
            return False
        raise
    return True


async def unwatch_fleet(tag: str) -> None:
    """Withdraw this workflow's watch ``tag``; a registry that is gone is not an error."""
    try:
        await signals.send(
            REGISTRY_WORKFLOW_ID,
            UNWATCH_SIGNAL,
            FleetWatch(workflow_id=workflow.info().workflow_id, tag=tag),
        )
    except Exception as e:  # noqa: BLE001 - boundary: the registry may be gone
        workflow.logger.info("fleet watch %s not withdrawn: %s", tag, e)
