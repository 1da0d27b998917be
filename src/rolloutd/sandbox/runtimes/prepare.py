"""A runtime's prepare steps (``RuntimeSpec.prepare``), run at the end of
:meth:`~rolloutd.sandbox.runtimes.base.Runtime.start`, in order, before any harness:

- ``exec``: a command in the runtime; a non-zero exit fails provisioning (not retried: the same
  step fails the same way);
- ``upload``: a host file or folder, or a file behind an fsspec URL (``s3://``, ``gs://``,
  ``file://``), copied to a path in the runtime; ``extract`` unpacks a tar archive with the
  ``data`` filter of :mod:`tarfile` (no absolute paths, no links out, no devices) into a folder
  of the worker's, then copies it there. Copies into the runtime never follow a link the
  runtime holds (:meth:`~rolloutd.sandbox.runtimes.base.Runtime.copy_in`).
"""

from __future__ import annotations

import asyncio
import io
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import fsspec
import structlog

from rolloutd.errors import PolicyError, RuntimeStartError
from rolloutd.sandbox_policy import upload_violation
from rolloutd.types import ExecStep, UploadStep

if TYPE_CHECKING:
    from rolloutd.sandbox.runtimes.base import Runtime

log = structlog.get_logger(__name__)


async def run_prepare(runtime: Runtime, steps: list[ExecStep | UploadStep]) -> None:
    """Run ``steps`` in ``runtime`` in order.

    Raises:
        RuntimeStartError (not retryable): a step failed; the message names its index.
    """
    for index, step in enumerate(steps):
        if isinstance(step, ExecStep):
            result = await runtime.exec(step.command, env=step.env, timeout_s=step.timeout_s)
            if result.exit_code != 0:
                raise RuntimeStartError(
                    f"runtime.prepare[{index}] exited {result.exit_code}"
                    f"{' (timed out)' if result.timed_out else ''}: "
                    f"{(result.stderr or result.stdout).strip()[-500:]}",
                    retryable=False,
                )
        else:
            try:
                await upload_source(runtime, step)
            except (OSError, tarfile.TarError, ValueError) as exc:
                raise RuntimeStartError(
                    f"runtime.prepare[{index}] upload of {step.source!r} failed: {exc}",
                    retryable=False,
                ) from exc
        log.info(
            "runtime_prepare_step_done", runtime_id=runtime.runtime_id, index=index, step=step.type
        )


async def upload_source(runtime: Runtime, step: UploadStep) -> None:
    """Copy ``step.source`` into the runtime (see the module docstring).

    Raises:
        OSError, tarfile.TarError: the source cannot be read or unpacked.
        ConfigError: the destination leaves the workspace and home.
        PolicyError: the source is outside the runtime's policy (symlinks followed).
    """
    if runtime.policy is not None:
        why = upload_violation(step.source, runtime.policy, resolve=True)
        if why:
            raise PolicyError(
                f"upload source {step.source!r} is outside the sandbox policy: {why} "
                f"(upload_sources: {', '.join(runtime.policy.upload_sources) or 'none'})"
            )
    local = Path(step.source).expanduser()
    if "://" not in step.source and local.is_dir():
        await runtime.copy_in(local, step.path)
        return
    data = await asyncio.to_thread(_read_source, step.source)
    if step.extract:
        # unpacked where nothing of the runtime can reach, then copied in without following
        # a link the runtime holds
        staging = Path(tempfile.mkdtemp(prefix="extract-", dir=runtime.runtime_dir))
        try:
            await asyncio.to_thread(_extract, data, staging)
            await runtime.copy_in(staging, step.path)
        finally:
            await asyncio.to_thread(shutil.rmtree, staging, True)
        return
    path = step.path
    if path in (".", "") or path.endswith("/"):
        path = f"{path.rstrip('/') or '.'}/{Path(step.source).name}"
    await runtime.upload(path, data)


def _read_source(source: str) -> bytes:
    with fsspec.open(source, "rb") as f:
        return f.read()


def _extract(data: bytes, target: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        tar.extractall(target, filter="data")
