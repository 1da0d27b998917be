"""The ``math_answer`` evaluator: the model's final answer against the gold one, by math-verify.

Hugging Face's ``math-verify`` (``math_verify.parse`` / ``math_verify.verify``) extracts the
answer of a text (the last ``\\boxed{...}``, else the last LaTeX or plain expression) and
compares it with the gold answer symbolically: ``\\frac{1}{2}``, ``0.5`` and ``1/2`` are one
answer, and so are equivalent sets, intervals and equations. It enforces its time limits with
SIGALRM, which only works in a process's main thread, so it runs here in a child interpreter
(a Python subprocess per answer), never in the worker's event loop thread.

- in the runtime (:meth:`MathAnswer.collect`, sandbox fleet, after the harness): read the
  answer the harness left in ``params.answer_file`` (a path in the workspace);
- on the eval fleet (:meth:`MathAnswer.evaluate`): reward 1.0 when math-verify finds the
  answer equivalent to ``params.answer``, else 0.0 (no answer, nothing parsable, a wrong one,
  or a check that ran past ``EvaluatorSpec.timeout_s``).

``EvaluatorSpec.params``::

    {"answer": str (the gold answer, LaTeX or plain), "answer_file": "answer.txt"}
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rolloutd.errors import ArtifactTooLargeError, EvaluatorError, NotFoundError
from rolloutd.evaluators.base import (
    CHECK_ARTIFACT,
    EvaluationContext,
    EvaluationOutcome,
    Evaluator,
)
from rolloutd.final_state import FinalStateParts
from rolloutd.sandbox.runtimes.base import Runtime

#: address space of the child, bytes: the answer is the policy's text, and sympy evaluates what
#: it parses (``\boxed{10^{10^{10}}}``): past this the child fails, never the eval host.
CHILD_ADDRESS_SPACE_BYTES = 4 * 2**30

#: the child's program: JSON ``{"gold", "answer"}`` on stdin, JSON verdict on stdout.
VERIFY_PROGRAM = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
from math_verify import parse, verify
req = json.load(sys.stdin)
gold = req["gold"]
if "$" not in gold and "\\boxed" not in gold:
    gold = "$" + gold + "$"
parsed_gold = parse(gold)
parsed_answer = parse(req["answer"])
ok = bool(parsed_gold) and bool(parsed_answer) and bool(verify(parsed_gold, parsed_answer))
json.dump({"verified": ok, "gold": [str(x) for x in parsed_gold],
           "parsed": [str(x) for x in parsed_answer]}, sys.stdout)
""".replace("ADDRESS_SPACE", str(CHILD_ADDRESS_SPACE_BYTES))
#: bytes of the answer file read; a larger file is no answer (a harness that dumped a log there).
MAX_ANSWER_BYTES = 64 * 1024


class MathAnswerParams(BaseModel):
    """``EvaluatorSpec.params`` of the math_answer evaluator (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    answer: str = Field(min_length=1, description="the gold answer, LaTeX or plain")
    answer_file: str = Field(
        default="answer.txt", description="workspace file holding the model's answer"
    )


async def verify_answer(gold: str, answer: str, *, timeout_s: float = 30.0) -> dict[str, Any]:
    """math-verify's verdict on ``answer`` against ``gold``, computed in a child interpreter.

    Args:
        gold: the gold answer; wrapped in ``$...$`` unless it has ``$`` or ``\\boxed``.
        answer: the model's text.
        timeout_s: the child is killed after this many seconds.

    Returns:
        ``{"verified": bool, "gold": [str], "parsed": [str]}``, or ``{"verified": False,
        "error": str}`` when the child timed out or failed.
    """
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        VERIFY_PROGRAM,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    request = json.dumps({"gold": gold, "answer": answer}).encode()
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(request), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return {"verified": False, "error": f"math-verify ran past {timeout_s} s"}
    if proc.returncode != 0:
        lines = stderr.decode(errors="replace").strip().splitlines()
        return {
            "verified": False,
            "error": lines[-1] if lines else f"math-verify exited {proc.returncode}",
        }
    return json.loads(stdout)


class MathAnswer(Evaluator):
    """1.0 when math-verify finds the model's answer equivalent to the gold one, else 0.0."""

    name = "math_answer"
    #: 2: an answer file over MAX_ANSWER_BYTES is no answer (it was cut); math-verify's child
    #: is bounded in memory
    revision = 2

    def params(self) -> MathAnswerParams:
        """The validated params.

        Raises:
            EvaluatorError: malformed ``params``.
        """
        try:
            return MathAnswerParams.model_validate(self.spec.params)
        except ValidationError as exc:
            raise EvaluatorError(f"evaluator.params of math_answer: {exc}") from exc

    def final_state(self) -> FinalStateParts:
        """Its answer file is all a re-score needs (``params.answer_file``)."""
        return FinalStateParts(kind="files", files=[self.params().answer_file])

    async def collect(self, runtime: Runtime) -> dict[str, Any]:
        """Read the answer file of ``runtime``: the ``check`` artifact ``{"answer": str|None}``
        (None, with ``error``, for a file over :data:`MAX_ANSWER_BYTES`)."""
        params = self.params()
        try:
            data = await runtime.download(params.answer_file, max_bytes=MAX_ANSWER_BYTES)
        except NotFoundError:
            return {"answer": None}
        except ArtifactTooLargeError:
            return {"answer": None, "error": f"answer file over {MAX_ANSWER_BYTES} bytes"}
        return {"answer": data.decode("utf-8", "replace")}

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationOutcome:
        """Score the answer with math-verify (in a subprocess)."""
        params = self.params()
        check: Any = ctx.artifacts.get(CHECK_ARTIFACT)
        answer = check.get("answer") if isinstance(check, dict) else None
        if not answer or not str(answer).strip():
            error = check.get("error") if isinstance(check, dict) else None
            return EvaluationOutcome(
                reward=0.0, details={"reason": error or "no answer", "status": ctx.status.value}
            )
        verdict = await verify_answer(params.answer, str(answer), timeout_s=self.spec.timeout_s)
        if not verdict.get("verified"):
            verdict["reason"] = verdict.get("error") or (
                "no answer parsed" if not verdict.get("parsed") else "wrong answer"
            )
        return EvaluationOutcome(reward=1.0 if verdict["verified"] else 0.0, details=verdict)
