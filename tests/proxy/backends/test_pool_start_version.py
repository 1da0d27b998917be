"""Backends registered at start (ROLLOUTD_BACKEND_URL) carry ROLLOUTD_BACKEND_POLICY_VERSION:
the Helm chart's backends.policyVersion, for a fleet started on weights already trained."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from rolloutd.proxy.backends.pool import BackendPool
from rolloutd.proxy.backends.specs import load_pool_state
from rolloutd.settings import GatewaySettings
from rolloutd.store import BlobStore


def test_start_backends_carry_the_configured_policy_version(tmp_path: Path) -> None:
    store = BlobStore(str(tmp_path))
    settings = GatewaySettings(
        backend_url="http://10.0.0.1:8000,http://10.0.0.2:8000",
        backend_type="vllm",
        backend_policy_version=7,
        store_url=str(tmp_path),
    )
    pool = BackendPool.from_settings(settings, store=store)
    assigned = {pool.assign().policy_version for _ in range(2)}
    assert assigned == {7}
    stored = load_pool_state(store)
    assert stored is not None
    assert [b.policy_version for b in stored.backends] == [7, 7]


def test_default_is_version_zero_and_negative_is_refused(tmp_path: Path) -> None:
    pool = BackendPool.from_settings(
        GatewaySettings(backend_url="http://10.0.0.1:8000", store_url=str(tmp_path))
    )
    assert pool.assign().policy_version == 0
    with pytest.raises(ValidationError, match="backend_policy_version"):
        GatewaySettings(backend_policy_version=-1)
