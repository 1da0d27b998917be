"""Apptainer and Docker runtimes: command lines checked against the CLIs' documented flags,
image cache modes, and real runs where the binaries (and the Docker daemon) exist. (The
podman runtime, whose code the docker runtime runs, has tests/sandbox/test_runtime_podman.py.)"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from rolloutd.sandbox.images import ImageTemplate, definition, ensure_image
from rolloutd.sandbox.runtimes import create_runtime
from rolloutd.sandbox.runtimes.containers import ApptainerRuntime
from rolloutd.sandbox.runtimes.podman import DockerRuntime
from rolloutd.types import RuntimeSpec

#: long flags of the Apptainer 1.3 CLI reference pages (apptainer.org/docs/user/latest/cli/):
#: apptainer_instance_start.html, apptainer_exec.html, apptainer_instance_stop.html,
#: apptainer_build.html (subsets: the flags this project may use).
APPTAINER_FLAGS = {
    ("instance", "start"): {
        "--containall",
        "--no-home",
        "--cleanenv",
        "--net",
        "--network",
        "--fakeroot",
        "--bind",
        "--pids-limit",
        "--memory",
        "--cpus",
        "--contain",
        "--env",
        "--pwd",
        "--writable-tmpfs",
        "--no-privs",
    },
    ("exec",): {
        "--cleanenv",
        "--pwd",
        "--containall",
        "--bind",
        "--env",
        "--net",
        "--network",
        "--no-home",
        "--fakeroot",
        "--no-privs",
    },
    ("build",): {"--fakeroot", "--force", "--sandbox", "--notest"},
}


def _flags(argv: list[str]) -> set[str]:
    return {a for a in argv if a.startswith("--") and a != "--"}  # "--": end of options


def _docker_help_flags(*subcommand: str) -> set[str]:
    out = subprocess.run(
        ["docker", *subcommand, "--help"], capture_output=True, text=True, check=True
    ).stdout
    return set(re.findall(r"(--[a-z0-9][a-z0-9-]*)", out))


def _docker_daemon() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0


def test_apptainer_commands_use_documented_flags(tmp_path: Path):
    runtime = create_runtime(
        RuntimeSpec(
            type="apptainer", image="/images/swe.sif", max_processes=64, memory_mb=2048, cpus=1.5
        ),
        "app-1",
        tmp_path,
    )
    assert isinstance(runtime, ApptainerRuntime)
    start = runtime.start_argv()
    assert start[1:3] == ["instance", "start"]
    assert _flags(start) <= APPTAINER_FLAGS[("instance", "start")]
    assert {"--containall", "--no-home", "--net", "--cleanenv"} <= set(start)
    assert start[start.index("--network") + 1] == "none"
    assert f"{runtime.net_dir}:/run/rolloutd:ro" in start
    assert start[-2:] == ["/images/swe.sif", runtime.name]
    argv, _ = runtime._wrap(["python3", "-V"], "/workspace")
    assert argv[1] == "exec" and _flags(argv) <= APPTAINER_FLAGS[("exec",)]
    assert argv[-3:] == [f"instance://{runtime.name}", "python3", "-V"]
    env = runtime._host_env(["x"], {"OPENAI_API_KEY": "secret"}, argv)
    assert env["APPTAINERENV_OPENAI_API_KEY"] == "secret" and "secret" not in " ".join(argv)
    fakeroot = ApptainerRuntime(
        RuntimeSpec(type="apptainer", image="/i.sif"), "app-2", tmp_path, fakeroot=True
    )
    assert "--fakeroot" in fakeroot.start_argv()
    # a root worker's container root keeps no capability (fakeroot maps root elsewhere)
    root_worker = os.geteuid() == 0
    assert ("--no-privs" in start) == root_worker and ("--no-privs" in argv) == root_worker
    assert "--no-privs" not in fakeroot.start_argv()


@pytest.mark.skipif(shutil.which("docker") is None, reason="the docker CLI is not installed")
def test_docker_commands_use_flags_of_the_installed_cli(tmp_path: Path):
    """The docker runtime is the podman runtime's code with another binary: its command lines
    use only flags the installed docker CLI lists (no ``--uidmap``: the daemon maps users)."""
    runtime = create_runtime(
        RuntimeSpec(
            type="docker", image="python:3.11-slim", max_processes=64, memory_mb=2048, cpus=2
        ),
        "dock-1",
        tmp_path,
    )
    assert isinstance(runtime, DockerRuntime)
    runtime.image = "python:3.11-slim"
    start = runtime.run_argv()
    assert start[1:2] == ["run"]
    assert _flags(start[: start.index("--")]) <= _docker_help_flags("run"), _flags(
        start
    ) - _docker_help_flags("run")
    assert start[start.index("--network") + 1] == "none"
    assert "--uidmap" not in start and start[start.index("--pids-limit") + 1] == "64"
    assert _flags(runtime.rm_argv()) <= _docker_help_flags("rm")


@pytest.mark.skipif(shutil.which("apptainer") is None, reason="apptainer is not installed")
async def test_apptainer_runs_a_command(tmp_path: Path):  # pragma: no cover - needs apptainer
    sif = Path(__file__).with_name("alpine.sif")
    if not sif.exists():
        pytest.skip("no SIF image at tests/sandbox/alpine.sif")
    runtime = create_runtime(
        RuntimeSpec(type="apptainer", image=str(sif), network="none"), "app-run", tmp_path
    )
    await runtime.start()
    try:
        assert (await runtime.exec("echo hi")).stdout == "hi\n"
    finally:
        await runtime.stop()


@pytest.mark.skipif(not _docker_daemon(), reason="no Docker daemon reachable (docker info fails)")
async def test_docker_runs_a_command(tmp_path: Path):  # pragma: no cover - needs a daemon
    runtime = create_runtime(
        RuntimeSpec(type="docker", image="python:3.11-slim", network="none"), "dock-run", tmp_path
    )
    await runtime.start()
    try:
        assert (await runtime.exec("echo hi")).stdout == "hi\n"
    finally:
        await runtime.stop()


def test_definition_template_renders_through_spython():
    text = definition(
        ImageTemplate(
            name="swe",
            base_image="python:3.11-slim",
            post=["pip install pytest"],
            environment={"A": "1"},
        )
    )
    assert text.startswith("Bootstrap: docker\nFrom: python:3.11-slim")
    assert "%post\npip install pytest" in text
    assert "export A=1" in text and "rolloutd.version 1" in text


async def test_image_cache_modes(tmp_path: Path):
    builds: list[list[str]] = []

    async def fake_build(argv: list[str]) -> int:
        builds.append(argv)
        Path(argv[-2]).write_bytes(b"SIF")
        return 0

    lock = tmp_path / "requirements.lock"
    lock.write_text("pytest==8.0\n")
    base = ImageTemplate(name="swe", base_image="python:3.11-slim", lockfile=str(lock))
    cache = tmp_path / "cache"

    first, built = await ensure_image(base, cache, "always", build=fake_build)
    again, built_again = await ensure_image(base, cache, "always", build=fake_build)
    assert built and built_again and first != again  # always rebuilds

    sif, built = await ensure_image(base, cache, "base_version", build=fake_build)
    assert built and builds[-1][:2] == ["apptainer", "build"]
    assert (await ensure_image(base, cache, "base_version", build=fake_build)) == (sif, False)
    bumped = base.model_copy(update={"version": "2"})
    assert (await ensure_image(bumped, cache, "base_version", build=fake_build))[1] is True
    other_base = base.model_copy(update={"base_image": "python:3.12-slim"})
    assert (await ensure_image(other_base, cache, "base_version", build=fake_build))[1] is True

    locked, built = await ensure_image(base, cache, "lockfile", build=fake_build)
    assert built
    bumped_only = base.model_copy(update={"version": "3"})  # the version does not matter here
    assert (await ensure_image(bumped_only, cache, "lockfile", build=fake_build)) == (locked, False)
    lock.write_text("pytest==8.1\n")
    assert (await ensure_image(base, cache, "lockfile", build=fake_build))[1] is True
    num_builds = len(builds)

    async def failing(argv: list[str]) -> int:
        return 1

    with pytest.raises(RuntimeError):
        await ensure_image(
            base.model_copy(update={"name": "bad"}), cache, "base_version", build=failing
        )
    assert len(builds) == num_builds
    assert not list(cache.glob("bad-*.sif"))
