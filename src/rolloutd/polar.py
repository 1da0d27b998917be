"""POLAR's rollout request (Polar, arXiv 2605.24220; NVIDIA-NeMo/ProRL-Agent-Server
``src/polar/rollout/models.py``) and its mapping onto rolloutd's ``TaskRequest``, field by field
(the table is docs/polar.md, :data:`POLAR_PATHS` its code). Pure: no I/O; the REST facade
(:mod:`rolloutd.rest`) validates a submit with it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rolloutd.trainer_client.client import InvalidTaskError
from rolloutd.types import SessionStatus


class _Wire(BaseModel):
    # unknown fields are kept to be named: the submit route refuses those not in POLAR_IGNORED
    model_config = ConfigDict(extra="allow")


class PolarRuntime(_Wire):
    #: None: rolloutd's default runtime (bwrap), or ``podman`` with an image; POLAR's own
    #: default, ``local``, isolates nothing and runs only where the sandbox policy allows it
    #: (with an image it becomes ``podman``: an image is never the host)
    backend: str | None = None
    image: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    network: str | None = None
    workdir: str | None = None
    memory_mb: int | None = None
    cpus: float | None = None
    #: rolloutd's own: the workspace's files and the steps that prepare it (a task's repository,
    #: where POLAR names an image that holds it)
    files: dict[str, str] = Field(default_factory=dict)
    prepare: list[dict[str, Any]] = Field(default_factory=list)


class PolarAgent(_Wire):
    harness: str | None = None
    import_path: str | None = None
    model_name: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)


class PolarStrategy(_Wire):
    strategy: str
    config: dict[str, Any] = Field(default_factory=dict)


class PolarTaskRequest(_Wire):
    """Polar's ``TaskRequest`` (``src/polar/rollout/models.py``); unknown fields are kept."""

    task_id: str
    instruction: str
    num_samples: int = Field(default=1, ge=1)
    timeout_seconds: float = Field(default=600.0, gt=0)
    runtime: PolarRuntime | None = None
    agent: PolarAgent
    builder: PolarStrategy | None = None
    evaluator: PolarStrategy | None = None
    callback_url: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    #: rolloutd's own: sampling parameters and phase budgets (TaskRequest.sampling, .phases),
    #: passed as they are
    sampling: dict[str, Any] | None = None
    phases: dict[str, Any] | None = None
    #: Polar's: larger is dispatched sooner (0 by default); mapped to TaskRequest.priority
    #: by :func:`priority_of`
    dispatch_priority: int | None = None
    #: rolloutd's own (TaskRequest.tenant, .priority, .fairness_weight); ``priority``, when
    #: given, wins over ``dispatch_priority``
    tenant: str | None = None
    priority: int | None = None
    fairness_weight: float | None = None


def priority_of(dispatch_priority: int) -> int:
    """TaskRequest.priority (Temporal's key: 1 first, 3 default, 5 last) of a Polar
    ``dispatch_priority`` (larger sooner, 0 default): ``3 - dispatch_priority``, clamped to
    1..5, so 0 is the default, 1 one step sooner, 2 and above the first."""
    return min(5, max(1, 3 - dispatch_priority))


#: POLAR fields rolloutd accepts and ignores (docs/polar.md), by the object that holds them
#: (``""`` the request); any other field rolloutd does not know is refused by name.
POLAR_IGNORED: dict[str, frozenset[str]] = {
    "": frozenset({"early_stop_min_usable_sessions", "refresh_runtime"}),
    "runtime": frozenset(
        {
            "eval_prepare",
            "direct_exec_init_command",
            "storage_mb",
            "gpus",
            "allow_internet",
            "internet_volumes",
            "kwargs",
        }
    ),
    "agent": frozenset(),
    "builder": frozenset(),
    "evaluator": frozenset({"refresh_runtime"}),
}


def unknown_polar_fields(polar: PolarTaskRequest) -> list[str]:
    """The dotted paths of the request's fields that neither rolloutd nor :data:`POLAR_IGNORED`
    knows (``agent.settings`` and ``builder.config`` are free-form: other keys are ignored)."""
    unknown = []
    for where, ignored in POLAR_IGNORED.items():
        part = getattr(polar, where) if where else polar
        extra = part.model_extra if part is not None else None
        for name in extra or {}:
            if name not in ignored:
                unknown.append(f"{where}.{name}" if where else name)
    return unknown


#: POLAR's image naming the host's own system (no container image).
HOST_IMAGE = "host"
#: a session's status as Polar's results name it
SESSION_STATUS = {
    SessionStatus.COMPLETED: "COMPLETED",
    SessionStatus.FAILED: "ERROR",
    SessionStatus.TIMEOUT: "TIMEOUT",
    SessionStatus.CANCELLED: "ERROR",
}
#: Polar's evaluator strategies under another name here.
EVALUATOR_ALIASES = {"swebench_harness": "swebench"}
#: rolloutd TaskRequest path -> the Polar request path it comes from (docs/polar.md's table),
#: so an error names the field the caller sent. Longest prefix wins.
POLAR_PATHS = {
    "timeout_s": "timeout_seconds",
    "harness": "agent",
    "harness.type": "agent.harness",
    "harness.command": "agent.settings.command",
    "harness.args": "agent.settings.args",
    "harness.max_turns": "agent.settings.max_turns",
    "harness.profile": "agent.settings.profile",
    "harness.env": "agent.env",
    "model": "agent.model_name",
    "runtime.type": "runtime.backend",
    "builder.type": "builder.strategy",
    "builder.on_drift": "builder.config.on_drift",
    "builder.loss_mask": "builder.config.loss_mask",
    "evaluator.type": "evaluator.strategy",
    "evaluator.runtime": "evaluator.config.refresh_runtime",
    "evaluator.command": "evaluator.config.command",
    "evaluator.expected_output": "evaluator.config.expected_output",
    "evaluator.timeout_s": "evaluator.config.timeout_s",
    "evaluator.params": "evaluator.config",
}


def polar_path(path: str) -> str:
    """The Polar request path of a rolloutd TaskRequest path (unchanged when it has none)."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        head = ".".join(parts[:n])
        if head in POLAR_PATHS:
            return ".".join([POLAR_PATHS[head], *parts[n:]])
    return path


def _refresh_runtime(polar: PolarTaskRequest, config: dict[str, Any]) -> bool:
    """Polar's ``refresh_runtime`` (evaluate in a fresh runtime), read from the evaluator's
    config, the evaluator, or the request."""
    evaluator = polar.evaluator.model_extra if polar.evaluator is not None else None
    for where in (config, evaluator or {}, polar.model_extra or {}):
        if "refresh_runtime" in where:
            return bool(where["refresh_runtime"])
    return False


def to_task_request(polar: PolarTaskRequest) -> dict[str, Any]:
    """A rolloutd TaskRequest (as a dict, validated by the client) from a Polar request.

    Raises:
        InvalidTaskError: a field rolloutd cannot honour (named by its Polar path).
    """
    agent = polar.agent
    if agent.import_path or not agent.harness:
        raise InvalidTaskError(
            [
                (
                    "agent.harness",
                    "a registered harness name is required; agent.import_path is not supported",
                )
            ]
        )
    settings = agent.settings
    # Polar spells CLI names with hyphens (claude-code); the glossary with underscores
    harness = {
        "type": agent.harness.replace("-", "_"),
        "env": agent.env,
        **{k: settings[k] for k in ("command", "args", "max_turns", "profile") if k in settings},
    }
    task: dict[str, Any] = {
        "task_id": polar.task_id,
        "instruction": polar.instruction,
        "num_samples": polar.num_samples,
        "timeout_s": polar.timeout_seconds,
        "harness": harness,
        "metadata": polar.metadata,
        "callback_url": polar.callback_url,
    }
    if agent.model_name:
        task["model"] = agent.model_name
    if polar.dispatch_priority is not None:
        task["priority"] = priority_of(polar.dispatch_priority)
    for own in ("tenant", "priority", "fairness_weight"):
        if getattr(polar, own) is not None:
            task[own] = getattr(polar, own)
    if polar.sampling is not None:
        task["sampling"] = polar.sampling
    if polar.phases is not None:
        task["phases"] = polar.phases
    if polar.runtime is not None:
        rt = polar.runtime
        runtime: dict[str, Any] = {"env": rt.env, "memory_mb": rt.memory_mb}
        if rt.backend is not None:
            runtime["type"] = rt.backend
        if rt.image not in (None, "", HOST_IMAGE):
            # an image is a container image: never the host (`local`)
            if rt.backend in (None, "local"):
                runtime["type"] = "podman"
            runtime["image"] = rt.image
        if rt.workdir:
            runtime["workdir"] = rt.workdir
        if rt.files:
            runtime["files"] = rt.files
        if rt.prepare:
            runtime["prepare"] = rt.prepare
        if rt.network is not None:  # an unknown network is refused by RuntimeSpec
            runtime["network"] = rt.network
        if rt.cpus is not None:
            runtime["cpus"] = rt.cpus
        task["runtime"] = runtime
    if polar.builder is not None:
        task["builder"] = {
            "type": polar.builder.strategy,
            **{k: v for k, v in polar.builder.config.items() if k in ("on_drift", "loss_mask")},
        }
    if polar.evaluator is not None:
        config = dict(polar.evaluator.config)
        fresh = _refresh_runtime(polar, config)
        config.pop("refresh_runtime", None)
        strategy = polar.evaluator.strategy
        task["evaluator"] = {
            "type": EVALUATOR_ALIASES.get(strategy, strategy),
            **{
                k: config.pop(k) for k in ("command", "expected_output", "timeout_s") if k in config
            },
            "params": config,
            "runtime": "fresh" if fresh else "session",
        }
    return task
