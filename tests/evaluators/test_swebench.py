"""The swebench evaluator: log parsing, params, and the example task in a real bwrap runtime."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from rolloutd.errors import EvaluatorError
from rolloutd.evaluators import EvaluationContext, get_evaluator, run_check
from rolloutd.evaluators.swebench import parse_pytest_log
from rolloutd.sandbox.artifacts import apply_patch, git_patch
from rolloutd.sandbox.runtimes import create_runtime
from rolloutd.types import EvaluatorSpec, RuntimeSpec, SessionStatus

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "swebench_task"


def load_example():
    spec = importlib.util.spec_from_file_location("swebench_make_task", EXAMPLE / "make_task.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_parse_pytest_log_reads_the_short_summary():
    log = (
        "tests/a.py ..F\n= short test summary info =\nPASSED tests/a.py::test_x\n"
        "FAILED tests/a.py::test_y - AssertionError: 1 != 2\nERROR tests/b.py::test_z\n"
    )
    assert parse_pytest_log(log) == {
        "tests/a.py::test_x": "PASSED",
        "tests/a.py::test_y": "FAILED",
        "tests/b.py::test_z": "ERROR",
    }


async def test_params_are_checked():
    evaluator = get_evaluator(EvaluatorSpec(type="swebench", params={"fail_to_pass": []}))
    with pytest.raises(EvaluatorError, match="fail_to_pass"):
        evaluator.params()
    evaluator = get_evaluator(EvaluatorSpec(type="swebench", params={"bogus": 1}))
    with pytest.raises(EvaluatorError, match="bogus"):
        evaluator.params()


async def test_missing_results_score_zero():
    spec = EvaluatorSpec(type="swebench", params={"fail_to_pass": ["t::a"]})
    ctx = EvaluationContext(
        task_id="t", session_id="s", status=SessionStatus.COMPLETED, spec=spec, artifacts={}
    )
    outcome = await get_evaluator(spec).evaluate(ctx)
    assert outcome.reward == 0.0 and outcome.details["reason"] == "no test results"


@pytest.mark.sandbox
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
@pytest.mark.parametrize(
    ("patch_name", "reward"), [("gold.patch", 1.0), ("wrong.patch", 0.0), (None, 0.0)]
)
async def test_example_task_scores_in_a_bwrap_runtime(tmp_path, patch_name, reward):
    example = load_example()
    task = example.task()
    evaluator_spec = EvaluatorSpec.model_validate(task["evaluator"])
    session = create_runtime(RuntimeSpec.model_validate(task["runtime"]), "session", tmp_path)
    fresh = create_runtime(RuntimeSpec.model_validate(task["runtime"]), "fresh", tmp_path)
    try:
        await session.start()
        await fresh.start()
        if patch_name:
            assert (await apply_patch(session, (EXAMPLE / patch_name).read_text())).exit_code == 0
        # the session's change travels as `git diff --binary` into a fresh copy of the repo
        patch = await git_patch(session)
        assert patch is not None and (patch["num_bytes"] > 0) == bool(patch_name)
        applied = await apply_patch(fresh, patch["patch"])
        assert applied.exit_code == 0, applied.stderr
        check = await run_check(fresh, evaluator_spec)
        assert check["test_patch_applied"] is True
        ctx = EvaluationContext(
            task_id="t",
            session_id="s",
            status=SessionStatus.COMPLETED,
            spec=evaluator_spec,
            artifacts={"check": check},
        )
        outcome = await get_evaluator(evaluator_spec).evaluate(ctx)
    finally:
        await session.stop()
        await fresh.stop()
    assert outcome.reward == reward, outcome.details
    assert check["tests"]["tests/test_ops.py::test_add"] == "PASSED"
    if patch_name == "wrong.patch":
        assert outcome.details["failed_fail_to_pass"] == [
            "tests/test_mean.py::test_mean_of_empty_raises"
        ]


async def test_official_swebench_package_grades_the_log():
    pytest.importorskip("swebench")
    spec = EvaluatorSpec(
        type="swebench", params={"fail_to_pass": ["t.py::a"], "pass_to_pass": ["t.py::b"]}
    )
    log = "PASSED t.py::a\nPASSED t.py::b\n"
    check = {
        "exit_code": 0,
        "stdout": log,
        "timed_out": False,
        "test_patch_applied": True,
        "tests": parse_pytest_log(log),
    }
    ctx = EvaluationContext(
        task_id="t",
        session_id="s",
        status=SessionStatus.COMPLETED,
        spec=spec,
        artifacts={"check": check},
    )
    outcome = await get_evaluator(spec).evaluate(ctx)
    assert outcome.reward == 1.0 and outcome.details["grader"] == "swebench"
    assert outcome.details["resolution_status"] == "RESOLVED_FULL"
    check["stdout"] = "PASSED t.py::a\nFAILED t.py::b - AssertionError\n"
    outcome = await get_evaluator(spec).evaluate(ctx)
    assert outcome.reward == 0.0 and outcome.details["failed_pass_to_pass"] == ["t.py::b"]
    assert outcome.details["resolution_status"] == "RESOLVED_NO"
