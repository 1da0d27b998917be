"""Built-in evaluators: ``session_completed`` and ``test_on_output``."""

from __future__ import annotations

from typing import Any

from rolloutd.evaluators.base import (
    CHECK_ARTIFACT,
    EvaluationContext,
    EvaluationOutcome,
    Evaluator,
)
from rolloutd.types import SessionStatus


class SessionCompleted(Evaluator):
    """1.0 when the session completed, the harness exited 0 and its own output reports no
    error (the ``harness`` artifact's ``summary.is_error``, where the adapter reads one:
    Qwen Code exits 0 even when every model call failed), else 0.0."""

    name = "session_completed"

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationOutcome:
        """Score on status, exit code and the harness's own error report."""
        harness: Any = ctx.artifacts.get("harness") or {}
        summary = harness.get("summary") if isinstance(harness, dict) else None
        harness_error = bool(summary.get("is_error")) if isinstance(summary, dict) else False
        ok = (
            ctx.status == SessionStatus.COMPLETED
            and ctx.harness_exit_code == 0
            and not harness_error
        )
        return EvaluationOutcome(
            reward=1.0 if ok else 0.0,
            details={
                "status": ctx.status.value,
                "harness_exit_code": ctx.harness_exit_code,
                "harness_error": harness_error,
            },
        )


class TestOnOutput(Evaluator):
    """1.0 when the check command exited 0 and, if ``spec.expected_output`` is set, its
    stripped text occurs in the check's stdout; else 0.0.

    What it trusts: the check command's exit code and stdout, as they come out of the runtime
    it ran in (:func:`rolloutd.evaluators.run_check`). In the session's runtime (the
    default) that is the agent's workdir and HOME as it left them: a file there that the
    command loads (a ``conftest.py`` under ``pytest``, a module a script imports) decides as
    much as the answer does. Python's user site-packages and a repository's git hooks are off
    for the check (``CHECK_ENV``); the command's programs are the runtime's (read-only on
    bwrap, the agent's own in a container it ran in). ``evaluator.runtime = "fresh"`` checks
    only the session's ``git diff``, in a runtime the agent never ran in.

    Without a ``check`` artifact (the session ended before the check ran, or the spec has no
    command) the reward is 0.0 and ``details["reason"]`` says why.
    """

    name = "test_on_output"
    #: 2: the check runs without Python's user site-packages and a repository's git hooks
    revision = 2
    __test__ = False  # not a pytest class despite its name

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationOutcome:
        """Score the ``check`` artifact."""
        check: Any = ctx.artifacts.get(CHECK_ARTIFACT)
        if not isinstance(check, dict) or "exit_code" not in check:
            return EvaluationOutcome(
                reward=0.0,
                details={
                    "reason": "no check artifact",
                    "status": ctx.status.value,
                },
            )
        details: dict[str, Any] = {
            "exit_code": check["exit_code"],
            "timed_out": bool(check.get("timed_out", False)),
        }
        passed = check["exit_code"] == 0 and not details["timed_out"]
        expected = (self.spec.expected_output or "").strip()
        if expected:
            found = expected in str(check.get("stdout") or "")
            details["expected_output_found"] = found
            passed = passed and found
        if not passed:
            details["reason"] = (
                "check timed out"
                if details["timed_out"]
                else f"check exited {check['exit_code']}"
                if check["exit_code"] != 0
                else "expected output not found"
            )
        return EvaluationOutcome(reward=1.0 if passed else 0.0, details=details)
