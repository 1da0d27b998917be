"""Artifacts of a runtime (the workspace's patch) and applying a patch to a workspace.

(Prepare steps, ``RuntimeSpec.prepare``, are part of starting a runtime:
:func:`rolloutd.sandbox.runtimes.prepare.run_prepare`.)

Artifacts (:func:`git_patch`) are read after the harness ran: ``git diff --binary`` of
everything in a git workspace against ``HEAD`` (or :data:`BASE_REF`), untracked files included,
computed with a throw-away index so the workspace's own index is untouched (git-diff(1),
git-read-tree(1)).
"""

from __future__ import annotations

import structlog

from rolloutd.sandbox.runtimes.base import ExecResult, Runtime

log = structlog.get_logger(__name__)

#: bytes of a patch kept in an artifact; a larger diff is reported, not stored.
MAX_PATCH_BYTES = 8 * 2**20

#: the ref a task may set at start (a prepare step) to the commit its patch is taken against,
#: so that a harness that commits its work still yields the whole change
BASE_REF = "refs/rolloutd/base"

#: ``git diff --binary`` of the workspace against :data:`BASE_REF` (else HEAD), untracked
#: files included, compiled bytecode left out (``__pycache__/``, ``*.pyc``, ``*.pyo``: an
#: agent that ran the tests leaves them, and a verifier must never load them in place of the
#: sources: PEP 552's unchecked hash-based files are never compared with their source); the
#: real index is left alone (a temporary one is filled from the base, then ``add -A``).
GIT_PATCH_SCRIPT = (
    "git rev-parse --is-inside-work-tree >/dev/null 2>&1 || exit 3; "
    f"base=HEAD; git rev-parse -q --verify {BASE_REF} >/dev/null && base={BASE_REF}; "
    'export GIT_INDEX_FILE="$(mktemp)"; '
    "git read-tree \"$base\" && git add -A -- . ':(exclude,glob)**/__pycache__/**' "
    "':(exclude,glob)**/*.py[co]' && "
    'git -c core.fileMode=false diff --binary --no-color --no-ext-diff --cached "$base"; '
    'status=$?; rm -f "$GIT_INDEX_FILE"; exit $status'
)

#: git identity and safety settings for commands in a workspace owned by another uid.
GIT_ENV = {
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "safe.directory",
    "GIT_CONFIG_VALUE_0": "*",
    "GIT_AUTHOR_NAME": "rolloutd",
    "GIT_AUTHOR_EMAIL": "rolloutd@localhost",
    "GIT_COMMITTER_NAME": "rolloutd",
    "GIT_COMMITTER_EMAIL": "rolloutd@localhost",
}


async def git_patch(runtime: Runtime, *, timeout_s: float = 120.0) -> dict[str, object] | None:
    """The workspace's changes as ``git diff --binary`` against HEAD, or None (not a repo).

    Returns:
        ``{"format": "git-diff-binary", "patch": str, "num_bytes": int, "truncated": bool}``;
        a patch over :data:`MAX_PATCH_BYTES` is stored empty with ``truncated`` true.
    """
    result = await runtime.exec(
        ["/bin/sh", "-c", GIT_PATCH_SCRIPT],
        env=GIT_ENV,
        timeout_s=timeout_s,
        max_output_bytes=MAX_PATCH_BYTES + 1,
    )
    if result.exit_code == 3:
        return None
    if result.exit_code != 0:
        log.warning(
            "git_patch_failed", exit_code=result.exit_code, stderr=result.stderr.strip()[-300:]
        )
        return {
            "format": "git-diff-binary",
            "patch": "",
            "num_bytes": 0,
            "truncated": False,
            "error": result.stderr.strip()[-1000:] or f"exit {result.exit_code}",
        }
    num_bytes = len(result.stdout.encode())
    truncated = result.truncated or num_bytes > MAX_PATCH_BYTES
    return {
        "format": "git-diff-binary",
        "patch": "" if truncated else result.stdout,
        "num_bytes": num_bytes,
        "truncated": truncated,
    }


async def apply_patch(runtime: Runtime, patch: str, *, timeout_s: float = 120.0) -> ExecResult:
    """Apply a ``git diff --binary`` patch to the workspace (``git apply``, git-apply(1)).

    An empty patch is a no-op that succeeds.
    """
    if not patch.strip():
        return ExecResult(exit_code=0)
    return await runtime.exec(
        ["git", "apply", "--binary", "--whitespace=nowarn", "-"],
        env=GIT_ENV,
        stdin=patch.encode(),
        timeout_s=timeout_s,
    )
