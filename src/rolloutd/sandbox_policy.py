"""The sandbox policy: the isolation a sandbox fleet's operator lets a task ask for.

The operator, who writes a fleet's settings (``ROLLOUTD_SANDBOX_POLICY``), is trusted; a tenant,
a task file and a task's own runtime spec are not (docs/security.md, "Threat model"). A task may
narrow what the policy allows (``network: none`` where ``gateway`` is allowed), never widen it.
The policy is checked twice: when a task is submitted, against the policy every sandbox host
published with its capabilities (:func:`rolloutd.capabilities.check_task`), and on the host
itself right before a runtime starts (:func:`enforce`), where host paths are also resolved
(symlinks followed), so a path that looked inside an allowed folder cannot point outside it.

What a policy governs:

- ``runtimes``: runtime types a task may name; ``local`` isolates nothing and is off unless the
  operator lists it (as the stack tests build does);
- ``networks``: network policies a task may name; ``none`` is always allowed (it narrows);
- ``image_roots``: host folders below which host-path images may lie: bwrap image folders,
  apptainer SIF files, and the build contexts of container images (podman, docker);
- ``images``: name patterns (:func:`fnmatch.fnmatchcase`) of container images a task may run;
- ``upload_sources``: host folders and URL prefixes (``s3://bucket/prefix/``) prepare-step
  uploads may copy from (the worker reads them with its own credentials);
- ``build_network``: whether a task's image build may use the network.

Pure except :func:`enforce` (which resolves host paths): :func:`violations` runs in the
submitting client and in workflow code.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

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
        images: patterns of container image names (podman, docker) a task may run, matched
            with :func:`fnmatch.fnmatchcase` (``localhost/*``); ``*`` allows any.
        upload_sources: absolute host folders (never ``/``) and URL prefixes with a scheme
            and a bucket or host (``s3://bucket/prefix/``) that prepare-step uploads may read.
        build_network: whether an image build from a task's Dockerfile may reach the network
            (``podman build --network``); off, a build sees none.

    Raises:
        pydantic.ValidationError: ``/`` as an image root or upload source, a relative folder,
            or a URL prefix without a bucket or host.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    runtimes: list[RuntimeType] = Field(default_factory=lambda: list(DEFAULT_RUNTIMES))
    networks: list[NetworkPolicy] = Field(default_factory=lambda: list(DEFAULT_NETWORKS))
    image_roots: list[str] = Field(default_factory=list)
    images: list[str] = Field(default_factory=lambda: ["*"])
    upload_sources: list[str] = Field(default_factory=list)
    build_network: bool = False

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
            f"upload_sources: {', '.join(self.upload_sources) or 'none'}"
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
                f"({setting}; the operator sets it in {POLICY_ENV})",
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


def check_message(found: list[tuple[str, str]]) -> str:
    """One message of :func:`violations`' findings (for an exception)."""
    return "; ".join(message for _, message in found)
