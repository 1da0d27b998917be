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
  types, networks, images and upload sources the operator allows; a task outside the policy of
  any registered sandbox host is refused, naming the field and the policy (any host may
  provision it, and each checks again before a runtime starts);
- eval hosts publish the names in their evaluator registry (built-ins, the
  ``rolloutd.evaluators`` entry-point group, the operator's ``ROLLOUTD_EVALUATORS``); a task
  names an evaluator by one of them, never by an import path (the submitting process and the
  eval hosts import nothing a request names).

When no sandbox (or eval) host has registered yet, the client waits a little for one (a stack
that is just starting), then refuses the task with a message saying so; a caller that knows
better submits with ``check_capabilities=False``. A host that was killed
without stopping stays registered until a host with its id registers again (its entry only
ever says more than the fleet can do, never less).

Everything here is pure (no I/O): it runs in workflow code and in the client.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator

from rolloutd.sandbox_policy import SandboxPolicy, violations
from rolloutd.types import Model, TaskRequest

#: the fleet registry's workflow id (one per namespace).
REGISTRY_WORKFLOW_ID = "rolloutd-fleets"
#: signal a host sends at start (signal-with-start), with its :class:`HostCapabilities`.
REGISTER_SIGNAL = "register"
#: signal a host sends when it stops, with its ``instance_id``.
UNREGISTER_SIGNAL = "unregister"
#: query answering :class:`FleetCapabilities`.
CAPABILITIES_QUERY = "capabilities"
#: update that asks an eval host whether an evaluator import path imports.
CHECK_EVALUATOR_UPDATE = "check_evaluator"
#: the eval fleet's activity behind :data:`CHECK_EVALUATOR_UPDATE`.
CHECK_EVALUATOR_ACTIVITY = "check_evaluator"
#: what a caller names to skip the check (in messages).
OPT_OUT = "check_capabilities=False"

PublishingFleet = Literal["sandbox", "eval"]


class _Payload(Model):
    """A Temporal payload: unknown fields are ignored, so hosts and clients of different
    versions read each other's registrations."""

    model_config = ConfigDict(extra="ignore")


class HostCapabilities(_Payload):
    """What one host of a fleet can run, published when its worker starts.

    Attributes:
        fleet: ``sandbox`` or ``eval``.
        host_id: the host's id (``ROLLOUTD_HOST_ID``).
        instance_id: this worker process's id; a stop withdraws exactly this registration.
        harnesses: harness type -> version of its CLI on this host (None: the harness needs
            no CLI, e.g. ``shell``); sandbox hosts only.
        missing_harnesses: harness type -> why this host cannot run it (CLI not installed).
        evaluators: built-in evaluator names; eval hosts only.
        max_concurrent_sessions: runtimes the host holds at once
            (``SandboxSettings.max_concurrent_sessions``); sandbox hosts only.
        policy: the host's sandbox policy (``SandboxSettings.sandbox_policy``); sandbox hosts
            only (None: a host of a version before policies; nothing is checked for it).
        runtimes: runtime types whose program is installed on the host (empty: a host of a
            version before this field; not checked).
        started_at: when the worker started (UTC).
    """

    fleet: PublishingFleet
    host_id: str = Field(min_length=1)
    instance_id: str = Field(min_length=1)
    harnesses: dict[str, str | None] = Field(default_factory=dict)
    missing_harnesses: dict[str, str] = Field(default_factory=dict)
    evaluators: list[str] = Field(default_factory=list)
    max_concurrent_sessions: int | None = Field(default=None, ge=1)
    policy: SandboxPolicy | None = None
    runtimes: list[str] = Field(default_factory=list)
    started_at: datetime | None = None

    @field_validator("policy", mode="before")
    @classmethod
    def _known_policy_fields(cls, value: Any) -> Any:
        # a newer host's policy may have settings this version does not know: they are left
        # out here (the host enforces them itself), the operator's own input stays strict
        if isinstance(value, dict):
            return {k: v for k, v in value.items() if k in SandboxPolicy.model_fields}
        return value


class FleetCapabilities(_Payload):
    """The registered hosts; what the fleets can run is the union of theirs."""

    hosts: list[HostCapabilities] = Field(default_factory=list)

    def of(self, fleet: PublishingFleet) -> list[HostCapabilities]:
        """The registered hosts of one fleet."""
        return [h for h in self.hosts if h.fleet == fleet]

    def harness_types(self) -> list[str]:
        """Harness types at least one sandbox host can run, sorted."""
        return sorted({t for h in self.of("sandbox") for t in h.harnesses})

    def evaluator_names(self) -> list[str]:
        """Built-in evaluator names at least one eval host has, sorted."""
        return sorted({n for h in self.of("eval") for n in h.evaluators})


class CheckEvaluatorInput(Model):
    """An evaluator import path to try on an eval host."""

    type: str = Field(min_length=1, description="`module:attr`")


class CheckEvaluatorOutput(Model):
    """Whether an import path resolves to an evaluator on an eval host.

    Attributes:
        error: None when it imports and is an evaluator; else why not.
        host_id: the eval host that checked it (None: no eval host answered).
    """

    error: str | None = None
    host_id: str | None = None


def policy_errors(task: TaskRequest, fleets: FleetCapabilities) -> list[tuple[str, str]]:
    """What of a task's runtimes (its own, and its evaluator's fresh one) the sandbox policy of
    some registered sandbox host refuses.

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
        for path, spec in specs:
            for field, message in violations(spec, policy, path=path):
                errors.append((field, f"{message}; policy of {where}: {policy.describe()}"))
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
