"""The ``harbor`` evaluator: a Harbor task's ``tests/test.sh``, run where the agent cannot reach,
with tools the agent never touched.

Harbor's verifier (harbor/verifier/verifier.py) copies the task's ``tests/`` to ``/tests`` after
the agent ran, runs ``test.sh`` with ``[verifier] env``, and reads ``/logs/verifier/reward.json``
(a JSON object of numbers; preferred) or ``reward.txt`` (one number). Here, in the runtime's step
(:meth:`HarborVerifier.collect`, on the session's sandbox host after the harness ended):

1. a fresh container starts from the task's image (:class:`rolloutd.sandbox.snapshot.
   FreshRuntime`), with the verifier's network (``none`` unless the task asks for ``public``)
   and nothing of the agent's running. It gets the agent's workdir and, by default, nothing
   else of what the agent changed: the programs, libraries, interpreter and shell start-up
   files ``test.sh`` runs with are the image's. The changes the agent made outside its workdir
   that a verifier must not trust are listed in the tamper report's ``ignored``; a task set
   with ``carry_system_changes`` carries them, and then each such change is a finding;
2. the workdir is compared with the image's: a runner configuration the task did not ship
   (``conftest.py``, pytest's configuration, ``sitecustomize.py``, a ``.pth``, a module named
   like the runner), a git hook or a git setting that runs a program is a finding
   (:mod:`rolloutd.sandbox.tamper`). With a finding, ``test.sh`` does not run: the session
   scores 0.0 with the finding named (the policy's doing, ``failure`` stays None);
3. the task's ``tests/`` (from the host, where the agent never saw it; ``tests_dir`` must lie
   below one of the sandbox policy's ``upload_sources``, as a prepare step's upload must) and
   an empty ``/logs/verifier`` are copied in by the container CLI from the host
   (:func:`rolloutd.sandbox.transfer.copy_in`), never by a program inside;
4. ``test.sh`` runs from the workdir with the image's own ``/bin/bash``, the task's
   ``[verifier] env`` and :data:`GUARD_ENV`: ``PYTHONSAFEPATH=1`` (Python does not put the
   working folder first on ``sys.path``: a ``pytest.py`` there cannot stand in for pytest under
   ``python3 -m pytest``), ``PYTHONNOUSERSITE=1``, and git's hooks and ``core.fsmonitor`` off
   through ``GIT_CONFIG_COUNT``/``KEY``/``VALUE`` (git-config(1), "ENVIRONMENT": they win over
   every configuration file). Its output comes to the worker through pipes; then every process
   left in the container is killed, so none writes a reward after the script;
5. the reward files are read by the container CLI from the host
   (:func:`rolloutd.sandbox.transfer.read_file`), and the container is removed.

What the verifier still trusts: the task's image, its ``tests/`` and ``test.sh``, and, like
Harbor, whatever ``test.sh`` runs of the agent's workdir: a test that imports the agent's code
runs it in the test's process, where it can end the process or patch the test runner. Such a
task's verdict is only as strong as its test's isolation.

On the eval fleet (:meth:`HarborVerifier.evaluate`) the rewards are parsed as Harbor parses
them: ``reward.json`` wins, ``reward.txt`` is ``{"reward": value}``; the session's reward is the
``reward`` key (or the only key). No reward file: reward 0.0 (the test script did not get to
write one: the environment the agent left did not let it). A reward file that is not numbers:
an evaluator error (the task's fault, never the policy's).

``[environment] storage_mb`` is checked here, when the run has ended: the disk the agent's
container wrote (its writable layer and workspace) over the limit is reward 0.0. (podman cannot
cap a container's disk while it runs on an ext4-backed overlay: ``--storage-opt size`` needs
XFS project quotas.) The pack of carried system changes is bounded too
(:data:`rolloutd.sandbox.snapshot.MAX_PACK_BYTES`, or ``max_pack_mb``): a session whose changes
pack to more, after at least one model call, scores 0.0 with the bound named (the policy wrote
them); one that made no model call gets no reward (an evaluator error naming the bound, never
retried), as a limit hit before any answered call is not the policy's to be scored on.

``EvaluatorSpec.params`` (written by :func:`rolloutd.tasksets.harbor.evaluator_spec`)::

    {"tests_dir": host folder holding test.sh, "env": {name: value}, "network": "none" |
     "host", "timeout_s": test.sh's budget, "reward_key": "reward", "storage_mb": int,
     "carry_system_changes": bool, "max_pack_mb": int}
"""

from __future__ import annotations

import json
import math
import tempfile
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
from rolloutd.sandbox.snapshot import MAX_PACK_BYTES, FreshRuntime, disk_used_bytes
from rolloutd.sandbox.transfer import check_source, copy_in, read_file, write_pack
from rolloutd.types import TamperReport

#: Harbor's paths inside (harbor/models/trial/paths.py ``EnvironmentPaths``)
TESTS_INSIDE = "/tests"
VERIFIER_INSIDE = "/logs/verifier"
REWARD_TXT = f"{VERIFIER_INSIDE}/reward.txt"
REWARD_JSON = f"{VERIFIER_INSIDE}/reward.json"
#: the image's own shell, which runs test.sh (Harbor runs ``bash /tests/test.sh``)
SHELL = "/bin/bash"
#: bytes of test output kept in the check artifact (head and tail halves)
MAX_TEST_OUTPUT = 64 * 1024
#: git settings every test.sh runs with: no hook, no file-system monitor (git-config(1))
GIT_GUARD = (("core.hooksPath", "/dev/null"), ("core.fsmonitor", "false"))
#: the environment test.sh runs with on top of the task's (see the module docstring)
GUARD_ENV = {"PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1"}


def guard_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with :data:`GUARD_ENV` and :data:`GIT_GUARD` on top: git's ``GIT_CONFIG_*``
    settings appended after any the task set (the last of a key wins), never replacing them.

    Raises:
        EvaluatorError: the task's ``GIT_CONFIG_COUNT`` is not a number.
    """
    try:
        count = int(env.get("GIT_CONFIG_COUNT", "0") or "0")
    except ValueError:
        raise EvaluatorError(
            f"[verifier] env GIT_CONFIG_COUNT={env['GIT_CONFIG_COUNT']!r} is not a number"
        ) from None
    guarded = {**env, **GUARD_ENV}
    for n, (key, value) in enumerate(GIT_GUARD, start=count):
        guarded[f"GIT_CONFIG_KEY_{n}"] = key
        guarded[f"GIT_CONFIG_VALUE_{n}"] = value
    guarded["GIT_CONFIG_COUNT"] = str(count + len(GIT_GUARD))
    return guarded


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
    carry_system_changes: bool = Field(
        default=False,
        description="the verifier sees the agent's changes outside its workdir too (each "
        "changed program, library, interpreter path, shell profile or git configuration "
        "among them is a finding)",
    )
    max_pack_mb: int = Field(
        default=MAX_PACK_BYTES >> 20,
        ge=1,
        le=MAX_PACK_BYTES >> 20,
        description="bound of the carried changes' pack, MiB",
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
    """Harbor's verifier in a fresh container of the task's image; see the module."""

    name = "harbor"
    #: 2: the verifier sees the image plus the agent's workdir, files go in and out host-side,
    #: test.sh runs guarded, and a tamper report scores the session
    revision = 2

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
        """Steps 1-5 of the module docstring: the ``check`` artifact.

        Returns:
            ``{"ran" (whether test.sh ran), "exit_code", "timed_out", "stdout", "stderr"
            (test.sh's output), "reward_json", "reward_txt" (each the file's text or None),
            "reward_files" (what was found at each path), "tamper" (the report),
            "pack_too_large" (why the verifier did not run, or None), "disk_used_mb"}``.

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
                "fresh container from the task's image and the agent's workdir; use 'session'"
            )
        tests = Path(params.tests_dir)
        if not (tests / "test.sh").is_file():
            raise EvaluatorError(f"evaluator.params.tests_dir {tests} holds no test.sh")
        check_source(runtime, tests, "evaluator.params.tests_dir")
        disk_mb = await disk_used_bytes(runtime) / 2**20 if params.storage_mb else None
        env = guard_env(params.env)
        check: dict[str, Any] = {"ran": False, "disk_used_mb": disk_mb}
        fresh = FreshRuntime(
            runtime,
            network=params.network,
            env=params.env,
            carry_system_changes=params.carry_system_changes,
            max_pack_bytes=params.max_pack_mb << 20,
            verifier_env=env,
        )
        async with fresh as verifier:
            assert fresh.report is not None
            check |= {"tamper": fresh.report.model_dump(), "pack_too_large": fresh.pack_too_large}
            if fresh.report.tampered or fresh.pack_too_large:
                return check
            with tempfile.TemporaryDirectory(prefix="harbor-tests-") as staging:
                pack = Path(staging) / "in.tar"
                write_pack(pack, {TESTS_INSIDE: tests, VERIFIER_INSIDE: None})
                await copy_in(verifier, pack)
            result = await verifier.exec(
                [SHELL, f"{TESTS_INSIDE}/test.sh"],
                env=env,
                timeout_s=params.timeout_s,
                cwd=runtime.workdir,
                max_output_bytes=MAX_TEST_OUTPUT,
            )
            # nothing test.sh (or what it ran) left behind may write a reward from now on
            await verifier.cancel()
            found = {path: await read_file(verifier, path) for path in (REWARD_JSON, REWARD_TXT)}
        return check | {
            "ran": True,
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "reward_json": found[REWARD_JSON].text(),
            "reward_txt": found[REWARD_TXT].text(),
            "reward_files": {path: r.kind for path, r in found.items()},
        }

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationOutcome:
        """The reward test.sh wrote (see the module docstring); 0.0 with the tamper report's
        findings, or over a bound.

        Raises:
            EvaluatorError: a reward file that is not numbers, no ``reward_key`` among several
                rewards, or a pack over its bound in a session that made no model call.
        """
        params = self.params()
        check: Any = ctx.artifacts.get(CHECK_ARTIFACT)
        if not isinstance(check, dict) or "reward_txt" not in check and "tamper" not in check:
            return EvaluationOutcome(
                reward=0.0, details={"reason": "the verifier did not run", "status": ctx.status}
            )
        report = TamperReport.model_validate(check["tamper"]) if check.get("tamper") else None
        details: dict[str, Any] = {}
        disk_mb = check.get("disk_used_mb")
        if params.storage_mb and disk_mb is not None and disk_mb > params.storage_mb:
            reason = f"the agent wrote {disk_mb:.0f} MiB, over storage_mb = {params.storage_mb}"
            return EvaluationOutcome(reward=0.0, details={"reason": reason}, tamper=report)
        if too_large := check.get("pack_too_large"):
            if ctx.num_completions == 0:
                raise EvaluatorError(f"{too_large}, before any model call")
            return EvaluationOutcome(reward=0.0, details={"reason": too_large}, tamper=report)
        if report is not None and report.tampered:
            # scored 0.0 by the tamper report (the evaluation record names the finding)
            return EvaluationOutcome(
                reward=0.0, details={"reason": "test.sh did not run"}, tamper=report
            )
        rewards = parse_rewards(check.get("reward_json"), check.get("reward_txt"))
        details = {
            "test_exit_code": check.get("exit_code"),
            "timed_out": bool(check.get("timed_out")),
            "rewards": rewards,
        }
        not_carried = _not_carried(report)
        if rewards is None:
            files = check.get("reward_files") or {}
            odd = [f"{p} is {k.replace('_', ' ')}" for p, k in files.items() if k != "missing"]
            reason = "test.sh wrote no reward file" + (f" ({'; '.join(odd)})" if odd else "")
            return EvaluationOutcome(
                reward=0.0, details={**details, "reason": reason + not_carried}, tamper=report
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
        source = "reward.json" if check.get("reward_json") is not None else "reward.txt"
        reason = f"test.sh wrote reward {reward:g} ({source})" + not_carried
        return EvaluationOutcome(
            reward=reward, details={**details, "reason": reason}, tamper=report
        )


def _not_carried(report: TamperReport | None) -> str:
    """A clause naming the changes the verifier did not carry, for a reason ("" if none)."""
    if report is None or not report.ignored:
        return ""
    first = ", ".join(f"{f.path} ({f.category})" for f in report.ignored[:3])
    more = len(report.ignored) - 3
    return (
        f"; not carried to the verifier: {first}"
        + (f" and {more} more" if more > 0 else "")
        + (" (list truncated)" if report.truncated else "")
    )
