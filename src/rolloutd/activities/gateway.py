"""Gateway-fleet activities, run in the gateway process: open/close session, build trajectory.

``open_session`` runs on the shared queue ``rolloutd-gateway`` (a session's first open on
``rolloutd-gateway-admit``, which a host polls only while its backends have room:
:class:`rolloutd.workers.capacity.SessionSlots`) and returns this host's queue
``rolloutd-gateway@{host_id}``, where ``close_session`` then runs so that the process serving
the session seals it. ``build_trajectory`` reads the durable completion log from the blob store,
so any gateway host can run it.
"""

from __future__ import annotations

import asyncio

import structlog
from temporalio import activity

from rolloutd.activities.models import (
    BackendCapacityOutput,
    BackendHealthInput,
    BackendHealthOutput,
    BuildTrajectoryInput,
    BuildTrajectoryOutput,
    CapacityInput,
    CloseSessionInput,
    CloseSessionOutput,
    OpenSessionInput,
    OpenSessionOutput,
)
from rolloutd.activities.names import (
    BACKEND_CAPACITY,
    BACKEND_HEALTH,
    BUILD_TRAJECTORY,
    CLOSE_SESSION,
    OPEN_SESSION,
)
from rolloutd.errors import to_application_error
from rolloutd.proxy.http.server import Gateway
from rolloutd.proxy.sessions.call_errors import call_waiting_at, is_backend_error
from rolloutd.proxy.sessions.state import unrecovered_errors
from rolloutd.routes import store_trace_routes
from rolloutd.store import CompletionLog, trajectory_key
from rolloutd.task_queues import host_queue
from rolloutd.trajectory import build_traces, check_invariants
from rolloutd.types import ReplayStats, Trajectory

log = structlog.get_logger(__name__)


class GatewayActivities:
    """Activities that act on the gateway living in the same process.

    Args:
        gateway: the running gateway (sessions, store, tokenizer).
        host_id: this host's id.
    """

    def __init__(self, gateway: Gateway, host_id: str) -> None:
        self.gateway = gateway
        self.host_queue = host_queue("gateway", host_id)

    @activity.defn(name=OPEN_SESSION)
    async def open_session(self, input: OpenSessionInput) -> OpenSessionOutput:
        """Open (or re-open, on retry) a gateway session and return how a harness reaches it."""
        structlog.contextvars.bind_contextvars(session_id=input.session_id, task_id=input.task_id)
        try:
            info = await self.gateway.sessions.open_session(
                input.session_id,
                input.task_id,
                sampling=input.sampling,
                model=input.model,
                replay_from=input.replay_from,
                replay_max_staleness=input.replay_max_staleness,
                wait_for_backends=input.wait_for_backends,
                pool=input.pool,
            )
        except Exception as e:
            raise to_application_error(e) from e
        started = activity.info()
        # both times are the server's: how long this attempt waited for a gateway with room
        queue_wait = max(
            0.0,
            (started.started_time - started.current_attempt_scheduled_time).total_seconds(),
        )
        return OpenSessionOutput(
            queue_wait_s=queue_wait,
            session_id=info.session_id,
            session_key=info.session_key,
            openai_base_url=info.openai_base_url,
            anthropic_base_url=info.anthropic_base_url,
            gemini_base_url=info.gemini_base_url,
            model=info.model,
            backend=info.backend,
            host_queue=self.host_queue,
        )

    @activity.defn(name=BACKEND_HEALTH)
    async def backend_health(self, input: BackendHealthInput) -> BackendHealthOutput:
        """The health of the input's pool, the policy's or the judge's (unhealthy backends
        probed first, so an engine that came back is seen without a call): whether a policy
        version has no healthy backend."""
        pool = self.gateway.pool
        await pool.probe_unhealthy()
        health = pool.judge_health() if input.pool == "judge" else pool.health()
        return BackendHealthOutput.model_validate(health)

    @activity.defn(name=BACKEND_CAPACITY)
    async def backend_capacity(self, input: CapacityInput) -> BackendCapacityOutput:
        """The pool's saturation now: open sessions against ``max_sessions_per_slot`` x
        slots (:mod:`rolloutd.proxy.backends.saturation`); unbounded without a capacity."""
        capacity = self.gateway.sessions.capacity
        if capacity is None:
            return BackendCapacityOutput()
        await capacity.refresh()
        return BackendCapacityOutput.model_validate(capacity.check().describe())

    @activity.defn(name=CLOSE_SESSION)
    async def close_session(self, input: CloseSessionInput) -> CloseSessionOutput:
        """Seal the session's completion log; later calls with its key are refused.

        Returns its failed calls too: how many, how many 5xx answers no later completion
        made good (the harness did not recover), and the last one in words. The sealed
        session then leaves the gateway's memory (its log and state are in the store:
        :meth:`rolloutd.proxy.sessions.manager.SessionManager.evict`).
        """
        structlog.contextvars.bind_contextvars(session_id=input.session_id)
        try:
            num = await self.gateway.sessions.close_session(input.session_id)
            session = await self.gateway.sessions.get(input.session_id)
        except Exception as e:
            raise to_application_error(e) from e
        state = session.state
        # every unrecovered failure is kept (not only the last few), so one that scrolled
        # out of the recent errors still decides the failure cause (docs/failures.md)
        unrecovered = [
            e for e in unrecovered_errors(state, session.recovery) if is_backend_error(e)
        ]
        waiting = input.run_deadline_at is not None and call_waiting_at(
            input.run_deadline_at,
            session.completions,
            state.errors if state.open_errors is None else [*state.errors, *state.open_errors],
            session.cut_calls,
        )
        first = unrecovered[0] if unrecovered else None
        refusal = next((e for e in reversed(state.errors) if not is_backend_error(e)), None)
        replay = ReplayStats()
        if session.replay is not None:
            try:
                await session.replay.ensure_loaded(session.completions)
                replay = session.replay.stats(session.completions)
            except Exception as e:
                raise to_application_error(e) from e
        self.gateway.sessions.evict(input.session_id)
        return CloseSessionOutput(
            replay=replay,
            num_completions=num,
            num_errors=state.num_errors,
            num_unrecovered_errors=len(unrecovered),
            last_error=state.errors[-1].describe() if state.errors else None,
            last_refusal=refusal.describe() if refusal else None,
            first_unrecovered_error=(
                f"{first.describe()} (request {first.request_hash[:12]})" if first else None
            ),
            call_waiting_at_deadline=waiting,
            num_invalid_tool_calls=sum(1 for c in session.completions if c.tool_call_parse_failed),
        )

    @activity.defn(name=BUILD_TRAJECTORY)
    async def build_trajectory(self, input: BuildTrajectoryInput) -> BuildTrajectoryOutput:
        """Build the session's trajectory from its completion log and store it.

        Raises (as ApplicationError): BuilderError when a builder invariant fails
        (:func:`rolloutd.trajectory.check_invariants`).
        """
        structlog.contextvars.bind_contextvars(session_id=input.session_id, task_id=input.task_id)
        try:
            return await asyncio.to_thread(self._build, input)
        except Exception as e:
            log.warning("trajectory_build_failed", error=str(e))
            raise to_application_error(e) from e

    def _build(self, input: BuildTrajectoryInput) -> BuildTrajectoryOutput:
        store = self.gateway.store
        completions = CompletionLog(store, input.session_id).read_all()
        # the end-of-turn token the gateway's token chains use, from the chat template
        traces, stats = build_traces(
            completions, input.builder, end_of_turn_id=self.gateway.template.end_of_turn_id
        )
        check_invariants(traces, completions)
        # routed experts (R3) stay out of line: each trace's rows go to the store beside it
        store_trace_routes(store, input.session_id, traces, completions)
        trajectory = Trajectory(
            session_id=input.session_id,
            task_id=input.task_id,
            sample_index=input.sample_index,
            status=input.status,
            builder=input.builder.type,
            traces=traces,
            stats=stats,
            metadata=input.metadata,
            failure=input.failure,
        )
        key = trajectory_key(input.session_id)
        store.put_json(key, trajectory)
        log.info(
            "trajectory_built",
            builder=input.builder.type,
            num_traces=len(traces),
            num_completions=stats.num_completions,
            num_trainable_tokens=stats.num_trainable_tokens,
        )
        return BuildTrajectoryOutput(trajectory_ref=key, num_traces=len(traces), stats=stats)
