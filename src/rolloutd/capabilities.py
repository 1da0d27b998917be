"""What the fleets can run, as each host publishes it at start, and the check of a task against it.

The submitting process cannot see what the fleets have installed: a trainer's machine has no
harness CLIs, and an evaluator's import path may import on the eval hosts only. So every
sandbox and eval host publishes its capabilities to the fleet registry (the long-lived workflow
``rolloutd-fleets``, :mod:`rolloutd.workflows.fleets`) when it starts and withdraws them when it
stops; the trainer client (and through it ``rolloutd submit`` and the REST facade) refuses a task
that no registered host can run, before any workflow starts, with an error naming the field.

- sandbox hosts publish each harness type whose adapter is built and whose CLI is installed on
  the host, with the CLI's version, and the types they cannot run with the reason;
- sandbox hosts also publish their sandbox policy (:mod:`rolloutd.sandbox_policy`): the runtime
  types, networks, images and upload sources the operator allows, and the ceilings on a
  runtime's resources (default and maximum processes, memory, CPUs, disk, ``/tmp``); a task
  outside the policy of any registered sandbox host (a limit above a maximum among them) is
  refused, naming the field and the policy (any host may provision it, and each checks again
  before a runtime starts, where the defaults fill what the task did not ask);
- eval hosts publish the names in their evaluator registry (built-ins, the
  ``rolloutd.evaluators`` entry-point group, the operator's ``ROLLOUTD_EVALUATORS``); a task
  names an evaluator by one of them, never by an import path (the submitting process and the
  eval hosts import nothing a request names).

When no sandbox (or eval) host has registered yet, the client waits a little for one (a stack
that is just starting), then refuses the task with a message saying so; a caller that knows
better submits with ``check_capabilities=False``.

Liveness comes from the same registry: every worker process of every fleet (workflows,
sandbox, gateway, eval) signals a heartbeat to it every :data:`HEARTBEAT_EVERY_S`, from a task
of its own that needs no free activity slot, so a host whose slots are all taken (a saturated
host) still beats. :func:`fleet_liveness` is the one rule every reader applies (``rolloutd
submit`` and the trainer client's waits, the REST status, the metrics, the sessions waiting
for a sandbox host): a fleet is alive while one of its processes beat within
:data:`DEAD_AFTER_S`, dead otherwise, never judged from queue polls (a full sandbox host makes
none). A process that stops without withdrawing (a killed pod) is forgotten
:data:`FORGET_AFTER_S` after its last beat.

Everything here is pure (no I/O): it runs in workflow code and in the client.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import Field, field_validator

from rolloutd.payload import Payload
from rolloutd.sandbox_policy import (
    LIMIT_FIELDS,
    POLICY_SETTING,
    SandboxPolicy,
    upload_violation,
    violations,
)
from rolloutd.types import TaskRequest

#: the fleet registry's workflow id (one per namespace).
REGISTRY_WORKFLOW_ID = "rolloutd-fleets"
#: signal a host sends at start (signal-with-start), with its :class:`HostCapabilities`.
REGISTER_SIGNAL = "register"
#: signal a host sends when it stops, with its ``instance_id``.
UNREGISTER_SIGNAL = "unregister"
#: query answering :class:`FleetCapabilities`.
CAPABILITIES_QUERY = "capabilities"
#: signal every worker process sends every :data:`HEARTBEAT_EVERY_S` (signal-with-start), with
#: its :class:`HostCapabilities` (``heartbeat_at`` set): a registry that lost it learns it again.
HEARTBEAT_SIGNAL = "heartbeat"
#: signal a workflow sends to be told when a fleet dies or lives again (:class:`FleetWatch`).
WATCH_SIGNAL = "watch_fleet"
#: signal withdrawing a workflow's watches (its workflow id).
UNWATCH_SIGNAL = "unwatch_fleet"
#: signal the registry sends a watching workflow (:class:`FleetState`).
FLEET_STATE_SIGNAL = "fleet_state"
#: update that asks an eval host whether an evaluator import path imports (the eval fleet's
#: activity behind it: :data:`rolloutd.activities.names.CHECK_EVALUATOR`).
CHECK_EVALUATOR_UPDATE = "check_evaluator"
#: what a caller names to skip the check (in messages).
OPT_OUT = "check_capabilities=False"

#: seconds between two heartbeats of a worker process (``CommonSettings.fleet_heartbeat_s``
#: sets it per process; this is its default).
HEARTBEAT_EVERY_S = 10.0
#: a fleet none of whose processes beat for this long is dead, seconds: four missed beats
#: (a busy host's beat may come late), so a dead fleet is told within about a minute of its
#: death with a reader checking every 10 s.
DEAD_AFTER_S = 45.0
#: a process not heard from for this long is dropped from the registry, seconds.
FORGET_AFTER_S = 600.0

PublishingFleet = Literal["workflows", "sandbox", "gateway", "eval"]


class HostCapabilities(Payload):
    """What one worker process of a fleet can run, published when its workers start, and
    when it last said it was alive."""

    fleet: PublishingFleet = Field(
        description="``workflows``, ``sandbox``, ``gateway`` or ``eval``"
    )
    host_id: str = Field(min_length=1, description="the host's id (``ROLLOUTD_HOST_ID``)")
    instance_id: str = Field(
        min_length=1,
        description="this worker process's id; a stop withdraws exactly this registration",
    )
    harnesses: dict[str, str | None] = Field(
        default_factory=dict,
        description="harness type -> version of its CLI on this host (None: the harness needs no "
        "CLI, e.g. ``shell``); sandbox hosts only",
    )
    missing_harnesses: dict[str, str] = Field(
        default_factory=dict,
        description="harness type -> why this host cannot run it (CLI not installed)",
    )
    evaluators: list[str] = Field(
        default_factory=list,
        description="built-in evaluator names; eval hosts only",
    )
    max_concurrent_sessions: int | None = Field(
        default=None,
        ge=1,
        description="runtimes the host holds at once "
        "(``SandboxSettings.max_concurrent_sessions``); sandbox hosts only",
    )
    policy: SandboxPolicy | None = Field(
        default=None,
        description="the host's sandbox policy (``SandboxSettings.sandbox_policy``); sandbox hosts "
        "only (None: a host of a version before policies; nothing is checked for it)",
    )
    runtimes: list[str] = Field(
        default_factory=list,
        description="runtime types whose program is installed on the host (empty: a host of a "
        "version before this field; not checked)",
    )
    started_at: datetime | None = Field(default=None, description="when the worker started (UTC)")
    heartbeat_at: datetime | None = Field(
        default=None,
        description="when the process last beat (UTC, its own clock; the registry's clock "
        "when it registered without one)",
    )

    def last_seen(self) -> datetime | None:
        """When the process was last known alive: its last beat, else its start."""
        return self.heartbeat_at or self.started_at

    @field_validator("policy", mode="before")
    @classmethod
    def _known_policy_fields(cls, value: Any) -> Any:
        # a newer host's policy may have settings this version does not know: they are left
        # out here (the host enforces them itself), the operator's own input stays strict
        if isinstance(value, dict):
            known = {k: v for k, v in value.items() if k in SandboxPolicy.model_fields}
            for name in ("default_limits", "max_limits"):
                if isinstance(known.get(name), dict):
                    known[name] = {k: v for k, v in known[name].items() if k in LIMIT_FIELDS}
            return known
        return value


class FleetCapabilities(Payload):
    """The registered hosts; what the fleets can run is the union of theirs."""

    hosts: list[HostCapabilities] = Field(default_factory=list)
    last_seen: dict[str, datetime] = Field(
        default_factory=dict,
        description="fleet -> the latest beat of any of its processes, kept after they are "
        "withdrawn or forgotten (how long a fleet has been dead)",
    )

    def of(self, fleet: PublishingFleet) -> list[HostCapabilities]:
        """The registered hosts of one fleet."""
        return [h for h in self.hosts if h.fleet == fleet]

    def harness_types(self) -> list[str]:
        """Harness types at least one sandbox host can run, sorted."""
        return sorted({t for h in self.of("sandbox") for t in h.harnesses})

    def evaluator_names(self) -> list[str]:
        """Built-in evaluator names at least one eval host has, sorted."""
        return sorted({n for h in self.of("eval") for n in h.evaluators})


class FleetLiveness(Payload):
    """Whether a fleet is alive, by :func:`fleet_liveness`."""

    fleet: str
    alive: bool
    num_processes: int = Field(default=0, description="its processes that beat in time")
    last_heartbeat_s_ago: float | None = Field(
        default=None, description="seconds since its latest beat (None: never seen)"
    )

    def describe(self, dead_after_s: float = DEAD_AFTER_S) -> str:
        """Why the fleet is dead (or that it lives), in words."""
        if self.alive:
            return f"fleet {self.fleet!r} is alive ({self.num_processes} processes beating)"
        if self.last_heartbeat_s_ago is None:
            return f"no worker process of fleet {self.fleet!r} has ever beaten"
        return (
            f"no worker process of fleet {self.fleet!r} has beaten for {dead_after_s:g} s "
            f"(its last heartbeat was {self.last_heartbeat_s_ago:.0f} s ago)"
        )


def fleet_liveness(
    fleets: FleetCapabilities,
    fleet: str,
    now: datetime,
    *,
    dead_after_s: float = DEAD_AFTER_S,
) -> FleetLiveness:
    """The one liveness rule: a fleet is alive while at least one of its worker processes beat
    within ``dead_after_s`` of ``now``; a saturated fleet (every slot taken) still beats, so it
    is never called dead. Queue polls are not evidence either way: a full sandbox host makes
    none (``RuntimeSlots`` reserves no slot), and an idle one's long poll begins up to a
    minute before a reader looks.

    Args:
        fleets: the registry's answer (its hosts and each fleet's latest beat).
        fleet: ``workflows``, ``sandbox``, ``gateway`` or ``eval``.
        now: the reader's time (UTC).
        dead_after_s: the limit without a beat, seconds.

    Returns:
        The fleet's liveness; ``last_heartbeat_s_ago`` is None when no process of it ever beat.
    """
    limit = timedelta(seconds=dead_after_s)
    seen = [s for h in fleets.hosts if h.fleet == fleet and (s := h.last_seen()) is not None]
    alive = [s for s in seen if now - s < limit]
    latest = latest_beat(fleets, fleet)
    return FleetLiveness(
        fleet=fleet,
        alive=bool(alive),
        num_processes=len(alive),
        last_heartbeat_s_ago=None if latest is None else max(0.0, (now - latest).total_seconds()),
    )


class FleetWatch(Payload):
    """A workflow asks the registry to be told (:data:`FLEET_STATE_SIGNAL`) when ``fleet``
    has been dead for ``after_s`` since ``since`` (``until="dead"``: a session waiting for a
    sandbox host), or as soon as it is alive (``until="alive"``: a replacement waiting for
    the fleet to come back). One signal per watch; a watch ends when told or withdrawn."""

    workflow_id: str
    fleet: PublishingFleet = "sandbox"
    until: Literal["dead", "alive"] = "dead"
    after_s: float = Field(default=DEAD_AFTER_S, ge=0, description="dead for this long, seconds")
    since: datetime | None = Field(
        default=None,
        description="the wait began then: a fleet that never beat since counts as dead from it "
        "(None: when the registry got the watch)",
    )
    tag: str = Field(
        default="",
        description="the watcher's name for this wait, echoed in the answer; a watch replaces "
        "an earlier one of the same workflow and tag; an unwatch with tag '' withdraws all "
        "of the workflow's",
    )


def latest_beat(fleets: FleetCapabilities, fleet: str) -> datetime | None:
    """The latest sign of life of any process of ``fleet`` (None: never seen)."""
    seen = [s for h in fleets.hosts if h.fleet == fleet and (s := h.last_seen()) is not None]
    if fleet in fleets.last_seen:
        seen.append(fleets.last_seen[fleet])
    return max(seen, default=None)


def dead_watch_due(
    watch: FleetWatch, fleets: FleetCapabilities, *, dead_after_s: float = DEAD_AFTER_S
) -> datetime:
    """When a ``until="dead"`` watch is told: once the fleet is dead by
    :func:`fleet_liveness` and no process of it has beaten for ``watch.after_s`` since the
    wait began (``watch.since``), whichever is later. A beat moves it on.

    Raises:
        ValueError: the watch has no ``since`` (the registry sets it when it gets one).
    """
    if watch.since is None:
        raise ValueError("a watch needs since")
    beat = latest_beat(fleets, watch.fleet)
    if beat is None:
        return watch.since + timedelta(seconds=watch.after_s)
    return max(
        beat + timedelta(seconds=dead_after_s),
        max(watch.since, beat) + timedelta(seconds=watch.after_s),
    )


class FleetState(Payload):
    """What the registry tells a watching workflow."""

    fleet: str
    alive: bool
    message: str = ""
    tag: str = Field(default="", description="the watch's tag")


class CheckEvaluatorInput(Payload):
    """An evaluator import path to try on an eval host."""

    type: str = Field(min_length=1, description="`module:attr`")


class CheckEvaluatorOutput(Payload):
    """Whether an import path resolves to an evaluator on an eval host."""

    error: str | None = Field(
        default=None,
        description="None when it imports and is an evaluator; else why not",
    )
    host_id: str | None = Field(
        default=None,
        description="the eval host that checked it (None: no eval host answered)",
    )


def host_sources(task: TaskRequest) -> list[tuple[str, str]]:
    """The host folders a task names for a sandbox host to read besides its runtime's uploads:
    the oracle's reference solution (``harness.solution``) and the Harbor verifier's tests
    (``evaluator.params.tests_dir``). The host refuses them outside the policy's
    ``upload_sources`` when it reads them (:func:`rolloutd.sandbox.transfer.check_source`).

    Returns:
        ``(dotted.field.path, host path)`` pairs.
    """
    sources = []
    if task.harness.solution:
        sources.append(("harness.solution", task.harness.solution))
    tests_dir = task.evaluator.params.get("tests_dir") if task.evaluator.type == "harbor" else None
    if isinstance(tests_dir, str) and tests_dir:
        sources.append(("evaluator.params.tests_dir", tests_dir))
    return sources


def policy_errors(task: TaskRequest, fleets: FleetCapabilities) -> list[tuple[str, str]]:
    """What of a task's runtimes (its own, and its evaluator's fresh one) and of the host
    folders it names (:func:`host_sources`) the sandbox policy of some registered sandbox host
    refuses.

    Every registered sandbox host may provision the task, so every host's policy must allow
    it; hosts with the same policy are named together.

    Returns:
        ``(dotted.field.path, message)`` pairs naming the field, the policy and its hosts.
    """
    by_policy: dict[str, tuple[SandboxPolicy, list[str]]] = {}
    for host in fleets.of("sandbox"):
        if host.policy is not None:
            key = host.policy.model_dump_json()
            by_policy.setdefault(key, (host.policy, []))[1].append(host.host_id)
    specs = [("runtime", task.runtime)]
    if task.evaluator.runtime == "fresh" and task.evaluator.runtime_spec is not None:
        specs.append(("evaluator.runtime_spec", task.evaluator.runtime_spec))
    errors: list[tuple[str, str]] = []
    for policy, hosts in by_policy.values():
        where = f"sandbox host {hosts[0]}" + (f" and {len(hosts) - 1} more" if hosts[1:] else "")
        found = [pair for path, spec in specs for pair in violations(spec, policy, path=path)]
        for field, source in host_sources(task):
            if why := upload_violation(source, policy):
                allowed = ", ".join(policy.upload_sources) or "none"
                found.append(
                    (
                        field,
                        f"{field}={source!r} is outside the sandbox policy: {why} "
                        f"(upload_sources: {allowed}; the operator sets it in {POLICY_SETTING})",
                    )
                )
        # each message names the setting that refuses it; the whole policy is said once
        for index, (field, message) in enumerate(found):
            whole = f": {policy.describe()}" if index == 0 else ""
            errors.append((field, f"{message}; policy of {where}{whole}"))
    return errors


def check_task(task: TaskRequest, fleets: FleetCapabilities) -> list[tuple[str, str]]:
    """What of a task no registered host can run, or its sandbox policy refuses.

    Args:
        task: a validated task request.
        fleets: the registry's answer.

    Returns:
        ``(dotted.field.path, message)`` pairs, empty when the task can run.
    """
    errors: list[tuple[str, str]] = policy_errors(task, fleets)
    installed = sorted({t for h in fleets.of("sandbox") for t in h.runtimes})
    if installed and task.runtime.type not in installed:
        errors.append(
            (
                "runtime.type",
                f"runtime.type={task.runtime.type!r} is not installed on any sandbox host "
                f"(installed: {', '.join(installed)})",
            )
        )
    harness = task.harness.type
    sandbox = fleets.of("sandbox")
    if not sandbox:
        errors.append(
            (
                "harness.type",
                "no sandbox fleet has registered what it can run yet "
                "(start `rolloutd up` or `rolloutd worker --fleet sandbox`, or submit "
                f"with {OPT_OUT})",
            )
        )
    elif harness not in fleets.harness_types():
        reasons = {
            h.host_id: h.missing_harnesses[harness]
            for h in sandbox
            if harness in h.missing_harnesses
        }
        if reasons:
            host, reason = next(iter(sorted(reasons.items())))
            message = (
                f"harness.type={harness!r} cannot run on any sandbox host "
                f"({len(reasons)} of {len(sandbox)} lack it; {host}: {reason})"
            )
        else:
            message = f"harness.type={harness!r} has no adapter on any sandbox host"
        errors.append(
            ("harness.type", f"{message}; available: {', '.join(fleets.harness_types()) or 'none'}")
        )
    evaluator = task.evaluator.type
    if not fleets.of("eval"):
        errors.append(
            (
                "evaluator.type",
                "no eval fleet has registered what it can run yet "
                "(start `rolloutd up` or `rolloutd worker --fleet eval`, or submit with "
                f"{OPT_OUT})",
            )
        )
    elif evaluator not in fleets.evaluator_names():
        errors.append(
            (
                "evaluator.type",
                f"evaluator.type={evaluator!r} is not in the eval fleet's registry; use one "
                f"of {', '.join(fleets.evaluator_names())} (an operator registers more: "
                "docs/security.md, 'Evaluators')",
            )
        )
    return errors
