"""Runtimes: where harnesses run: ``local``, ``bwrap``, ``apptainer``, ``docker``.

Use :func:`create_runtime`; every runtime offers ``start``, ``exec``, ``spawn``, ``upload``,
``download``, ``cancel`` and ``stop`` (see :class:`~rolloutd.sandbox.runtimes.base.Runtime`).
"""

from __future__ import annotations

from pathlib import Path

from rolloutd.errors import ConfigError
from rolloutd.sandbox.runtimes.base import ExecResult, Runtime
from rolloutd.sandbox.runtimes.process import RuntimeProcess
from rolloutd.types import RuntimeSpec

__all__ = ["ExecResult", "Runtime", "RuntimeProcess", "create_runtime"]


def create_runtime(
    spec: RuntimeSpec, runtime_id: str, root: Path, *, grace_s: float = 5.0
) -> Runtime:
    """Create (not start) the runtime ``spec.type`` asks for.

    Args:
        spec: the task's runtime spec.
        runtime_id: unique on this host; letters, digits, '.', '_' and '-' (a folder name).
        root: host folder of the runtimes (``SandboxSettings.runtime_root``).
        grace_s: seconds between SIGTERM and SIGKILL when its processes are terminated.

    Returns:
        The runtime; call ``await runtime.start()`` next and ``await runtime.stop()`` always.

    Raises:
        ConfigError: an unknown or not yet built runtime type, or a spec it cannot honour.
    """
    if spec.type == "local":
        from rolloutd.sandbox.runtimes.local import LocalRuntime

        return LocalRuntime(spec, runtime_id, Path(root), grace_s=grace_s)
    if spec.type == "bwrap":
        from rolloutd.sandbox.runtimes.bwrap import BwrapRuntime

        return BwrapRuntime(spec, runtime_id, Path(root), grace_s=grace_s)
    if spec.type == "apptainer":
        from rolloutd.sandbox.runtimes.containers import ApptainerRuntime

        return ApptainerRuntime(spec, runtime_id, Path(root), grace_s=grace_s)
    if spec.type == "docker":
        from rolloutd.sandbox.runtimes.containers import DockerRuntime

        return DockerRuntime(spec, runtime_id, Path(root), grace_s=grace_s)
    raise ConfigError(f"runtime.type={spec.type!r} is unknown")
