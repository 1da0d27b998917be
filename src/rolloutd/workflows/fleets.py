"""``FleetRegistryWorkflow``: what the fleets' hosts can run, and whether each fleet lives
(:mod:`rolloutd.capabilities`).

One per namespace, id ``rolloutd-fleets``, on the workflows queue. Every worker process
signal-with-starts it when its workers start (``register``), beats every few seconds
(``heartbeat``, signal-with-start too) and signals it when it stops (``unregister``); a
process not heard from for :data:`~rolloutd.capabilities.FORGET_AFTER_S` (a killed pod) is
dropped. The query ``capabilities`` answers every registered process and each fleet's latest
beat; the update ``check_evaluator`` asks an eval host whether an evaluator import path
imports there (the submitting process never imports it).

Workflows that wait on a fleet watch it (``watch_fleet``): a session whose provisioning waits
in the sandbox queue is told (``fleet_state``) once the sandbox fleet has been dead for its
``provision_wait_s``; a task holding a replacement back is told once the fleet beats again.
The registry keeps one durable timer for the earliest due watch: a waiting workflow records no
event while it waits (no poll in workflow code).

Its history stays bounded: it continues as new, carrying the registered hosts and the watches,
once the server suggests it or after :data:`MAX_HISTORY_EVENTS` events, when no handler is
running. Deterministic code only.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import Field
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from rolloutd import task_queues
    from rolloutd.activities.names import CHECK_EVALUATOR
    from rolloutd.capabilities import (
        CAPABILITIES_QUERY,
        CHECK_EVALUATOR_UPDATE,
        DEAD_AFTER_S,
        FLEET_STATE_SIGNAL,
        FORGET_AFTER_S,
        HEARTBEAT_SIGNAL,
        REGISTER_SIGNAL,
        UNREGISTER_SIGNAL,
        UNWATCH_SIGNAL,
        WATCH_SIGNAL,
        CheckEvaluatorInput,
        CheckEvaluatorOutput,
        FleetCapabilities,
        FleetState,
        FleetWatch,
        HostCapabilities,
        dead_watch_due,
        fleet_liveness,
    )
    from rolloutd.payload import Payload

#: events after which the registry continues as new (each registration or beat is about 1-4
#: events, each import check about 8), far below Temporal's 50K-event limit so a replay stays
#: quick.
MAX_HISTORY_EVENTS = 2000
#: all attempts of one import check on an eval host, queue time included: a submit waits this
#: long at most when no eval worker polls.
CHECK_TIMEOUT = timedelta(seconds=15)


class FleetRegistryInput(Payload):
    """The registry's state carried over a continue-as-new, and its bounds."""

    hosts: list[HostCapabilities] = Field(default_factory=list)
    last_seen: dict[str, datetime] = Field(
        default_factory=dict, description="fleet -> latest beat of any of its processes"
    )
    watches: list[FleetWatch] = Field(default_factory=list)
    max_history_events: int = Field(
        default=MAX_HISTORY_EVENTS, ge=10, description="continue as new after this many events"
    )
    dead_after_s: float = Field(
        default=DEAD_AFTER_S, gt=0, description="a fleet without a beat this long is dead, s"
    )
    forget_after_s: float = Field(
        default=FORGET_AFTER_S, gt=0, description="a process without a beat this long is dropped"
    )


@workflow.defn
class FleetRegistryWorkflow:
    """The union of what the registered hosts can run; see the module docstring."""

    @workflow.init
    def __init__(self, input: FleetRegistryInput) -> None:
        # the carried-over registrations are in place before any signal of the new run is
        # handled (signals that arrived during continue-as-new come in its first activation)
        self._hosts: dict[str, HostCapabilities] = {h.instance_id: h for h in input.hosts}
        self._last_seen: dict[str, datetime] = dict(input.last_seen)
        #: watching workflow id -> its watches (one per fleet and kind at most)
        self._watches: list[FleetWatch] = list(input.watches)
        self._dead_after_s = input.dead_after_s
        self._forget_after = timedelta(seconds=input.forget_after_s)
        self._changed = False
        #: import path -> an eval host's answer; emptied when an eval host (re)registers.
        self._checked: dict[str, CheckEvaluatorOutput] = {}

    @workflow.run
    async def run(self, input: FleetRegistryInput) -> None:
        """Keep the registrations and tell the watches that are due, until the history is
        long; then continue as new with both."""
        while not self._continue_as_new_due(input):
            # cleared first: a handler that runs while the due watches are told is seen
            self._changed = False
            await self._tell_due()
            due = self._next_due()
            timeout = None if due is None else max(0.001, (due - workflow.now()).total_seconds())
            try:
                await workflow.wait_condition(
                    lambda: self._changed or self._continue_as_new_due(input), timeout=timeout
                )
            except TimeoutError:
                pass
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(
            FleetRegistryInput(
                hosts=list(self._hosts.values()),
                last_seen=self._last_seen,
                watches=self._watches,
                max_history_events=input.max_history_events,
                dead_after_s=input.dead_after_s,
                forget_after_s=input.forget_after_s,
            )
        )

    @staticmethod
    def _continue_as_new_due(input: FleetRegistryInput) -> bool:
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() > input.max_history_events
        )

    def _state(self) -> FleetCapabilities:
        return FleetCapabilities(hosts=list(self._hosts.values()), last_seen=dict(self._last_seen))

    def _next_due(self) -> datetime | None:
        """When the earliest ``dead`` watch is due (``alive`` watches are told on a beat)."""
        state = self._state()
        dues = [
            dead_watch_due(w, state, dead_after_s=self._dead_after_s)
            for w in self._watches
            if w.until == "dead"
        ]
        return min(dues, default=None)

    async def _tell_due(self) -> None:
        """Signal every watch whose condition holds now, and drop it."""
        state, now = self._state(), workflow.now()
        due: list[tuple[FleetWatch, FleetState]] = []
        for watch in self._watches:
            liveness = fleet_liveness(state, watch.fleet, now, dead_after_s=self._dead_after_s)
            if watch.until == "alive" and liveness.alive:
                due.append((watch, FleetState(fleet=watch.fleet, alive=True, tag=watch.tag)))
            elif (
                watch.until == "dead"
                and not liveness.alive
                and now >= dead_watch_due(watch, state, dead_after_s=self._dead_after_s)
            ):
                message = liveness.describe(self._dead_after_s)
                due.append(
                    (
                        watch,
                        FleetState(fleet=watch.fleet, alive=False, message=message, tag=watch.tag),
                    )
                )
        if not due:
            return
        told = [w for w, _ in due]
        self._watches = [w for w in self._watches if all(w is not t for t in told)]
        for watch, fleet_state in due:
            try:
                await workflow.get_external_workflow_handle(watch.workflow_id).signal(
                    FLEET_STATE_SIGNAL, fleet_state
                )
            except Exception as e:  # noqa: BLE001 - boundary: the watcher may have ended
                workflow.logger.info("watcher %s gone: %s", watch.workflow_id, e)

    def _seen(self, host: HostCapabilities) -> None:
        """Note a sign of life of ``host`` and forget the processes silent for too long."""
        now = workflow.now()
        if host.heartbeat_at is None:
            host.heartbeat_at = now
        if host.fleet not in self._last_seen or self._last_seen[host.fleet] < host.heartbeat_at:
            self._last_seen[host.fleet] = host.heartbeat_at
        for key, known in list(self._hosts.items()):
            seen = known.last_seen()
            if seen is not None and now - seen > self._forget_after:
                del self._hosts[key]
                workflow.logger.info(
                    "fleet host forgotten (silent for %s): %s %s", now - seen, known.fleet, key
                )
        self._changed = True

    @workflow.signal(name=REGISTER_SIGNAL)
    def register(self, host: HostCapabilities) -> None:
        """A host started: its registration replaces earlier ones of the same host and fleet
        (a host killed without unregistering comes back under its id)."""
        for key, known in list(self._hosts.items()):
            if (known.fleet, known.host_id) == (host.fleet, host.host_id):
                del self._hosts[key]
        self._hosts[host.instance_id] = host
        self._seen(host)
        if host.fleet == "eval":
            self._checked.clear()
        workflow.logger.info(
            "fleet host registered: %s %s (%s)", host.fleet, host.host_id, host.instance_id
        )

    @workflow.signal(name=HEARTBEAT_SIGNAL)
    def heartbeat(self, host: HostCapabilities) -> None:
        """A process is alive; one the registry does not know (forgotten, or a registry
        that started afresh) is registered again from its beat."""
        known = self._hosts.get(host.instance_id)
        if known is None:
            self.register(host)
            return
        if host.heartbeat_at is not None and (
            known.heartbeat_at is None or host.heartbeat_at > known.heartbeat_at
        ):
            known.heartbeat_at = host.heartbeat_at
        self._seen(known)

    @workflow.signal(name=UNREGISTER_SIGNAL)
    def unregister(self, instance_id: str) -> None:
        """A host stopped: its registration is withdrawn (its fleet's latest beat is kept)."""
        if self._hosts.pop(instance_id, None) is not None:
            workflow.logger.info("fleet host unregistered: %s", instance_id)
            self._changed = True

    @workflow.signal(name=WATCH_SIGNAL)
    def watch(self, watch: FleetWatch) -> None:
        """A workflow waits on a fleet (:class:`~rolloutd.capabilities.FleetWatch`); a watch
        replaces an earlier one of the same workflow and tag."""
        if watch.since is None:
            watch = watch.model_copy(update={"since": workflow.now()})
        self._watches = [
            w for w in self._watches if (w.workflow_id, w.tag) != (watch.workflow_id, watch.tag)
        ]
        self._watches.append(watch)
        self._changed = True

    @workflow.signal(name=UNWATCH_SIGNAL)
    def unwatch(self, watch: FleetWatch) -> None:
        """A workflow stopped waiting: its watch of ``watch.tag`` (all of its watches when the
        tag is empty) is withdrawn."""
        self._watches = [
            w
            for w in self._watches
            if w.workflow_id != watch.workflow_id or (watch.tag and w.tag != watch.tag)
        ]
        self._changed = True

    @workflow.query(name=CAPABILITIES_QUERY)
    def capabilities(self) -> FleetCapabilities:
        """Every registered process, in registration order, and each fleet's latest beat."""
        return self._state()

    @workflow.query(name="watches")
    def watches(self) -> list[FleetWatch]:
        """The workflows waiting on a fleet now."""
        return list(self._watches)

    @workflow.update(name=CHECK_EVALUATOR_UPDATE)
    async def check_evaluator(self, input: CheckEvaluatorInput) -> CheckEvaluatorOutput:
        """Ask an eval host whether ``input.type`` imports there (cached until an eval host
        registers again).

        Returns:
            The host's answer; an error naming the cause when no eval host answered within
            :data:`CHECK_TIMEOUT`.
        """
        if input.type in self._checked:
            return self._checked[input.type]
        try:
            answer: CheckEvaluatorOutput = await workflow.execute_activity(
                CHECK_EVALUATOR,
                input,
                result_type=CheckEvaluatorOutput,
                task_queue=task_queues.EVAL,
                schedule_to_close_timeout=CHECK_TIMEOUT,
                retry_policy=RetryPolicy(maximum_attempts=2),
            )
        except ActivityError as e:
            # not cached: the next submit asks again (an eval host may have come up)
            return CheckEvaluatorOutput(
                error=f"no eval host answered the import check within "
                f"{CHECK_TIMEOUT.total_seconds():.0f} s ({e.cause or e})"
            )
        self._checked[input.type] = answer
        return answer
