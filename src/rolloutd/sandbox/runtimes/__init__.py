"""Runtimes: where harnesses run: ``local``, ``bwrap``, ``podman``, ``apptainer``, ``docker``.

Use :func:`create_runtime`; every runtime offers ``start``, ``exec``, ``spawn``, ``upload``,
``download``, ``cancel`` and ``stop`` (see :class:`~rolloutd.sandbox.runtimes.base.Runtime`).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from rolloutd.errors import ConfigError, PolicyError
from rolloutd.sandbox.runtimes.base import ExecResult, Runtime
from rolloutd.sandbox.runtimes.process import RuntimeProcess
from rolloutd.sandbox_policy import (
    SandboxPolicy,
    check_message,
    violations,
    with_default_limits,
)
from rolloutd.types import RuntimeSpec

__all__ = [
    "ExecResult",
    "Runtime",
    "RuntimeProcess",
    "create_runtime",
    "host_policy",
    "installed_runtimes",
    "verified_runtimes",
]

#: the program each runtime type needs on the host (``local`` needs none).
RUNTIME_PROGRAMS = {
    "bwrap": "bwrap",
    "podman": "podman",
    "apptainer": "apptainer",
    "docker": "docker",
}


def installed_runtimes() -> list[str]:
    """Runtime types whose program is installed on this host (``local`` always), for the
    fleet registry; docker only when its daemon answers (``docker version``)."""
    found = ["local"]
    for kind, program in RUNTIME_PROGRAMS.items():
        if shutil.which(program) is None:
            continue
        if kind == "docker":
            try:
                subprocess.run(
                    [program, "version", "--format", "{{.Server.Version}}"],
                    capture_output=True,
                    timeout=10,
                    check=True,
                )
            except (OSError, subprocess.SubprocessError):
                continue
        found.append(kind)
    return found


def verified_runtimes() -> list[str]:
    """Isolating runtime types installed here whose isolation this host can verify: bwrap
    and podman (rolloutd sets their namespaces, uid map, seccomp and limits itself), docker
    only when its daemon remaps users or runs rootless
    (:func:`~rolloutd.sandbox.runtimes.podman.docker_isolation`). Apptainer never: its
    isolation depends on its own configuration (``apptainer.conf``, setuid or not), which
    rolloutd does not check; an operator who has checked it lists it in the policy."""
    from rolloutd.sandbox.runtimes.podman import docker_isolation

    installed = installed_runtimes()
    found = [k for k in ("bwrap", "podman") if k in installed]
    if "docker" in installed and docker_isolation("docker") is None:
        found.append("docker")
    return found


def host_policy(policy: SandboxPolicy) -> SandboxPolicy:
    """The policy a sandbox host enforces and publishes: an operator's ``runtimes`` as they
    are; without them (the built-in default), only :func:`verified_runtimes`."""
    if "runtimes" in policy.model_fields_set:
        return policy
    verified = set(verified_runtimes())
    return policy.model_copy(update={"runtimes": [r for r in policy.runtimes if r in verified]})


def create_runtime(
    spec: RuntimeSpec,
    runtime_id: str,
    root: Path,
    *,
    grace_s: float = 5.0,
    policy: SandboxPolicy | None = None,
    host_id: str = "",
) -> Runtime:
    """Create (not start) the runtime ``spec.type`` asks for.

    Args:
        spec: the task's runtime spec.
        runtime_id: unique on this host; letters, digits, '.', '_' and '-' (a folder name).
        root: host folder of the runtimes (``SandboxSettings.runtime_root``).
        grace_s: seconds between SIGTERM and SIGKILL when its processes are terminated.
        policy: the sandbox fleet's policy, checked when the runtime starts, whose default
            limits fill those ``spec`` does not ask for (the runtime's :attr:`Runtime.spec`
            has them); the sandbox fleet always passes its own. None (a trusted caller:
            tests, benchmarks): not checked, no default limits.
        host_id: this host's id (a label of podman and docker containers).

    Returns:
        The runtime; call ``await runtime.start()`` next and ``await runtime.stop()`` always.

    Raises:
        PolicyError: ``spec.type`` is outside ``policy`` (the rest is checked at start).
        ConfigError: an unknown or not yet built runtime type, or a spec it cannot honour.
    """
    if policy is not None:
        if spec.type not in policy.runtimes:
            raise PolicyError(check_message(violations(spec, policy)))
        spec = with_default_limits(spec, policy)
    kwargs = {"grace_s": grace_s, "policy": policy}
    if spec.type == "local":
        from rolloutd.sandbox.runtimes.local import LocalRuntime

        return LocalRuntime(spec, runtime_id, Path(root), **kwargs)
    if spec.type == "bwrap":
        from rolloutd.sandbox.runtimes.bwrap import BwrapRuntime

        return BwrapRuntime(spec, runtime_id, Path(root), **kwargs)
    if spec.type == "apptainer":
        from rolloutd.sandbox.runtimes.containers import ApptainerRuntime

        return ApptainerRuntime(spec, runtime_id, Path(root), **kwargs)
    if spec.type == "podman":
        from rolloutd.sandbox.runtimes.podman import PodmanRuntime

        return PodmanRuntime(spec, runtime_id, Path(root), host_id=host_id, **kwargs)
    if spec.type == "docker":
        from rolloutd.sandbox.runtimes.podman import DockerRuntime

        return DockerRuntime(spec, runtime_id, Path(root), host_id=host_id, **kwargs)
    raise ConfigError(f"runtime.type={spec.type!r} is unknown")
