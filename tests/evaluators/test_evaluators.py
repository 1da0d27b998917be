"""The evaluator registry and the built-in evaluators."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from rolloutd import evaluators
from rolloutd.errors import EvaluatorError
from rolloutd.evaluators import (
    EvaluationOutcome,
    evaluator_names,
    get_evaluator,
    register_evaluators,
    run_check,
)
from rolloutd.evaluators.builtins import SessionCompleted, TestOnOutput
from rolloutd.sandbox.runtimes import create_runtime
from rolloutd.types import EvaluatorSpec, RuntimeSpec, SessionStatus
from tests.conftest import have_bwrap
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


def test_an_import_path_is_refused_by_the_spec():
    with pytest.raises(ValidationError, match="import paths are not accepted"):
        EvaluatorSpec(type="rolloutd.evaluators.builtins:SessionCompleted")


async def test_an_operator_registration_resolves_by_name(tmp_path: Path, monkeypatch):
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
    monkeypatch.setattr(evaluators, "_REGISTERED", {})
    try:
        spec = EvaluatorSpec(type="per_trace", params={"scale": 0.5})
        with pytest.raises(EvaluatorError, match="not in the registry"):
            get_evaluator(spec)
        register_evaluators({"per_trace": "my_rolloutd_eval:make"})
        assert "per_trace" in evaluator_names()
        outcome = await get_evaluator(spec).evaluate(evaluation_context(spec, num_traces=3))
        assert outcome.trace_rewards == [0.5, 0.5, 0.5]
        assert outcome.reward is None
    finally:
        sys.modules.pop("my_rolloutd_eval", None)


async def test_an_entry_point_resolves_by_name(tmp_path: Path, monkeypatch):
    """An installed distribution's ``rolloutd.evaluators`` entry point (a real .dist-info
    folder on sys.path, read by importlib.metadata)."""
    (tmp_path / "ep_rolloutd_eval.py").write_text(
        "from rolloutd.evaluators import EvaluationOutcome, Evaluator\n"
        "class Half(Evaluator):\n"
        "    name = 'half'\n"
        "    async def evaluate(self, ctx):\n"
        "        return EvaluationOutcome(reward=0.5)\n"
    )
    dist = tmp_path / "ep_rolloutd_eval-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-rolloutd-eval\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[rolloutd.evaluators]\nhalf_reward = ep_rolloutd_eval:Half\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert "half_reward" in evaluator_names()
        spec = EvaluatorSpec(type="half_reward")
        assert (await get_evaluator(spec).evaluate(evaluation_context(spec))).reward == 0.5
    finally:
        sys.modules.pop("ep_rolloutd_eval", None)


def test_a_registration_cannot_shadow_a_builtin_or_be_a_bare_module():
    with pytest.raises(EvaluatorError, match="built-in"):
        register_evaluators({"session_completed": "os:system"})
    with pytest.raises(EvaluatorError, match="module:attr"):
        register_evaluators({"bare": "os"})


@pytest.mark.parametrize("name", ["no_such_evaluator", "sys.exit"])
def test_unknown_evaluators_raise(name):
    with pytest.raises(EvaluatorError, match="not in the registry"):
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


@pytest.mark.sandbox
@pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed")
@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="no system python3")
async def test_a_check_does_not_load_the_agents_user_site_packages(tmp_path):
    """A ``.pth`` the agent leaves in its HOME's user site-packages prints the expected output
    and exits 0 in every interpreter started there; the check runs without user site-packages,
    so a check of ``hello.py`` (never written) earns 0.0. The same command run without the
    check's environment shows the cheat works."""
    spec = EvaluatorSpec(
        type="test_on_output", command="/usr/bin/python3 hello.py", expected_output="hello world"
    )
    runtime = create_runtime(RuntimeSpec(type="bwrap"), "user-site", tmp_path)
    await runtime.start()
    try:
        site = f"{runtime.home}/.local/lib/python3.11/site-packages"
        await runtime.upload(
            f"{site}/zz.pth", b"import os; print('hello world', flush=True); os._exit(0)\n"
        )
        plain = await runtime.exec(["sh", "-c", spec.command])
        check = await run_check(runtime, spec)
    finally:
        await runtime.stop()
    assert (plain.exit_code, plain.stdout.strip()) == (0, "hello world")  # the cheat, unchecked
    ctx = evaluation_context(spec, artifacts={"check": check})
    outcome = await get_evaluator(spec).evaluate(ctx)
    assert outcome.reward == 0.0 and "hello.py" in check["stderr"], check
