"""Admin and task routes off loopback: the gateway and the REST facade refuse to start
without their token; the REST facade refuses requests without it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import httpx
import pytest
from temporalio.service import RPCError

from rolloutd.rest import create_app
from rolloutd.security.exposure import is_loopback
from rolloutd.trainer_client import RolloutClient
from rolloutd.workflows.task import task_workflow_id


def test_loopback_addresses() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "", "10.0.0.5", "gateway.internal"]))


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ROLLOUTD_ADMIN_TOKEN", "ROLLOUTD_REST_TOKEN")
    }
    # an address nothing listens on: the refusal must come before any connection
    clean.update({"ROLLOUTD_TEMPORAL_ADDRESS": "127.0.0.1:9", **env})
    return subprocess.run(
        [sys.executable, "-m", "rolloutd.cli", *args],
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_gateway_bound_off_loopback_without_an_admin_token_refuses_to_start() -> None:
    done = run_cli("worker", "--fleet", "gateway", ROLLOUTD_GATEWAY_HOST="0.0.0.0")
    assert done.returncode == 1
    assert "the gateway would listen on '0.0.0.0', which is not a loopback address" in done.stderr
    assert "ROLLOUTD_ADMIN_TOKEN" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_rest_facade_bound_off_loopback_without_a_token_refuses_to_start() -> None:
    done = run_cli("rest", "--host", "0.0.0.0", "--port", "0")
    assert done.returncode == 1
    assert "the REST facade would listen on '0.0.0.0'" in done.stderr
    assert "ROLLOUTD_REST_TOKEN" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.temporal
async def test_the_rest_facade_refuses_a_submit_without_its_token(temporal_server) -> None:
    client = await RolloutClient.connect(temporal_server.address)
    app = create_app(client, token="rest-secret")
    task_id = f"unauth-{uuid.uuid4().hex[:6]}"
    polar = {"task_id": task_id, "instruction": "x", "agent": {"type": "shell"}}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://rest"
    ) as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "rest-secret"}):
            refused = await http.post("/rollout/task/submit", json=polar, headers=headers)
            assert refused.status_code == 401, refused.text
            assert "ROLLOUTD_REST_TOKEN" in refused.text
        for method, path in (
            ("GET", f"/rollout/task/{task_id}"),
            ("DELETE", f"/rollout/task/{task_id}"),
            ("GET", "/rollout/status"),
            ("POST", "/clear_llm_server"),
        ):
            assert (await http.request(method, path)).status_code == 401, path
        # the schema stays readable; a caller with the token gets past the check
        assert (await http.get("/openapi.json")).status_code == 200
        status = await http.get("/rollout/status", headers={"Authorization": "Bearer rest-secret"})
        assert status.status_code == 200, status.text
    with pytest.raises(RPCError):  # nothing was started
        await client.client.get_workflow_handle(task_workflow_id(task_id)).describe()
