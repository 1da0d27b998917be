"""Evaluation records: what the eval activity stores beside a reward, and the tamper rule (a
verdict-affecting finding scores 0.0 with the cause named, never "no reward")."""

from __future__ import annotations

from typing import ClassVar

import pytest
from temporalio.testing import ActivityEnvironment

import rolloutd
from rolloutd.activities.evaluation import EvalActivities
from rolloutd.activities.models import EvaluateInput
from rolloutd.evaluators import (
    EvaluationContext,
    EvaluationOutcome,
    Evaluator,
    evaluator_version,
    get_evaluator,
    register_evaluators,
)
from rolloutd.evaluators.builtins import SessionCompleted
from rolloutd.store import BlobStore
from rolloutd.types import (
    EvaluatorSpec,
    SessionStatus,
    TamperFinding,
    TamperReport,
    Trace,
    Trajectory,
)


class _Tampered(Evaluator):
    """Reports 1.0 and a verdict-affecting tamper (a shadowing ``python3``)."""

    name = "tests_tampered"
    version: ClassVar[str] = "7"

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationOutcome:
        return EvaluationOutcome(
            reward=1.0,
            details={"reason": "tests passed"},
            tamper=TamperReport(
                findings=[
                    TamperFinding(
                        path="/usr/local/bin/python3", category="executable", change="added"
                    )
                ],
                num_changed_paths=3,
            ),
        )


class _Listed(_Tampered):
    """Reports 1.0 and only changes the verifier did not carry (listed, not scored)."""

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationOutcome:
        outcome = await super().evaluate(ctx)
        assert outcome.tamper is not None
        tamper = TamperReport(ignored=outcome.tamper.findings, num_changed_paths=1)
        return outcome.model_copy(update={"tamper": tamper})


def _store_trajectory(store: BlobStore, key: str) -> None:
    trace = Trace(prompt_ids=[1, 2], response_ids=[3], loss_mask=[1], response_logprobs=[-0.5])
    store.put_json(key, Trajectory(session_id="s-0", task_id="t", traces=[trace]))


async def _evaluate(tmp_path, spec: EvaluatorSpec, forced: float | None = None):
    store = BlobStore(str(tmp_path / "store"))
    _store_trajectory(store, "sessions/s-0/trajectory.json")
    output = await ActivityEnvironment().run(
        EvalActivities(store).evaluate,
        EvaluateInput(
            session_id="s-0",
            task_id="t",
            evaluator=spec,
            status=SessionStatus.COMPLETED,
            harness_exit_code=0,
            num_completions=1,
            trajectory_ref="sessions/s-0/trajectory.json",
            forced_reward=forced,
        ),
    )
    return output, store.get_model("sessions/s-0/trajectory.json", Trajectory)


@pytest.fixture
def registered():
    register_evaluators(
        {
            "tests_tampered": f"{__name__}:_Tampered",
            "tests_listed": f"{__name__}:_Listed",
        }
    )


async def test_honest_outcome_is_recorded_with_the_builtin_version(tmp_path):
    output, trajectory = await _evaluate(tmp_path, EvaluatorSpec())
    assert output.reward == 1.0
    record = output.evaluation
    assert record is not None
    assert record.evaluator == "session_completed"
    assert record.version == f"{rolloutd.__version__}+r{SessionCompleted.revision}"
    assert record.reward == 1.0 and record.tamper is None and not record.forced
    assert trajectory.evaluation == record and trajectory.reward == 1.0


async def test_a_tamper_scores_zero_with_the_cause_named(tmp_path, registered):
    output, trajectory = await _evaluate(tmp_path, EvaluatorSpec(type="tests_tampered"))
    assert output.reward == 0.0 and output.error is None
    record = output.evaluation
    assert record is not None and record.version == "7"
    assert record.reason is not None and "/usr/local/bin/python3" in record.reason
    assert record.tamper is not None and record.tamper.tampered
    assert output.details["reward_before_tamper"] == 1.0
    assert trajectory.reward == 0.0 and trajectory.failure is None
    assert [t.reward for t in trajectory.traces] == [0.0]


async def test_changes_listed_but_not_carried_do_not_change_the_reward(tmp_path, registered):
    output, trajectory = await _evaluate(tmp_path, EvaluatorSpec(type="tests_listed"))
    assert output.reward == 1.0
    assert output.evaluation is not None and output.evaluation.tamper is not None
    assert not output.evaluation.tamper.tampered
    assert trajectory.evaluation is not None
    assert trajectory.evaluation.tamper.ignored[0].path == "/usr/local/bin/python3"


async def test_a_forced_reward_is_recorded_as_forced(tmp_path):
    output, trajectory = await _evaluate(tmp_path, EvaluatorSpec(), forced=0.0)
    assert output.reward == 0.0
    assert output.evaluation is not None and output.evaluation.forced
    assert trajectory.evaluation is not None and trajectory.evaluation.forced


def test_version_of_an_evaluator_without_one_is_empty():
    class Plain:
        async def evaluate(self, ctx):  # pragma: no cover - never called
            raise AssertionError

    assert evaluator_version(Plain()) == ""
    assert evaluator_version(get_evaluator(EvaluatorSpec())).startswith(rolloutd.__version__)
