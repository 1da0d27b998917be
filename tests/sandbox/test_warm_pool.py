"""The warm pool on real podman: a claim only on an exact key, the session's files, env and
prepare steps applied at claim, a used container never handed out again, a policy change
draining the pool, and a killed worker's warm containers gone (podman ps by label). The
podman runtime's isolation tests run again here on pooled runtimes (imported below: the
module's ``make_runtime`` claims each one from a warm pool and checks it was a hit).

``acceptance``: containers (the Debian base image, made when missing); about 1-5 s a test.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from rolloutd.sandbox.runtimes import Runtime
from rolloutd.sandbox.runtimes import podman_images as images
from rolloutd.sandbox.runtimes.podman import ROOT_LABEL
from rolloutd.sandbox.warm_pool import WarmPool
from rolloutd.sandbox_policy import SandboxPolicy
from rolloutd.task_spec import ExecStep
from rolloutd.types import RuntimeSpec
from tests.sandbox.conftest import _runtime_pids
from tests.sandbox.test_runtime_podman import (  # noqa: F401 - collected here on pooled runtimes
    test_limits_and_oom_are_reported,
    test_the_hosts_harness_clis_run_inside,
    test_user_namespace_maps_root_to_an_unprivileged_host_uid,
)

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
async def make_runtime(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Runtime]]]:
    """As tests/sandbox/conftest.py's, but each runtime is a warm pool's hit."""
    root = tmp_path / "runtimes"
    pool = WarmPool(root, None, size=1, grace_s=2.0)
    made: list[Runtime] = []

    async def make(type: str = "podman", **spec: object) -> Runtime:
        wanted = RuntimeSpec(type=type, **spec)
        assert await pool.claim(wanted) is None  # the first ask of a key is a miss
        await ready(pool)
        runtime = await pool.claim(wanted)
        assert runtime is not None, "an exact key is a hit"
        made.append(runtime)
        return runtime

    yield make
    await pool.drain()
    for runtime in made:
        await runtime.stop()
        assert _runtime_pids(runtime) == []
    assert containers(root) == []


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


WORKER = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from rolloutd.sandbox.warm_pool import WarmPool
    from rolloutd.types import RuntimeSpec

    async def main():
        pool = WarmPool(Path(sys.argv[1]), None, size=2)
        await pool.claim(RuntimeSpec(type="podman"))
        while len(pool.runtime_ids()) < 2:
            await asyncio.sleep(0.05)
        print("ready", flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
    """
)


async def test_a_killed_worker_leaves_no_warm_container(tmp_path: Path) -> None:
    """SIGKILL of a process holding a warm pool of two containers: both end by themselves
    (the exec server's socket closes, the container exits, ``--rm`` removes it). Control:
    they ran while the process lived."""
    root = tmp_path / "runtimes"
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(root)],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    try:
        assert worker.stdout is not None
        line = ""
        while line.strip() != "ready":  # the worker's log lines come first
            line = await asyncio.wait_for(asyncio.to_thread(worker.stdout.readline), 120)
            assert line, "the worker ended before its pool was ready"
        assert len(containers(root)) == 2
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    deadline = time.monotonic() + 30
    while containers(root):
        assert time.monotonic() < deadline, containers(root)
        await asyncio.sleep(0.2)
