"""The task's specs: where a harness runs (runtime), what runs (harness), how a session is
prepared, built and scored (builder, evaluator), and the phase budgets.

Split from :mod:`rolloutd.types`, which re-exports every name here (import them from there):
they cross process boundaries as fields of :class:`rolloutd.types.TaskRequest` (Temporal
payloads encode pydantic models by field, not by class path), so new fields always get
defaults.
"""

from __future__ import annotations

import posixpath
import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from rolloutd.payload import Payload
from rolloutd.rubrics import JUDGE_EVALUATOR, JudgeSpec


class ExecStep(Payload):
    """A prepare step that runs a command in the runtime (``sh -c`` when a string)."""

    type: Literal["exec"] = "exec"
    command: str | list[str] = Field(description="argv, or a string run by /bin/sh -c")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment")
    timeout_s: float = Field(default=300.0, gt=0, le=86_400, description="step time limit")

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        return check_env(env)


class UploadStep(Payload):
    """A prepare step that copies a host file or folder (or an fsspec URL of a file) into the
    runtime. The source is named by the trainer, never by the agent."""

    type: Literal["upload"] = "upload"
    source: str = Field(min_length=1, description="host path (file or folder) or fsspec URL")
    path: str = Field(
        default=".",
        description="destination inside the runtime (workspace-"
        "relative or absolute under workdir or home); a folder for folders",
    )
    extract: bool = Field(default=False, description="unpack a .tar/.tar.gz/.tgz source there")


PrepareStep = Annotated[ExecStep | UploadStep, Field(discriminator="type")]

#: runtime types that isolate the network; ``gateway`` is their default policy.
ISOLATING_RUNTIMES = ("bwrap", "podman", "apptainer", "docker")
#: runtime types running OCI container images (an image name, or one built from a Dockerfile).
CONTAINER_RUNTIMES = ("podman", "docker")
#: a folder inside a runtime: absolute, normalised, of letters, digits and ``._+-/`` only (it
#: lands in container command lines and bind specifications, where ``,`` and ``:`` separate).
WORKDIR_PATTERN = re.compile(r"^/[A-Za-z0-9._+-][A-Za-z0-9._+/-]{0,253}$")
#: an evaluator's registry name (never an import path ``module:attr``).
EVALUATOR_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")
#: a container image reference (registry/name:tag@digest): never an option (``--privileged``).
IMAGE_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}$")
#: an environment variable's name (POSIX.1-2017, 8.1 "Environment Variable Definition": letters,
#: digits and underscores, not starting with a digit): ``A=B`` would split at ``=`` at run time.
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")


def check_env(env: dict[str, str]) -> dict[str, str]:
    """``env``, when every name is a POSIX variable name and no value holds a NUL byte.

    Raises:
        ValueError: naming the first bad variable.
    """
    for name, value in env.items():
        if not ENV_NAME_PATTERN.match(name):
            raise ValueError(
                f"environment variable name {name!r} is not valid (letters, digits and '_', "
                "not starting with a digit)"
            )
        if "\x00" in value:
            raise ValueError(f"environment variable {name!r} holds a NUL byte")
    return env


def artifact_file_name(path: str) -> str:
    """The store name of the artifact file at workspace-relative ``path``: ``/`` becomes
    ``__`` (one blob-store key per artifact, no folders), so ``a/b`` and ``a__b`` would share
    one; :class:`RuntimeSpec` refuses such a pair at submit."""
    return posixpath.normpath(path).replace("/", "__")


class ImageBuild(Payload):
    """A container image built from a Dockerfile on the sandbox host (podman, docker), cached by
    the hash of everything that goes into it (``rolloutd.sandbox.runtimes.podman_images``)."""

    context: str = Field(
        min_length=2,
        description="the build context: an absolute host folder (below one of the sandbox "
        "policy's image_roots)",
    )
    dockerfile: str = Field(
        default="Dockerfile", description="the Dockerfile, relative to the context"
    )
    args: dict[str, str] = Field(
        default_factory=dict, description="build arguments (ARG), name -> value"
    )

    @field_validator("context")
    @classmethod
    def _absolute_context(cls, context: str) -> str:
        if not context.startswith("/") or ".." in context.split("/"):
            raise ValueError(f"build context {context!r} must be an absolute host folder")
        return context

    @field_validator("dockerfile")
    @classmethod
    def _relative_dockerfile(cls, dockerfile: str) -> str:
        if dockerfile.startswith("/") or ".." in dockerfile.split("/") or not dockerfile:
            raise ValueError(f"dockerfile {dockerfile!r} must be relative to the build context")
        return dockerfile

    @field_validator("args")
    @classmethod
    def _arg_names(cls, args: dict[str, str]) -> dict[str, str]:
        for name in args:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
                raise ValueError(f"build argument name {name!r} is not a valid ARG name")
        return args


class RuntimeSpec(Payload):
    """Where a harness runs: the runtime (:mod:`rolloutd.sandbox.runtimes`).

    ``type`` selects the backend. ``image`` means a root folder for ``bwrap`` (default: the
    host's read-only system), a SIF path for ``apptainer``, an image name for ``podman`` and
    ``docker`` (default: rolloutd's Debian base image, made on the host), which may instead
    be built from a Dockerfile (``build``).

    ``network`` defaults to ``gateway`` (only the session's gateway is reachable) on every
    isolating runtime and to ``host`` on ``local``, which isolates nothing.
    Limits (``cpus``, ``memory_mb``, ``max_processes``, ``disk_mb``, ``tmpfs_mb``,
    ``wall_time_s``) are enforced or the runtime refuses to start (see each runtime's docstring
    for how). The sandbox policy's ceilings bound them: a task asking above a maximum is refused,
    and one asking nothing gets the policy's default where its runtime starts
    (:mod:`rolloutd.sandbox_policy`).
    """

    type: Literal["local", "bwrap", "podman", "apptainer", "docker"] = Field(
        default="bwrap", description="runtime backend"
    )
    image: str | None = Field(default=None, description="root folder, SIF path or image name")
    build: ImageBuild | None = Field(
        default=None,
        description="podman, docker: build the image from a Dockerfile (instead of `image`)",
    )
    workdir: str = Field(default="/workspace", description="working folder inside the runtime")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables")
    files: dict[str, str] = Field(
        default_factory=dict,
        description="files written into the workspace before the harness runs: path -> text",
    )
    prepare: list[PrepareStep] = Field(
        default_factory=list, description="steps run in order at start, after `files`"
    )
    network: Literal["gateway", "none", "host"] = Field(
        default=None,  # type: ignore[assignment] - resolved by _default_network
        description="network policy: `gateway` (default where isolated) reaches only the "
        "session's gateway, `none` nothing, `host` the host's network",
    )
    max_processes: int | None = Field(
        default=None, ge=1, description="process limit (tasks: processes and threads)"
    )
    memory_mb: int | None = Field(default=None, ge=16, description="memory limit, MiB")
    cpus: float | None = Field(default=None, gt=0, le=1024, description="CPU limit, cores")
    disk_mb: int | None = Field(
        default=None,
        ge=16,
        description="disk limit, MiB: the workspace, home and logs (and a container's "
        "writable layer where the runtime can bound it)",
    )
    tmpfs_mb: int | None = Field(default=None, ge=1, description="size of /tmp (a tmpfs), MiB")
    wall_time_s: float | None = Field(
        default=None,
        gt=0,
        le=7 * 86_400,
        description="default time limit of every command and of the harness run",
    )
    artifacts: list[str] = Field(
        default_factory=list,
        description="workspace files stored as artifacts after the run (relative paths)",
    )
    git_diff: bool = Field(
        default=True, description="store `git diff --binary` of a git workspace as `patch`"
    )

    @model_validator(mode="before")
    @classmethod
    def _default_network(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("network") is None:
            kind = data.get("type", "bwrap")
            data = {**data, "network": "gateway" if kind in ISOLATING_RUNTIMES else "host"}
        return data

    @field_validator("workdir")
    @classmethod
    def _safe_workdir(cls, workdir: str) -> str:
        if not WORKDIR_PATTERN.match(workdir) or posixpath.normpath(workdir) != workdir:
            raise ValueError(
                f"workdir {workdir!r} must be an absolute, normalised folder of letters, "
                "digits and '._+-/' only"
            )
        return workdir

    @model_validator(mode="after")
    def _image_of_its_type(self) -> RuntimeSpec:
        image = self.image
        if self.build is not None:
            if self.type not in CONTAINER_RUNTIMES:
                raise ValueError(
                    f"build needs a container runtime (podman, docker), not {self.type}"
                )
            if image is not None:
                raise ValueError("give image or build, not both")
        if image is None:
            return self
        if self.type == "local":
            raise ValueError("image is not used by the local runtime (it runs on the host)")
        if self.type in CONTAINER_RUNTIMES and not IMAGE_NAME_PATTERN.match(image):
            raise ValueError(
                f"image {image!r} is not an image name (registry/name:tag; letters, digits "
                "and '._/:@+-', not starting with '-')"
            )
        if self.type in ("bwrap", "apptainer") and (
            not image.startswith("/") or ".." in image.split("/") or "\x00" in image
        ):
            raise ValueError(f"image {image!r} must be an absolute host path without '..'")
        return self

    @field_validator("files")
    @classmethod
    def _relative_paths(cls, files: dict[str, str]) -> dict[str, str]:
        for path in files:
            if path.startswith("/") or ".." in path.split("/") or not path:
                raise ValueError(f"file path {path!r} must be relative and stay in the workspace")
        return files

    @field_validator("artifacts")
    @classmethod
    def _relative_artifacts(cls, paths: list[str]) -> list[str]:
        names: dict[str, str] = {}
        for path in paths:
            if path.startswith("/") or ".." in path.split("/") or not path:
                raise ValueError(f"artifact path {path!r} must be relative to the workspace")
            name = artifact_file_name(path)
            if name in names:
                raise ValueError(
                    f"artifact paths {names[name]!r} and {path!r} would be stored under one "
                    f"name ({name!r}: '/' is stored as '__'); keep one of them"
                )
            names[name] = path
        return paths

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        return check_env(env)


class HarnessSpec(Payload):
    """The agent program a session runs (:mod:`rolloutd.sandbox.harnesses`).

    ``command`` is the command template of the ``shell`` harness; ``{instruction}`` in it is
    replaced by the shell-quoted instruction and ``{base_url}`` by the session's OpenAI base URL.
    """

    type: Literal[
        "shell",
        "python",
        "qwen_code",
        "codex",
        "claude_code",
        "gemini_cli",
        "opencode",
        "pi",
        "mini_swe_agent",
        "aider",
        "cli",
        "oracle",
    ] = Field(default="shell", description="harness adapter")
    command: str | list[str] | None = Field(
        default=None,
        description="command template: a shell string (shell, cli) or an argv list (cli)",
    )
    dialect: Literal["chat", "responses", "anthropic", "gemini"] | None = Field(
        default=None,
        description="the provider API the harness speaks, where it can speak several (cli, pi); "
        "`{base_url}` in a cli template is this dialect's session URL",
    )
    files: dict[str, str] = Field(
        default_factory=dict,
        description="files written into the runtime before the harness starts: path (relative: "
        "under the runtime's HOME) -> content template with the cli placeholders",
    )
    args: list[str] = Field(default_factory=list, description="extra CLI arguments")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables")
    max_turns: int = Field(default=10, ge=1, le=1000, description="turn limit where supported")
    profile: Literal["default", "compact"] = Field(
        default="default",
        description="`compact`: a short system prompt and the core tools only, for models "
        "served with a small context window (where the adapter supports it)",
    )
    solution: str | None = Field(
        default=None,
        description="oracle: the reference solution's folder on the sandbox host (a Harbor "
        "task's solution/, holding solve.sh), copied to /solution and run; a task set's "
        "loader fills it in per task (rolloutd.tasksets.harbor)",
    )
    entry: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="python: the agent coroutine as `module:function`, imported inside the "
        "runtime from the workdir, HOME (where `files` go) or PYTHONPATH",
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        return check_env(env)

    @model_validator(mode="after")
    def _shell_needs_command(self) -> HarnessSpec:
        if self.type in ("shell", "cli") and not self.command:
            raise ValueError(f"harness.command is required when harness.type is {self.type!r}")
        if self.type == "python" and not self.entry:
            raise ValueError(
                "harness.entry (`module:function`) is required when harness.type is 'python'"
            )
        if self.type == "shell" and not isinstance(self.command, str):
            raise ValueError("harness.command of the shell harness is one shell string")
        return self


class BuilderSpec(Payload):
    """How a completion log becomes a trajectory: the builder (:mod:`rolloutd.trajectory`)."""

    type: Literal["per_request", "prefix_merging"] = Field(
        default="prefix_merging", description="trajectory builder"
    )
    on_drift: Literal["keep", "split"] = Field(
        default="split", description="a drifting turn continues its chain (keep) or starts one"
    )
    loss_mask: Literal["full_assistant", "action_only"] = Field(
        default="full_assistant", description="which sampled tokens are trainable"
    )


class EvaluatorSpec(Payload):
    """How a session is scored: the evaluator (:mod:`rolloutd.evaluators`).

    ``command`` runs in the session's runtime after the harness (before teardown); its exit
    code and output become the artifact ``check`` that ``test_on_output`` scores.
    """

    type: str = Field(
        default="session_completed",
        description="a name in the eval fleet's evaluator registry (session_completed, "
        "test_on_output, ..., or one its operator registered); never an import path",
    )
    command: str | None = Field(default=None, description="check command run in the runtime")
    expected_output: str | None = Field(
        default=None, description="test_on_output: reward 1.0 when stdout contains it"
    )
    timeout_s: float = Field(default=60.0, gt=0, le=86_400, description="check command limit")
    params: dict[str, Any] = Field(default_factory=dict, description="evaluator parameters")
    runtime: Literal["session", "fresh"] = Field(
        default="session",
        description="where the check runs: the session's runtime after the harness, or a "
        "fresh runtime provisioned while the harness runs (the session's patch is applied "
        "there first)",
    )
    runtime_spec: RuntimeSpec | None = Field(
        default=None, description="the fresh runtime's spec; default: the task's runtime"
    )
    judge: JudgeSpec | None = Field(
        default=None,
        description="``llm_judge``: the rubric, mode and limits of the judge (rolloutd.rubrics)",
    )

    @field_validator("type")
    @classmethod
    def _registry_name(cls, name: str) -> str:
        if not EVALUATOR_NAME_PATTERN.match(name):
            raise ValueError(
                f"evaluator type {name!r} is not a registry name (letters, digits, '_', '.', "
                "'-'); import paths are not accepted: evaluators come from the eval fleet's "
                "registry (built-ins, the `rolloutd.evaluators` entry-point group, the "
                "operator's ROLLOUTD_EVALUATORS)"
            )
        return name

    @model_validator(mode="after")
    def _test_needs_check(self) -> EvaluatorSpec:
        if (self.type == JUDGE_EVALUATOR) != (self.judge is not None):
            raise ValueError(
                f"evaluator.judge is required when evaluator.type is {JUDGE_EVALUATOR!r}, "
                "and taken by no other evaluator"
            )
        if self.type == "test_on_output" and not (self.command or self.expected_output):
            raise ValueError(
                "evaluator.command or evaluator.expected_output is required "
                "when evaluator.type is 'test_on_output'"
            )
        return self


class PhaseTimeouts(Payload):
    """Execution budget of each session phase, in seconds (queue time is not charged)."""

    open_s: float = Field(default=30.0, gt=0, le=3600)
    provision_s: float = Field(default=120.0, gt=0, le=86_400)
    provision_wait_s: float = Field(
        default=60.0,
        gt=0,
        le=86_400,
        description="how long provisioning waits for a "
        "sandbox host while the sandbox fleet is dead (none of its worker processes beats in "
        "the fleet registry): past it the session fails ('no sandbox worker is alive'); a "
        "fleet that beats but is full is waited for, up to capacity_wait_s",
    )
    capacity_wait_s: float = Field(
        default=86_400.0,
        gt=0,
        le=7 * 86_400,
        description="the deadline of each wait for capacity in a queue, s: for a gateway "
        "to admit the session (backend room), then for a sandbox host to take its "
        "provisioning. Waiting sessions record no event and are served in priority and "
        "arrival order; past it the session fails (backend, sandbox), not retried",
    )
    run_s: float = Field(default=600.0, gt=0, le=86_400)
    collect_s: float = Field(default=120.0, gt=0, le=86_400)
    teardown_s: float = Field(default=60.0, gt=0, le=3600)
    build_s: float = Field(default=120.0, gt=0, le=86_400)
    evaluate_s: float = Field(default=300.0, gt=0, le=86_400)
