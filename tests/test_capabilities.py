"""What the fleets can run, and the check of a task against it (no server: the registry's and
the REST facade's end-to-end behaviour is in tests/test_rest.py).

A host publishes the harness adapters whose CLI it has; a task naming a harness no host can run,
an unknown evaluator, or any of them before a host registered, is refused naming the field; a
POLAR request maps onto a TaskRequest as docs/polar.md's table says.
"""

from __future__ import annotations

import importlib.metadata

import pytest

from rolloutd.capabilities import FleetCapabilities, HostCapabilities, check_task
from rolloutd.polar import PolarTaskRequest, polar_path, to_task_request
from rolloutd.sandbox.harnesses import HARNESSES, harness_capabilities
from rolloutd.types import TaskRequest


def _task(harness: str = "shell", evaluator: str = "session_completed") -> TaskRequest:
    return TaskRequest(
        task_id="t",
        instruction="x",
        harness={"type": harness, "command": "true"},
        evaluator={"type": evaluator},
    )


def _fleets(harnesses=None, missing=None, evaluators=("session_completed",)) -> FleetCapabilities:
    return FleetCapabilities(
        hosts=[
            HostCapabilities(
                fleet="sandbox",
                host_id="h1",
                instance_id="a",
                harnesses=harnesses if harnesses is not None else {"shell": None},
                missing_harnesses=missing or {},
            ),
            HostCapabilities(
                fleet="eval", host_id="h1", instance_id="b", evaluators=list(evaluators)
            ),
        ]
    )


def test_a_runnable_task_passes():
    assert check_task(_task(), _fleets()) == []


def test_no_registered_host_refuses_with_a_message_saying_so():
    errors = dict(check_task(_task(), FleetCapabilities()))
    assert "no sandbox fleet has registered" in errors["harness.type"]
    assert "no eval fleet has registered" in errors["evaluator.type"]
    assert "check_capabilities=False" in errors["harness.type"]


@pytest.mark.parametrize(
    ("harness", "missing", "expected"),
    [
        ("codex", {}, "'codex' has no adapter on any sandbox host; available: shell"),
        (
            "qwen_code",
            {"qwen_code": "cli.js not found"},
            "'qwen_code' cannot run on any sandbox host (1 of 1 lack it; h1: cli.js not found)",
        ),
    ],
)
def test_a_harness_no_host_can_run_is_refused(harness, missing, expected):
    (error,) = check_task(_task(harness), _fleets(missing=missing))
    assert error[0] == "harness.type" and expected in error[1]


def test_an_evaluator_outside_the_eval_fleets_registry_is_refused():
    (error,) = check_task(_task(evaluator="swebench_harness"), _fleets())
    assert error[0] == "evaluator.type"
    assert "'swebench_harness' is not in the eval fleet's registry" in error[1]


def test_a_host_publishes_every_adapter_and_why_it_cannot_run_one(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLLOUTD_NPM_PREFIX", str(tmp_path))  # no CLI installed there
    monkeypatch.setenv("ROLLOUTD_TOOLS_DIR", str(tmp_path))
    harnesses, missing = harness_capabilities()
    # shell, cli and oracle (a task's own solution script) need no CLI of ours; python needs
    # the openai SDK in rolloutd's environment
    assert harnesses == {
        "shell": None,
        "cli": None,
        "oracle": None,
        "python": importlib.metadata.version("openai"),
    }
    assert set(missing) == set(HARNESSES) - {"shell", "cli", "oracle", "python"}
    assert "not found" in missing["qwen_code"]
    assert "scripts/setup.sh" in missing["codex"] and "scripts/setup.sh" in missing["aider"]


def test_polar_a3_fields_map_onto_a_task_request():
    polar = PolarTaskRequest.model_validate(
        {
            "task_id": "a3",
            "instruction": "fix it",
            "timeout_seconds": 1800,
            "runtime": {"backend": "bwrap"},
            "agent": {"harness": "qwen-code", "model_name": "Qwen3-8B"},
            "builder": {"strategy": "per_request"},
            "evaluator": {
                "strategy": "swebench_harness",
                "config": {"refresh_runtime": True, "fail_to_pass": ["t::a"]},
            },
        }
    )
    task = TaskRequest.model_validate(to_task_request(polar))
    assert (task.harness.type, task.model, task.runtime.type, task.builder.type) == (
        "qwen_code",
        "Qwen3-8B",
        "bwrap",
        "per_request",
    )
    assert (task.evaluator.type, task.evaluator.runtime) == ("swebench", "fresh")
    assert task.evaluator.params == {"fail_to_pass": ["t::a"]}
    assert task.timeout_s == 1800
    assert polar_path("evaluator.type") == "evaluator.strategy"
    assert polar_path("harness.type") == "agent.harness"
    assert polar_path("evaluator.params.fail_to_pass") == "evaluator.config.fail_to_pass"
    assert polar_path("num_samples") == "num_samples"


def test_registrations_of_other_versions_are_read():
    """A newer host's registration (fields, policy settings this version does not know) is
    read by an older client: Temporal payloads ignore unknown fields."""
    host = HostCapabilities.model_validate(
        {
            "fleet": "sandbox",
            "host_id": "h",
            "instance_id": "i",
            "a_later_field": 1,
            "policy": {"runtimes": ["bwrap"], "a_later_setting": True},
        }
    )
    assert host.policy is not None and host.policy.runtimes == ["bwrap"]
    assert FleetCapabilities.model_validate({"hosts": [], "later": 2}).hosts == []


def test_a_task_sets_host_folders_are_refused_at_submit_outside_upload_sources():
    """The Harbor examples name three host folders a sandbox host reads: the build context
    (image_roots), the oracle's solution and the verifier's tests (upload_sources); a policy
    without them refuses each at submit, naming the setting; the policy docs/task_sets.md gives
    for the examples allows them (the control)."""
    from pathlib import Path

    from rolloutd.sandbox_policy import SandboxPolicy
    from rolloutd.tasksets import read_task_set

    examples = Path(__file__).resolve().parents[1] / "examples" / "harbor"
    (task, *_) = read_task_set("harbor", examples, {"harness": {"type": "oracle"}})

    def fleets(policy: SandboxPolicy) -> FleetCapabilities:
        published = _fleets(harnesses={"oracle": None}, evaluators=("harbor",))
        published.hosts[0].runtimes = ["local", "podman"]
        published.hosts[0].policy = policy
        return published

    errors = dict(check_task(task, fleets(SandboxPolicy())))
    assert set(errors) == {
        "runtime.build.context",
        "harness.solution",
        "evaluator.params.tests_dir",
    }
    assert "image_roots: none" in errors["runtime.build.context"]
    for field in ("harness.solution", "evaluator.params.tests_dir"):
        assert "upload_sources: none" in errors[field]
        assert "ROLLOUTD_SANDBOX_POLICY" in errors[field]
    folder = str(examples.parent)
    allowed = SandboxPolicy(image_roots=[folder], upload_sources=[folder], build_network=True)
    assert check_task(task, fleets(allowed)) == []
