"""The workers of the four fleets: :func:`run_fleet` builds one fleet's Temporal workers (and,
for the gateway, its HTTP server), publishes the process to the fleet registry, and drains it
at the end.

| fleet     | queues                                      | what it runs                         |
|-----------|---------------------------------------------|--------------------------------------|
| workflows | rolloutd-workflows                          | workflows + local activities         |
| sandbox   | rolloutd-sandbox, rolloutd-sandbox@{host}   | provision / run / collect / teardown |
| gateway   | rolloutd-gateway, rolloutd-gateway@{host},  | HTTP gateway + session activities    |
|           | rolloutd-gateway-admit                      | (admission: opens while backends     |
|           |                                             | have room)                           |
| eval      | rolloutd-eval                               | evaluate, read_task_chunk, callbacks,|
|           |                                             | generation I/O                       |
|           | rolloutd-judge                              | LLM judges (own slots)               |

Every worker process publishes itself to the fleet registry once its workers poll (sandbox and
eval hosts with what they can run), beats there every ``fleet_heartbeat_s`` (its liveness,
:func:`rolloutd.capabilities.fleet_liveness`), and withdraws when it stops
(:mod:`rolloutd.workers.registry`). When :func:`run_fleet`'s block exits, the fleet drains
(:mod:`rolloutd.workers.drain`): it stops polling, a sandbox host hands its running harnesses
back, and other activities get ``ROLLOUTD_GRACEFUL_SHUTDOWN_S`` to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import structlog
from temporalio.client import Client
from temporalio.worker import (
    FixedSizeSlotSupplier,
    PollerBehaviorSimpleMaximum,
    Worker,
    WorkerTuner,
)

from rolloutd import task_queues
from rolloutd.capabilities import HostCapabilities
from rolloutd.settings import (
    CommonSettings,
    EvalSettings,
    GatewaySettings,
    SandboxSettings,
)
from rolloutd.store import BlobStore
from rolloutd.task_queues import Fleet
from rolloutd.workers.capacity import RuntimeSlots, SessionSlots, size_pool_forever
from rolloutd.workers.drain import drain_fleet

log = structlog.get_logger(__name__)

FLEETS: tuple[Fleet, ...] = ("workflows", "sandbox", "gateway", "eval")
#: activity slots of a sandbox host's own queue (runs, collects, teardowns of its runtimes).
HOST_QUEUE_SLOTS = 1000
#: concurrent task polls of the workflow worker (80 % on its sticky queue) and of the session
#: queues (sandbox host queue: run/collect/teardown; gateway: close, build). Each poll waits on
#: the server's write, so the SDK's 5 drain a burst slowly: 100 sessions cancelled at once (4-5
#: workflow tasks and 3 activities each to tear down, close and build) waited seconds per task
#: for a poll (docs/measurements.md). Idle long polls cost the server nothing.
TASK_POLLS = PollerBehaviorSimpleMaximum(25)
#: the longest an activity's heartbeats are held back. Temporal delivers an activity's
#: cancellation only in the answer to a heartbeat, and the SDK sends them at most every
#: min(0.8 x heartbeat timeout, this): with the 10 s heartbeat timeout a cancelled harness
#: learned of it up to 8 s late. 2 s: 100 running harnesses cost the server 50 heartbeats a
#: second.
HEARTBEAT_THROTTLE = timedelta(seconds=2)


@dataclass
class FleetHandle:
    """The running workers of one fleet, and what they own (gateway server, runtimes)."""

    fleet: Fleet
    workers: list[Worker]
    resources: dict[str, Any] = field(default_factory=dict)


@dataclass
class _FleetParts:
    """What a fleet's builder leaves for :func:`run_fleet` to start and, at the end, stop."""

    #: Temporal's graceful_shutdown_timeout: activities still running when the drain began
    #: get this long to finish, then the SDK cancels them
    grace_s: float
    #: called after the drain, last first
    cleanups: list[Callable[[], Awaitable[Any]]] = field(default_factory=list)
    #: what the process publishes to the fleet registry (and beats for)
    host: HostCapabilities | None = None
    #: seconds between two beats
    heartbeat_s: float = 10.0
    #: monotonic time the drain began (set when it does)
    drain_began: float = field(default_factory=time.monotonic)

    @property
    def grace(self) -> timedelta:
        return timedelta(seconds=self.grace_s)


@contextlib.asynccontextmanager
async def run_fleet(
    fleet: Fleet, client: Client, settings: CommonSettings | None = None
) -> AsyncIterator[FleetHandle]:
    """Run one fleet's workers (and, for ``gateway``, its HTTP server) until the block exits.

    Args:
        fleet: ``workflows``, ``sandbox``, ``gateway`` or ``eval``.
        client: a Temporal client (from :func:`rolloutd.workers.process.connect`).
        settings: the fleet's settings; default: read from ``ROLLOUTD_*`` variables.

    Yields:
        A :class:`FleetHandle`; for the gateway, ``resources["gateway"]`` is the
        :class:`~rolloutd.proxy.http.server.Gateway` and ``resources["server"]`` its server handle.
        When the block exits, the fleet drains (:func:`rolloutd.workers.drain.drain_fleet`,
        bounded by ``settings.graceful_shutdown_s``) and ``resources["drain"]`` holds its
        :class:`~rolloutd.workers.drain.DrainReport`; then what the fleet owns is stopped.

    Raises:
        ValueError: an unknown fleet.
    """
    build = _BUILDERS.get(fleet)
    if build is None:
        raise ValueError(f"unknown fleet {fleet!r}; one of {', '.join(FLEETS)}")
    if fleet in ("sandbox", "eval"):
        from rolloutd.evaluators import register_evaluators

        # the operator's evaluators: eval hosts score with them, sandbox hosts run their checks
        register_evaluators((settings or CommonSettings()).evaluators)
    handle = FleetHandle(fleet=fleet, workers=[])
    common = settings or CommonSettings()
    parts = _FleetParts(grace_s=common.graceful_shutdown_s, heartbeat_s=common.fleet_heartbeat_s)
    await build(handle, client, settings, parts)
    if parts.host is None:
        from rolloutd.workers.registry import host_capabilities

        parts.host = host_capabilities(fleet, common.host_id)
    async with contextlib.AsyncExitStack() as stack:
        for worker in handle.workers:
            await stack.enter_async_context(worker)
        log.info("fleet_started", fleet=fleet, task_queues=[w.task_queue for w in handle.workers])
        from rolloutd.workers.registry import beat, export_liveness, publish, withdraw

        # published once polling: a task accepted on it finds a worker; withdrawn first
        # at stop, before the drain
        published = parts.host
        await publish(client, published)
        beating = asyncio.create_task(beat(client, published, parts.heartbeat_s))
        handle.resources["heartbeat"] = beating
        exporting = (
            asyncio.create_task(export_liveness(client, parts.heartbeat_s))
            if fleet == "workflows"
            else None
        )
        try:
            yield handle
        finally:
            parts.drain_began = time.monotonic()
            for task in (beating, exporting):
                if task is not None:
                    await _cancelled(task)
            with contextlib.suppress(Exception):
                await withdraw(client, published)
            try:
                handle.resources["drain"] = await drain_fleet(
                    fleet,
                    handle.workers,
                    parts.grace_s,
                    handle.resources.get("activities") if fleet == "sandbox" else None,
                )
            except Exception as e:  # noqa: BLE001 - a process boundary: the cleanups below still run
                log.error("fleet_drain_failed", fleet=fleet, error=repr(e))
            for cleanup in reversed(parts.cleanups):
                with contextlib.suppress(Exception):
                    await cleanup()
    log.info("fleet_stopped", fleet=fleet)


async def _cancelled(task: asyncio.Task[Any]) -> None:
    """Cancel a background task of the process and wait for it to end."""
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


def every_workflow() -> list[type]:
    """The workflow classes the workflows fleet registers (imported on the call: the other
    fleets do not load the workflow code)."""
    from rolloutd.workflows.buffer.workflow import RolloutBufferWorkflow
    from rolloutd.workflows.callback import CallbackWorkflow
    from rolloutd.workflows.fleets import FleetRegistryWorkflow
    from rolloutd.workflows.generation.workflow import GenerationWorkflow
    from rolloutd.workflows.reverify import ReverifyWorkflow
    from rolloutd.workflows.session.judging import RejudgeWorkflow
    from rolloutd.workflows.session.workflow import RolloutSessionWorkflow
    from rolloutd.workflows.task import RolloutTaskWorkflow
    from rolloutd.workflows.tenants import TenantWorkflow

    return [
        RolloutTaskWorkflow,
        RolloutSessionWorkflow,
        RolloutBufferWorkflow,
        FleetRegistryWorkflow,
        CallbackWorkflow,
        GenerationWorkflow,
        TenantWorkflow,
        ReverifyWorkflow,
        RejudgeWorkflow,
    ]


async def _workflows_fleet(
    handle: FleetHandle, client: Client, settings: CommonSettings | None, parts: _FleetParts
) -> None:
    """The workflows fleet: every workflow, and the local activities they run."""
    from rolloutd.activities.cancel import cancel_workflows
    from rolloutd.activities.capacity import CapacityActivities

    handle.workers.append(
        Worker(
            client,
            task_queue=task_queues.WORKFLOWS,
            workflows=every_workflow(),
            # local activities only: a cancelled task cancels its sessions directly with
            # cancel_workflows
            activities=[
                cancel_workflows,
                CapacityActivities(client).sandbox_capacity,
            ],
            no_remote_activities=True,
            max_cached_workflows=(settings or CommonSettings()).max_cached_workflows,
            workflow_task_poller_behavior=TASK_POLLS,
            graceful_shutdown_timeout=parts.grace,
        )
    )


async def _sandbox_fleet(
    handle: FleetHandle, client: Client, settings: CommonSettings | None, parts: _FleetParts
) -> None:
    """A sandbox host: provisioning bounded by its runtimes, and its own queue's activities."""
    from rolloutd.activities.sandbox import SandboxActivities
    from rolloutd.sandbox.runtimes import host_policy
    from rolloutd.workers.registry import host_capabilities

    s = settings if isinstance(settings, SandboxSettings) else SandboxSettings()
    # the built-in policy's runtimes narrow to those whose isolation this host verifies
    policy = await asyncio.to_thread(host_policy, s.sandbox_policy)
    s = s.model_copy(update={"sandbox_policy": policy})
    host = await asyncio.to_thread(host_capabilities, "sandbox", s.host_id)
    host.max_concurrent_sessions = s.max_concurrent_sessions
    host.policy = s.sandbox_policy
    parts.host = host
    acts = SandboxActivities(s, BlobStore(s.store_url))
    # before polling: runtimes a killed worker left on this root are killed and removed,
    # so a teardown of them that arrives on this host's queue finds nothing left running
    reclaimed = await asyncio.to_thread(acts.reclaim)
    # backpressure: a provisioning slot is handed out only while the host's live
    # runtimes (so its running harnesses) stay under max_concurrent_sessions
    slots = RuntimeSlots(
        s.max_concurrent_sessions,
        lambda: len(acts.runtimes),
        max_reserved=s.max_concurrent_provisions,
    )
    acts.on_runtime_gone = slots.notify
    handle.resources.update(activities=acts, reclaimed=reclaimed, slots=slots)
    if acts.pool is not None:  # the pool grows with the sessions waiting for a host
        sizing = asyncio.create_task(
            size_pool_forever(client, acts.pool), name="rolloutd-size-warm-pool"
        )
        handle.resources.update(pool_sizing=sizing)
    handle.workers += [
        Worker(
            client,
            task_queue=task_queues.SANDBOX,
            activities=[acts.provision_runtime],
            tuner=_activity_slots_from(slots),
            max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
            graceful_shutdown_timeout=parts.grace,
        ),
        # every provisioned runtime needs a slot here for its run and then its teardown;
        # provisioning (above) is what bounds the number of runtimes
        Worker(
            client,
            task_queue=acts.host_queue,
            activities=[
                acts.run_harness,
                acts.collect_artifacts,
                acts.restore_final_state,
                acts.teardown_runtime,
            ],
            max_concurrent_activities=HOST_QUEUE_SLOTS,
            activity_task_poller_behavior=TASK_POLLS,
            max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
            graceful_shutdown_timeout=parts.grace,
        ),
    ]
    parts.cleanups.append(acts.stop_all)
    if "pool_sizing" in handle.resources:  # stopped first: nothing refills a stopped pool
        parts.cleanups.append(lambda: _cancelled(handle.resources["pool_sizing"]))


def _activity_slots_from(supplier: RuntimeSlots | SessionSlots) -> WorkerTuner:
    """A worker's tuner whose activity slots ``supplier`` hands out (one slot each for
    workflows, local activities and Nexus tasks, which such a worker does not run)."""
    return WorkerTuner.create_composite(
        workflow_supplier=FixedSizeSlotSupplier(1),
        activity_supplier=supplier,
        local_activity_supplier=FixedSizeSlotSupplier(1),
        nexus_supplier=FixedSizeSlotSupplier(1),
    )


async def _gateway_fleet(
    handle: FleetHandle, client: Client, settings: CommonSettings | None, parts: _FleetParts
) -> None:
    """A gateway host: the HTTP gateway, and the session and trajectory activities."""
    from rolloutd.activities.gateway import GatewayActivities
    from rolloutd.proxy.http.server import Gateway, serve

    s = settings if isinstance(settings, GatewaySettings) else GatewaySettings()
    gateway = await asyncio.to_thread(Gateway.from_settings, s)
    server = await serve(gateway, s.gateway_host, s.gateway_port)
    acts = GatewayActivities(gateway, s.host_id)
    capacity = gateway.sessions.capacity

    def room() -> tuple[int, int | None]:
        if capacity is None or capacity.max_sessions_per_slot is None:
            return 0, None
        load = capacity.check()
        return load.num_sessions_open, load.max_sessions

    admission = SessionSlots(room, capacity.refresh if capacity is not None else None)
    # copies of sessions another gateway re-opened (a retried open) give their place back
    superseded = asyncio.create_task(
        gateway.sessions.drop_superseded_forever(), name="rolloutd-drop-superseded"
    )
    handle.resources.update(
        gateway=gateway,
        server=server,
        activities=acts,
        admission=admission,
        drop_superseded=superseded,
    )
    handle.workers += [
        # a session's first open: taken only while the pool has room, so sessions waiting
        # for the backends are this queue's backlog (ordered by priority and fairness)
        Worker(
            client,
            task_queue=task_queues.GATEWAY_ADMIT,
            activities=[acts.open_session],
            tuner=_activity_slots_from(admission),
            graceful_shutdown_timeout=parts.grace,
        ),
        # close_session here too: when the gateway host serving a session is gone, any
        # gateway seals it from the durable state in the store
        Worker(
            client,
            task_queue=task_queues.GATEWAY,
            activities=[
                acts.open_session,
                acts.close_session,
                acts.build_trajectory,
                acts.backend_health,
                acts.backend_capacity,
            ],
            activity_task_poller_behavior=TASK_POLLS,
            graceful_shutdown_timeout=parts.grace,
        ),
        Worker(
            client,
            task_queue=acts.host_queue,
            activities=[acts.close_session, acts.build_trajectory],
            activity_task_poller_behavior=TASK_POLLS,
            graceful_shutdown_timeout=parts.grace,
        ),
    ]
    # after the drain: harness calls in flight are answered (and recorded) within what
    # is left of the grace period (a call cut here was sampled for nothing)
    parts.cleanups.append(
        lambda: server.shutdown(
            timeout_s=max(1.0, parts.grace_s - (time.monotonic() - parts.drain_began))
        )
    )
    parts.cleanups.append(lambda: _cancelled(superseded))


async def _eval_fleet(
    handle: FleetHandle, client: Client, settings: CommonSettings | None, parts: _FleetParts
) -> None:
    """An eval host: evaluators, the trainer's I/O, the generations' activities."""
    from rolloutd.activities.closed import closed_workflows
    from rolloutd.activities.evaluation import EvalActivities
    from rolloutd.activities.judging import JudgeActivities
    from rolloutd.activities.reverify import ReverifyActivities
    from rolloutd.activities.trainer_io import TrainerIOActivities
    from rolloutd.generation.activities import GenerationActivities
    from rolloutd.workers.registry import host_capabilities

    s = settings if isinstance(settings, EvalSettings) else EvalSettings()
    parts.host = host_capabilities("eval", s.host_id)
    acts = EvalActivities(BlobStore(s.store_url), host_id=s.host_id)
    reverify = ReverifyActivities(BlobStore(s.store_url))
    io = TrainerIOActivities(allowed_hosts=s.callback_allowed_hosts)
    gen = GenerationActivities(client, BlobStore(s.store_url))
    judges = JudgeActivities(BlobStore(s.store_url))
    handle.resources.update(judges=judges)
    handle.workers.append(
        Worker(
            client,
            task_queue=task_queues.EVAL,
            activities=[
                acts.evaluate,
                acts.check_evaluator,
                acts.store_task_request,
                acts.read_task_request,
                acts.store_group,
                acts.store_group_part,
                acts.assemble_group,
                # a tenant and a buffer ask whether their holders still run
                closed_workflows,
                io.read_task_chunk,
                io.post_callback,
                gen.plan_generation,
                gen.journal_row,
                gen.await_task,
                gen.write_generation_outputs,
                reverify.plan,
                reverify.rescore,
                reverify.summarize,
                judges.judge_failed,
            ],
            max_concurrent_activities=s.max_concurrent_evaluations,
            max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
            graceful_shutdown_timeout=parts.grace,
        )
    )
    # judgings wait in their own queue for their own slots: a burst of judgings never holds
    # the evaluations' slots, nor the reverse, and the queue's backlog scales the judges
    handle.workers.append(
        Worker(
            client,
            task_queue=task_queues.JUDGE,
            activities=[judges.judge],
            max_concurrent_activities=s.max_concurrent_judgings,
            max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
            graceful_shutdown_timeout=parts.grace,
        )
    )
    parts.cleanups.append(io.aclose)
    parts.cleanups.append(judges.aclose)


#: how each fleet's workers are built
_BUILDERS: dict[str, Callable[..., Awaitable[None]]] = {
    "workflows": _workflows_fleet,
    "sandbox": _sandbox_fleet,
    "gateway": _gateway_fleet,
    "eval": _eval_fleet,
}
