"""The ``swebench`` evaluator: SWE-bench's resolution rule on a repository in a runtime.

SWE-bench (Jimenez et al., ICLR 2024; harness ``swebench/harness/grading.py``) calls an instance
resolved when, after the model's patch and the instance's test patch are applied, every test of
``FAIL_TO_PASS`` and every test of ``PASS_TO_PASS`` passes. Here:

- in the runtime (:meth:`Swebench.collect`, run by the sandbox fleet after the session's patch
  was applied, in the session's runtime or a fresh one): compare the files that may configure
  pytest with the base commit (before any test runs), apply ``params.test_patch`` with
  ``git apply``, run ``params.test_command`` on all listed tests at once through the hardened
  runner (:mod:`~rolloutd.evaluators.pytest_runner`: the working folder cannot shadow pytest,
  and the graded log is pytest's report, written to a file outside the repository and read
  host-side, not what the process printed), and parse the pytest ``-rA`` summary
  (``PASSED id`` / ``FAILED id`` / ``ERROR id`` lines) into a status per test;
- on the eval fleet (:meth:`Swebench.evaluate`): with the official ``swebench`` package
  installed (the ``swebench`` extra), the log is parsed by its parser ``params.log_parser``
  (``swebench.harness.log_parsers.PARSER_REGISTRY``) and graded by its
  ``get_eval_tests_report`` / ``get_resolution_status``: reward 1.0 when the FAIL_TO_PASS /
  PASS_TO_PASS report says ``RESOLVED_FULL``; without it, by the same rule here: every listed
  test has status ``PASSED`` (a test missing from the log counts as failed). Either way 0.0
  when the test patch did not apply or the tests timed out. ``details["grader"]`` says which.
  The session's patch (the ``patch`` artifact) is read for changes to what runs the tests
  (:meth:`Swebench.tamper_report`): a ``conftest.py`` outside the instance's test files, a
  pytest configuration, ``sitecustomize`` / ``usercustomize`` / ``*.pth``, bytecode, package
  metadata, a module named like the runner or the standard library where pytest imports
  first, the test command's own program. Any such finding is a tamper: reward 0.0, the path
  named in the evaluation record.

With ``params.eval_script`` (SWE-bench, SWE-Gym and SWE-smith instances,
:mod:`rolloutd.tasksets.swebench`) the runtime runs that script instead (it resets the test
files to the instance's version, applies the test patch and runs the tests between SWE-bench's
log markers; its pytest lines run through the hardened runner), and the package reads the whole
log with its ``get_logs_eval`` before the report.

What this trusts: the image (its interpreter, pytest, ``git``), the instance's test files (reset
before the tests), and pytest's own process, where the code under test runs: that code can
still subvert pytest from inside on purpose, as it can under SWE-bench's own harness, and the
repository's other files (test helpers included) are the patch's to change. Graded in the
session's runtime (``EvaluatorSpec.runtime = "session"``) it also trusts whatever the agent
left there; the task sets grade in a fresh one.

``EvaluatorSpec.params``::

    {"test_patch": str (a git diff, may be empty), "fail_to_pass": [test ids],
     "pass_to_pass": [test ids], "test_command": "python3 -m pytest -rA ..." (optional),
     "log_parser": "parse_log_pytest" (optional), "eval_script": str (optional),
     "eval_type": "pass_and_fail" | "fail_only" (optional), "instance_id": str (optional)}
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rolloutd.errors import ArtifactTooLargeError, EvaluatorError, NotFoundError
from rolloutd.evaluators import pytest_runner
from rolloutd.evaluators.base import (
    CHECK_ARTIFACT,
    EvaluationContext,
    EvaluationOutcome,
    Evaluator,
)
from rolloutd.sandbox.artifacts import BASE_REF, GIT_ENV, apply_patch
from rolloutd.sandbox.runtimes.base import Runtime
from rolloutd.security.tamper import (
    PYTEST_CONFIG_NAMES,
    capped,
    config_finding,
    patched_files,
    path_finding,
)
from rolloutd.types import TamperFinding, TamperReport

#: pytest's ``-rA`` short test summary line: ``STATUS test-id[ - message]``.
PYTEST_SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+)", re.MULTILINE)
#: SWE-bench's log lines (``swebench.harness.constants``): a test patch that did not apply;
#: tests that ran out of time
APPLY_PATCH_FAIL = ">>>>> Patch Apply Failed"
TESTS_TIMEOUT = ">>>>> Tests Timed Out"
#: bytes of test output kept in the check artifact (head and tail).
MAX_LOG_BYTES = 256 * 1024
#: bytes of the runner's report read; the graded log keeps its last MAX_REPORT_KEPT bytes
#: (pytest's short summary is at its end)
MAX_REPORT_BYTES = 64 * 2**20
MAX_REPORT_KEPT = 4 * 2**20
#: files that may configure pytest compared with the base commit, at most
MAX_CONFIG_FILES = 20
#: bytes of one such file read
MAX_CONFIG_BYTES = 1 * 2**20


class SwebenchParams(BaseModel):
    """``EvaluatorSpec.params`` of the swebench evaluator (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    test_patch: str = Field(default="", description="git diff adding or changing the tests")
    fail_to_pass: list[str] = Field(default_factory=list, description="must pass after the fix")
    pass_to_pass: list[str] = Field(default_factory=list, description="must keep passing")
    test_command: str = Field(
        default="python3 -m pytest -rA -p no:cacheprovider",
        description="test runner; the test ids are appended, shell-quoted",
    )
    log_parser: str = Field(
        default="parse_log_pytest",
        description="the swebench package's log parser (PARSER_REGISTRY name) for the "
        "test runner's output",
    )
    eval_script: str | None = Field(
        default=None,
        description="a whole SWE-bench eval script (bash): it resets the test files, applies "
        "the test patch and runs the tests between SWE-bench's log markers; when set, "
        "test_patch and test_command are not used (rolloutd.tasksets.swebench.eval_script)",
    )
    eval_type: Literal["pass_and_fail", "fail_only"] = Field(
        default="pass_and_fail", description="the swebench package's EvalType of the instance"
    )
    instance_id: str = Field(default="", description="the instance's id, for the record")


def official_grade(log: str, params: SwebenchParams) -> dict[str, Any] | None:
    """The official ``swebench`` package's verdict on a test log, or None without it.

    Imported here, not at module load: the package (and docker, modal, datasets with it) is
    an optional extra and takes seconds to import; evaluators that never grade SWE-bench do
    not pay for it.

    Returns:
        ``{"resolved": bool, "status": "RESOLVED_FULL" | ..., "report": {FAIL_TO_PASS:
        {success, failure}, PASS_TO_PASS: {...}, ...}, "tests": {id: status}}``.

    Raises:
        EvaluatorError: ``params.log_parser`` is not one of the package's parsers.
    """
    if importlib.util.find_spec("swebench") is None:
        return None
    from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS, EvalType, ResolvedStatus
    from swebench.harness.grading import get_eval_tests_report, get_resolution_status
    from swebench.harness.log_parsers import PARSER_REGISTRY

    parser = PARSER_REGISTRY.get(params.log_parser)
    if parser is None:
        raise EvaluatorError(
            f"evaluator.params.log_parser={params.log_parser!r} is not a "
            "parser of the swebench package (PARSER_REGISTRY)"
        )
    # the pytest-style parsers read the log alone; test_spec only matters to a few
    # repository-specific ones
    if params.eval_script is not None:
        tests, ok = logs_eval(log, params)
        if not ok:
            return {"resolved": False, "status": "LOG_INVALID", "report": None, "tests": {}}
    else:
        tests = parser(log, None)
    report = get_eval_tests_report(
        tests,
        {FAIL_TO_PASS: params.fail_to_pass, PASS_TO_PASS: params.pass_to_pass},
        eval_type=EvalType(params.eval_type),
    )
    status = get_resolution_status(report)
    return {
        "resolved": status == ResolvedStatus.FULL.value,
        "status": status,
        "report": report,
        "tests": tests,
    }


def logs_eval(log: str, params: SwebenchParams) -> tuple[dict[str, str], bool]:
    """The ``swebench`` package's own reading of an eval script's log
    (``swebench.harness.grading.get_logs_eval``): the status of each test between the
    markers, and False when the log shows a patch that did not apply, a failed reset, a
    timeout, no markers, or an exit code the statuses contradict.

    Returns:
        ``(test id -> status, valid)``.
    """
    import tempfile

    from swebench.harness.grading import get_logs_eval
    from swebench.types import TestSpec

    spec = TestSpec(
        instance_id=params.instance_id or "rolloutd",
        image="",
        eval_script_list=[],
        repo="",
        version="",
        FAIL_TO_PASS=params.fail_to_pass,
        PASS_TO_PASS=params.pass_to_pass,
        log_parser=params.log_parser,
        eval_type=params.eval_type,
    )
    with tempfile.NamedTemporaryFile("w", suffix=".log", encoding="utf-8") as f:
        f.write(log)
        f.flush()
        return get_logs_eval(spec, f.name)


def parse_pytest_log(log: str) -> dict[str, str]:
    """Test id -> status from pytest ``-rA`` output (the last status of an id wins).

    Args:
        log: pytest's stdout.
    """
    return {test_id: status for status, test_id in PYTEST_SUMMARY.findall(log)}


class Swebench(Evaluator):
    """Resolved (1.0) when every FAIL_TO_PASS and PASS_TO_PASS test passes; see the module."""

    name = "swebench"
    #: 2: the session patch's changes to the test run are tamper findings (0.0); pytest runs
    #: through :mod:`~rolloutd.evaluators.pytest_runner` and its report is the graded log
    revision = 2

    def params(self) -> SwebenchParams:
        """The validated params.

        Raises:
            EvaluatorError: malformed ``params`` or no test listed at all.
        """
        try:
            params = SwebenchParams.model_validate(self.spec.params)
        except ValidationError as exc:
            raise EvaluatorError(f"evaluator.params of swebench: {exc}") from exc
        if not params.fail_to_pass and not params.pass_to_pass:
            raise EvaluatorError(
                "evaluator.params of swebench needs fail_to_pass or pass_to_pass tests"
            )
        return params

    async def collect(self, runtime: Runtime) -> dict[str, Any]:
        """Run the tests in ``runtime`` (the session's patch already applied): the ``check``
        artifact.

        First, before any code of the session runs, the files that may configure pytest
        (``setup.cfg``, ``tox.ini``, ``pyproject.toml``, ``pytest.ini``) are compared with the
        base commit (:func:`changed_configs`). Then the eval script (or the test patch and
        the test command) runs, its pytest lines through
        :mod:`~rolloutd.evaluators.pytest_runner`.

        Returns:
            ``{"exit_code", "stdout", "stderr", "timed_out", "test_patch_applied",
            "tests": {id: status}, "graded_log": str (a hardened run's), "log_source":
            "runner_report" | "stdout", "tamper_findings": [TamperFinding as dict]}``.
        """
        params = self.params()
        configs = [f.model_dump() for f in await changed_configs(runtime)]
        if params.eval_script is not None:
            check = await self._run_script(runtime, params.eval_script)
            check["test_patch_applied"] = APPLY_PATCH_FAIL not in check["graded_log"]
            return check | {"tamper_findings": configs}
        applied = await apply_patch(runtime, params.test_patch)
        if applied.exit_code != 0:
            return {
                "exit_code": applied.exit_code,
                "stdout": applied.stdout,
                "stderr": applied.stderr,
                "timed_out": applied.timed_out,
                "test_patch_applied": False,
                "tests": {},
                "tamper_findings": configs,
            }
        test_ids = list(dict.fromkeys(params.fail_to_pass + params.pass_to_pass))
        script = "\n".join(
            [
                f"echo '{pytest_runner.START_TEST_OUTPUT}'",
                f"{params.test_command} {shlex.join(test_ids)}",
                f"echo '{pytest_runner.END_TEST_OUTPUT}'",
            ]
        )
        check = await self._run_script(runtime, script)
        return check | {"test_patch_applied": True, "tamper_findings": configs}

    async def _run_script(self, runtime: Runtime, script: str) -> dict[str, Any]:
        """Run ``script`` (bash, from standard input) in the repository, its pytest lines
        hardened; the log is stdout and stderr together, as SWE-bench's harness keeps it, and
        the graded log the runner's report (:func:`pytest_runner.graded_log`)."""
        report = pytest_runner.report_path(runtime.home)
        script, hardened = pytest_runner.harden_script(script, report)
        result = await runtime.exec(
            ["bash", "-c", 'exec bash -s "$@" 2>&1', "eval"],
            stdin=script.encode(),
            env=GIT_ENV,
            timeout_s=self.spec.timeout_s,
            max_output_bytes=MAX_LOG_BYTES,
        )
        log = result.stdout + (f"\n{TESTS_TIMEOUT}" if result.timed_out else "")
        graded = log
        if hardened:
            text = await read_report(runtime, report)
            graded = pytest_runner.graded_log(result.stdout, text, timed_out=result.timed_out)
        return {
            "exit_code": result.exit_code,
            "stdout": log,
            "stderr": result.stderr,
            "timed_out": result.timed_out,
            "graded_log": graded,
            "log_source": "runner_report" if hardened else "stdout",
            "tests": parse_pytest_log(graded),
        }

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationOutcome:
        """Score the ``check`` artifact with SWE-bench's rule, and report the session patch's
        changes to what runs the tests (:meth:`tamper_report`; any finding scores 0.0)."""
        params = self.params()
        tamper = self.tamper_report(ctx, params)
        check: Any = ctx.artifacts.get(CHECK_ARTIFACT)
        if not isinstance(check, dict) or "tests" not in check:
            return EvaluationOutcome(
                reward=0.0,
                details={"reason": "no test results", "status": ctx.status.value},
                tamper=tamper,
            )
        applied = bool(check.get("test_patch_applied"))
        timed_out = bool(check.get("timed_out"))
        # a check of an older worker has no graded log: its stdout is the log
        log = str(check.get("graded_log") or check.get("stdout") or "")
        official = official_grade(log, params) if applied else None
        if official is not None:
            report = official["report"] or {
                "FAIL_TO_PASS": {"failure": params.fail_to_pass},
                "PASS_TO_PASS": {"failure": params.pass_to_pass},
            }
            failed_f2p = report["FAIL_TO_PASS"]["failure"]
            failed_p2p = report["PASS_TO_PASS"]["failure"]
            resolved = official["resolved"] and not timed_out
        else:
            tests = parse_pytest_log(log) if "graded_log" in check else check["tests"]
            failed_f2p = [t for t in params.fail_to_pass if tests.get(t) != "PASSED"]
            failed_p2p = [t for t in params.pass_to_pass if tests.get(t) != "PASSED"]
            resolved = applied and not failed_f2p and not failed_p2p and not timed_out
        details: dict[str, Any] = {
            "resolved": resolved,
            "grader": "rolloutd" if official is None else "swebench",
            "resolution_status": None if official is None else official["status"],
            "log_source": check.get("log_source", "stdout"),
            "test_patch_applied": applied,
            "num_fail_to_pass": len(params.fail_to_pass),
            "num_pass_to_pass": len(params.pass_to_pass),
            "failed_fail_to_pass": failed_f2p,
            "failed_pass_to_pass": failed_p2p,
            "timed_out": timed_out,
        }
        if not resolved:
            details["reason"] = (
                "test patch did not apply"
                if not applied
                else "tests timed out"
                if timed_out
                else f"{len(failed_f2p)} FAIL_TO_PASS and {len(failed_p2p)} PASS_TO_PASS "
                "test(s) did not pass"
            )
        return EvaluationOutcome(reward=1.0 if resolved else 0.0, details=details, tamper=tamper)

    def tamper_report(self, ctx: EvaluationContext, params: SwebenchParams) -> TamperReport:
        """What of the session's patch (the ``patch`` artifact, the very diff the evaluation
        runtime applied) configures or extends the test run: files found by name
        (:func:`rolloutd.security.tamper.path_finding`), an added or changed pytest
        section (the ``check`` artifact's comparison with the base commit, and the added
        files' text), and a change to the program the test command runs (``bin/test``,
        ``tests/runtests.py``). The instance's own test files are reset before the tests run,
        so changes there are not findings.
        """
        patch: Any = ctx.artifacts.get("patch")
        text = patch.get("patch") if isinstance(patch, dict) else None
        files = patched_files(text) if isinstance(text, str) else []
        changed = {f.path for f in files}
        exempt = instance_test_files(params)
        runner = runner_files(params)
        findings: list[TamperFinding] = []
        for f in files:
            if f.path in exempt:
                continue
            if f.path in runner:
                finding: TamperFinding | None = TamperFinding(
                    path=f.path,
                    category="runner_config",
                    change=f.change,
                    detail="the program the test command runs",
                )
            elif f.change == "added" and PurePosixPath(f.path).name in PYTEST_CONFIG_NAMES:
                # a renamed or binary file carries no text: counted as changed
                finding = config_finding(f.path, None, f.text if f.text is not None else "?")
            else:
                finding = path_finding(f.path, f.change)
            if finding is not None:
                findings.append(finding)
        check: Any = ctx.artifacts.get(CHECK_ARTIFACT)
        scanned = check.get("tamper_findings") if isinstance(check, dict) else None
        for raw in scanned or []:
            finding = TamperFinding.model_validate(raw)
            # only what the patch changed: an image's own difference is not the session's
            if finding.path in changed and finding.path not in exempt:
                findings.append(finding)
        kept, truncated = capped(findings)
        return TamperReport(findings=kept, num_changed_paths=len(changed), truncated=truncated)


def instance_test_files(params: SwebenchParams) -> set[str]:
    """The instance's test files: those its test patch changes (in ``test_patch`` or the
    eval script's embedded diff) and those of its listed test ids. The eval script resets them
    to the instance's version before the tests run."""
    files = {f.path for f in patched_files(params.test_patch)}
    files |= {f.path for f in patched_files(params.eval_script or "")}
    for test_id in params.fail_to_pass + params.pass_to_pass:
        path = test_id.split("::", 1)[0]
        if path.endswith(".py"):
            files.add(path)
    return files


def runner_files(params: SwebenchParams) -> set[str]:
    """Repository files the test command runs as its program: a relative program path
    (``bin/test``, ``./tests/runtests.py``) or the script given to ``python``."""
    script = params.eval_script
    lines = (
        [params.test_command]
        if script is None
        else script.split(pytest_runner.START_TEST_OUTPUT, 1)[-1]
        .split(pytest_runner.END_TEST_OUTPUT, 1)[0]
        .splitlines()
    )
    files: set[str] = set()
    for line in lines:
        try:
            tokens = shlex.split(line)
        except ValueError:
            continue
        while tokens and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tokens[0]):
            tokens.pop(0)
        if not tokens:
            continue
        candidates = [tokens[0]]
        if re.fullmatch(r"(?:\S*/)?python[\d.]*", tokens[0]) and len(tokens) > 1:
            candidates.append(tokens[1])
        for token in candidates:
            if token.startswith(("-", "/")) or ("/" not in token and not token.endswith(".py")):
                continue
            files.add(str(PurePosixPath(token.removeprefix("./"))))
    return files


async def changed_configs(runtime: Runtime) -> list[TamperFinding]:
    """Tracked files that may configure pytest whose pytest part differs from the base commit
    (:data:`~rolloutd.sandbox.artifacts.BASE_REF`, else ``HEAD``) in ``runtime``'s
    repository, read before any test runs: the base with the image's ``git``, the file
    host-side. Nothing when the workdir is not a git repository."""
    patterns = [f"*{name}" for name in sorted(PYTEST_CONFIG_NAMES)]
    listing = await runtime.exec(["git", "ls-files", "-z", "--", *patterns], env=GIT_ENV)
    if listing.exit_code != 0:
        return []
    paths = [p for p in listing.stdout.split("\0") if PurePosixPath(p).name in PYTEST_CONFIG_NAMES]
    has_base = await runtime.exec(["git", "rev-parse", "-q", "--verify", BASE_REF], env=GIT_ENV)
    base = BASE_REF if has_base.exit_code == 0 else "HEAD"
    findings = []
    for path in paths[:MAX_CONFIG_FILES]:
        shown = await runtime.exec(
            ["git", "show", f"{base}:{path}"], env=GIT_ENV, max_output_bytes=MAX_CONFIG_BYTES
        )
        before = shown.stdout if shown.exit_code == 0 else None
        try:
            data = await runtime.download(path, max_bytes=MAX_CONFIG_BYTES)
            after: str | None = data.decode("utf-8", "replace")
        except NotFoundError:
            after = None
        except ArtifactTooLargeError:
            after = f"(over {MAX_CONFIG_BYTES} bytes)"
        finding = config_finding(path, _lf(before), _lf(after))
        if finding is not None:
            findings.append(finding)
    return findings


async def read_report(runtime: Runtime, path: str) -> str | None:
    """The runner's report, read host-side; its last :data:`MAX_REPORT_KEPT` bytes (from a
    line start) when longer; None when the runner wrote none."""
    try:
        data = await runtime.download(path, max_bytes=MAX_REPORT_BYTES)
    except NotFoundError:
        return None
    except ArtifactTooLargeError:
        return f"rolloutd: the test report is over {MAX_REPORT_BYTES} bytes\n"
    text = data.decode("utf-8", "replace")
    if len(text) > MAX_REPORT_KEPT:
        text = text[-MAX_REPORT_KEPT:].split("\n", 1)[-1]
    return text


def _lf(text: str | None) -> str | None:
    return None if text is None else text.replace("\r\n", "\n")
