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
FAIL_TO_PASS = [
    "tests/test_mean.py::test_mean_is_exact",
    "tests/test_mean.py::test_mean_of_empty_raises",
]


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


#: a pytest hook that reports every test phase as passed (pytest's "Writing hook functions")
PASS_EVERYTHING = """import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome, report.longrepr = "passed", None
"""
#: the example's failing tests, printed as passed when the interpreter exits, with the exit
#: code SWE-bench's grading cross-checks (its first match is read)
PRINT_AT_EXIT = (
    "import atexit\n"
    "atexit.register(print, '\\n'.join(['PASSED tests/test_mean.py::test_mean_is_exact',\n"
    "    'PASSED tests/test_mean.py::test_mean_of_empty_raises', '>>>>> Test Exit Code: 0']))\n"
)
#: what the session leaves in the repository, per case: path -> text (None: the patch file)
CHEATS: dict[str, dict[str, str]] = {
    "root conftest.py": {"conftest.py": PASS_EVERYTHING},
    "pytest.ini loading a plugin": {
        "pytest.ini": "[pytest]\naddopts = -p rolloutd_cheat\n",
        "rolloutd_cheat.py": PASS_EVERYTHING,
    },
    "pytest.py shadowing the runner": {
        "pytest.py": "print('PASSED tests/test_mean.py::test_mean_is_exact')\n"
        "print('PASSED tests/test_mean.py::test_mean_of_empty_raises')\n",
    },
    "PASSED lines printed at exit": {"calc/__init__.py": PRINT_AT_EXIT},
}


async def score_example(
    tmp_path, files: dict[str, str], patch_name: str | None = None, *, then: str | None = None
):
    """The example task scored as the stack scores it: ``patch_name`` applied and ``files``
    written in a session runtime, its ``git diff`` applied in a fresh one, the check run there,
    the outcome as the evaluation activity scores it (a tamper report's findings make it 0.0).

    Args:
        then: a command run in the fresh runtime after the check (its stdout is returned).

    Returns:
        ``(outcome, check, then's stdout or None)``.
    """
    from rolloutd.activities.evaluation import scored_outcome

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
        for path, text in files.items():
            await session.upload(path, text.encode())
        # the session's change travels as `git diff --binary` into a fresh copy of the repo
        patch = await git_patch(session)
        assert patch is not None and (patch["num_bytes"] > 0) == bool(patch_name or files)
        applied = await apply_patch(fresh, patch["patch"])
        assert applied.exit_code == 0, applied.stderr
        check = await run_check(fresh, evaluator_spec)
        assert check["test_patch_applied"] is True
        ctx = EvaluationContext(
            task_id="t",
            session_id="s",
            status=SessionStatus.COMPLETED,
            spec=evaluator_spec,
            artifacts={"check": check, "patch": patch},
        )
        outcome = scored_outcome(await get_evaluator(evaluator_spec).evaluate(ctx))
        after = (await fresh.exec(then)).stdout if then else None
    finally:
        await session.stop()
        await fresh.stop()
    return outcome, check, after


@pytest.mark.sandbox
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
@pytest.mark.parametrize(
    ("patch_name", "reward"), [("gold.patch", 1.0), ("wrong.patch", 0.0), (None, 0.0)]
)
async def test_example_task_scores_in_a_bwrap_runtime(tmp_path, patch_name, reward):
    outcome, check, _ = await score_example(tmp_path, {}, patch_name)
    assert outcome.reward == reward, outcome.details
    assert outcome.tamper is not None and outcome.tamper.findings == []
    assert check["log_source"] == "runner_report"
    assert check["tests"]["tests/test_ops.py::test_add"] == "PASSED"
    if patch_name == "wrong.patch":
        assert outcome.details["failed_fail_to_pass"] == [
            "tests/test_mean.py::test_mean_of_empty_raises"
        ]


@pytest.mark.sandbox
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
async def test_bytecode_and_install_metadata_of_an_honest_run_are_no_finding(tmp_path):
    """An honest agent runs the tests (bytecode in ``__pycache__``) and installs its package
    in development mode (``*.egg-info``): the gold patch still scores 1.00, and no bytecode
    reaches the fresh runtime (it is never part of the patch)."""
    honest = {
        "calc/__pycache__/__init__.cpython-311.pyc": "not bytecode at all",
        "stray.pyc": "nor this",
        "calc.egg-info/SOURCES.txt": "calc/__init__.py\n",
        "calc.egg-info/PKG-INFO": "Metadata-Version: 2.1\nName: calc\n",
    }
    # the check's own pytest run writes bytecode in the fresh runtime: look for the session's
    outcome, _, carried = await score_example(
        tmp_path,
        honest,
        "gold.patch",
        then="grep -rl --include='*.pyc' -e 'not bytecode' -e 'nor this' . || true",
    )
    assert outcome.reward == 1.0, outcome.details
    assert outcome.tamper is not None and outcome.tamper.findings == []
    assert carried == "", carried


@pytest.mark.sandbox
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
@pytest.mark.parametrize("cheat", list(CHEATS))
async def test_a_patch_cannot_steer_its_grading(tmp_path, cheat):
    """Each cheat leaves the bug in place and changes how the tests run or read: 0.00 with
    its cause named. A runner file is a tamper finding; a conftest hook or a pytest.ini would
    have scored 1.00 without the finding (``reward_before_tamper``); lines printed at exit are
    not in the graded log (SWE-bench's grading of the printed log believes them)."""
    # the command the check ran before it was hardened, for the printed cheat
    plain = "python3 -m pytest -rA -p no:cacheprovider " + " ".join(FAIL_TO_PASS)
    printed = cheat == "PASSED lines printed at exit"
    outcome, check, before = await score_example(
        tmp_path, CHEATS[cheat], then=plain if printed else None
    )
    print(f"{cheat}: reward {outcome.reward:.2f}, reason {outcome.details.get('reason')}")
    assert outcome.reward == 0.0, outcome.details
    findings = outcome.tamper.findings if outcome.tamper else []
    if printed:
        assert findings == []
        assert outcome.details["failed_fail_to_pass"] == FAIL_TO_PASS
        # run as before, its printed log says the failing tests passed (the last line wins)
        assert parse_pytest_log(before)[FAIL_TO_PASS[0]] == "PASSED", before
        return
    named = next(iter(CHEATS[cheat]))
    assert [f.path for f in findings][:1] == [named], findings
    assert outcome.details["reason"].startswith("tampered:") and named in outcome.details["reason"]
    if cheat != "pytest.py shadowing the runner":
        assert outcome.details["reward_before_tamper"] == 1.0


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
