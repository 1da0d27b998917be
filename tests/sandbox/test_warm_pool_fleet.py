"""The warm pool inside the sandbox fleet, through Temporal: ``provision_runtime`` misses on
a key's first ask, then claims a warm container (hit), and a draining host stops its pool
and refuses to provision; and SIGKILL of the real sandbox worker process (``rolloutd worker
--fleet sandbox``, as ``rolloutd up`` starts it) holding a warm pool leaves no container
(``podman ps -a`` by label) and no conmon or ``runc`` process of its containers.

``acceptance``: a Temporal namespace of its own, a sandbox fleet and podman containers
(the Debian base image, made when missing); about 10-20 s each here.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rolloutd.activities.models import ProvisionRuntimeOutput
from rolloutd.observability import metrics, names
from rolloutd.processes import free_port, stop_process
from rolloutd.sandbox.runtimes import podman_images as images
from rolloutd.sandbox.warm_pool import WARM_PREFIX
from rolloutd.settings import SandboxSettings
from rolloutd.types import RuntimeSpec
from rolloutd.workers import connect, run_fleet
from tests.sandbox.test_warm_pool import containers
from tests.support.namespaces import fresh_namespace
from tests.support.pool_sessions import Sessions
from tests.support.procs import our_processes

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.temporal,
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed"),
]


def claims(result: str) -> float:
    return metrics.WARM_POOL_CLAIMS.labels(result=result)._value.get()


def claim_count() -> float:
    (family,) = [m for m in metrics.WARM_POOL_CLAIM_SECONDS.collect()]
    return next(s.value for s in family.samples if s.name.endswith("_count"))


async def until(check, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


@pytest.fixture(autouse=True)
async def base_image() -> None:
    await images.ensure_base_image()


async def test_provisioning_claims_from_the_pool_through_temporal(temporal_server) -> None:
    """The sandbox fleet with ``warm_pool_size=1``: a key's first provisioning misses and
    starts cold (control); the next one claims the warm container, with the session's files
    and env, and the hit, the miss and the claim's time are counted; the host's drain stops
    the pool and refuses further provisioning, and no container is left."""
    tag = f"wp{uuid.uuid4().hex[:6]}"
    namespace = await fresh_namespace(temporal_server.address, tag)
    with tempfile.TemporaryDirectory(prefix=f"{tag}-") as home:
        root = Path(home) / "r"
        settings = SandboxSettings(
            temporal_address=temporal_server.address,
            temporal_namespace=namespace,
            store_url=str(Path(home) / "store"),
            host_id=f"{tag}-host",
            runtime_root=str(root),
            warm_pool_size=1,
            log_json=False,
        )
        client = await connect(settings)
        sessions = Sessions(client)
        spec = RuntimeSpec(type="podman", network="none")
        hits, misses, timed = claims("hit"), claims("miss"), claim_count()
        async with run_fleet("sandbox", client, settings) as fleet, sessions.worker():
            acts = fleet.resources["activities"]
            cold = await sessions.provision(spec)
            assert isinstance(cold, ProvisionRuntimeOutput), cold
            assert not cold.runtime_id.startswith(WARM_PREFIX)
            assert (claims("hit"), claims("miss")) == (hits, misses + 1)
            await until(lambda: len(acts.pool.runtime_ids()) == 1, 120, "a warm container")
            (warm_id,) = acts.pool.runtime_ids()

            session = spec.model_copy(
                update={"files": {"task.txt": "pooled task\n"}, "env": {"TASK_NAME": "hit"}}
            )
            warm = await sessions.provision(session)
            assert isinstance(warm, ProvisionRuntimeOutput), warm
            assert warm.runtime_id == warm_id
            assert (claims("hit"), claims("miss")) == (hits + 1, misses + 1)
            assert claim_count() == timed + 1
            seen = await acts.runtimes[warm_id].exec('cat task.txt; echo "$TASK_NAME"')
            assert seen.stdout.split() == ["pooled", "task", "hit"]
            await until(lambda: len(acts.pool.runtime_ids()) == 1, 120, "the refill")
            assert warm_id not in acts.pool.runtime_ids()  # never handed out again
            for runtime in (cold, warm):
                await sessions.teardown(runtime)
            assert len(containers(root)) == 1  # the refilled warm one

            acts.start_drain()
            await until(lambda: not containers(root), 30, "the drained pool's container")
            refused = await sessions.provision(spec)
            assert refused == "HostDrainingError"
            assert acts.pool.runtime_ids() == [] and containers(root) == []


def container_ids(root: Path) -> set[str]:
    return set(
        subprocess.run(
            ["podman", "ps", "--all", "--no-trunc", "--format", "{{.ID}}", "--filter"]
            + [f"label=rolloutd.root={root.absolute()}"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.split()
    )


def metric(port: int, name: str, **labels: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    )


async def test_a_killed_sandbox_worker_leaves_no_warm_container(temporal_server) -> None:
    """``rolloutd worker --fleet sandbox`` with ``warm_pool_size=2``, a miss then a hit
    through Temporal (read off its metrics port); SIGKILL while it holds two warm containers
    and a claimed one: within 30 s no container of its root is left, not even stopped, and
    no conmon or runc of theirs runs, with no worker restarted (so no reclaim: the containers
    end by themselves when their exec server's socket closes). Their sized disks stay
    mounted until a worker starts again on the root, whose reclaim unmounts them and removes
    their folders. Control: all three ran, with their conmon, before the kill."""
    tag = f"wk{uuid.uuid4().hex[:6]}"
    namespace = await fresh_namespace(temporal_server.address, tag)
    home = Path(tempfile.mkdtemp(prefix=f"{tag}-"))
    root = home / "r"
    port = free_port()
    env = {
        **os.environ,
        "ROLLOUTD_TEMPORAL_ADDRESS": temporal_server.address,
        "ROLLOUTD_TEMPORAL_NAMESPACE": namespace,
        "ROLLOUTD_HOME": str(home),
        "ROLLOUTD_STORE_URL": str(home / "store"),
        "ROLLOUTD_RUNTIME_ROOT": str(root),
        "ROLLOUTD_HOST_ID": f"{tag}-host",
        "ROLLOUTD_WARM_POOL_SIZE": "2",
        "ROLLOUTD_METRICS_PORT": str(port),
        "ROLLOUTD_METRICS_HOST": "127.0.0.1",
        "ROLLOUTD_LOG_JSON": "false",
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    log = open(home / "sandbox.log", "wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "rolloutd.cli", "worker", "--fleet", "sandbox"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    client = await connect(
        SandboxSettings(temporal_address=temporal_server.address, temporal_namespace=namespace)
    )
    sessions = Sessions(client)
    spec = RuntimeSpec(type="podman", network="none")
    ids: set[str] = set()
    owners = root / ".owners"

    def note_owners() -> bool:  # every runtime id ever owned: records precede the containers
        ids.update(p.stem for p in owners.glob("*.json")) if owners.exists() else None
        return True

    try:
        async with sessions.worker():
            cold = await sessions.provision(spec)
            assert isinstance(cold, ProvisionRuntimeOutput), cold
            note_owners()

            def pool_full() -> bool:
                note_owners()
                assert worker.poll() is None, (home / "sandbox.log").read_text()[-3000:]
                return sum(c.startswith(f"rolloutd-{WARM_PREFIX}") for c in containers(root)) == 2

            await until(pool_full, 120, "two warm containers")
            warm = await sessions.provision(spec)
            assert isinstance(warm, ProvisionRuntimeOutput) and warm.runtime_id.startswith(
                WARM_PREFIX
            ), warm
            await until(pool_full, 120, "the refill")
            assert metric(port, names.WARM_POOL_CLAIMS, result="hit") == 1
            assert metric(port, names.WARM_POOL_CLAIMS, result="miss") == 1
            assert metric(port, f"{names.WARM_POOL_CLAIM_SECONDS}_count") == 1
            await sessions.teardown(cold)
            note_owners()
            running = container_ids(root)
            assert len(running) == 3, running  # two warm, one claimed
            assert len(our_processes(ids, running)) >= 3  # a conmon each, at least
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
        log.close()
    killed_at = time.monotonic()
    note_owners()
    await until(
        lambda: not containers(root) and not our_processes(ids, running),
        30,
        "the killed worker's containers and their conmon/runc to end",
    )
    gone_s = time.monotonic() - killed_at
    print(f"containers gone {gone_s:.1f} s after the kill")
    # each runtime's sized disk (the policy's default disk_mb) outlives the kill: the next
    # worker on the root reclaims it before it polls (control: they are mounted now)
    assert mounts_below(root), "the runtimes had no sized disk to reclaim"
    with open(home / "sandbox-restarted.log", "wb") as log:
        restarted = subprocess.Popen(
            [sys.executable, "-m", "rolloutd.cli", "worker", "--fleet", "sandbox"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            kept = {".owners", ".images", ".disks"}
            await until(
                lambda: not mounts_below(root) and {p.name for p in root.iterdir()} <= kept,
                60,
                "the restarted worker's reclaim of the disks and folders",
            )
        finally:
            stop_process(restarted)
    stop_process(worker)
    shutil.rmtree(home, ignore_errors=True)


def mounts_below(root: Path) -> list[str]:
    """Mount points below ``root`` (proc(5), /proc/mounts)."""
    prefix = f"{root.absolute()}/"
    with open("/proc/mounts") as f:
        return [line.split()[1] for line in f if line.split()[1].startswith(prefix)]
