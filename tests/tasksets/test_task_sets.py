"""Harbor task folders and SWE-bench-family rows as tasks (no container: what the loaders
write into each TaskRequest)."""

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from rolloutd.errors import ConfigError, EvaluatorError
from rolloutd.evaluators import get_evaluator
from rolloutd.evaluators.base import EvaluationContext
from rolloutd.evaluators.harbor import parse_rewards
from rolloutd.sandbox.artifacts import BASE_REF
from rolloutd.tasksets import harbor, read_task_set, swebench
from rolloutd.tasksets.harbor import HarborOptions
from rolloutd.types import SessionStatus

ROOT = Path(__file__).resolve().parents[2]
HARBOR = ROOT / "examples" / "harbor"
INSTANCES = ROOT / "examples" / "swebench" / "instances.jsonl"


@pytest.fixture
def instances(tmp_path: Path) -> Path:
    """The example instances beside complete build contexts: the instances' Dockerfiles copy
    ``repo`` (made from each sdist by make_instances.py --contexts; an empty folder here, as
    nothing is built)."""
    for dockerfile in INSTANCES.parent.glob("*/environment/Dockerfile"):
        folder = tmp_path / dockerfile.parent.relative_to(INSTANCES.parent)
        (folder / "repo").mkdir(parents=True)
        shutil.copy(dockerfile, folder / "Dockerfile")
    return Path(shutil.copy(INSTANCES, tmp_path / INSTANCES.name))


NOP = {"harness": {"type": "shell", "command": "true"}}


def test_every_harbor_example_becomes_a_task():
    tasks = read_task_set("harbor", HARBOR, NOP)
    assert len(tasks) >= 6
    by_id = {t.task_id: t for t in tasks}
    word = by_id["fix-word-count"]
    assert word.instruction.startswith("The Python package in `/app/textstats`")
    assert word.runtime.workdir == "/app/textstats"  # [environment] workdir
    assert word.runtime.network == "gateway"  # nothing set: rolloutd's default
    assert (word.runtime.cpus, word.runtime.memory_mb) == (1, 1024)
    assert word.evaluator.type == "harbor" and word.evaluator.params["network"] == "none"
    assert Path(word.evaluator.params["tests_dir"], "test.sh").is_file()
    assert word.phases.run_s == 600.0
    assert by_id["csv-column-stats"].runtime.workdir == "/app"  # the Dockerfile's WORKDIR
    assert by_id["csv-column-stats"].runtime.memory_mb == 1024  # memory = "1G" (1.0 form)
    assert by_id["sqlite-city-report"].evaluator.params["env"] == {"EXPECTED_ROWS": "3"}
    assert by_id["sqlite-city-report"].runtime.env == {"LC_ALL": "C.UTF-8"}
    # nothing of tests/ or solution/ reaches the agent's side of the task
    for task in tasks:
        assert "test_outputs" not in json.dumps(task.runtime.model_dump())
        assert task.harness.solution is None


def test_oracle_gets_each_tasks_solution(tmp_path):
    options = {"harness": {"type": "oracle"}, "task_id_prefix": "o-"}
    (task,) = read_task_set("harbor", HARBOR / "sqlite-city-report", options)
    assert task.task_id == "o-sqlite-city-report"
    assert Path(task.harness.solution, "solve.sh").is_file()
    shutil.copytree(HARBOR / "fix-word-count", tmp_path / "t")
    shutil.rmtree(tmp_path / "t" / "solution")
    with pytest.raises(ConfigError, match="oracle needs solution/solve.sh"):
        read_task_set("harbor", tmp_path / "t", options)


def test_public_network_and_compose_files(tmp_path):
    task_dir = tmp_path / "t"
    shutil.copytree(HARBOR / "archive-text-files", task_dir)
    toml = task_dir / "task.toml"
    toml.write_text(
        toml.read_text()
        .replace("allow_internet = false", "allow_internet = true")
        .replace('network_mode = "no-network"\n', "")
    )
    task = harbor.task_request(harbor.load_task(task_dir), HarborOptions.model_validate(NOP))
    assert (task.runtime.network, task.evaluator.params["network"]) == ("host", "host")
    (task_dir / "environment" / "docker-compose.yaml").write_text("services: {}\n")
    with pytest.raises(ConfigError, match="docker-compose.yaml is not supported"):
        harbor.load_task(task_dir)


def test_swebench_instances_become_tasks(instances):
    tasks = read_task_set("swebench", instances, NOP)
    assert len(tasks) == 3
    task = tasks[0]
    row = json.loads(INSTANCES.read_text().splitlines()[0])
    assert task.task_id == row["instance_id"]
    assert task.instruction == row["problem_statement"]
    assert task.runtime.workdir == "/testbed"
    assert task.evaluator.type == "swebench" and task.evaluator.runtime == "fresh"
    params = task.evaluator.params
    assert params["fail_to_pass"] == json.loads(row["FAIL_TO_PASS"])  # JSON text read
    script = params["eval_script"]
    # the test files are reset to the instance's version, then the test patch applied
    assert f"git checkout {row['base_commit']} -- tests/test_recipes.py" in script
    assert script.index("git checkout") < script.index("git apply")
    assert ">>>>> Start Test Output" in script and ">>>>> Test Exit Code" in script
    assert row["patch"] not in json.dumps(task.model_dump())  # the gold fix is never sent
    assert any(BASE_REF in str(step.command) for step in task.runtime.prepare)


def test_an_instance_whose_build_context_lacks_what_it_copies_is_refused(instances):
    shutil.rmtree(next(instances.parent.glob("kjd__idna*/environment")) / "repo")
    with pytest.raises(ConfigError, match=r"kjd__idna.*lacks 'repo'.*make_instances.py --contexts"):
        read_task_set("swebench", instances, NOP)


def test_swe_gym_and_swe_smith_rows():
    gym = {
        "instance_id": "getmoto__moto-5752",
        "repo": "getmoto/moto",
        "base_commit": "b2300f1",
        "patch": "diff --git a/x b/x\n",
        "test_patch": "diff --git a/tests/t.py b/tests/t.py\nnew file mode 100644\n",
        "problem_statement": "p",
        "FAIL_TO_PASS": ["tests/t.py::test_a"],
        "PASS_TO_PASS": [],
        "version": "4.1",
        "hints_text": "",
        "created_at": "2023-01-01",
        "environment_setup_commit": "b2300f1",
    }
    options = {**NOP, "image_template": "docker.io/xingyaoww/sweb.eval.x86_64.{instance_id_s}"}
    task = swebench.task_request(gym, swebench.SwebenchOptions.model_validate(options))
    assert task.runtime.image == "docker.io/xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752"
    script = task.evaluator.params["eval_script"]
    assert "rm -rf -- tests/t.py" in script  # a file the test patch adds is removed first
    smith = {
        "instance_id": "oauthlib__oauthlib.1fd52536.combine_file__09vlzwgc",
        "repo": "swesmith/oauthlib__oauthlib.1fd52536",
        "patch": "diff --git a/oauthlib/x.py b/oauthlib/x.py\n",
        "FAIL_TO_PASS": ["tests/test_x.py::test_y"],
        "PASS_TO_PASS": ["tests/test_x.py::test_z"],
        "created_at": "2025-03-14",
        "image_name": "jyangballin/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536",
        "problem_statement": "p",
    }
    task = swebench.task_request(smith, swebench.SwebenchOptions.model_validate(NOP))
    assert task.metadata["task_set"] == "swesmith"
    assert task.runtime.image == smith["image_name"]
    assert "git apply" in str(task.runtime.prepare[0].command)  # the bug, at start
    assert f"git checkout {BASE_REF} -- tests/test_x.py" in task.evaluator.params["eval_script"]
    with pytest.raises(ConfigError, match="shiny: unknown field"):
        swebench.task_request({**smith, "shiny": 1}, swebench.SwebenchOptions.model_validate(NOP))


def test_harbor_rewards_are_read_as_harbor_reads_them():
    assert parse_rewards('{"reward": 1, "rows": 3}', "0") == {"reward": 1.0, "rows": 3.0}
    assert parse_rewards(None, " 0.5\n") == {"reward": 0.5}
    assert parse_rewards(None, None) is None
    for bad_json, bad_txt in (("[1", None), ('{"r": "1"}', None), (None, "yes"), (None, "nan")):
        with pytest.raises(EvaluatorError):
            parse_rewards(bad_json, bad_txt)


async def evaluate_check(evaluator, check, num_completions=1):
    """The evaluator's outcome for a completed session with the ``check`` artifact."""
    ctx = EvaluationContext(
        task_id="t",
        session_id="s",
        status=SessionStatus.COMPLETED,
        num_completions=num_completions,
        artifacts={"check": check},
    )
    return await evaluator.evaluate(ctx)


async def test_harbor_evaluator_scores_the_check():
    (task,) = read_task_set("harbor", HARBOR / "sqlite-city-report", NOP)
    evaluator = get_evaluator(task.evaluator)

    def score(check):
        return evaluate_check(evaluator, check)

    check = {"exit_code": 0, "reward_json": '{"reward": 1.0, "rows": 3}', "reward_txt": None}
    outcome = await score(check)
    assert (
        outcome.reward == 1.0
        and outcome.details["reason"] == "test.sh wrote reward 1 (reward.json)"
    )
    outcome = await score({**check, "reward_json": None})
    assert outcome.reward == 0.0 and outcome.details["reason"] == "test.sh wrote no reward file"
    linked = {
        **check,
        "reward_json": None,
        "reward_files": {"/logs/verifier/reward.txt": "not_a_file"},
    }
    assert "reward.txt is not a file" in (await score(linked)).details["reason"]


async def test_harbor_evaluator_scores_a_tamper_report_and_the_pack_bound():
    """A report with findings: 0.0 whatever was written (the evaluation record names the
    finding); ignored changes named in the reason of the reward test.sh wrote; a pack over its
    bound: 0.0 after a model call, no reward (an evaluator error) before any."""
    from rolloutd.activities.evaluation import scored_outcome
    from rolloutd.evaluators.harbor import GUARD_ENV, guard_env
    from rolloutd.types import TamperFinding, TamperReport

    (task,) = read_task_set("harbor", HARBOR / "fix-word-count", NOP)
    evaluator = get_evaluator(task.evaluator)
    assert evaluator.revision == 2

    async def score(check, num_completions=1):
        return scored_outcome(await evaluate_check(evaluator, check, num_completions))

    shadow = TamperFinding(
        path="/app/textstats/pytest.py", category="runner_config", change="added"
    )
    tampered = TamperReport(findings=[shadow], num_changed_paths=1)
    outcome = await score({"ran": False, "tamper": tampered.model_dump()})
    assert outcome.reward == 0.0 and outcome.tamper == tampered
    assert "/app/textstats/pytest.py (runner_config, added)" in outcome.details["reason"]

    fake = TamperFinding(path="/usr/local/bin/python3", category="executable", change="added")
    ignored = TamperReport(ignored=[fake], num_changed_paths=2)
    check = {"ran": True, "reward_txt": "0\n", "reward_json": None, "tamper": ignored.model_dump()}
    outcome = await score(check)
    assert outcome.reward == 0.0 and not outcome.tamper.tampered
    assert outcome.details["reason"] == (
        "test.sh wrote reward 0 (reward.txt); not carried to the verifier: "
        "/usr/local/bin/python3 (executable)"
    )
    assert (await score({**check, "reward_txt": "1"})).reward == 1.0  # solved, cheat or not

    big = {"ran": False, "tamper": TamperReport().model_dump(), "pack_too_large": "over 5 bytes"}
    assert (await score(big)).details["reason"] == "over 5 bytes"
    with pytest.raises(EvaluatorError, match="over 5 bytes, before any model call"):
        await score(big, num_completions=0)

    env = guard_env({"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "a.b", "X": "1"})
    assert env["GIT_CONFIG_COUNT"] == "3" and env["GIT_CONFIG_KEY_0"] == "a.b"
    assert (env["GIT_CONFIG_KEY_1"], env["GIT_CONFIG_VALUE_1"]) == ("core.hooksPath", "/dev/null")
    assert (env["GIT_CONFIG_KEY_2"], env["GIT_CONFIG_VALUE_2"]) == ("core.fsmonitor", "false")
    assert env.items() >= GUARD_ENV.items() and env["X"] == "1"
    carry = {**NOP, "carry_system_changes": True}
    (carried,) = read_task_set("harbor", HARBOR / "fix-word-count", carry)
    assert carried.evaluator.params["carry_system_changes"] is True
    assert "carry_system_changes" not in task.evaluator.params


def test_generation_reads_harbor_and_container_swebench_sources(instances):
    from rolloutd.generation.sources import read_rows, row_to_task
    from rolloutd.workflows.generation.models import GenerationSpec

    template = {
        "harness": {"type": "qwen_code", "profile": "compact"},
        "runtime": {"type": "podman"},
        "num_samples": 4,
        "sampling": {"temperature": 0.6, "max_tokens": 300},
    }
    spec = GenerationSpec.model_validate(
        {
            "name": "tb",
            "outputs": {"dir": "/tmp/unused"},
            "source": {"type": "harbor", "path": str(HARBOR)},
            "template": template,
        }
    )
    rows = read_rows(spec.source)
    assert [key for key, _ in rows][:2] == ["archive-text-files", "csv-column-stats"]
    task = row_to_task(spec, *rows[1])
    assert task.task_id == "gen-tb-csv-column-stats" and task.num_samples == 4
    assert task.evaluator.type == "harbor" and task.runtime.build is not None
    assert (task.sampling.temperature, task.sampling.max_tokens) == (0.6, 300)
    assert task.metadata["generation"] == "tb" and task.metadata["task_set"] == "harbor"
    swe = spec.model_copy(
        update={
            "source": spec.source.model_copy(update={"type": "swebench", "path": str(instances)})
        }
    )
    key, row = read_rows(swe.source)[2]
    task = row_to_task(swe, key, row)
    assert task.runtime.build is not None and task.runtime.workdir == "/testbed"
    assert task.evaluator.params["eval_script"].startswith("#!/bin/bash")


async def test_swebench_eval_script_logs_are_graded_by_the_swebench_package(instances):
    (task,) = [t for t in read_task_set("swebench", instances, NOP) if "idna" in t.task_id]
    evaluator = get_evaluator(task.evaluator)
    f2p = task.evaluator.params["fail_to_pass"]
    p2p = task.evaluator.params["pass_to_pass"]

    def log(status: str, exit_code: int, extra: str = "") -> str:
        lines = [f"{status} {t}" for t in f2p] + [f"PASSED {t}" for t in p2p]
        return (
            f"{extra}>>>>> Start Test Output\n" + "\n".join(lines) + "\n>>>>> End Test Output\n"
            f">>>>> Test Exit Code: {exit_code}\n"
        )

    async def score(stdout: str) -> tuple[float | None, dict]:
        check = {
            "exit_code": 0,
            "stdout": stdout,
            "timed_out": False,
            "test_patch_applied": ">>>>> Patch Apply Failed" not in stdout,
            "tests": {},
        }
        ctx = EvaluationContext(
            task_id="t", session_id="s", status=SessionStatus.COMPLETED, artifacts={"check": check}
        )
        outcome = await evaluator.evaluate(ctx)
        return outcome.reward, outcome.details

    reward, details = await score(log("PASSED", 0))
    assert (reward, details["grader"], details["resolution_status"]) == (
        1.0,
        "swebench",
        "RESOLVED_FULL",
    )
    assert (await score(log("FAILED", 1)))[0] == 0.0
    # a log that says PASSED while the test command failed is not believed (get_logs_eval)
    assert (await score(log("PASSED", 1)))[0] == 0.0
    assert (await score(log("PASSED", 0, ">>>>> Patch Apply Failed\n")))[0] == 0.0


def test_submit_reads_a_task_set_from_the_command_line(instances):
    from rolloutd.cli.parser import build_parser
    from rolloutd.cli.submission import read_task_set

    def _task_set(args):
        return read_task_set(args.file, args.task_set, args.harness, args.options)

    args = build_parser().parse_args(
        [
            "submit",
            str(HARBOR),
            "--task-set",
            "harbor",
            "--harness",
            "oracle",
            "--options",
            '{"num_samples": 2, "task_id_prefix": "cli-"}',
        ]
    )
    tasks = _task_set(args)
    assert len(tasks) >= 6
    assert all(t["harness"]["type"] == "oracle" and t["num_samples"] == 2 for t in tasks)
    assert tasks[0]["task_id"] == "cli-archive-text-files"
    args = build_parser().parse_args(
        ["submit", str(instances), "--task-set", "swebench", "--harness", '{"type": "codex"}']
    )
    assert {t["harness"]["type"] for t in _task_set(args)} == {"codex"}
    bad = build_parser().parse_args(
        ["submit", str(HARBOR), "--task-set", "harbor", "--options", '{"shiny": 1}']
    )
    with pytest.raises(SystemExit, match="shiny"):
        _task_set(bad)


def test_options_are_strict_where_written_and_lenient_where_a_worker_reads_them():
    from pydantic import ValidationError

    from rolloutd.tasksets import row_task, task_set_rows
    from rolloutd.trainer_client.buffer import create_buffer
    from rolloutd.workflows.buffer.models import TaskSource

    typo = {**NOP, "num_sample": 8}
    with pytest.raises(ValidationError, match="did you mean 'num_samples'"):
        read_task_set("harbor", HARBOR, typo)
    # a field of a later build in a payload: the source and the worker's row read accept it
    newer = {**NOP, "num_samples": 2, "field_of_a_later_build": 1}
    source = TaskSource(type="harbor", path=str(HARBOR), options=newer)
    (row, *_) = task_set_rows("harbor", HARBOR)
    assert row_task("harbor", row, source.options or {}, path=HARBOR).num_samples == 2
    # the trainer that starts a buffer is told, before anything starts
    config = {"buffer_id": "b", "source": {"type": "harbor", "path": str(HARBOR), "options": typo}}
    with pytest.raises(ValidationError, match="did you mean 'num_samples'"):
        asyncio.run(create_buffer(None, config))  # type: ignore[arg-type]
    config["source"]["optons"] = config["source"].pop("options")  # type: ignore[index]
    with pytest.raises(ValidationError, match="did you mean 'options'"):
        asyncio.run(create_buffer(None, config))  # type: ignore[arg-type]
