"""``FleetRegistryWorkflow``: what sandbox and eval hosts can run (:mod:`rolloutd.capabilities`).

One per namespace, id ``rolloutd-fleets``, on the workflows queue. Hosts signal-with-start it
when their worker starts (``register``) and signal it when they stop (``unregister``); the query
``capabilities`` answers every registered host; the update ``check_evaluator`` asks an eval
host whether an evaluator import path imports there (the submitting process never imports it).

Its history stays bounded: it continues as new, carrying the registered hosts, once the server
suggests it or after :data:`MAX_HISTORY_EVENTS` events, when no handler is running.
Deterministic code only.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from rolloutd import task_queues
    from rolloutd.capabilities import (
        CAPABILITIES_QUERY,
        CHECK_EVALUATOR_ACTIVITY,
        CHECK_EVALUATOR_UPDATE,
        REGISTER_SIGNAL,
        UNREGISTER_SIGNAL,
        CheckEvaluatorInput,
        CheckEvaluatorOutput,
        FleetCapabilities,
        HostCapabilities,
    )
    from rolloutd.payload import Payload

#: events after which the registry continues as new (each registration is about 3 events, each
#: import check about 8), far below Temporal's 50K-event limit so a replay stays quick.
MAX_HISTORY_EVENTS = 2000
#: all attempts of one import check on an eval host, queue time included: a submit waits this
#: long at most when no eval worker polls.
CHECK_TIMEOUT = timedelta(seconds=15)


class FleetRegistryInput(Payload):
    """The registry's state carried over a continue-as-new, and its history bound."""

    hosts: list[HostCapabilities] = Field(default_factory=list)
    max_history_events: int = Field(
        default=MAX_HISTORY_EVENTS, ge=10, description="continue as new after this many events"
    )


@workflow.defn
class FleetRegistryWorkflow:
    """The union of what the registered hosts can run; see the module docstring."""

    @workflow.init
    def __init__(self, input: FleetRegistryInput) -> None:
        # the carried-over registrations are in place before any signal of the new run is
        # handled (signals that arrived during continue-as-new come in its first activation)
        self._hosts: dict[str, HostCapabilities] = {h.instance_id: h for h in input.hosts}
        #: import path -> an eval host's answer; emptied when an eval host (re)registers.
        self._checked: dict[str, CheckEvaluatorOutput] = {}

    @workflow.run
    async def run(self, input: FleetRegistryInput) -> None:
        """Keep the registrations until the history is long, then continue as new."""
        await workflow.wait_condition(
            lambda: (
                workflow.info().is_continue_as_new_suggested()
                or workflow.info().get_current_history_length() > input.max_history_events
            )
        )
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(
            FleetRegistryInput(
                hosts=list(self._hosts.values()), max_history_events=input.max_history_events
            )
        )

    @workflow.signal(name=REGISTER_SIGNAL)
    def register(self, host: HostCapabilities) -> None:
        """A host started: its registration replaces earlier ones of the same host and fleet
        (a host killed without unregistering comes back under its id)."""
        for key, known in list(self._hosts.items()):
            if (known.fleet, known.host_id) == (host.fleet, host.host_id):
                del self._hosts[key]
        self._hosts[host.instance_id] = host
        if host.fleet == "eval":
            self._checked.clear()
        workflow.logger.info(
            "fleet host registered: %s %s (%s)", host.fleet, host.host_id, host.instance_id
        )

    @workflow.signal(name=UNREGISTER_SIGNAL)
    def unregister(self, instance_id: str) -> None:
        """A host stopped: its registration is withdrawn."""
        if self._hosts.pop(instance_id, None) is not None:
            workflow.logger.info("fleet host unregistered: %s", instance_id)

    @workflow.query(name=CAPABILITIES_QUERY)
    def capabilities(self) -> FleetCapabilities:
        """Every registered host, in registration order."""
        return FleetCapabilities(hosts=list(self._hosts.values()))

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
                CHECK_EVALUATOR_ACTIVITY,
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
