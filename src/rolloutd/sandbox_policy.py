"""The sandbox policy: the isolation a sandbox fleet's operator lets a task ask for.

The operator, who writes a fleet's settings (``[sandbox_policy]`` in the config file, or
``ROLLOUTD_SANDBOX_POLICY``), is trusted; a tenant, a task file and a task's own runtime spec
are not (docs/security.md, "Threat model"). A task may narrow what the policy allows
(``network: none`` where ``gateway`` is allowed), never widen it. The policy is checked
twice: when a task is submitted, against the policy every sandbox host published with its
capabilities (:func:`rolloutd.capabilities.check_task`), and on the host itself right before
a runtime starts (:func:`enforce`), where host paths are also resolved (symlinks followed), so
a path that looked inside an allowed folder cannot point outside it.

What a policy governs:

- ``runtimes``: runtime types a task may name; ``local`` isolates nothing and is off unless the
  operator lists it (as the stack tests build does);
- ``networks``: network policies a task may name; ``none`` is always allowed (it narrows);
- ``image_roots``: host folders below which host-path images may lie: bwrap image folders,
  apptainer SIF files, and the build contexts of container images (podman, docker);
- ``images``: name patterns (:func:`fnmatch.fnmatchcase`) of container images a task may run,
  and of every image its Dockerfile builds from (``FROM`` read after the build arguments;
  checked on the sandbox host, which holds the Dockerfile:
  :func:`rolloutd.sandbox.runtimes.podman_images.build_images`);
- ``upload_sources``: host folders and URL prefixes (``s3://bucket/prefix/``) prepare-step
  uploads may copy from (the worker reads them with its own credentials);
- ``build_network``: whether a task's image build may use the network;
- ``default_limits`` and ``max_limits``: the operator's ceilings on a runtime's resources
  (:class:`Limits`: processes, memory, CPUs, disk, the size of ``/tmp``). A task asking above
  a maximum is refused, naming the field; a task asking nothing gets the default where its
  runtime starts (:func:`with_default_limits`), so every session on an isolating runtime runs
  inside them. How each runtime enforces them while the session runs: docs/runtimes.md.

Pure except :func:`enforce` (which resolves host paths): :func:`violations` runs in the
submitting client and in workflow code.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from rolloutd.task_spec import RuntimeSpec, UploadStep

#: runtime types (``RuntimeSpec.type``).
RuntimeType = Literal["local", "bwrap", "podman", "apptainer", "docker"]
#: network policies (``RuntimeSpec.network``).
NetworkPolicy = Literal["gateway", "none", "host"]
#: runtimes a policy allows unless its operator says otherwise: every isolating one.
DEFAULT_RUNTIMES: tuple[RuntimeType, ...] = ("bwrap", "podman", "apptainer", "docker")
#: networks a policy allows unless its operator says otherwise (``none`` is always allowed).
DEFAULT_NETWORKS: tuple[NetworkPolicy, ...] = ("gateway", "none")
#: runtime types whose ``image`` is a host path (a folder, a SIF file).
PATH_IMAGE_RUNTIMES = ("bwrap", "apptainer")
#: runtime types whose ``image`` is a container image name.
NAMED_IMAGE_RUNTIMES = ("podman", "docker")
#: the environment variable holding a fleet's policy as JSON (SandboxSettings.sandbox_policy).
POLICY_ENV = "ROLLOUTD_SANDBOX_POLICY"
#: where an operator sets the policy, as refusals name it
POLICY_SETTING = f"the config file's [sandbox_policy], or {POLICY_ENV}"


#: the resource limits a policy bounds, as named in :class:`~rolloutd.task_spec.RuntimeSpec`.
LIMIT_FIELDS = ("max_processes", "memory_mb", "cpus", "disk_mb", "tmpfs_mb")
#: the limits each runtime type enforces while a session runs (docs/runtimes.md, "Ceilings"):
#: the policy's defaults fill only these, and a task asking another is refused. ``local``
#: isolates nothing and gets no default (it is off unless the operator lists it; a task may
#: still ask it for ``memory_mb``, RLIMIT_AS, and ``max_processes``, not enforced there).
ENFORCED_LIMITS: dict[str, tuple[str, ...]] = {
    "bwrap": LIMIT_FIELDS,
    "podman": LIMIT_FIELDS,
    "docker": LIMIT_FIELDS,
    "apptainer": ("max_processes", "memory_mb", "cpus"),
}
#: runtime types the ceilings apply to.
LIMITED_RUNTIMES: tuple[str, ...] = tuple(ENFORCED_LIMITS)


class Limits(BaseModel):
    """Resource limits of a runtime (the fields of :class:`~rolloutd.task_spec.RuntimeSpec` of
    the same names); None: no limit.

    Attributes:
        max_processes: tasks (processes and threads) at once.
        memory_mb: memory of all the runtime's processes together (page cache and tmpfs
            pages included), MiB, no swap.
        cpus: CPU bandwidth, cores.
        disk_mb: what the runtime may write to disk: its workspace, home and logs (and a
            container's writable layer where the runtime can bound it), MiB.
        tmpfs_mb: the size of ``/tmp``, a tmpfs (its pages count against ``memory_mb`` too), MiB.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_processes: int | None = Field(default=None, ge=1)
    memory_mb: int | None = Field(default=None, ge=16)
    cpus: float | None = Field(default=None, gt=0, le=1024)
    disk_mb: int | None = Field(default=None, ge=16)
    tmpfs_mb: int | None = Field(default=None, ge=1)

    def describe(self) -> str:
        """The limits in one line (``max_processes=1024, memory_mb=4096, ...``)."""
        return ", ".join(f"{f}={getattr(self, f)}" for f in LIMIT_FIELDS)


#: what a task that asks nothing gets, unless the operator says otherwise: room for an agent
#: CLI (node), its tools and a test suite, eight of them on a 2-core, 24 GiB host.
DEFAULT_LIMITS = Limits(max_processes=1024, memory_mb=4096, cpus=2.0, disk_mb=10_240, tmpfs_mb=1024)
#: the most a task may ask for, unless the operator says otherwise.
MAX_LIMITS = Limits(max_processes=8192, memory_mb=16_384, cpus=8.0, disk_mb=51_200, tmpfs_mb=8192)


def _absolute_folder(value: str, field: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"{field} entry {value!r} must be an absolute host folder")
    normal = posixpath.normpath(value)
    if normal in ("/", "//"):
        raise ValueError(
            f"{field} entry {value!r} would expose the host's whole file system (its /proc, "
            "the worker's environment, every session's files); name the folders to allow"
        )
    return normal


class SandboxPolicy(BaseModel):
    """What a sandbox fleet lets a task ask for; see the module docstring.

    Attributes:
        runtimes: runtime types a task may name (``local``: only where listed).
        networks: network policies a task may name; ``none`` is always allowed.
        image_roots: absolute host folders below which bwrap image folders, apptainer SIF
            files and container build contexts must lie; never ``/``.
        images: patterns of container image names (podman, docker) a task may run or its
            Dockerfile may name, matched with :func:`fnmatch.fnmatchcase` (``localhost/*``);
            ``*`` allows any.
        upload_sources: absolute host folders (never ``/``) and URL prefixes with a scheme
            and a bucket or host (``s3://bucket/prefix/``) that prepare-step uploads may read.
        build_network: whether an image build from a task's Dockerfile may reach the network
            (``podman build --network``); off, a build sees none.
        default_limits: what a task on an isolating runtime gets for each limit it does not
            ask for (:data:`DEFAULT_LIMITS`, at most the maximum, for each one the operator does
            not name; null: none, and then the maximum applies, so no session runs above a
            maximum).
        max_limits: the most a task may ask for (:data:`MAX_LIMITS` for each one the operator
            does not name; null: no maximum); above it, a task is refused.

    Raises:
        pydantic.ValidationError: ``/`` as an image root or upload source, a relative folder,
            a URL prefix without a bucket or host, or a default above its maximum.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    runtimes: list[RuntimeType] = Field(default_factory=lambda: list(DEFAULT_RUNTIMES))
    networks: list[NetworkPolicy] = Field(default_factory=lambda: list(DEFAULT_NETWORKS))
    image_roots: list[str] = Field(default_factory=list)
    images: list[str] = Field(default_factory=lambda: ["*"])
    upload_sources: list[str] = Field(default_factory=list)
    build_network: bool = False
    default_limits: Limits = DEFAULT_LIMITS
    max_limits: Limits = MAX_LIMITS

    @model_validator(mode="before")
    @classmethod
    def _over_the_defaults(cls, data: Any) -> Any:
        # an operator naming one limit keeps the others' built-in values (null says "none");
        # a built-in default above the operator's maximum comes down to it
        if not isinstance(data, dict):
            return data
        data = dict(data)
        maxima = data.get("max_limits", MAX_LIMITS)
        if isinstance(maxima, dict):
            maxima = data["max_limits"] = {**MAX_LIMITS.model_dump(), **maxima}
        elif isinstance(maxima, Limits):
            maxima = maxima.model_dump()
        defaults = data.get("default_limits", {})
        if isinstance(defaults, dict):
            built_in = DEFAULT_LIMITS.model_dump()
            for name, maximum in maxima.items():
                # an unknown name is left to validation, which refuses it by name
                if built_in.get(name) is not None and maximum is not None:
                    built_in[name] = min(built_in[name], maximum)
            data["default_limits"] = {**built_in, **defaults}
        return data

    @model_validator(mode="after")
    def _defaults_within_maxima(self) -> SandboxPolicy:
        for name in LIMIT_FIELDS:
            default, maximum = getattr(self.default_limits, name), getattr(self.max_limits, name)
            if default is not None and maximum is not None and default > maximum:
                raise ValueError(
                    f"default_limits.{name}={default} is above max_limits.{name}={maximum}"
                )
        return self

    def default_limit(self, name: str) -> int | float | None:
        """The limit ``name`` (one of :data:`LIMIT_FIELDS`) a task that does not ask for it
        gets: ``default_limits``' value, else ``max_limits``' (None: no limit)."""
        default = getattr(self.default_limits, name)
        return default if default is not None else getattr(self.max_limits, name)

    @field_validator("image_roots")
    @classmethod
    def _image_roots(cls, roots: list[str]) -> list[str]:
        return [_absolute_folder(r, "image_roots") for r in roots]

    @field_validator("upload_sources")
    @classmethod
    def _upload_sources(cls, sources: list[str]) -> list[str]:
        checked = []
        for source in sources:
            if "://" in source:
                parts = urlsplit(source)
                if not parts.scheme or not parts.netloc or "::" in source:
                    raise ValueError(
                        f"upload_sources entry {source!r} must be a URL prefix with a scheme "
                        "and a bucket or host, e.g. s3://bucket/prefix/"
                    )
                checked.append(source)
            else:
                checked.append(_absolute_folder(source, "upload_sources"))
        return checked

    def describe(self) -> str:
        """The policy in one line, for error messages."""
        return (
            f"runtimes: {', '.join(self.runtimes) or 'none'}; "
            f"networks: {', '.join(sorted({*self.networks, 'none'}))}; "
            f"image_roots: {', '.join(self.image_roots) or 'none'}; "
            f"images: {', '.join(self.images) or 'none'}; "
            f"upload_sources: {', '.join(self.upload_sources) or 'none'}; "
            f"max_limits: {self.max_limits.describe()}"
        )


def _under(path: str, roots: list[str]) -> bool:
    """Whether the absolute, normalised ``path`` is one of ``roots`` or below one."""
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _host_path(value: str, *, resolve: bool) -> str | None:
    """``value`` as a normalised absolute host path (``file://`` URLs too), symlinks followed
    when ``resolve``; None when it is not a host path."""
    if value.startswith("file://"):
        value = urlsplit(value).path
    elif "://" in value or "::" in value:
        return None
    if not value.startswith("/"):
        return ""  # relative: never allowed (relative to what? the worker's cwd)
    return os.path.realpath(value) if resolve else posixpath.normpath(value)


def upload_violation(source: str, policy: SandboxPolicy, *, resolve: bool = False) -> str | None:
    """Why an upload step's ``source`` is outside ``policy`` (None: it is inside).

    Args:
        source: ``UploadStep.source``: a host path, a ``file://`` URL or another fsspec URL.
        policy: the fleet's policy.
        resolve: follow symlinks (on the sandbox host, right before the copy).
    """
    path = _host_path(source, resolve=resolve)
    folders = [s for s in policy.upload_sources if "://" not in s]
    prefixes = [s for s in policy.upload_sources if "://" in s]
    if path is None:
        if "::" in source or ".." in urlsplit(source).path.split("/"):
            return "a chained or '..' URL is never allowed"
        if any(source.startswith(p) for p in prefixes):
            return None
        return "its URL is not below an allowed prefix"
    if not path:
        return "a relative host path is never allowed"
    if _under(path, folders):
        return None
    return f"{path} is not below an allowed folder"


def violations(
    spec: RuntimeSpec, policy: SandboxPolicy, *, path: str = "runtime", resolve: bool = False
) -> list[tuple[str, str]]:
    """What of a runtime spec ``policy`` refuses.

    Args:
        spec: a validated runtime spec (the task's, or its evaluator's fresh runtime).
        policy: the sandbox fleet's policy.
        path: the spec's dotted path in the task, for messages (``evaluator.runtime_spec``).
        resolve: follow symlinks of host paths (on the sandbox host).

    Returns:
        ``(dotted.field.path, message)`` pairs, empty when the spec is allowed; each message
        names the field, its value and the policy's setting that refuses it.
    """
    found: list[tuple[str, str]] = []

    def refuse(field: str, value: object, setting: str, why: str = "") -> None:
        reason = f": {why}" if why else ""
        found.append(
            (
                f"{path}.{field}",
                f"{path}.{field}={value!r} is outside the sandbox policy{reason} "
                f"({setting}; the operator sets it in {POLICY_SETTING})",
            )
        )

    if spec.type not in policy.runtimes:
        refuse("type", spec.type, f"runtimes: {', '.join(policy.runtimes) or 'none'}")
    if spec.type != "local" and spec.network != "none" and spec.network not in policy.networks:
        allowed = ", ".join(sorted({*policy.networks, "none"}))
        refuse("network", spec.network, f"networks: {allowed}")
    image_roots = f"image_roots: {', '.join(policy.image_roots) or 'none'}"
    if spec.image and spec.type in PATH_IMAGE_RUNTIMES:
        image = _host_path(spec.image, resolve=resolve)
        if image in ("/", "//"):
            refuse("image", spec.image, image_roots, "the host's root is never an image")
        elif not image or not _under(image, policy.image_roots):
            refuse("image", spec.image, image_roots)
    if spec.image and spec.type in NAMED_IMAGE_RUNTIMES:
        if not any(fnmatch.fnmatchcase(spec.image, p) for p in policy.images):
            refuse("image", spec.image, f"images: {', '.join(policy.images) or 'none'}")
    if spec.build is not None:
        context = _host_path(spec.build.context, resolve=resolve)
        if not context or not _under(context, policy.image_roots):
            refuse("build.context", spec.build.context, image_roots)
    if spec.type in LIMITED_RUNTIMES:
        for name in LIMIT_FIELDS:
            asked, maximum = getattr(spec, name), getattr(policy.max_limits, name)
            if asked is None:
                continue
            if name not in ENFORCED_LIMITS[spec.type]:
                refuse(
                    name,
                    asked,
                    f"{spec.type} enforces {', '.join(ENFORCED_LIMITS[spec.type])}",
                    f"the {spec.type} runtime cannot enforce it",
                )
            elif maximum is not None and asked > maximum:
                refuse(name, asked, f"max_limits.{name}: {maximum}", "above the maximum")
    for index, step in enumerate(spec.prepare):
        if isinstance(step, UploadStep):
            why = upload_violation(step.source, policy, resolve=resolve)
            if why:
                refuse(
                    f"prepare[{index}].source",
                    step.source,
                    f"upload_sources: {', '.join(policy.upload_sources) or 'none'}",
                    why,
                )
    return found


def with_default_limits(spec: RuntimeSpec, policy: SandboxPolicy) -> RuntimeSpec:
    """``spec`` with the policy's default for each limit it does not ask for and its runtime
    enforces (:data:`ENFORCED_LIMITS`; ``local`` enforces none and is returned as it is).

    Args:
        spec: a runtime spec within the policy (:func:`violations` found nothing).
        policy: the sandbox host's policy.

    Returns:
        A copy with every limit of :data:`ENFORCED_LIMITS` the spec left None set to
        :meth:`SandboxPolicy.default_limit` (still None where the policy sets neither a
        default nor a maximum).
    """
    if spec.type not in LIMITED_RUNTIMES:
        return spec
    update = {
        name: policy.default_limit(name)
        for name in ENFORCED_LIMITS[spec.type]
        if getattr(spec, name) is None and policy.default_limit(name) is not None
    }
    return spec.model_copy(update=update) if update else spec


def check_message(found: list[tuple[str, str]]) -> str:
    """One message of :func:`violations`' findings (for an exception)."""
    return "; ".join(message for _, message in found)
