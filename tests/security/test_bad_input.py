"""Bad input gets a clear error: what a user writes (a task dict or file, a POLAR body, a buffer
source's line, a generation spec) is checked strictly and refused with the field's name, while
Temporal payload models keep ignoring unknown fields (old and new workers interoperate). A bad
buffer-source line is reported with its line number and skipped (counted), never failing the
buffer. A sandbox host's policy refusal is the task's fault, never a sandbox failure. Each test
fails when its guard is removed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from pydantic import ValidationError

from rolloutd.activities.models import ReadTaskChunkInput
from rolloutd.activities.trainer_io import TrainerIOActivities
from rolloutd.cli.report import infrastructure_failure
from rolloutd.fault import Fault, refusal_fault
from rolloutd.generation.commands import load_spec
from rolloutd.payload import unknown_fields, validate_strict
from rolloutd.rest import create_app
from rolloutd.trainer_client import RolloutClient
from rolloutd.trainer_client.client import InvalidTaskError, validate_task
from rolloutd.types import TaskRequest
from rolloutd.workflows.session.failures import SessionFacts, classify
from tests.support.buffer_tasks import all_win, local_task, poll
from tests.support.namespaces import fresh_namespace


def shell_task(**fields: object) -> dict:
    """A minimal valid task dict, with ``fields`` merged in at the top level."""
    return {
        "task_id": f"t-{uuid.uuid4().hex[:6]}",
        "instruction": "do it",
        "harness": {"type": "shell", "command": "true"},
        **fields,
    }


def error_locs(e: InvalidTaskError) -> dict[str, str]:
    return dict(e.errors)


# --------------------------------------------------------------------------- unknown fields


def test_an_unknown_task_field_is_refused_by_name_with_the_field_meant() -> None:
    with pytest.raises(InvalidTaskError) as caught:
        validate_task(shell_task(num_sample=8))
    errors = error_locs(caught.value)
    assert list(errors) == ["num_sample"]
    assert "unknown field 'num_sample'" in errors["num_sample"]
    assert "did you mean 'num_samples'" in errors["num_sample"]


def test_unknown_fields_are_found_at_any_depth_with_their_paths() -> None:
    task = shell_task(
        runtime={
            "type": "bwrap",
            "prepare": [
                {"type": "exec", "command": "ls"},
                {"type": "upload", "source": "/srv/x", "extrct": True},
            ],
            "build_args": {},
        },
        evaluator={"type": "session_completed", "runtime_spec": {"netwrk": "none"}},
        sampling={"temprature": 0.5},
    )
    with pytest.raises(InvalidTaskError) as caught:
        validate_task(task)
    errors = error_locs(caught.value)
    assert set(errors) == {
        "runtime.prepare.1.extrct",
        "runtime.build_args",
        "evaluator.runtime_spec.netwrk",
        "sampling.temprature",
    }
    assert "did you mean 'extract'" in errors["runtime.prepare.1.extrct"]
    assert "did you mean 'temperature'" in errors["sampling.temprature"]


def test_free_form_fields_and_a_valid_task_pass_the_strict_check() -> None:
    task = shell_task(metadata={"anything": {"nested": 1}}, runtime={"env": {"LANG": "C"}})
    assert unknown_fields(TaskRequest, task) == []
    assert validate_task(task).metadata == {"anything": {"nested": 1}}


def test_temporal_payload_models_keep_ignoring_unknown_fields() -> None:
    # a newer worker's field reaching an older one: ignored, not refused (payload evolution)
    payload = TaskRequest.model_validate(shell_task(field_of_a_newer_version=1))
    assert not hasattr(payload, "field_of_a_newer_version")
    with pytest.raises(ValidationError, match="unknown field 'field_of_a_newer_version'"):
        validate_strict(TaskRequest, shell_task(field_of_a_newer_version=1))


def test_a_generation_spec_file_with_an_unknown_field_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "hi"}\n')
    spec = {
        "name": "g",
        "source": {"type": "jsonl", "path": str(data)},
        "outputs": {"dir": str(tmp_path / "out")},
        "template": {"instruction": "{prompt}", "harness": {"type": "shell", "command": "true"}},
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    assert load_spec(path).name == "g"
    path.write_text(json.dumps({**spec, "num_sampels": 4}))
    with pytest.raises(ValidationError) as caught:
        load_spec(path)
    assert [e["loc"] for e in caught.value.errors() if e["type"] == "unknown_field"] == [
        ("num_sampels",)
    ]


# --------------------------------------------------------------------------- enums, names


def test_an_unknown_enum_value_is_refused() -> None:
    with pytest.raises(InvalidTaskError) as caught:
        validate_task(shell_task(runtime={"type": "bwrap", "network": "hostt"}))
    assert list(error_locs(caught.value)) == ["runtime.network"]


@pytest.mark.parametrize(
    "where",
    [
        lambda env: {"runtime": {"env": env}},
        lambda env: {"harness": {"type": "shell", "command": "true", "env": env}},
        lambda env: {"runtime": {"prepare": [{"type": "exec", "command": "ls", "env": env}]}},
    ],
    ids=["runtime.env", "harness.env", "prepare.env"],
)
@pytest.mark.parametrize("name", ["A=B", "1X", "", "A B", "X-Y"])
def test_an_environment_variable_name_is_validated_at_submit(where, name: str) -> None:
    with pytest.raises(InvalidTaskError, match="environment variable name"):
        validate_task(shell_task(**where({name: "v"})))


def test_a_nul_byte_in_an_environment_value_is_refused() -> None:
    with pytest.raises(InvalidTaskError, match="NUL"):
        validate_task(shell_task(runtime={"env": {"A": "x\x00y"}}))


@pytest.mark.parametrize(
    "paths", [["a/b", "a__b"], ["out/x.txt", "out//x.txt"], ["a/./b", "a/b"], ["c", "c/"]]
)
def test_artifact_paths_stored_under_one_name_are_refused(paths: list[str]) -> None:
    with pytest.raises(InvalidTaskError, match="would be stored under one name"):
        validate_task(shell_task(runtime={"artifacts": paths}))


def test_distinct_artifact_paths_pass() -> None:
    task = validate_task(shell_task(runtime={"artifacts": ["a/b", "a_b", "a/b.txt"]}))
    assert task.runtime.artifacts == ["a/b", "a_b", "a/b.txt"]


# --------------------------------------------------------------------------- REST bodies


@pytest.fixture
async def rest(temporal_server):
    """The REST facade on a real Temporal client; every request here is refused before any
    workflow starts, so no fleet is needed."""
    # a namespace of its own: no fleet has registered there, whatever else the session runs
    namespace = await fresh_namespace(temporal_server.address, "badinput")
    client = await RolloutClient.connect(temporal_server.address, namespace=namespace)
    client.registry_wait_s = 0.0  # no fleet registers here: refuse at once
    app = create_app(client)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://rest"
    ) as http:
        yield http


def polar(**fields: object) -> dict:
    body = {
        "task_id": f"p-{uuid.uuid4().hex[:6]}",
        "instruction": "do it",
        "agent": {"harness": "shell", "settings": {"command": "true"}},
        "evaluator": {"strategy": "session_completed"},
    }
    for key, value in fields.items():
        if isinstance(value, dict) and isinstance(body.get(key), dict):
            body[key] = {**body[key], **value}
        else:
            body[key] = value
    return body


@pytest.mark.temporal
@pytest.mark.parametrize(
    ("fields", "loc"),
    [
        ({"num_sample": 8}, ["num_sample"]),
        ({"agent": {"import_pth": "x:y"}}, ["agent", "import_pth"]),
        ({"runtime": {"backend": "bwrap", "import_path": "x:y"}}, ["runtime", "import_path"]),
        ({"evaluator": {"strategy": "session_completed", "cfg": {}}}, ["evaluator", "cfg"]),
        ({"sampling": {"temprature": 0.3}}, ["sampling", "temprature"]),
        ({"runtime": {"backend": "bwrap", "network": "hostt"}}, ["runtime", "network"]),
        ({"agent": {"env": {"A=B": "1"}}}, ["agent", "env"]),
    ],
)
async def test_a_rest_body_with_an_unknown_field_or_value_is_refused_by_name(
    rest, fields: dict, loc: list[str]
) -> None:
    response = await rest.post("/rollout/task/submit", json=polar(**fields))
    assert response.status_code == 422, response.text
    assert [d["loc"] for d in response.json()["detail"]] == [loc]


@pytest.mark.temporal
async def test_documented_polar_fields_are_accepted_and_ignored(rest) -> None:
    body = polar(
        early_stop_min_usable_sessions=1,
        runtime={"backend": "bwrap", "gpus": 0, "allow_internet": True, "storage_mb": 10},
    )
    # accepted: the body gets past the field checks to the capability check, which finds no
    # registered host here and names the harness and the evaluator, not the ignored fields
    response = await rest.post("/rollout/task/submit", json=body)
    assert response.status_code == 422, response.text
    assert "unknown field" not in response.text
    assert [d["loc"] for d in response.json()["detail"]] == [
        ["agent", "harness"],
        ["evaluator", "strategy"],
    ]


@pytest.mark.temporal
async def test_an_add_llm_server_body_with_an_unknown_field_is_refused(rest) -> None:
    response = await rest.post("/add_llm_server", json={"address": "http://x", "typ": "vllm"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "typ"]


# --------------------------------------------------------------------------- buffer sources


async def test_bad_source_lines_are_reported_by_line_number_and_skipped(tmp_path: Path) -> None:
    good = shell_task()
    lines = [
        "# a comment",
        json.dumps(good),
        "[1]",
        "",
        "{not json",
        json.dumps(shell_task(num_sample=2)),
        '"a string"',
        json.dumps(shell_task()),
    ]
    source = tmp_path / "tasks.jsonl"
    source.write_text("\n".join(lines) + "\n")
    io = TrainerIOActivities()
    try:
        out = await io.read_task_chunk(ReadTaskChunkInput(path=str(source), limit=100))
    finally:
        await io.aclose()
    assert [t.task_id for t in out.tasks] == [good["task_id"], json.loads(lines[7])["task_id"]]
    assert [e.split(":")[0] for e in out.errors] == ["line 3", "line 5", "line 6", "line 7"]
    assert "a task is a JSON object, not list" in out.errors[0]
    assert "not JSON" in out.errors[1]
    assert "unknown field 'num_sample'" in out.errors[2]
    assert out.exhausted and out.next_offset == 6


@pytest.mark.temporal
@pytest.mark.engine
async def test_a_buffer_skips_and_counts_bad_lines_and_runs_the_good_ones(
    fleets, tmp_path: Path
) -> None:
    u = uuid.uuid4().hex[:6]
    source = tmp_path / "tasks.jsonl"
    rows = ["[1]", json.dumps(local_task(f"ok-{u}", all_win())), "{oops", '{"task_id": 1}']
    source.write_text("\n".join(rows) + "\n")
    client = RolloutClient(fleets.client)
    buffer = await client.create_buffer(
        {
            "buffer_id": f"bad-src-{u}",
            "num_in_flight": 2,
            "num_samples": 2,
            "drop_zero_variance": False,
            "source": {"type": "jsonl", "path": str(source), "chunk_size": 2},
        }
    )
    try:
        batch = await buffer.take(1, timeout_s=120)
        assert [g.group.task_id for g in batch.groups] == [f"ok-{u}"]
        stats = await poll(buffer.stats, lambda s: s.source_exhausted, what="source read")
        assert stats.state_counters["num_source_errors"] == 3
        assert [e.split(":")[0] for e in stats.source_errors] == ["line 1", "line 3", "line 4"]
        assert not stats.closed
    finally:
        await buffer.close()


# --------------------------------------------------------------------------- whose fault


def test_a_policy_refusal_on_the_host_is_the_tasks_fault_not_a_sandbox_failure() -> None:
    facts = SessionFacts(
        failed_phase="provision",
        error="runtime r1: runtime.network='host' is outside the sandbox policy",
        error_type="PolicyError",
        non_retryable=True,
    )
    cause = classify(facts)
    assert cause is not None
    assert (cause.kind, cause.retryable) == ("refused", False)
    assert refusal_fault("PolicyError") is Fault.TASK
    # not an infrastructure cause: `rolloutd submit` does not count it as one
    assert not infrastructure_failure(SimpleNamespace(failure=cause))
    # a runtime that failed to start for another reason stays the sandbox's
    other = classify(
        SessionFacts(failed_phase="provision", error="x", error_type="RuntimeStartError")
    )
    assert other is not None and other.kind == "sandbox" and other.retryable


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("[1]", "tasks.jsonl:2: a task is a JSON object, not list"),
        ("{oops", "tasks.jsonl:2: not JSON"),
        (json.dumps(shell_task(num_sample=8)), "num_sample: unknown field 'num_sample'"),
    ],
)
def test_rolloutd_submit_refuses_a_bad_task_file_before_connecting(
    tmp_path: Path, line: str, message: str
) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(shell_task()) + "\n" + line + "\n")
    # the address is never dialled: the file is refused first
    run = subprocess.run(
        [sys.executable, "-m", "rolloutd.cli", "submit", str(path), "--address", "127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1 and message in run.stderr, run.stderr
