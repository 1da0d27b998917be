"""The host decides the isolation: each input a tenant or a task file could use to widen its
sandbox is refused at submit (by the policy the sandbox hosts publish, or by the task's own
validation), and again where the runtime starts; what gets that far is contained (the harness
cannot read the host file). Each test fails when its guard is removed."""

from __future__ import annotations

import contextlib
import shutil
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import ActivityEnvironment

from rolloutd.activities.models import ProvisionRuntimeInput
from rolloutd.activities.sandbox import SandboxActivities
from rolloutd.capabilities import FleetCapabilities, HostCapabilities, check_task
from rolloutd.errors import PolicyError
from rolloutd.polar import PolarTaskRequest, to_task_request
from rolloutd.sandbox.runtimes import create_runtime, verified_runtimes
from rolloutd.sandbox.runtimes.containers import ApptainerRuntime
from rolloutd.sandbox.runtimes.podman import DockerRuntime, PodmanRuntime
from rolloutd.sandbox.runtimes.podman_images import BASE_IMAGE, build_images
from rolloutd.sandbox_policy import SandboxPolicy, violations
from rolloutd.settings import CommonSettings, EvalSettings, SandboxSettings
from rolloutd.store import BlobStore
from rolloutd.trainer_client import RolloutClient
from rolloutd.trainer_client.client import InvalidTaskError
from rolloutd.types import EvaluatorSpec, ImageBuild, RuntimeSpec, TaskRequest
from rolloutd.workers import connect, run_fleet
from tests.support.namespaces import fresh_namespace

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bubblewrap")


def fleets_with(policy: SandboxPolicy) -> FleetCapabilities:
    """A registry answer: one sandbox host with ``policy``, one eval host."""
    now = datetime.now(UTC)
    return FleetCapabilities(
        hosts=[
            HostCapabilities(
                fleet="sandbox",
                host_id="h1",
                instance_id="i1",
                harnesses={"shell": None},
                policy=policy,
                started_at=now,
            ),
            HostCapabilities(
                fleet="eval", host_id="e1", instance_id="i2", evaluators=["session_completed"]
            ),
        ]
    )


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


# ---------------------------------------------------------------- refused at submit


def test_the_local_runtime_is_refused_unless_the_operator_allows_it() -> None:
    errors = check_task(task({"type": "local"}), fleets_with(SandboxPolicy()))
    assert [path for path, _ in errors] == ["runtime.type"]
    message = errors[0][1]
    assert "runtime.type='local' is outside the sandbox policy" in message
    assert "runtimes: bwrap, podman, apptainer, docker" in message and "h1" in message
    allowing = SandboxPolicy(runtimes=["local", "bwrap"])
    assert check_task(task({"type": "local"}), fleets_with(allowing)) == []


def test_a_runtime_no_sandbox_host_has_installed_is_refused() -> None:
    fleets = fleets_with(SandboxPolicy())
    fleets.hosts[0].runtimes = ["local", "bwrap", "podman"]
    ((path, message),) = check_task(task({"type": "docker", "image": "debian"}), fleets)
    assert path == "runtime.type" and "not installed on any sandbox host" in message
    assert check_task(task({"type": "podman"}), fleets) == []


def test_the_hosts_root_as_an_image_and_the_host_network_are_refused() -> None:
    errors = dict(
        check_task(
            task({"type": "bwrap", "image": "/", "network": "host"}), fleets_with(SandboxPolicy())
        )
    )
    assert set(errors) == {"runtime.image", "runtime.network"}
    assert "the host's root is never an image" in errors["runtime.image"]
    assert "networks: gateway, none" in errors["runtime.network"]
    # even an operator cannot name / as an image root
    with pytest.raises(ValidationError, match="whole file system"):
        SandboxPolicy(image_roots=["/"])


def test_a_task_refused_on_several_fields_is_told_the_whole_policy_once() -> None:
    policy = SandboxPolicy()
    spec = {"type": "bwrap", "image": "/", "network": "host", "memory_mb": 10**6}
    errors = check_task(task(spec), fleets_with(policy))
    assert {path for path, _ in errors} == {"runtime.image", "runtime.network", "runtime.memory_mb"}
    assert sum(policy.describe() in message for _, message in errors) == 1
    # each still names the setting that refuses it, and the hosts whose policy it is
    memory = dict(errors)["runtime.memory_mb"]
    assert "max_limits.memory_mb" in memory and "policy of sandbox host" in memory


def test_a_task_may_narrow_the_network_but_not_widen_it() -> None:
    gateway_only = SandboxPolicy(networks=["gateway"])
    assert violations(RuntimeSpec(type="bwrap", network="none"), gateway_only) == []
    assert violations(RuntimeSpec(type="bwrap", network="host"), gateway_only)


def test_an_image_folder_outside_the_image_roots_is_refused(tmp_path: Path) -> None:
    policy = SandboxPolicy(image_roots=[str(tmp_path / "images")])
    inside = RuntimeSpec(type="bwrap", image=str(tmp_path / "images" / "debian"))
    outside = RuntimeSpec(type="bwrap", image=str(tmp_path / "elsewhere"))
    assert violations(inside, policy) == []
    assert [p for p, _ in violations(outside, policy)] == ["runtime.image"]
    with pytest.raises(ValidationError, match="without '..'"):
        RuntimeSpec(type="bwrap", image=f"{tmp_path}/images/../elsewhere")


@pytest.mark.parametrize(
    "source",
    ["/proc/self/environ", "/root/.rolloutd/admin_token", "s3://bucket/secrets", "relative"],
)
def test_upload_sources_outside_the_policy_are_refused(source: str) -> None:
    spec = task({"type": "bwrap", "prepare": [{"type": "upload", "source": source}]})
    errors = check_task(spec, fleets_with(SandboxPolicy()))
    assert [path for path, _ in errors] == ["runtime.prepare[0].source"]
    assert "upload_sources: none" in errors[0][1]


def test_upload_sources_inside_the_policy_pass() -> None:
    policy = SandboxPolicy(upload_sources=["/srv/tasks", "s3://bucket/tasks/"])
    for source in ("/srv/tasks/repo", "s3://bucket/tasks/a.tar"):
        spec = task({"type": "bwrap", "prepare": [{"type": "upload", "source": source}]})
        assert check_task(spec, fleets_with(policy)) == []
    for source in ("/srv/tasks/../../proc/self/environ", "s3://bucket/other", "/srv/tasksx"):
        spec = task({"type": "bwrap", "prepare": [{"type": "upload", "source": source}]})
        assert check_task(spec, fleets_with(policy)), source


def test_the_evaluators_fresh_runtime_is_checked_too() -> None:
    request = task(
        {"type": "bwrap"},
        evaluator={"runtime": "fresh", "runtime_spec": {"type": "local"}},
    )
    errors = check_task(request, fleets_with(SandboxPolicy()))
    assert [path for path, _ in errors] == ["evaluator.runtime_spec.type"]


def test_a_container_image_option_and_a_bind_in_a_workdir_are_refused() -> None:
    with pytest.raises(ValidationError, match="not an image name"):
        RuntimeSpec(type="docker", image="--privileged")
    with pytest.raises(ValidationError, match="workdir"):
        RuntimeSpec(type="apptainer", image="/images/a.sif", workdir="/tmp/x,/:/host")


def test_an_evaluator_import_path_is_refused() -> None:
    with pytest.raises(ValidationError, match="import paths are not accepted"):
        EvaluatorSpec(type="sys:exit")


def test_a_polar_image_never_becomes_the_local_runtime() -> None:
    polar = PolarTaskRequest.model_validate(
        {
            "task_id": "p",
            "instruction": "x",
            "runtime": {"backend": "local", "image": "swebench/sweb.eval.x86_64.astropy:latest"},
            "agent": {"harness": "shell", "settings": {"command": "true"}},
        }
    )
    runtime = TaskRequest.model_validate(to_task_request(polar)).runtime
    assert (runtime.type, runtime.image) == ("podman", "swebench/sweb.eval.x86_64.astropy:latest")


# ---------------------------------------------------------------- container argv


def test_container_command_lines_end_options_before_the_image(tmp_path: Path) -> None:
    for runtime in (
        DockerRuntime(RuntimeSpec(type="docker", image="debian:12"), "d1", tmp_path),
        PodmanRuntime(RuntimeSpec(type="podman", image="debian:12"), "p1", tmp_path),
    ):
        runtime.image = runtime.spec.image or ""
        argv = runtime.run_argv()
        assert argv[argv.index("--") + 1] == "debian:12"
        assert "--privileged" not in argv
    apptainer = ApptainerRuntime(RuntimeSpec(type="apptainer", image="/i/a.sif"), "a1", tmp_path)
    argv = apptainer.start_argv()
    assert argv[argv.index("--") + 1 :] == ["/i/a.sif", "rolloutd-a1"]


def test_the_task_env_never_reaches_a_container_cli(tmp_path: Path) -> None:
    """A task's environment goes to the exec server inside, per command; the container's
    command line and the CLI's environment carry none of it."""
    task_env = {"DOCKER_HOST": "tcp://attacker:2375", "CONTAINER_HOST": "tcp://attacker:1"}
    for runtime in (
        DockerRuntime(RuntimeSpec(type="docker", image="debian:12", env=task_env), "d2", tmp_path),
        PodmanRuntime(RuntimeSpec(type="podman", image="debian:12", env=task_env), "p2", tmp_path),
    ):
        runtime.image = "debian:12"
        argv = " ".join(runtime.run_argv())
        assert "attacker" not in argv and "DOCKER_HOST" not in argv
        assert "--env" not in argv.split() and "--env-file" not in argv.split()


# ---------------------------------------------------------------- checked again on the host


@needs_bwrap
async def test_the_runtime_refuses_a_symlink_out_of_an_allowed_folder(tmp_path: Path) -> None:
    """The lexical check at submit passes (the source is below the allowed folder); the host
    follows the link before copying, refuses, and the worker's environment never lands in the
    workspace."""
    allowed = tmp_path / "tasks"
    allowed.mkdir()
    (allowed / "env").symlink_to("/proc/self/environ")
    policy = SandboxPolicy(upload_sources=[str(allowed)])
    spec = RuntimeSpec(
        type="bwrap", prepare=[{"type": "upload", "source": str(allowed / "env"), "path": "e"}]
    )
    assert violations(spec, policy) == []
    runtime = create_runtime(spec, "sym", tmp_path / "rt", policy=policy)
    with pytest.raises(PolicyError, match="not below an allowed folder"):
        await runtime.start()
    assert not (runtime.workspace / "e").exists()


@pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed")
async def test_a_build_argument_cannot_name_an_image_the_policy_does_not_allow(
    tmp_path: Path,
) -> None:
    """``ARG BASE_IMAGE=<allowed>`` then ``FROM ${BASE_IMAGE}``: submit sees only the build
    argument (the Dockerfile lies on the sandbox host), so the host reads ``FROM`` after the
    arguments and refuses before anything is pulled or built; a ``COPY --from`` image too.
    Control: the Dockerfile's own default passes the same check. Under a second: nothing runs."""
    roots = tmp_path / "images"
    context = roots / "task"
    context.mkdir(parents=True)
    dockerfile = context / "Dockerfile"
    dockerfile.write_text(f"ARG BASE_IMAGE={BASE_IMAGE}\nFROM ${{BASE_IMAGE}}\nRUN true\n")
    policy = SandboxPolicy(
        runtimes=["podman"], image_roots=[str(roots)], images=["localhost/rolloutd-base:*"]
    )
    honest = ImageBuild(context=str(context))
    assert build_images(honest, policy.images) == [BASE_IMAGE]
    swapped = ImageBuild(context=str(context), args={"BASE_IMAGE": "docker.io/library/debian"})
    spec = RuntimeSpec(type="podman", build=swapped)
    assert violations(spec, policy) == []  # what submit can check passes
    runtime = create_runtime(spec, "from-arg", tmp_path / "rt", policy=policy)
    with pytest.raises(PolicyError, match="'docker.io/library/debian'.*images: localhost"):
        await runtime.start()
    assert runtime.built_image is False and not runtime.image

    dockerfile.write_text(f"FROM {BASE_IMAGE}\nCOPY --from=docker.io/library/busybox /x /y\n")
    runtime = create_runtime(
        RuntimeSpec(type="podman", build=honest), "copy-from", tmp_path / "rt", policy=policy
    )
    with pytest.raises(PolicyError, match="docker.io/library/busybox"):
        await runtime.start()


@needs_bwrap
async def test_the_sandbox_host_refuses_what_submit_did_not_check(tmp_path: Path) -> None:
    """A task submitted without the capability check (``check_capabilities=False``) still
    meets the host's policy: provisioning fails with a non-retryable ``PolicyError`` and
    nothing is copied or started."""
    settings = SandboxSettings(
        host_id="policy-host",
        runtime_root=str(tmp_path / "rt"),
        store_url=str(tmp_path / "store"),
        log_json=False,
        sandbox_policy=SandboxPolicy(),
    )
    acts = SandboxActivities(settings, BlobStore(settings.store_url))
    env = ActivityEnvironment()
    for spec in (
        RuntimeSpec(type="local"),
        RuntimeSpec(type="bwrap", network="host"),
        RuntimeSpec(type="bwrap", prepare=[{"type": "upload", "source": "/proc/self/environ"}]),
        RuntimeSpec(type="bwrap", disk_mb=10**7),  # above the policy's maximum
    ):
        session_id = f"p/{uuid.uuid4().hex[:6]}"
        with pytest.raises(ApplicationError) as refused:
            await env.run(
                acts.provision_runtime, ProvisionRuntimeInput(session_id=session_id, runtime=spec)
            )
        assert refused.value.type == "PolicyError" and refused.value.non_retryable
        assert acts.runtimes == {}
    assert [p.name for p in (tmp_path / "rt").iterdir() if p.name != ".owners"] == []


# ---------------------------------------------------------------- refused at submit, for real


@pytest.mark.temporal
async def test_a_sandbox_host_publishes_its_policy_and_submit_refuses_by_it(
    temporal_server, tmp_path: Path
) -> None:
    """Real fleets (sandbox with the default policy, eval, workflows) in a namespace of their
    own: the client refuses, before any workflow starts, what the published policy refuses."""
    namespace = await fresh_namespace(temporal_server.address, "policy")
    common = {
        "temporal_address": temporal_server.address,
        "temporal_namespace": namespace,
        "store_url": str(tmp_path / "store"),
        "host_id": "policy-host",
        "log_json": False,
    }
    sandbox = SandboxSettings(
        **common, runtime_root=str(tmp_path / "rt"), sandbox_policy=SandboxPolicy()
    )
    client = await connect(sandbox)
    async with contextlib.AsyncExitStack() as stack:
        for fleet, settings in (
            ("sandbox", sandbox),
            ("eval", EvalSettings(**common)),
            ("workflows", CommonSettings(**common)),
        ):
            await stack.enter_async_context(run_fleet(fleet, client, settings))
        rollout = RolloutClient(client)
        fleets = await rollout.capabilities()
        (host,) = fleets.of("sandbox")
        # the built-in policy, its runtimes narrowed to those this host verifies
        assert host.policy == SandboxPolicy(runtimes=verified_runtimes())
        assert "apptainer" not in host.policy.runtimes
        for runtime, field in (
            ({"type": "local"}, "runtime.type"),
            ({"type": "bwrap", "network": "host"}, "runtime.network"),
            (
                {"type": "bwrap", "prepare": [{"type": "upload", "source": "/proc/self/environ"}]},
                "runtime.prepare[0].source",
            ),
            ({"type": "bwrap", "memory_mb": 10**6}, "runtime.memory_mb"),
        ):
            with pytest.raises(InvalidTaskError) as refused:
                await rollout.submit(task(runtime).model_dump())
            ((path, message),) = refused.value.errors
            assert path == field and "sandbox policy" in message and "policy-host" in message
        assert await rollout.check_tasks([task({"type": "bwrap"})])  # inside the policy
        with pytest.raises(RPCError):  # nothing was started
            await client.get_workflow_handle("task/t").describe()
