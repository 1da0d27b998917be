"""The evaluator registry and the built-in evaluators."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rolloutd.errors import EvaluatorError
from rolloutd.evaluators import EvaluationOutcome, get_evaluator
from rolloutd.evaluators.builtins import SessionCompleted, TestOnOutput
from rolloutd.types import EvaluatorSpec, SessionStatus
from tests.support.contexts import evaluation_context


def _check(exit_code: int = 0, stdout: str = "", timed_out: bool = False) -> dict[str, object]:
    return {
        "check": {"exit_code": exit_code, "stdout": stdout, "stderr": "", "timed_out": timed_out}
    }


@pytest.mark.parametrize(
    ("status", "exit_code", "reward"),
    [
        (SessionStatus.COMPLETED, 0, 1.0),
        (SessionStatus.COMPLETED, 1, 0.0),
        (SessionStatus.COMPLETED, None, 0.0),
        (SessionStatus.TIMEOUT, 0, 0.0),
        (SessionStatus.FAILED, 0, 0.0),
        (SessionStatus.CANCELLED, None, 0.0),
    ],
)
async def test_session_completed(status, exit_code, reward):
    spec = EvaluatorSpec()
    evaluator = get_evaluator(spec)
    assert isinstance(evaluator, SessionCompleted)
    outcome = await evaluator.evaluate(
        evaluation_context(spec, status=status, harness_exit_code=exit_code)
    )
    assert outcome.reward == reward
    assert outcome.details["status"] == status.value


@pytest.mark.parametrize(
    ("expected", "artifacts", "reward"),
    [
        (None, _check(0), 1.0),
        (None, _check(1), 0.0),
        (None, _check(0, timed_out=True), 0.0),
        ("42", _check(0, "answer: 42\n"), 1.0),
        ("  42\n", _check(0, "answer: 42\n"), 1.0),  # expected_output is stripped
        ("42", _check(0, "answer: 41\n"), 0.0),
        ("42", _check(3, "answer: 42\n"), 0.0),
    ],
)
async def test_test_on_output(expected, artifacts, reward):
    spec = EvaluatorSpec(type="test_on_output", command="pytest -q", expected_output=expected)
    evaluator = get_evaluator(spec)
    assert isinstance(evaluator, TestOnOutput)
    outcome = await evaluator.evaluate(evaluation_context(spec, artifacts=artifacts))
    assert outcome.reward == reward
    assert ("reason" in outcome.details) == (reward == 0.0)


async def test_test_on_output_without_check_artifact_scores_zero_with_reason():
    spec = EvaluatorSpec(type="test_on_output", command="pytest -q")
    outcome = await get_evaluator(spec).evaluate(
        evaluation_context(spec, status=SessionStatus.TIMEOUT, harness_exit_code=None, artifacts={})
    )
    assert outcome.reward == 0.0
    assert outcome.details["reason"] == "no check artifact"


async def test_import_path_to_a_builtin_class():
    spec = EvaluatorSpec(type="rolloutd.evaluators.builtins:SessionCompleted")
    outcome = await get_evaluator(spec).evaluate(evaluation_context(spec))
    assert outcome.reward == 1.0


async def test_import_path_to_a_factory_returning_per_trace_rewards(tmp_path: Path, monkeypatch):
    (tmp_path / "my_rolloutd_eval.py").write_text(
        "from rolloutd.evaluators import EvaluationOutcome\n"
        "class PerTrace:\n"
        "    def __init__(self, spec):\n"
        "        self.scale = spec.params['scale']\n"
        "    async def evaluate(self, ctx):\n"
        "        return EvaluationOutcome(trace_rewards=[self.scale] * ctx.num_traces)\n"
        "def make(spec):\n"
        "    return PerTrace(spec)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        spec = EvaluatorSpec(type="my_rolloutd_eval:make", params={"scale": 0.5})
        outcome = await get_evaluator(spec).evaluate(evaluation_context(spec, num_traces=3))
        assert outcome.trace_rewards == [0.5, 0.5, 0.5]
        assert outcome.reward is None
    finally:
        sys.modules.pop("my_rolloutd_eval", None)


@pytest.mark.parametrize(
    "name",
    [
        "no_such_evaluator",
        "no_such_module_xyz:Eval",
        "rolloutd.evaluators:NoSuchAttr",
        "json:dumps.__name__",
    ],
)
def test_unknown_evaluators_raise(name):
    with pytest.raises(EvaluatorError):
        get_evaluator(EvaluatorSpec(type=name))


def test_outcome_needs_a_reward():
    with pytest.raises(ValueError):
        EvaluationOutcome()


async def test_session_completed_scores_zero_when_the_harness_hid_an_error_behind_exit_0():
    spec = EvaluatorSpec(type="session_completed")
    hidden = {
        "harness": {
            "exit_code": 0,
            "summary": {"is_error": True, "api_error": "[API Error: 400 ...]"},
        }
    }
    clean = {"harness": {"exit_code": 0, "summary": {"is_error": False}}}
    bad = await get_evaluator(spec).evaluate(
        evaluation_context(spec, harness_exit_code=0, artifacts=hidden)
    )
    good = await get_evaluator(spec).evaluate(
        evaluation_context(spec, harness_exit_code=0, artifacts=clean)
    )
    assert (bad.reward, bad.details["harness_error"]) == (0.0, True)
    assert good.reward == 1.0
