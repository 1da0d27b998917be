"""The warm pool on real podman: a claim only on an exact key, the session's files, env and
prepare steps applied at claim, a used container never handed out again, a policy change
draining the pool, and the pool sized from the sessions waiting (SIGKILL of the real sandbox
worker holding a pool: tests/sandbox/test_warm_pool_fleet.py). The podman runtime's isolation
tests run again here on pooled runtimes (imported below: the module's ``make_runtime`` claims
each one from a warm pool and checks it was a hit).

``acceptance``: containers (the Debian base image, made when missing); about 1-5 s a test.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from rolloutd.sandbox.runtimes import Runtime
from rolloutd.sandbox.runtimes import podman_images as images
from rolloutd.sandbox.runtimes.podman import ROOT_LABEL
from rolloutd.sandbox.warm_pool import WarmPool
from rolloutd.sandbox_policy import SandboxPolicy
from rolloutd.task_spec import ExecStep
from rolloutd.types import RuntimeSpec
from tests.sandbox.test_runtime_podman import (  # noqa: F401 - collected here on pooled runtimes
    test_limits_and_oom_are_reported,
    test_the_hosts_harness_clis_run_inside,
    test_user_namespace_maps_root_to_an_unprivileged_host_uid,
)
from tests.support.procs import our_processes, processes_with

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed"),
]


def containers(root: Path) -> list[str]:
    """Names of the containers (running or not) of runtimes under ``root``."""
    return subprocess.run(
        ["podman", "ps", "--all", "--filter", f"label={ROOT_LABEL}={root.absolute()}"]
        + ["--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()


async def ready(pool: WarmPool, num: int = 1, timeout_s: float = 120.0) -> list[str]:
    """Wait until the pool holds ``num`` ready runtimes; their ids."""
    deadline = time.monotonic() + timeout_s
    while len(pool.runtime_ids()) < num:
        assert time.monotonic() < deadline, "the pool did not fill"
        await asyncio.sleep(0.05)
    return pool.runtime_ids()


@pytest.fixture(autouse=True)
async def base_image() -> None:
    await images.ensure_base_image()


@pytest.fixture
def make_runtime(pooled_make_runtime: Callable[..., Awaitable[Runtime]]):  # noqa: ANN201
    """The imported tests' runtimes, each a warm pool's hit (tests/sandbox/conftest.py)."""
    return pooled_make_runtime


async def test_a_claim_matches_the_key_exactly_and_applies_the_session(tmp_path: Path) -> None:
    """A warm container is claimed only by a spec of the same key; the claim writes the
    session's files (owned by the container's root), sets its env, runs its prepare steps;
    the claimed container never returns to the pool. Control: a spec differing only in a
    limit or the network misses, and the exact one hits."""
    root = tmp_path / "runtimes"
    pool = WarmPool(root, None, size=1, grace_s=2.0)
    base = RuntimeSpec(type="podman", memory_mb=512)
    try:
        assert await pool.claim(base) is None
        (warm_id,) = await ready(pool)
        assert await pool.claim(base.model_copy(update={"memory_mb": 256})) is None
        assert await pool.claim(base.model_copy(update={"network": "none"})) is None
        assert warm_id in pool.runtime_ids()
        session = base.model_copy(
            update={
                "files": {"task.txt": "the task\n"},
                "env": {"TASK_NAME": "pooled"},
                "prepare": [ExecStep(command="echo prepared > made.txt")],
            }
        )
        runtime = await pool.claim(session)
        assert runtime is not None and runtime.runtime_id == warm_id
        result = await runtime.exec(
            'cat task.txt made.txt; echo "$TASK_NAME"; stat -c %u task.txt; id -u'
        )
        assert result.stdout.split() == ["the", "task", "prepared", "pooled", "0", "0"]
        assert warm_id not in pool.runtime_ids()
        # refilled with a new container (and one for each key the misses asked for)
        refilled = await ready(pool, 3)
        assert warm_id not in refilled
        again = await pool.claim(base)
        assert again is not None and again.runtime_id in refilled
        assert (await again.exec("ls")).stdout.split() == []  # nothing of the first session
        await again.stop()
        await runtime.stop()
    finally:
        await pool.drain()
    assert containers(root) == []


async def test_a_policy_change_drains_the_pool(tmp_path: Path) -> None:
    """A new policy stops every warm container; the same policy again keeps them (control)."""
    root = tmp_path / "runtimes"
    policy = SandboxPolicy(runtimes=["podman"])
    pool = WarmPool(root, policy, size=1, grace_s=2.0)
    try:
        assert await pool.claim(RuntimeSpec(type="podman")) is None
        await ready(pool)
        await pool.set_policy(policy.model_copy())
        assert len(containers(root)) == 1
        await pool.set_policy(policy.model_copy(update={"networks": ["none"]}))
        assert pool.runtime_ids() == [] and containers(root) == []
    finally:
        await pool.drain()


async def test_the_pool_grows_with_the_sessions_waiting(tmp_path: Path) -> None:
    """``set_waiting``: a key's target is ``size`` plus its share of the waiting sessions
    (here all of them: the only key asked for), bounded by the host's room; fewer waiting
    stops the surplus. Control: with nobody waiting the pool holds ``size``."""
    root = tmp_path / "runtimes"
    room = {"left": 3}
    pool = WarmPool(root, None, size=1, grace_s=2.0, room=lambda: room["left"])
    spec = RuntimeSpec(type="podman", network="none")
    try:
        assert await pool.claim(spec) is None
        await ready(pool, 1)
        assert len(containers(root)) == 1  # size, nobody waiting
        pool.set_waiting(5)  # target 6, but the host has room for 3
        await ready(pool, 3)
        await asyncio.sleep(1.0)
        assert len(pool) == 3 and len(containers(root)) == 3
        room["left"] = 4
        pool.set_waiting(2)  # target 3: nothing more starts
        await asyncio.sleep(1.0)
        assert len(pool) == 3
        pool.set_waiting(0)  # target 1: two are stopped
        deadline = time.monotonic() + 60
        while len(containers(root)) > 1:
            assert time.monotonic() < deadline, containers(root)
            await asyncio.sleep(0.1)
        assert len(pool.runtime_ids()) == 1
        claimed = await pool.claim(spec)
        assert claimed is not None
        await claimed.stop()
    finally:
        await pool.close()
    assert containers(root) == []


async def test_a_drain_during_a_warm_start_leaves_no_conmon_or_runc(tmp_path: Path) -> None:
    """A drain while the pool's first container is starting (its owner record written, its
    ``podman run`` under way) waits for that start and stops it: no container of the root
    and no conmon or runc of it is left. (Cancelling the start, as the pool once did, left a
    conmon and a ``runc init`` with no container record here.)"""
    root = tmp_path / "runtimes"
    pool = WarmPool(root, None, size=1, grace_s=2.0)
    owners = root / ".owners"
    assert await pool.claim(RuntimeSpec(type="podman", network="none")) is None
    deadline = time.monotonic() + 30
    while not (owners.exists() and list(owners.glob("warm-*.json"))):
        assert time.monotonic() < deadline, "the warm start never began"
        await asyncio.sleep(0.005)
    ids = {p.stem for p in owners.glob("warm-*.json")}
    # into its podman run: the CLI naming the container runs
    while not any(processes_with(f"rolloutd-{i}") for i in ids):
        assert time.monotonic() < deadline, "podman run never started"
        await asyncio.sleep(0.005)
    assert len(pool) == 1 and pool.runtime_ids() == []  # starting, not ready
    await pool.close()
    assert containers(root) == []
    deadline = time.monotonic() + 10
    while left := our_processes(ids, set()):
        assert time.monotonic() < deadline, left
        await asyncio.sleep(0.1)
