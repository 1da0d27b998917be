"""Per-backend and per-host gauges are read from their owners at scrape time
(rolloutd.observability.metrics): a real BackendPool (admin operations as the gateway's
admin routes run them) and a real SandboxActivities; no engine needed, since nothing
samples."""

from __future__ import annotations

from prometheus_client import REGISTRY

from rolloutd.activities.sandbox import SandboxActivities
from rolloutd.observability import metrics, names
from rolloutd.proxy.backends.pool import BackendPool
from rolloutd.proxy.backends.specs import make_backend
from rolloutd.settings import SandboxSettings
from rolloutd.store import BlobStore


def gauge(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


async def test_backend_gauges_follow_pool_admin_operations():
    pool = BackendPool(
        [
            make_backend("llama_cpp", "state-a", "http://127.0.0.1:9"),
            make_backend("llama_cpp", "state-b", "http://127.0.0.1:9", policy_version=3),
        ]
    )
    metrics.watch_pool(pool)
    try:
        assert gauge(names.BACKEND_PAUSED, backend="state-a") == 0
        assert gauge(names.BACKEND_POLICY_VERSION, backend="state-b") == 3
        lease = await pool.acquire("state-a")
        assert gauge(names.BACKEND_CALLS_IN_FLIGHT, backend="state-a") == 1
        pool.release_lease(lease)
        assert gauge(names.BACKEND_CALLS_IN_FLIGHT, backend="state-a") == 0
        await pool.set_paused(True, ["state-a"])
        await pool.set_policy_version(7)
        assert gauge(names.BACKEND_PAUSED, backend="state-a") == 1
        assert gauge(names.BACKEND_PAUSED, backend="state-b") == 0
        assert gauge(names.BACKEND_POLICY_VERSION, backend="state-a") == 7
    finally:
        await pool.aclose()
    del pool  # a pool gone is no longer exported
    assert gauge(names.BACKEND_PAUSED, backend="state-a") is None


def test_runtimes_alive_counts_a_hosts_runtimes(tmp_path):
    settings = SandboxSettings(
        host_id="state-host", runtime_root=str(tmp_path / "rt"), store_url=str(tmp_path / "store")
    )
    acts = SandboxActivities(settings, BlobStore(settings.store_url))
    assert gauge(names.RUNTIMES_ALIVE, host="state-host") == 0
    acts.runtimes["r1"] = object()  # type: ignore[assignment]  # only counted, never run
    acts.runtimes["r2"] = object()  # type: ignore[assignment]
    assert gauge(names.RUNTIMES_ALIVE, host="state-host") == 2
    acts.runtimes.pop("r1")
    assert gauge(names.RUNTIMES_ALIVE, host="state-host") == 1
