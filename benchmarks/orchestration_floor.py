"""The bare-Temporal floor of ``benchmarks/orchestration.py``: rolloutd's session shape with
nothing inside it.

A parent workflow per task (:class:`FloorTaskWorkflow`) starts one child workflow per sample
(:class:`FloorSessionWorkflow`); each runs, one after the other, as many activities and local
activities as a rolloutd session ran in the same benchmark run (counted from its histories),
and the parent runs as many as a rolloutd task did. Every activity is :func:`noop`: a pydantic
model in, one out, no I/O.

Activities run on the workflows' own task queue (the cheapest shape: the SDK asks for each
at once in the workflow task that schedules it, Temporal's eager activity execution, and
the worker polls for almost none), or, with ``activity_queue``, on a queue of their own, as
rolloutd's run on their fleets' queues (each is polled for).

Workflows, activities and the client use rolloutd's Temporal client factory
(:func:`rolloutd.security.connection.connect_temporal`: the pydantic data converter, the
payload codec with the stack's key, the failure converter), and the worker polls with the
fleets' poller behaviour and workflow cache size (:mod:`rolloutd.workers`). So what a
rolloutd session costs beyond this is what rolloutd adds, not what Temporal itself charges for
a workflow, a child and an activity.

The worker is one process polling both queues:

    python -c "import orchestration_floor as f; f.main()" ADDRESS TASK_QUEUE ACTIVITY_QUEUE

(with ``benchmarks/`` on ``sys.path``). It is started by name, not as ``__main__``: Temporal's
workflow sandbox re-imports a workflow's module for each run, and everything this module
imports besides temporalio is passed through, as rolloutd's workflow modules do.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel

    from rolloutd.security.connection import connect_temporal
    from rolloutd.settings import CommonSettings
    from rolloutd.workers import TASK_POLLS

#: an activity's budget; a no-op takes milliseconds
ACTIVITY_TIMEOUT = timedelta(seconds=60)


class NoopInput(BaseModel):
    """What a no-op activity is given: whose step it is."""

    session_id: str
    step: int


class NoopOutput(BaseModel):
    """What a no-op activity returns: the step it did."""

    step: int


class FloorSessionInput(BaseModel):
    """One sample of a floor task."""

    session_id: str
    num_activities: int = 0
    num_local_activities: int = 0
    #: the activities' task queue (None: the workflow's own)
    activity_queue: str | None = None


class FloorSessionOutput(BaseModel):
    """A floor session's result: the activities it ran."""

    session_id: str
    num_activities: int


class FloorTaskInput(BaseModel):
    """A floor task: ``num_samples`` children, each with the given activities; the parent's
    own activities before its children start, as rolloutd's task runs its own."""

    task_id: str
    num_samples: int
    session_activities: int = 0
    session_local_activities: int = 0
    task_activities: int = 0
    task_local_activities: int = 0
    #: the activities' task queue (None: the workflows' own)
    activity_queue: str | None = None


class FloorTaskOutput(BaseModel):
    """The group: every child's result."""

    task_id: str
    sessions: list[FloorSessionOutput]


@activity.defn
async def noop(input: NoopInput) -> NoopOutput:
    """Do nothing: the activity's cost is Temporal's alone."""
    return NoopOutput(step=input.step)


async def _steps(session_id: str, num_activities: int, num_local: int, queue: str | None) -> int:
    for step in range(num_activities):
        await workflow.execute_activity(
            noop,
            NoopInput(session_id=session_id, step=step),
            task_queue=queue,
            start_to_close_timeout=ACTIVITY_TIMEOUT,
        )
    for step in range(num_local):
        await workflow.execute_local_activity(
            noop,
            NoopInput(session_id=session_id, step=step),
            start_to_close_timeout=ACTIVITY_TIMEOUT,
        )
    return num_activities + num_local


@workflow.defn
class FloorSessionWorkflow:
    """A session of the floor: its activities in sequence, then its result."""

    @workflow.run
    async def run(self, input: FloorSessionInput) -> FloorSessionOutput:
        done = await _steps(
            input.session_id,
            input.num_activities,
            input.num_local_activities,
            input.activity_queue,
        )
        return FloorSessionOutput(session_id=input.session_id, num_activities=done)


@workflow.defn
class FloorTaskWorkflow:
    """A task of the floor: its own activities, then one child per sample (ids
    ``{parent}/{index}``, as rolloutd's), all at once, and the group."""

    @workflow.run
    async def run(self, input: FloorTaskInput) -> FloorTaskOutput:
        await _steps(
            input.task_id, input.task_activities, input.task_local_activities, input.activity_queue
        )
        parent = workflow.info().workflow_id
        sessions = await asyncio.gather(
            *(
                workflow.execute_child_workflow(
                    FloorSessionWorkflow.run,
                    FloorSessionInput(
                        session_id=f"{input.task_id}/{index}",
                        num_activities=input.session_activities,
                        num_local_activities=input.session_local_activities,
                        activity_queue=input.activity_queue,
                    ),
                    id=f"{parent}/{index}",
                )
                for index in range(input.num_samples)
            )
        )
        return FloorTaskOutput(task_id=input.task_id, sessions=list(sessions))


async def serve(address: str, task_queue: str, activity_queue: str) -> None:
    """Run the floor's workers until SIGTERM or SIGINT: workflows and activities on
    ``task_queue``, activities alone on ``activity_queue``."""
    settings = CommonSettings(temporal_address=address)
    client = await connect_temporal(settings)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    workflows = Worker(
        client,
        task_queue=task_queue,
        workflows=[FloorTaskWorkflow, FloorSessionWorkflow],
        activities=[noop],
        max_cached_workflows=settings.max_cached_workflows,
        workflow_task_poller_behavior=TASK_POLLS,
        activity_task_poller_behavior=TASK_POLLS,
    )
    activities = Worker(
        client,
        task_queue=activity_queue,
        activities=[noop],
        activity_task_poller_behavior=TASK_POLLS,
    )
    async with workflows, activities:
        print("floor worker polling", task_queue, activity_queue, flush=True)
        await stop.wait()


def main() -> None:
    """``ADDRESS TASK_QUEUE ACTIVITY_QUEUE`` from the command line: :func:`serve`."""
    asyncio.run(serve(sys.argv[1], sys.argv[2], sys.argv[3]))
