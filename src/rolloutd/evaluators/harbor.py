"""The ``harbor`` evaluator: a Harbor task's ``tests/test.sh``, run where the agent cannot reach.

Harbor's verifier (harbor/verifier/verifier.py) copies the task's ``tests/`` to ``/tests`` after
the agent ran, runs ``test.sh`` with ``[verifier] env``, and reads ``/logs/verifier/reward.json``
(a JSON object of numbers; preferred) or ``reward.txt`` (one number). Here, in the runtime's step
(:meth:`HarborVerifier.collect`, on the session's sandbox host after the harness ended):

1. a fresh container is made from the agent's final file system
   (:class:`rolloutd.sandbox.snapshot.FreshRuntime`: the agent's container committed to an
   image, its workspace copied), with the verifier's network (``none`` unless the task asks for
   ``public``) and nothing of the agent's running;
2. ``/tests`` and ``/logs/verifier`` are removed and made afresh there (whatever the agent left
   at those paths is gone), and the task's ``tests/`` is copied in from the host, where the
   agent never saw it (``tests_dir`` must lie below one of the sandbox policy's
   ``upload_sources``, as a prepare step's upload must);
3. ``test.sh`` runs from the workdir, its output in ``/logs/verifier/test-stdout.txt``; then
   every process left in the container is killed, so none writes a reward after the script;
4. the reward files are read, and the container and its image are removed.

On the eval fleet (:meth:`HarborVerifier.evaluate`) the rewards are parsed as Harbor parses
them: ``reward.json`` wins, ``reward.txt`` is ``{"reward": value}``; the session's reward is the
``reward`` key (or the only key). No reward file: reward 0.0 (the test script did not get to
write one: the environment the agent left did not let it). A reward file that is not numbers:
an evaluator error (the task's fault, never the policy's).

``[environment] storage_mb`` is checked here, when the run has ended: the disk the agent's
container wrote (its writable layer and workspace) over the limit is reward 0.0. (podman cannot
cap a container's disk while it runs on an ext4-backed overlay: ``--storage-opt size`` needs
XFS project quotas.)

``EvaluatorSpec.params`` (written by :func:`rolloutd.tasksets.harbor.evaluator_spec`)::

    {"tests_dir": host folder holding test.sh, "env": {name: value}, "network": "none" |
     "host", "timeout_s": test.sh's budget, "reward_key": "reward", "storage_mb": int}
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rolloutd.errors import EvaluatorError
from rolloutd.evaluators.base import (
    CHECK_ARTIFACT,
    EvaluationContext,
    EvaluationOutcome,
    Evaluator,
)
from rolloutd.sandbox.runtimes.base import Runtime
from rolloutd.sandbox.snapshot import FreshRuntime, disk_used_bytes
from rolloutd.sandbox.transfer import check_source, copy_tree_in, read_inside

#: Harbor's paths inside (harbor/models/trial/paths.py ``EnvironmentPaths``)
TESTS_INSIDE = "/tests"
VERIFIER_INSIDE = "/logs/verifier"
REWARD_TXT = f"{VERIFIER_INSIDE}/reward.txt"
REWARD_JSON = f"{VERIFIER_INSIDE}/reward.json"
TEST_STDOUT = f"{VERIFIER_INSIDE}/test-stdout.txt"
#: bytes of test output kept in the check artifact
MAX_TEST_OUTPUT = 64 * 1024


class HarborParams(BaseModel):
    """``EvaluatorSpec.params`` of the harbor evaluator (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    tests_dir: str = Field(min_length=1, description="host folder holding test.sh")
    env: dict[str, str] = Field(default_factory=dict, description="test.sh's environment")
    network: Literal["none", "host"] = Field(default="none", description="verifier network")
    timeout_s: float = Field(default=600.0, gt=0, le=86_400, description="test.sh's budget, s")
    reward_key: str = Field(default="reward", description="the key of reward.json scored")
    storage_mb: int | None = Field(
        default=None, ge=1, description="disk the agent's container may have written, MiB"
    )


def parse_rewards(reward_json: str | None, reward_txt: str | None) -> dict[str, float] | None:
    """Harbor's reading of the reward files: ``reward.json`` (an object of finite numbers, or
    one number) wins, else ``reward.txt`` (one finite number) as ``{"reward": value}``.

    Returns:
        The rewards, or None when neither file exists.

    Raises:
        EvaluatorError: a file that is empty or not finite numbers.
    """
    if reward_json is not None:
        try:
            rewards: Any = json.loads(reward_json)
        except ValueError:
            raise EvaluatorError(f"{REWARD_JSON} is not JSON: {reward_json[:200]!r}") from None
        if not isinstance(rewards, dict):
            rewards = {"reward": rewards}
        for key, value in rewards.items():
            finite = isinstance(value, int | float) and not isinstance(value, bool)
            if not finite or not math.isfinite(value):
                raise EvaluatorError(f"{REWARD_JSON}: {key} = {value!r} is not a finite number")
        return {str(k): float(v) for k, v in rewards.items()}
    if reward_txt is not None:
        try:
            value = float(reward_txt)
        except ValueError:
            raise EvaluatorError(f"{REWARD_TXT} is not a number: {reward_txt[:200]!r}") from None
        if not math.isfinite(value):
            raise EvaluatorError(f"{REWARD_TXT} = {value} is not finite")
        return {"reward": value}
    return None


class HarborVerifier(Evaluator):
    """Harbor's verifier in a fresh container from the agent's file system; see the module."""

    name = "harbor"

    def params(self) -> HarborParams:
        """The validated params.

        Raises:
            EvaluatorError: malformed ``params``.
        """
        try:
            return HarborParams.model_validate(self.spec.params)
        except ValidationError as exc:
            raise EvaluatorError(f"evaluator.params of harbor: {exc}") from exc

    async def collect(self, runtime: Runtime) -> dict[str, Any]:
        """Steps 1-4 of the module docstring: the ``check`` artifact.

        Returns:
            ``{"exit_code", "timed_out", "stdout" (test.sh's output), "stderr",
            "reward_json", "reward_txt" (each the file's text or None)}``.

        Raises:
            EvaluatorError: ``tests_dir`` holds no test.sh, or ``evaluator.runtime`` is
                ``fresh`` (a runtime without the agent's changes).
            PolicyError: ``tests_dir`` is outside the sandbox policy's ``upload_sources``.
            ConfigError: the session's runtime is not a container runtime.
        """
        params = self.params()
        if self.spec.runtime == "fresh":
            raise EvaluatorError(
                "evaluator.runtime='fresh' is not for the harbor evaluator: it makes its own "
                "fresh container from the agent's final file system; use 'session'"
            )
        tests = Path(params.tests_dir)
        if not (tests / "test.sh").is_file():
            raise EvaluatorError(f"evaluator.params.tests_dir {tests} holds no test.sh")
        check_source(runtime, tests, "evaluator.params.tests_dir")
        disk_mb = await disk_used_bytes(runtime) / 2**20 if params.storage_mb else None
        async with FreshRuntime(runtime, network=params.network, env=params.env) as verifier:
            await copy_tree_in(verifier, tests, TESTS_INSIDE)
            made = await verifier.exec(
                ["/bin/sh", "-c", f"rm -rf {VERIFIER_INSIDE} && mkdir -p {VERIFIER_INSIDE}"],
                cwd="/",
            )
            if made.exit_code != 0:
                raise EvaluatorError(f"cannot make {VERIFIER_INSIDE}: {made.stderr[-300:]}")
            result = await verifier.exec(
                [
                    "bash",
                    "-c",
                    f"chmod +x {TESTS_INSIDE}/test.sh && {TESTS_INSIDE}/test.sh "
                    f"> {TEST_STDOUT} 2>&1",
                ],
                env=params.env,
                timeout_s=params.timeout_s,
                cwd=runtime.workdir,
            )
            # nothing test.sh (or what it ran) left behind may write a reward from now on
            await verifier.cancel()
            reward_json = await read_inside(verifier, REWARD_JSON)
            reward_txt = await read_inside(verifier, REWARD_TXT)
            output = await read_inside(verifier, TEST_STDOUT) or ""
        return {
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "stdout": output[-MAX_TEST_OUTPUT:],
            "stderr": result.stderr[-MAX_TEST_OUTPUT:],
            "reward_json": reward_json,
            "reward_txt": reward_txt,
            "disk_used_mb": disk_mb,
        }

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationOutcome:
        """The reward test.sh wrote (see the module docstring).

        Raises:
            EvaluatorError: a reward file that is not numbers, or no ``reward_key`` among
                several rewards.
        """
        params = self.params()
        check: Any = ctx.artifacts.get(CHECK_ARTIFACT)
        if not isinstance(check, dict) or "reward_txt" not in check:
            return EvaluationOutcome(
                reward=0.0, details={"reason": "the verifier did not run", "status": ctx.status}
            )
        rewards = parse_rewards(check.get("reward_json"), check.get("reward_txt"))
        details: dict[str, Any] = {
            "test_exit_code": check.get("exit_code"),
            "timed_out": bool(check.get("timed_out")),
            "rewards": rewards,
        }
        disk_mb = check.get("disk_used_mb")
        if params.storage_mb and disk_mb is not None and disk_mb > params.storage_mb:
            return EvaluationOutcome(
                reward=0.0,
                details={
                    **details,
                    "reason": f"the agent wrote {disk_mb:.0f} MiB, over storage_mb = "
                    f"{params.storage_mb}",
                },
            )
        if rewards is None:
            return EvaluationOutcome(
                reward=0.0, details={**details, "reason": "test.sh wrote no reward file"}
            )
        if params.reward_key in rewards:
            reward = rewards[params.reward_key]
        elif len(rewards) == 1:
            reward = next(iter(rewards.values()))
        else:
            raise EvaluatorError(
                f"reward.json has no {params.reward_key!r} among {sorted(rewards)}: set "
                "evaluator.params.reward_key"
            )
        return EvaluationOutcome(reward=reward, details=details)
