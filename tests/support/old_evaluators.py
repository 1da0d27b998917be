"""Old verifiers, reproduced as the operator's registered evaluators, to score a batch the way
a fleet did before a fix (``rolloutd reverify`` then scores it again with the fixed built-in).
Registered for every test fleet (tests/conftest.py).

``tests_humaneval_r1``: HumanEval as revision 1 of the ``humaneval`` evaluator scored it (an
answer passed when the program exited 0, whether or not ``check`` returned: an answer ending
in ``os._exit(0)`` passed). Its in-runtime step is revision 2's (which reports the exit status
too); only the verdict is the old one.

``tests_harbor_r1``: the ``harbor`` verifier as revision 1 ran it (:class:`HarborR1`), its
steps copied from rolloutd before the fix.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import Any, ClassVar

from rolloutd.evaluators import CHECK_ARTIFACT, EvaluationContext, EvaluationOutcome
from rolloutd.evaluators.harbor import (
    MAX_TEST_OUTPUT,
    REWARD_JSON,
    REWARD_TXT,
    TESTS_INSIDE,
    VERIFIER_INSIDE,
    HarborVerifier,
)
from rolloutd.evaluators.humaneval import HumanEval
from rolloutd.sandbox.runtimes import create_runtime
from rolloutd.sandbox.runtimes.base import Runtime
from rolloutd.sandbox.snapshot import changes
from rolloutd.sandbox.transfer import check_source, copy_tree_in
from rolloutd.types import RuntimeSpec


class HumanEvalR1(HumanEval):
    """HumanEval's verdict of revision 1: exit 0 in time is a pass."""

    name = "tests_humaneval_r1"
    version: ClassVar[str] = "r1-reproduced"

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationOutcome:
        """1.0 when the check program exited 0 in time (revision 1's rule)."""
        check: Any = ctx.artifacts.get(CHECK_ARTIFACT)
        passed = (
            isinstance(check, dict) and check.get("exit_code") == 0 and not check.get("timed_out")
        )
        details = {} if passed else {"reason": "the check program did not exit 0"}
        return EvaluationOutcome(reward=1.0 if passed else 0.0, details=details)


class HarborR1(HarborVerifier):
    """The ``harbor`` verifier of revision 1 (rolloutd before its fix), reproduced: the fresh
    container carries every change the agent made to its file system, packed by the agent's
    own ``tar`` inside its container; ``/tests`` goes in through the container's ``sh`` and
    ``tar``; ``test.sh`` runs with the ``bash`` first on the agent's ``PATH``, its working
    folder first on Python's path; the reward files are read with the agent's ``cat``. A fake
    ``python3`` or ``cat`` first on ``PATH``, or a ``pytest.py`` in the workdir, earns 1.00
    there. Its verdict is revision 2's reading of the reward files (identical for a check
    without a tamper report)."""

    name = "tests_harbor_r1"
    version: ClassVar[str] = "r1-reproduced"

    async def collect(self, runtime: Runtime) -> dict[str, Any]:
        """Revision 1's steps: the ``check`` artifact."""
        params = self.params()
        tests = Path(params.tests_dir)
        check_source(runtime, tests, "evaluator.params.tests_dir")
        verifier = await _carry_everything(runtime, params.network, params.env)
        try:
            await copy_tree_in(verifier, tests, TESTS_INSIDE)
            await verifier.exec(
                ["/bin/sh", "-c", f"rm -rf {VERIFIER_INSIDE} && mkdir -p {VERIFIER_INSIDE}"],
                cwd="/",
            )
            result = await verifier.exec(
                [
                    "bash",
                    "-c",
                    f"chmod +x {TESTS_INSIDE}/test.sh && {TESTS_INSIDE}/test.sh "
                    f"> {VERIFIER_INSIDE}/test-stdout.txt 2>&1",
                ],
                env=params.env,
                timeout_s=params.timeout_s,
                cwd=runtime.workdir,
            )
            await verifier.cancel()
            reward_json = await _cat(verifier, REWARD_JSON)
            reward_txt = await _cat(verifier, REWARD_TXT)
            output = await _cat(verifier, f"{VERIFIER_INSIDE}/test-stdout.txt") or ""
        finally:
            await verifier.stop()
        return {
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "stdout": output[-MAX_TEST_OUTPUT:],
            "stderr": result.stderr[-MAX_TEST_OUTPUT:],
            "reward_json": reward_json,
            "reward_txt": reward_txt,
            "disk_used_mb": None,
        }


async def _carry_everything(source: Runtime, network: str, env: dict[str, str]) -> Runtime:
    """Revision 1's fresh container: the agent's image, then every change of its file system
    (packed by ``tar`` inside the agent's container) and its workspace."""
    found = await changes(source)
    pack = b""
    if found.written:
        inside = f"{source.home}/.old-pack.tar"
        await source.exec(
            ["tar", "-c", "--no-recursion", "--null", "-T", "-", "-f", inside],
            stdin=b"\0".join(p.encode() for p in found.written),
            cwd="/",
        )
        host = source.host_path(inside)
        pack = host.read_bytes()
        host.unlink()
    updates = {"network": network, "env": {**source.spec.env, **env}, "files": {}, "prepare": []}
    spec = RuntimeSpec.model_validate({**source.spec.model_dump(), **updates, "artifacts": []})
    runtime = create_runtime(
        spec,
        f"{source.runtime_id}-o",
        source.runtime_dir.parent,
        grace_s=source.grace_s,
        policy=source.policy,
        host_id=str(getattr(source, "host_id", "")),
    )
    await runtime.start()
    try:
        # the workspace is a bind mount: its contents are replaced, never the folder
        for child in list(runtime.workspace.iterdir()):
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        shutil.copytree(source.workspace, runtime.workspace, symlinks=True, dirs_exist_ok=True)
        await runtime.adopt(runtime.workspace)
        if found.deleted:
            deleted = b"\0".join(p.encode() for p in found.deleted)
            await runtime.exec(["/bin/sh", "-c", "xargs -0 -r rm -rf --"], stdin=deleted, cwd="/")
        if pack:
            await runtime.exec(
                ["/bin/sh", "-c", "tar -x -p --same-owner -C / -f -"], stdin=pack, cwd="/"
            )
    except BaseException:
        await runtime.stop()
        raise
    return runtime


async def _cat(runtime: Runtime, path: str) -> str | None:
    """Revision 1's reading of a file: ``cat`` inside the container, as ``PATH`` finds it."""
    result = await runtime.exec(
        ["/bin/sh", "-c", f"test -f {shlex.quote(path)} && cat {shlex.quote(path)}"], cwd="/"
    )
    return result.stdout if result.exit_code == 0 else None
