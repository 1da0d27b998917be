"""SWE-bench, SWE-Gym and SWE-smith instances as tasks, with their fields as each set writes them.

- **SWE-bench** (Jimenez et al., ICLR 2024; ``SWE-bench/SWE-bench`` and its Lite and Verified
  splits): ``instance_id``, ``repo``, ``base_commit``, ``patch`` (the gold fix, never shown),
  ``test_patch``, ``problem_statement``, ``FAIL_TO_PASS`` / ``PASS_TO_PASS`` as JSON text;
  the ``swebench`` 5 format adds ``image``, ``eval_script``, ``log_parser``, ``eval_type``.
- **SWE-Gym** (Pan et al., arXiv 2412.21139): SWE-bench's fields, the test lists as lists;
  its rows name no image (give ``image_template``, or ``image_name`` per row).
- **SWE-smith** (Yang et al., arXiv 2504.21798): ``instance_id``, ``repo``, ``image_name``,
  ``patch`` (the change that *introduces* the bug: applied when the runtime starts, committed,
  so the agent starts from the broken repository), ``FAIL_TO_PASS`` / ``PASS_TO_PASS``; no
  ``test_patch``.

An instance runs in its own image (``image_name``, ``image``, ``options.image_template``, or
SWE-bench's ``swebench/sweb.eval.x86_64.{id}`` name), or one built per instance when the name is
a folder holding a Dockerfile (relative to the dataset file). The repository is the image's
``/testbed`` (``workdir``). The ``swebench`` evaluator grades in a fresh runtime from the same
image: the session's patch is applied, the test files are reset to the instance's version
(``git checkout {base_commit} -- ...``; files the test patch adds are removed), the test patch
is applied, the tests run between SWE-bench's log markers, and the ``swebench`` library's own
``get_logs_eval`` / ``get_eval_tests_report`` / ``get_resolution_status`` decide
(:mod:`rolloutd.evaluators.swebench`).
"""

from __future__ import annotations

import base64
import json
import shlex
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from rolloutd.errors import ConfigError
from rolloutd.payload import Payload, validate_strict
from rolloutd.task_spec import (
    EvaluatorSpec,
    ExecStep,
    HarnessSpec,
    PhaseTimeouts,
    RuntimeSpec,
)
from rolloutd.tasksets.contexts import check_build_context
from rolloutd.tasksets.options import TaskOptions
from rolloutd.types import SamplingParams, TaskRequest

#: SWE-bench's image names: ``{namespace}/sweb.eval.x86_64.{id}`` with ``__`` as ``_1776_``
#: (swebench.harness ``TestSpec.instance_image_key``).
DEFAULT_IMAGE_TEMPLATE = "swebench/sweb.eval.x86_64.{instance_id_1776}:latest"
#: where SWE-bench, SWE-Gym and SWE-smith images hold the repository.
TESTBED = "/testbed"
#: the instance's start, recorded when the runtime starts: the session's patch is taken
#: against it even after the harness commits (:data:`rolloutd.sandbox.artifacts.BASE_REF`).
BASE_REF = "refs/rolloutd/base"
#: what every instance's eval script runs first where the image has SWE-bench's conda env
ACTIVATE = (
    "if [ -f /opt/miniconda3/bin/activate ]; then "
    "source /opt/miniconda3/bin/activate && conda activate testbed; fi"
)
#: git identity of the commits made here
GIT_ENV = {
    "GIT_AUTHOR_NAME": "rolloutd",
    "GIT_AUTHOR_EMAIL": "rolloutd@localhost",
    "GIT_COMMITTER_NAME": "rolloutd",
    "GIT_COMMITTER_EMAIL": "rolloutd@localhost",
}


class SwebenchInstance(Payload):
    """One instance of SWE-bench, SWE-Gym or SWE-smith (any field a set writes; others are
    refused by name).

    Raises:
        pydantic.ValidationError: a field none of the sets writes, or a malformed one.
    """

    instance_id: str = Field(min_length=1)
    repo: str = ""
    problem_statement: str = Field(min_length=1)
    base_commit: str | None = None
    patch: str = Field(default="", description="SWE-bench, SWE-Gym: the fix; SWE-smith: the bug")
    test_patch: str | None = None
    FAIL_TO_PASS: list[str] = Field(default_factory=list)
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    image_name: str | None = Field(default=None, description="SWE-smith's image")
    image: str | None = Field(default=None, description="swebench 5's image")
    eval_script: str | None = None
    log_parser: str | None = None
    eval_type: Literal["pass_and_fail", "fail_only"] | None = None
    image_assets: Any = None
    # kept for the record, not used to run
    hints_text: str | None = None
    created_at: str | None = None
    version: str | float | None = None
    environment_setup_commit: str | None = None
    difficulty: str | None = None

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_text(cls, value: Any) -> Any:
        # SWE-bench's datasets hold the lists as JSON text; SWE-Gym's and SWE-smith's as lists
        return json.loads(value) if isinstance(value, str) else value

    @property
    def kind(self) -> Literal["swebench", "swesmith"]:
        """``swesmith`` when the instance has no test patch and its ``patch`` makes the bug."""
        return "swebench" if self.test_patch is not None else "swesmith"


class SwebenchOptions(TaskOptions):
    """:class:`TaskOptions` plus how an instance finds its image and runs its tests.

    Attributes:
        image_template: the image of a row that names none: ``str.format`` over
            ``instance_id``, ``instance_id_1776`` (``__`` as ``_1776_``, SWE-bench's),
            ``instance_id_s`` (``__`` as ``_s_``) and ``repo``.
        test_command: the test runner of a row without ``eval_script``; the F2P and P2P
            test ids are appended, shell-quoted.
        log_parser: the ``swebench`` parser (``PARSER_REGISTRY``) of such a row's log.
        eval_timeout_s: the tests' budget, s.
        workdir: the repository inside the image.
    """

    image_template: str = DEFAULT_IMAGE_TEMPLATE
    test_command: str = "python3 -m pytest -rA -p no:cacheprovider"
    log_parser: str = "parse_log_pytest"
    eval_timeout_s: float = Field(default=1800.0, gt=0, le=86_400)
    workdir: str = TESTBED


def read_instance(row: dict[str, Any]) -> SwebenchInstance:
    """A dataset row as a :class:`SwebenchInstance`.

    Raises:
        ConfigError: a field none of the sets writes (named), or a malformed one.
    """
    try:
        instance = validate_strict(SwebenchInstance, row)
    except ValidationError as e:
        key = row.get("instance_id", "?")
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: " + err["msg"] for err in e.errors()
        )
        raise ConfigError(f"instance {key!r}: {problems}") from None
    if instance.image_assets:
        raise ConfigError(
            f"instance {instance.instance_id!r}: image_assets (binary test files fetched "
            "from URLs at evaluation) are not supported"
        )
    if not instance.FAIL_TO_PASS and not instance.PASS_TO_PASS:
        raise ConfigError(f"instance {instance.instance_id!r} lists no FAIL_TO_PASS test")
    return instance


def instance_image(
    instance: SwebenchInstance, options: SwebenchOptions, base: Path | None
) -> dict[str, Any]:
    """The instance's image as ``RuntimeSpec`` fields: ``{"image": name}`` (its own name, else
    the template's), or ``{"build": {"context": folder}}`` when the name is a folder holding a
    Dockerfile (relative to ``base``, the dataset's folder): an image built per instance."""
    name = instance.image_name or instance.image
    if name is None:
        iid = instance.instance_id
        name = options.image_template.format(
            instance_id=iid,
            instance_id_1776=iid.replace("__", "_1776_").lower(),
            instance_id_s=iid.replace("__", "_s_").lower(),
            repo=instance.repo,
        )
    folder = Path(name) if name.startswith("/") else (base / name if base else None)
    if folder is not None and (folder / "Dockerfile").is_file():
        check_build_context(
            folder,
            what=f"instance {instance.instance_id!r}",
            hint="make the context first (the example instances: "
            "python examples/swebench/make_instances.py --contexts)",
        )
        return {"build": {"context": str(folder.resolve())}}
    return {"image": name}


def _start_steps(instance: SwebenchInstance) -> list[ExecStep]:
    """Prepare steps: SWE-smith's bug applied and committed; the start recorded as a ref."""
    steps = []
    if instance.kind == "swesmith" and instance.patch.strip():
        steps.append(
            ExecStep(
                command="git apply --whitespace=nowarn - <<'ROLLOUTD_EOF'\n"
                f"{instance.patch}\nROLLOUTD_EOF\n"
                f"git add -A && git commit -q --no-verify -m {shlex.quote(instance.instance_id)}",
                env=GIT_ENV,
            )
        )
    steps.append(ExecStep(command=f"git update-ref {BASE_REF} HEAD", env=GIT_ENV))
    return steps


def test_files(instance: SwebenchInstance) -> tuple[list[str], list[str]]:
    """The test files to reset before grading: ``(existing, added)``.

    ``existing``: files the test patch changes (or, without one, the files of the listed test
    ids), reset to the instance's version; ``added``: files the test patch creates, removed
    before it is applied (the agent may have written them).
    """
    existing: list[str] = []
    added: list[str] = []
    if instance.test_patch:
        current: str | None = None
        for line in instance.test_patch.splitlines():
            if line.startswith("diff --git "):
                current = line.split(" b/", 1)[-1]
                existing.append(current)
            elif line.startswith("new file mode") and current is not None:
                existing.remove(current)
                added.append(current)
    else:
        for test_id in instance.FAIL_TO_PASS + instance.PASS_TO_PASS:
            path = test_id.split("::", 1)[0]
            if "/" in path or path.endswith(".py"):
                existing.append(path)
    return list(dict.fromkeys(existing)), list(dict.fromkeys(added))


def eval_script(instance: SwebenchInstance, options: SwebenchOptions) -> str:
    """The instance's eval script: its own (``swebench`` 5 format), else one in SWE-bench's
    shape: reset the test files, apply the test patch, run the listed tests between
    ``>>>>> Start Test Output`` and ``>>>>> End Test Output``, record the exit code, reset.

    The reset names the instance's start (its ``base_commit`` where set, else the commit the
    runtime started from, :data:`BASE_REF`).
    """
    if instance.eval_script:
        return instance.eval_script
    base = instance.base_commit or BASE_REF
    existing, added = test_files(instance)
    reset = (
        f"git checkout {shlex.quote(base)} -- {shlex.join(existing)} || echo '>>>>> Reset Failed'"
        if existing
        else ":"
    )
    lines = [
        "#!/bin/bash",
        "set -uo pipefail",
        ACTIVATE,
        f"cd {shlex.quote(options.workdir)}",
        "git config --global --add safe.directory '*' 2>/dev/null || true",
        reset,
    ]
    if added:
        lines.append(f"rm -rf -- {shlex.join(added)}")
    if instance.test_patch:
        lines.append(
            "git apply -v --whitespace=nowarn - <<'ROLLOUTD_EOF' || "
            "echo '>>>>> Patch Apply Failed'\n"
            f"{instance.test_patch}\nROLLOUTD_EOF"
        )
    test_ids = list(dict.fromkeys(instance.FAIL_TO_PASS + instance.PASS_TO_PASS))
    lines += [
        "echo '>>>>> Start Test Output'",
        f"{options.test_command} {shlex.join(test_ids)}",
        "SWEBENCH_TEST_EXIT_CODE=$?",
        "echo '>>>>> End Test Output'",
        'echo ">>>>> Test Exit Code: $SWEBENCH_TEST_EXIT_CODE"',
        reset,
    ]
    return "\n".join(lines) + "\n"


def oracle_harness(instance: SwebenchInstance) -> HarnessSpec:
    """The instance's oracle: a ``shell`` harness that applies its gold change (SWE-bench,
    SWE-Gym: ``patch``; SWE-smith: ``patch`` reversed, since it made the bug), the set's own
    sanity check. The patch travels base64-encoded in the command (no shell quoting, no
    template placeholders), so it must stay under the 128 KiB of one argument (execve(2)).

    Raises:
        ConfigError: the instance has no patch.
    """
    if not instance.patch.strip():
        raise ConfigError(f"instance {instance.instance_id!r} has no patch: no oracle")
    encoded = base64.b64encode(instance.patch.encode()).decode()
    reverse = " -R" if instance.kind == "swesmith" else ""
    return HarnessSpec(
        type="shell",
        command=f"echo {encoded} | base64 -d | git apply{reverse} --whitespace=nowarn -",
    )


def task_request(
    row: dict[str, Any], options: SwebenchOptions, *, base: Path | None = None
) -> TaskRequest:
    """The task a SWE-bench / SWE-Gym / SWE-smith row becomes.

    Args:
        row: the dataset row.
        options: the trainer's options.
        base: the dataset file's folder (relative build contexts resolve against it).

    Raises:
        ConfigError: the row is not an instance (see :func:`read_instance`).
        pydantic.ValidationError: the resulting task is malformed.
    """
    instance = read_instance(row)
    runtime = RuntimeSpec.model_validate(
        {
            "type": options.runtime_type,
            **instance_image(instance, options, base),
            "workdir": options.workdir,
            "prepare": _start_steps(instance),
        }
    )
    evaluator = EvaluatorSpec(
        type="swebench",
        runtime="fresh",
        timeout_s=options.eval_timeout_s,
        params={
            "fail_to_pass": instance.FAIL_TO_PASS,
            "pass_to_pass": instance.PASS_TO_PASS,
            "eval_script": eval_script(instance, options),
            "log_parser": instance.log_parser or options.log_parser,
            "eval_type": instance.eval_type or "pass_and_fail",
            "instance_id": instance.instance_id,
        },
    )
    run_s = options.run_budget(None)
    phases = PhaseTimeouts(run_s=run_s, provision_s=900.0, evaluate_s=300.0)
    harness = oracle_harness(instance) if options.harness.type == "oracle" else options.harness
    sampling = options.sampling.model_dump() if options.sampling else {}
    return TaskRequest(
        task_id=options.task_id(instance.instance_id),
        instruction=instance.problem_statement,
        num_samples=options.num_samples,
        timeout_s=run_s + phases.collect_s + evaluator.timeout_s + 600.0,
        runtime=runtime,
        harness=harness,
        builder=options.builder,
        evaluator=evaluator,
        sampling=SamplingParams(**sampling),
        phases=phases,
        model=options.model,
        max_session_attempts=options.max_session_attempts,
        max_replacements=options.max_replacements,
        store_final_state=options.store_final_state,
        metadata={
            **options.metadata,
            "task_set": instance.kind,
            "instance_id": instance.instance_id,
            "repo": instance.repo,
            **({"base_commit": instance.base_commit} if instance.base_commit else {}),
        },
    )
