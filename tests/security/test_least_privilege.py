"""Least privilege by default: a runtime whose isolation the host cannot verify is not in its
default policy, and the docker runtime refuses a daemon whose containers' root is the host's.

No Docker daemon runs here: ``docker`` below is a stand-in script on PATH that answers
``docker info`` with the security options a daemon reports (the one thing read from it);
the real daemon's output has this shape (``docker info --format '{{json .SecurityOptions}}'``:
``["name=seccomp,profile=builtin","name=userns"]``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rolloutd.errors import ConfigError
from rolloutd.sandbox.runtimes import create_runtime, host_policy, verified_runtimes
from rolloutd.sandbox.runtimes.podman import docker_isolation
from rolloutd.sandbox_policy import SandboxPolicy
from rolloutd.types import RuntimeSpec


def fake_docker(folder: Path, options: str) -> Path:
    """A ``docker`` answering ``docker info`` and ``docker version`` as a daemon would."""
    script = folder / "docker"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f"  info) echo '{options}' ;;\n"
        "  version) echo 27.0.0 ;;\n"
        "  *) exit 1 ;;\n"
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.mark.parametrize(
    ("options", "isolated"),
    [
        ('["name=seccomp,profile=builtin","name=userns"]', True),
        ('["name=seccomp,profile=builtin","name=rootless","name=cgroupns"]', True),
        ('["name=seccomp,profile=builtin","name=cgroupns"]', False),
    ],
)
def test_docker_isolation_needs_user_remapping_or_rootless(
    tmp_path: Path, options: str, isolated: bool
) -> None:
    why = docker_isolation(str(fake_docker(tmp_path, options)))
    assert (why is None) == isolated, why
    if not isolated:
        assert "userns-remap" in why and "host's root" in why


async def test_the_docker_runtime_refuses_a_daemon_without_user_remapping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_docker(tmp_path, '["name=seccomp,profile=builtin"]')
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    runtime = create_runtime(
        RuntimeSpec(type="docker", image="debian:bookworm"), "d1", tmp_path / "rt"
    )
    with pytest.raises(ConfigError, match="neither remaps users"):
        await runtime.start()
    assert runtime.state == "stopped"


def test_the_built_in_policy_lists_only_runtimes_the_host_verifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a docker whose daemon maps users back to root: installed, not verified
    fake_docker(tmp_path, '["name=seccomp,profile=builtin"]')
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    verified = verified_runtimes()
    assert "docker" not in verified and "apptainer" not in verified
    policy = host_policy(SandboxPolicy())
    assert policy.runtimes == [r for r in SandboxPolicy().runtimes if r in verified]
    # an operator who lists runtimes is taken at their word
    chosen = SandboxPolicy(runtimes=["bwrap", "apptainer"])
    assert host_policy(chosen) is chosen
    fake_docker(tmp_path, '["name=userns"]')
    assert "docker" in verified_runtimes()
