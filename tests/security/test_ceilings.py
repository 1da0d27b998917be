"""The operator's ceilings: the sandbox policy's default and maximum limits. A task asking
above a maximum is refused naming the field (at submit, by the policy the hosts publish, and
again on the host); a task asking nothing gets the defaults where its runtime starts. The
real-fleet submit and the host's refusal are in test_sandbox_policy.py; enforcement while a
session runs is in tests/sandbox/test_ceilings_bwrap.py."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from rolloutd.capabilities import FleetCapabilities, HostCapabilities, check_task
from rolloutd.sandbox.runtimes import create_runtime
from rolloutd.sandbox_policy import (
    DEFAULT_LIMITS,
    LIMIT_FIELDS,
    MAX_LIMITS,
    SandboxPolicy,
    with_default_limits,
)
from rolloutd.types import RuntimeSpec, TaskRequest


def fleets_with(*policies: SandboxPolicy) -> FleetCapabilities:
    now = datetime.now(UTC)
    hosts = [
        HostCapabilities(
            fleet="sandbox",
            host_id=f"h{i}",
            instance_id=f"i{i}",
            harnesses={"shell": None},
            policy=policy,
            started_at=now,
        )
        for i, policy in enumerate(policies)
    ]
    hosts.append(
        HostCapabilities(
            fleet="eval", host_id="e", instance_id="e", evaluators=["session_completed"]
        )
    )
    return FleetCapabilities(hosts=hosts)


def task(runtime: dict, **extra: object) -> TaskRequest:
    return TaskRequest.model_validate(
        {
            "task_id": "t",
            "instruction": "x",
            "harness": {"type": "shell", "command": "true"},
            "runtime": runtime,
            **extra,
        }
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_processes", 100_000),
        ("memory_mb", 100_000),
        ("cpus", 64.0),
        ("disk_mb", 10**6),
        ("tmpfs_mb", 100_000),
    ],
)
def test_a_task_above_a_maximum_is_refused_naming_the_field(field: str, value: float) -> None:
    errors = check_task(task({"type": "bwrap", field: value}), fleets_with(SandboxPolicy()))
    ((path, message),) = errors
    assert path == f"runtime.{field}"
    assert f"max_limits.{field}: {getattr(MAX_LIMITS, field)}" in message
    assert "above the maximum" in message and "h0" in message
    # at the maximum it passes
    at_max = task({"type": "bwrap", field: getattr(MAX_LIMITS, field)})
    assert check_task(at_max, fleets_with(SandboxPolicy())) == []


def test_the_strictest_registered_host_decides_and_the_evaluators_runtime_counts() -> None:
    small = SandboxPolicy(max_limits={"memory_mb": 1024})
    fleets = fleets_with(SandboxPolicy(), small)
    ((path, message),) = check_task(task({"type": "bwrap", "memory_mb": 2048}), fleets)
    assert path == "runtime.memory_mb" and "h1" in message and "1024" in message
    fresh = task(
        {"type": "bwrap"},
        evaluator={
            "type": "session_completed",
            "runtime": "fresh",
            "runtime_spec": {"type": "bwrap", "tmpfs_mb": 10**6},
        },
    )
    ((path, _),) = check_task(fresh, fleets_with(SandboxPolicy()))
    assert path == "evaluator.runtime_spec.tmpfs_mb"


def test_a_task_that_asks_nothing_gets_the_defaults_where_its_runtime_starts(
    tmp_path: Path,
) -> None:
    runtime = create_runtime(
        RuntimeSpec(type="bwrap", memory_mb=512), "r1", tmp_path, policy=SandboxPolicy()
    )
    assert runtime.spec.memory_mb == 512  # asked: kept
    for name in set(LIMIT_FIELDS) - {"memory_mb"}:
        assert getattr(runtime.spec, name) == getattr(DEFAULT_LIMITS, name), name
    # a trusted caller without a policy (tests, benchmarks) gets none
    assert create_runtime(RuntimeSpec(type="bwrap"), "r2", tmp_path).spec.memory_mb is None


def test_the_local_runtime_gets_no_default_it_could_not_enforce() -> None:
    spec = RuntimeSpec(type="local")
    assert with_default_limits(spec, SandboxPolicy(runtimes=["local"])) == spec


def test_an_operator_naming_one_limit_keeps_the_other_defaults_and_null_means_none() -> None:
    policy = SandboxPolicy.model_validate(
        {"default_limits": {"memory_mb": 2048}, "max_limits": {"cpus": None}}
    )
    assert policy.default_limits.memory_mb == 2048
    assert policy.default_limits.disk_mb == DEFAULT_LIMITS.disk_mb
    assert policy.max_limits.cpus is None
    assert check_task(task({"type": "bwrap", "cpus": 500}), fleets_with(policy)) == []
    # no default but a maximum: a task asking nothing runs at the maximum, never above it
    no_default = SandboxPolicy.model_validate({"default_limits": {"disk_mb": None}})
    assert with_default_limits(RuntimeSpec(), no_default).disk_mb == MAX_LIMITS.disk_mb


def test_a_default_above_its_maximum_is_refused_naming_both() -> None:
    with pytest.raises(
        ValidationError,
        match=r"default_limits.memory_mb=9000 is above "
        r"max_limits.memory_mb=8000",
    ):
        SandboxPolicy.model_validate(
            {"default_limits": {"memory_mb": 9000}, "max_limits": {"memory_mb": 8000}}
        )


def test_a_newer_hosts_unknown_limit_is_left_out_of_its_published_policy() -> None:
    host = HostCapabilities.model_validate(
        {
            "fleet": "sandbox",
            "host_id": "h",
            "instance_id": "i",
            "policy": {"max_limits": {"memory_mb": 1000, "gpus": 1}, "later_setting": True},
        }
    )
    assert host.policy is not None and host.policy.max_limits.memory_mb == 1000
