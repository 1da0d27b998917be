"""The ``swebench`` evaluator: SWE-bench's resolution rule on a repository in a runtime.

SWE-bench (Jimenez et al., ICLR 2024; harness ``swebench/harness/grading.py``) calls an instance
resolved when, after the model's patch and the instance's test patch are applied, every test of
``FAIL_TO_PASS`` and every test of ``PASS_TO_PASS`` passes. Here:

- in the runtime (:meth:`Swebench.collect`, run by the sandbox fleet after the session's patch
  was applied, in the session's runtime or a fresh one): apply ``params.test_patch`` with
  ``git apply``, run ``params.test_command`` on all listed tests at once, and parse the pytest
  ``-rA`` summary (``PASSED id`` / ``FAILED id`` / ``ERROR id`` lines) into a status per test;
- on the eval fleet (:meth:`Swebench.evaluate`): with the official ``swebench`` package
  installed (the ``swebench`` extra), the log is parsed by its parser ``params.log_parser``
  (``swebench.harness.log_parsers.PARSER_REGISTRY``) and graded by its
  ``get_eval_tests_report`` / ``get_resolution_status``: reward 1.0 when the FAIL_TO_PASS /
  PASS_TO_PASS report says ``RESOLVED_FULL``; without it, by the same rule here: every listed
  test has status ``PASSED`` (a test missing from the log counts as failed). Either way 0.0
  when the test patch did not apply or the tests timed out. ``details["grader"]`` says which.

With ``params.eval_script`` (SWE-bench, SWE-Gym and SWE-smith instances,
:mod:`rolloutd.tasksets.swebench`) the runtime runs that script instead (it resets the test
files to the instance's version, applies the test patch and runs the tests between SWE-bench's
log markers), and the package reads the whole log with its ``get_logs_eval`` before the report.

``EvaluatorSpec.params``::

    {"test_patch": str (a git diff, may be empty), "fail_to_pass": [test ids],
     "pass_to_pass": [test ids], "test_command": "python3 -m pytest -rA ..." (optional),
     "log_parser": "parse_log_pytest" (optional), "eval_script": str (optional),
     "eval_type": "pass_and_fail" | "fail_only" (optional), "instance_id": str (optional)}
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rolloutd.errors import EvaluatorError
from rolloutd.evaluators.base import (
    CHECK_ARTIFACT,
    EvaluationContext,
    EvaluationOutcome,
    Evaluator,
)
from rolloutd.sandbox.artifacts import GIT_ENV, apply_patch
from rolloutd.sandbox.runtimes.base import Runtime

#: pytest's ``-rA`` short test summary line: ``STATUS test-id[ - message]``.
PYTEST_SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+)", re.MULTILINE)
#: SWE-bench's log lines (``swebench.harness.constants``): a test patch that did not apply;
#: tests that ran out of time
APPLY_PATCH_FAIL = ">>>>> Patch Apply Failed"
TESTS_TIMEOUT = ">>>>> Tests Timed Out"
#: bytes of test output kept in the check artifact (head and tail).
MAX_LOG_BYTES = 256 * 1024


class SwebenchParams(BaseModel):
    """``EvaluatorSpec.params`` of the swebench evaluator (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    test_patch: str = Field(default="", description="git diff adding or changing the tests")
    fail_to_pass: list[str] = Field(default_factory=list, description="must pass after the fix")
    pass_to_pass: list[str] = Field(default_factory=list, description="must keep passing")
    test_command: str = Field(
        default="python3 -m pytest -rA -p no:cacheprovider",
        description="test runner; the test ids are appended, shell-quoted",
    )
    log_parser: str = Field(
        default="parse_log_pytest",
        description="the swebench package's log parser (PARSER_REGISTRY name) for the "
        "test runner's output",
    )
    eval_script: str | None = Field(
        default=None,
        description="a whole SWE-bench eval script (bash): it resets the test files, applies "
        "the test patch and runs the tests between SWE-bench's log markers; when set, "
        "test_patch and test_command are not used (rolloutd.tasksets.swebench.eval_script)",
    )
    eval_type: Literal["pass_and_fail", "fail_only"] = Field(
        default="pass_and_fail", description="the swebench package's EvalType of the instance"
    )
    instance_id: str = Field(default="", description="the instance's id, for the record")


def official_grade(log: str, params: SwebenchParams) -> dict[str, Any] | None:
    """The official ``swebench`` package's verdict on a test log, or None without it.

    Imported here, not at module load: the package (and docker, modal, datasets with it) is
    an optional extra and takes seconds to import; evaluators that never grade SWE-bench do
    not pay for it.

    Returns:
        ``{"resolved": bool, "status": "RESOLVED_FULL" | ..., "report": {FAIL_TO_PASS:
        {success, failure}, PASS_TO_PASS: {...}, ...}, "tests": {id: status}}``.

    Raises:
        EvaluatorError: ``params.log_parser`` is not one of the package's parsers.
    """
    if importlib.util.find_spec("swebench") is None:
        return None
    from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS, EvalType, ResolvedStatus
    from swebench.harness.grading import get_eval_tests_report, get_resolution_status
    from swebench.harness.log_parsers import PARSER_REGISTRY

    parser = PARSER_REGISTRY.get(params.log_parser)
    if parser is None:
        raise EvaluatorError(
            f"evaluator.params.log_parser={params.log_parser!r} is not a "
            "parser of the swebench package (PARSER_REGISTRY)"
        )
    # the pytest-style parsers read the log alone; test_spec only matters to a few
    # repository-specific ones
    if params.eval_script is not None:
        tests, ok = logs_eval(log, params)
        if not ok:
            return {"resolved": False, "status": "LOG_INVALID", "report": None, "tests": {}}
    else:
        tests = parser(log, None)
    report = get_eval_tests_report(
        tests,
        {FAIL_TO_PASS: params.fail_to_pass, PASS_TO_PASS: params.pass_to_pass},
        eval_type=EvalType(params.eval_type),
    )
    status = get_resolution_status(report)
    return {
        "resolved": status == ResolvedStatus.FULL.value,
        "status": status,
        "report": report,
        "tests": tests,
    }


def logs_eval(log: str, params: SwebenchParams) -> tuple[dict[str, str], bool]:
    """The ``swebench`` package's own reading of an eval script's log
    (``swebench.harness.grading.get_logs_eval``): the status of each test between the
    markers, and False when the log shows a patch that did not apply, a failed reset, a
    timeout, no markers, or an exit code the statuses contradict.

    Returns:
        ``(test id -> status, valid)``.
    """
    import tempfile

    from swebench.harness.grading import get_logs_eval
    from swebench.types import TestSpec

    spec = TestSpec(
        instance_id=params.instance_id or "rolloutd",
        image="",
        eval_script_list=[],
        repo="",
        version="",
        FAIL_TO_PASS=params.fail_to_pass,
        PASS_TO_PASS=params.pass_to_pass,
        log_parser=params.log_parser,
        eval_type=params.eval_type,
    )
    with tempfile.NamedTemporaryFile("w", suffix=".log", encoding="utf-8") as f:
        f.write(log)
        f.flush()
        return get_logs_eval(spec, f.name)


def parse_pytest_log(log: str) -> dict[str, str]:
    """Test id -> status from pytest ``-rA`` output (the last status of an id wins).

    Args:
        log: pytest's stdout.
    """
    return {test_id: status for status, test_id in PYTEST_SUMMARY.findall(log)}


class Swebench(Evaluator):
    """Resolved (1.0) when every FAIL_TO_PASS and PASS_TO_PASS test passes; see the module."""

    name = "swebench"

    def params(self) -> SwebenchParams:
        """The validated params.

        Raises:
            EvaluatorError: malformed ``params`` or no test listed at all.
        """
        try:
            params = SwebenchParams.model_validate(self.spec.params)
        except ValidationError as exc:
            raise EvaluatorError(f"evaluator.params of swebench: {exc}") from exc
        if not params.fail_to_pass and not params.pass_to_pass:
            raise EvaluatorError(
                "evaluator.params of swebench needs fail_to_pass or pass_to_pass tests"
            )
        return params

    async def collect(self, runtime: Runtime) -> dict[str, Any]:
        """Apply the test patch and run the tests in ``runtime``: the ``check`` artifact.

        Returns:
            ``{"exit_code", "stdout", "stderr", "timed_out", "test_patch_applied",
            "tests": {id: status}}``.
        """
        params = self.params()
        if params.eval_script is not None:
            return await self._run_eval_script(runtime, params)
        applied = await apply_patch(runtime, params.test_patch)
        if applied.exit_code != 0:
            return {
                "exit_code": applied.exit_code,
                "stdout": applied.stdout,
                "stderr": applied.stderr,
                "timed_out": applied.timed_out,
                "test_patch_applied": False,
                "tests": {},
            }
        test_ids = list(dict.fromkeys(params.fail_to_pass + params.pass_to_pass))
        command = f"{params.test_command} {shlex.join(test_ids)}"
        result = await runtime.exec(
            command, timeout_s=self.spec.timeout_s, max_output_bytes=MAX_LOG_BYTES
        )
        return {
            "exit_code": result.exit_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "timed_out": result.timed_out,
            "test_patch_applied": True,
            "tests": parse_pytest_log(result.stdout),
        }

    async def _run_eval_script(self, runtime: Runtime, params: SwebenchParams) -> dict[str, Any]:
        """Run ``params.eval_script`` (bash, from standard input) in the repository; the
        log is stdout and stderr together, as SWE-bench's harness keeps it."""
        assert params.eval_script is not None
        result = await runtime.exec(
            ["bash", "-c", 'exec bash -s "$@" 2>&1', "eval"],
            stdin=params.eval_script.encode(),
            env=GIT_ENV,
            timeout_s=self.spec.timeout_s,
            max_output_bytes=MAX_LOG_BYTES,
        )
        log = result.stdout + (f"\n{TESTS_TIMEOUT}" if result.timed_out else "")
        return {
            "exit_code": result.exit_code,
            "stdout": log,
            "stderr": result.stderr,
            "timed_out": result.timed_out,
            "test_patch_applied": APPLY_PATCH_FAIL not in log,
            "tests": parse_pytest_log(log),
        }

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationOutcome:
        """Score the ``check`` artifact with SWE-bench's rule."""
        params = self.params()
        check: Any = ctx.artifacts.get(CHECK_ARTIFACT)
        if not isinstance(check, dict) or "tests" not in check:
            return EvaluationOutcome(
                reward=0.0, details={"reason": "no test results", "status": ctx.status.value}
            )
        applied = bool(check.get("test_patch_applied"))
        timed_out = bool(check.get("timed_out"))
        official = official_grade(str(check.get("stdout") or ""), params) if applied else None
        if official is not None:
            report = official["report"] or {
                "FAIL_TO_PASS": {"failure": params.fail_to_pass},
                "PASS_TO_PASS": {"failure": params.pass_to_pass},
            }
            failed_f2p = report["FAIL_TO_PASS"]["failure"]
            failed_p2p = report["PASS_TO_PASS"]["failure"]
            resolved = official["resolved"] and not timed_out
        else:
            tests: dict[str, str] = check["tests"]
            failed_f2p = [t for t in params.fail_to_pass if tests.get(t) != "PASSED"]
            failed_p2p = [t for t in params.pass_to_pass if tests.get(t) != "PASSED"]
            resolved = applied and not failed_f2p and not failed_p2p and not timed_out
        return EvaluationOutcome(
            reward=1.0 if resolved else 0.0,
            details={
                "resolved": resolved,
                "grader": "rolloutd" if official is None else "swebench",
                "resolution_status": None if official is None else official["status"],
                "test_patch_applied": applied,
                "num_fail_to_pass": len(params.fail_to_pass),
                "num_pass_to_pass": len(params.pass_to_pass),
                "failed_fail_to_pass": failed_f2p,
                "failed_pass_to_pass": failed_p2p,
                "timed_out": timed_out,
            },
        )
