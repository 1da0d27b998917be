"""Prepare steps (``RuntimeSpec.prepare``) and artifacts (the workspace's patch, named files).

Prepare steps run at the end of :meth:`Runtime.start`, in order, before any harness:

- ``exec``: a command in the runtime; a non-zero exit fails provisioning (not retried: the same
  step fails the same way);
- ``upload``: a host file or folder, or a file behind an fsspec URL (``s3://``, ``gs://``,
  ``file://``), copied to a path in the runtime; ``extract`` unpacks a tar archive there with
  the ``data`` filter of :mod:`tarfile` (no absolute paths, no links out, no devices).

Artifacts (:func:`git_patch`) are read after the harness ran: ``git diff --binary`` of
everything in a git workspace against ``HEAD``, untracked files included, computed with a
throw-away index so the workspace's own index is untouched (git-diff(1), git-read-tree(1)).
"""

from __future__ import annotations

import asyncio
import io
import shutil
import tarfile
from pathlib import Path

import fsspec
import structlog

from rolloutd.errors import RuntimeStartError
from rolloutd.sandbox.runtimes.base import ExecResult, Runtime
from rolloutd.types import ExecStep, UploadStep

log = structlog.get_logger(__name__)

#: bytes of a patch kept in an artifact; a larger diff is reported, not stored.
MAX_PATCH_BYTES = 8 * 2**20

#: ``git diff --binary`` of the workspace against HEAD, untracked files included; the real
#: index is left alone (a temporary one is filled from HEAD, then ``add -A``).
GIT_PATCH_SCRIPT = (
    'git rev-parse --is-inside-work-tree >/dev/null 2>&1 || exit 3; '
    'export GIT_INDEX_FILE="$(mktemp)"; '
    'git read-tree HEAD && git add -A && '
    'git -c core.fileMode=false diff --binary --no-color --no-ext-diff --cached HEAD; '
    'status=$?; rm -f "$GIT_INDEX_FILE"; exit $status'
)

#: git identity and safety settings for commands in a workspace owned by another uid.
GIT_ENV = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory",
           "GIT_CONFIG_VALUE_0": "*", "GIT_AUTHOR_NAME": "rolloutd",
           "GIT_AUTHOR_EMAIL": "rolloutd@localhost", "GIT_COMMITTER_NAME": "rolloutd",
           "GIT_COMMITTER_EMAIL": "rolloutd@localhost"}


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
                    f"{(result.stderr or result.stdout).strip()[-500:]}", retryable=False)
        else:
            try:
                await upload_source(runtime, step)
            except (OSError, tarfile.TarError, ValueError) as exc:
                raise RuntimeStartError(f"runtime.prepare[{index}] upload of {step.source!r} "
                                        f"failed: {exc}", retryable=False) from exc
        log.info("runtime_prepare_step_done", runtime_id=runtime.runtime_id, index=index,
                 step=step.type)


async def upload_source(runtime: Runtime, step: UploadStep) -> None:
    """Copy ``step.source`` into the runtime (see the module docstring).

    Raises:
        OSError, tarfile.TarError: the source cannot be read or unpacked.
        ConfigError: the destination leaves the workspace and home.
    """
    local = Path(step.source).expanduser()
    if "://" not in step.source and local.is_dir():
        target = runtime.host_path(step.path)
        await asyncio.to_thread(shutil.copytree, local, target, symlinks=True,
                                dirs_exist_ok=True)
        await runtime.adopt(target)
        return
    data = await asyncio.to_thread(_read_source, step.source)
    if step.extract:
        target = runtime.host_path(step.path)
        target.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(_extract, data, target)
        await runtime.adopt(target)
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


async def git_patch(runtime: Runtime, *, timeout_s: float = 120.0) -> dict[str, object] | None:
    """The workspace's changes as ``git diff --binary`` against HEAD, or None (not a repo).

    Returns:
        ``{"format": "git-diff-binary", "patch": str, "num_bytes": int, "truncated": bool}``;
        a patch over :data:`MAX_PATCH_BYTES` is stored empty with ``truncated`` true.
    """
    result = await runtime.exec(["/bin/sh", "-c", GIT_PATCH_SCRIPT], env=GIT_ENV,
                                timeout_s=timeout_s, max_output_bytes=MAX_PATCH_BYTES + 1)
    if result.exit_code == 3:
        return None
    if result.exit_code != 0:
        log.warning("git_patch_failed", exit_code=result.exit_code,
                    stderr=result.stderr.strip()[-300:])
        return {"format": "git-diff-binary", "patch": "", "num_bytes": 0, "truncated": False,
                "error": result.stderr.strip()[-1000:] or f"exit {result.exit_code}"}
    num_bytes = len(result.stdout.encode())
    truncated = result.truncated or num_bytes > MAX_PATCH_BYTES
    return {"format": "git-diff-binary", "patch": "" if truncated else result.stdout,
            "num_bytes": num_bytes, "truncated": truncated}


async def apply_patch(runtime: Runtime, patch: str, *, timeout_s: float = 120.0) -> ExecResult:
    """Apply a ``git diff --binary`` patch to the workspace (``git apply``, git-apply(1)).

    An empty patch is a no-op that succeeds.
    """
    if not patch.strip():
        return ExecResult(exit_code=0)
    return await runtime.exec(["git", "apply", "--binary", "--whitespace=nowarn", "-"],
                              env=GIT_ENV, stdin=patch.encode(), timeout_s=timeout_s)
