"""Harbor task folders as tasks: the layout Terminal-Bench 2.0 ships in (harbor.ai docs,
"Task structure")::

    my-task/
      instruction.md        what the agent is asked to do
      task.toml             budgets, container, network (:mod:`.harbor_config`)
      environment/          the image's build context: Dockerfile (docker-compose.yaml is
                            refused: rolloutd runs one container per runtime)
      tests/test.sh         the verifier; writes /logs/verifier/reward.txt or reward.json
      solution/solve.sh     the reference solution (the ``oracle`` harness runs it)

:func:`load_task` reads and checks one folder; :func:`task_request` turns it into a
:class:`~rolloutd.types.TaskRequest`: the image (``[environment] docker_image``, or built from
``environment/`` by the container runtime), limits and network from task.toml, the harness the
trainer chose (:class:`HarborOptions`), and the ``harbor`` evaluator
(:mod:`rolloutd.evaluators.harbor`), which runs ``tests/`` in a fresh container of the task's
image with the agent's workdir (and, with ``carry_system_changes``, the agent's other changes).
The agent never sees ``tests/`` or ``solution/``: both stay on the host, named by path in the
evaluator's and the oracle's specs.

Network: a phase's Harbor ``network_mode`` ``no-network`` is rolloutd's ``gateway`` for the
agent (the harness runs inside and must reach the model; nothing else) and ``none`` for the
verifier; ``public`` is ``host``, which the sandbox policy grants or refuses; a task.toml that
sets nothing gets rolloutd's defaults (``gateway``, ``none``), never more.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rolloutd.errors import ConfigError
from rolloutd.task_spec import EvaluatorSpec, PhaseTimeouts, RuntimeSpec
from rolloutd.tasksets.contexts import check_build_context
from rolloutd.tasksets.harbor_config import HarborTaskConfig, parse_task_config
from rolloutd.tasksets.options import TaskOptions
from rolloutd.types import SamplingParams, TaskRequest

#: files a task folder must hold.
REQUIRED = ("instruction.md", "task.toml", "tests/test.sh")
#: compose files Harbor's docker environments read (refused here).
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
#: seconds added to a verifier's budget for the snapshot, the fresh container and teardown.
VERIFIER_OVERHEAD_S = 120.0
_WORKDIR = re.compile(r"^\s*WORKDIR\s+(.+?)\s*$", re.IGNORECASE | re.MULTILINE)


class HarborOptions(TaskOptions):
    """:class:`TaskOptions` of a Harbor task set, plus what its verifier sees."""

    carry_system_changes: bool = Field(
        default=False,
        description="the verifier sees the agent's changes outside its workdir too, for tasks "
        "whose answer is a change to the system (a file in /etc); every changed program, "
        "library, interpreter path, runner configuration, shell profile or git configuration "
        "among them is then a tamper finding (reward 0.0). Default: the task's image plus the "
        "agent's workdir",
    )


class HarborTask(BaseModel):
    """One checked Harbor task folder.

    Attributes:
        path: the folder, absolute.
        name: the folder's name (the task's key in a set).
        instruction: instruction.md's text.
        config: the checked task.toml.
        environment_dir: the image's build context (``environment/``), when it has a
            Dockerfile.
        workdir: where commands run inside: ``[environment] workdir``, else the Dockerfile's
            last ``WORKDIR``, else ``/``.
        tests_dir: ``tests/`` (holds ``test.sh``).
        solution_dir: ``solution/`` when it holds ``solve.sh``.
    """

    model_config = ConfigDict(extra="forbid")

    path: Path
    name: str
    instruction: str
    config: HarborTaskConfig
    environment_dir: Path | None = None
    workdir: str = "/"
    tests_dir: Path
    solution_dir: Path | None = None


def dockerfile_workdir(dockerfile: str) -> str | None:
    """The last ``WORKDIR`` of a Dockerfile, or None (Dockerfile reference, "WORKDIR").

    Raises:
        ConfigError: the WORKDIR uses a build variable (``$VAR``), which is not expanded here.
    """
    found = _WORKDIR.findall(dockerfile)
    if not found:
        return None
    workdir = found[-1].strip().strip("\"'")
    if "$" in workdir:
        raise ConfigError(
            f"environment/Dockerfile: WORKDIR {workdir!r} uses a variable; set "
            "[environment] workdir in task.toml"
        )
    return workdir


def load_task(path: str | Path) -> HarborTask:
    """Read and check a Harbor task folder.

    Args:
        path: the task folder.

    Returns:
        The :class:`HarborTask`.

    Raises:
        ConfigError: a required file is missing, task.toml asks for something rolloutd does
            not support (named), the environment is a compose file, or there is neither an
            image nor a Dockerfile.
    """
    folder = Path(path).expanduser().resolve()
    for required in REQUIRED:
        if not (folder / required).is_file():
            raise ConfigError(f"Harbor task {folder}: {required} is missing")
    config = parse_task_config(
        (folder / "task.toml").read_text(encoding="utf-8"), where=f"{folder.name}/task.toml"
    )
    environment = folder / "environment"
    for compose in COMPOSE_FILES:
        if (environment / compose).is_file():
            raise ConfigError(
                f"Harbor task {folder.name}: environment/{compose} is not supported: rolloutd "
                "runs one container per session (a podman runtime), not compose services; "
                "give the task one environment/Dockerfile"
            )
    dockerfile = environment / "Dockerfile"
    has_dockerfile = dockerfile.is_file()
    if not has_dockerfile and not config.environment.docker_image:
        raise ConfigError(
            f"Harbor task {folder.name}: neither environment/Dockerfile nor "
            "[environment] docker_image"
        )
    workdir = config.environment.workdir or (
        dockerfile_workdir(dockerfile.read_text(encoding="utf-8")) if has_dockerfile else None
    )
    if workdir is not None and not workdir.startswith("/"):
        raise ConfigError(f"Harbor task {folder.name}: workdir {workdir!r} must be absolute")
    if has_dockerfile and not config.environment.docker_image:
        check_build_context(environment, what=f"Harbor task {folder.name}")
    solution = folder / "solution"
    return HarborTask(
        path=folder,
        name=folder.name,
        instruction=(folder / "instruction.md").read_text(encoding="utf-8"),
        config=config,
        environment_dir=environment if has_dockerfile else None,
        workdir=workdir or "/",
        tests_dir=folder / "tests",
        solution_dir=solution if (solution / "solve.sh").is_file() else None,
    )


def find_tasks(root: str | Path) -> list[Path]:
    """The task folders under ``root``: ``root`` itself when it holds a task.toml, else its
    subfolders that do, sorted by name (a Harbor dataset is a folder of task folders).

    Raises:
        ConfigError: ``root`` is not a folder, or holds no task.
    """
    folder = Path(root).expanduser().resolve()
    if not folder.is_dir():
        raise ConfigError(f"Harbor tasks: {folder} is not a folder")
    if (folder / "task.toml").is_file():
        return [folder]
    found = sorted(p for p in folder.iterdir() if (p / "task.toml").is_file())
    if not found:
        raise ConfigError(f"Harbor tasks: no task folder (with task.toml) under {folder}")
    return found


def runtime_network(
    task: HarborTask, phase: Literal["agent", "verifier"]
) -> Literal["gateway", "none", "host"]:
    """rolloutd's network policy for a phase (see the module docstring)."""
    mode = task.config.network(phase)
    if mode == "public":
        return "host"
    return "gateway" if phase == "agent" else "none"


def runtime_spec(task: HarborTask, runtime_type: str = "podman") -> RuntimeSpec:
    """The agent's container: the task's image, workdir, environment, limits and network.

    The image is ``[environment] docker_image`` when set (Harbor prefers it), else built from
    ``environment/`` (``runtime.build``: the container runtime builds it and caches it by
    content). ``storage_mb`` is not a runtime limit here (see :func:`evaluator_spec`).
    """
    env = task.config.environment
    image: dict[str, Any] = (
        {"image": env.docker_image}
        if env.docker_image
        else {"build": {"context": str(task.environment_dir)}}
    )
    return RuntimeSpec.model_validate(
        {
            "type": runtime_type,
            **image,
            "workdir": task.workdir,
            "env": dict(env.env),
            "cpus": env.cpus,
            "memory_mb": env.memory_mb,
            "network": runtime_network(task, "agent"),
            "git_diff": False,
        }
    )


def evaluator_spec(task: HarborTask, *, carry_system_changes: bool = False) -> EvaluatorSpec:
    """The ``harbor`` evaluator of a task: its tests, verifier environment and budget,
    ``[environment] storage_mb``, which the verifier checks against the disk the agent's
    container used (podman on an ext4-backed overlay cannot cap a container's disk while it
    runs: ``--storage-opt size`` needs XFS project quotas), and whether the verifier carries
    the agent's changes outside its workdir (:class:`HarborOptions`)."""
    verifier = task.config.verifier
    return EvaluatorSpec(
        type="harbor",
        runtime="session",
        timeout_s=verifier.timeout_sec + VERIFIER_OVERHEAD_S,
        params={
            "tests_dir": str(task.tests_dir),
            "env": dict(verifier.env),
            "network": runtime_network(task, "verifier"),
            "timeout_s": verifier.timeout_sec,
            **(
                {"storage_mb": task.config.environment.storage_mb}
                if task.config.environment.storage_mb
                else {}
            ),
            **({"carry_system_changes": True} if carry_system_changes else {}),
        },
    )


def task_request(task: HarborTask, options: HarborOptions) -> TaskRequest:
    """The task a Harbor task folder becomes under the trainer's options.

    The run budget is ``[agent] timeout_sec`` (else ``options.run_s``), provisioning may take
    ``[environment] build_timeout_sec`` (a first build of the image), and the evaluator's
    budget is ``[verifier] timeout_sec`` plus the fresh container's overhead; the session
    deadline is their sum.

    Raises:
        ConfigError: the ``oracle`` harness on a task without ``solution/solve.sh``.
        pydantic.ValidationError: the resulting task is malformed.
    """
    harness = options.harness
    if harness.type == "oracle":
        if task.solution_dir is None:
            raise ConfigError(f"Harbor task {task.name}: the oracle needs solution/solve.sh")
        harness = harness.model_copy(
            update={
                "solution": str(task.solution_dir),
                "env": {**task.config.solution.env, **harness.env},
            }
        )
    run_s = options.run_budget(task.config.agent.timeout_sec)
    evaluator = evaluator_spec(task, carry_system_changes=options.carry_system_changes)
    provision_s = task.config.environment.build_timeout_sec + 120.0
    phases = PhaseTimeouts(
        run_s=run_s, provision_s=provision_s, evaluate_s=300.0 + evaluator.timeout_s
    )
    metadata: dict[str, Any] = {
        **options.metadata,
        "task_set": "harbor",
        "harbor": {
            "name": task.name,
            "path": str(task.path),
            "schema_version": task.config.schema_version,
            **({"package": task.config.task.model_dump()} if task.config.task else {}),
            **({"metadata": task.config.metadata} if task.config.metadata else {}),
            **({"source": task.config.source} if task.config.source else {}),
        },
    }
    sampling = options.sampling.model_dump() if options.sampling else {}
    return TaskRequest(
        task_id=options.task_id(task.name),
        instruction=task.instruction,
        num_samples=options.num_samples,
        timeout_s=provision_s + run_s + phases.collect_s + evaluator.timeout_s + 300.0,
        runtime=runtime_spec(task, options.runtime_type),
        harness=harness,
        builder=options.builder,
        evaluator=evaluator,
        sampling=SamplingParams(**sampling),
        phases=phases,
        model=options.model,
        max_session_attempts=options.max_session_attempts,
        max_replacements=options.max_replacements,
        store_final_state=options.store_final_state,
        metadata=metadata,
    )


def load_task_requests(root: str | Path, options: HarborOptions) -> list[TaskRequest]:
    """Every task folder under ``root`` (:func:`find_tasks`) as a task, in name order.

    Raises:
        ConfigError: a folder is not a task rolloutd can run; the message names it.
    """
    return [task_request(load_task(path), options) for path in find_tasks(root)]
