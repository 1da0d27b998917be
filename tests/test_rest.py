"""The REST facade on real parts: a POLAR appendix A.3-shaped TaskRequest (with a runtime and a
harness that exist here: ``local`` and ``shell``) is submitted, polled to completion, and its
results come back; callbacks reach a real HTTP receiver that fails once (retried with backoff);
DELETE cancels; the OpenAPI document is published; ProRL's backend calls are forwarded to a
gateway's admin routes for the facade's token holder. What no registered fleet host can run
(POLAR's own A.3 payload with an unknown strategy, a harness nobody built) is refused with 422
naming the Polar field before any workflow starts; a task whose callback URL is unreachable is
completed with its results as soon as its sessions end, and its failed callback shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import httpx
import pytest
from fastapi import FastAPI, Request
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from rolloutd.proxy.http.server import Gateway
from rolloutd.rest import create_app
from rolloutd.settings import GatewaySettings
from rolloutd.stack import free_port
from rolloutd.trainer_client import RolloutClient
from rolloutd.trainer_client.admin import BackendAdmin
from tests.conftest import have_bwrap
from tests.support.buffer_tasks import poll
from tests.support.served import served

pytestmark = [pytest.mark.temporal, pytest.mark.engine]


def polar_a3_payload(task_id: str, strategy: str) -> dict:
    """POLAR's representative payload (its appendix A.3): codex, a SWE-bench evaluation in a
    fresh runtime, a callback."""
    return {
        "task_id": task_id,
        "instruction": "Fix the failing test in the repository.",
        "num_samples": 2,
        "timeout_seconds": 1800,
        "runtime": {"backend": "docker", "image": "swebench/sweb.eval.x86_64.astropy:latest"},
        "agent": {"harness": "codex", "model_name": "Qwen3-8B", "settings": {"max_turns": 50}},
        "builder": {"strategy": "prefix_merging", "config": {}},
        "evaluator": {
            "strategy": strategy,
            "config": {"refresh_runtime": True, "fail_to_pass": ["t::test_a"]},
        },
        "callback_url": "http://127.0.0.1:9/callback",
    }


def polar_payload(task_id: str, command: str, callback_url: str | None = None) -> dict:
    """Polar's TaskRequest (src/polar/rollout/models.py): agent/runtime/builder/evaluator."""
    return {
        "task_id": task_id,
        "instruction": "Create a file named answer.txt containing 42.",
        "num_samples": 2,
        "dispatch_priority": 0,
        "timeout_seconds": 300.0,
        "runtime": {"backend": "local", "image": "host", "env": {"LANG": "C"}, "network": "host"},
        "agent": {
            "harness": "shell",
            "model_name": "SmolLM2-135M-Instruct",
            "settings": {"command": command},
        },
        "builder": {"strategy": "prefix_merging", "config": {}},
        "evaluator": {
            "strategy": "test_on_output",
            "config": {"command": "cat answer.txt", "expected_output": "42"},
        },
        "callback_url": callback_url,
        "metadata": {"dataset": "unit", "index": 7},
    }


@contextlib.asynccontextmanager
async def receiver():
    """An HTTP callback receiver that answers 503 to the first POST of each session."""
    app = FastAPI()
    received: list[dict] = []
    refused: set[str] = set()

    @app.post("/callback")
    async def callback(request: Request):
        body = await request.json()
        if body["session_id"] not in refused:
            refused.add(body["session_id"])
            return _status(503)
        received.append(body)
        return {"ok": True}

    async with served(app) as url:
        yield f"{url}/callback", received


def _status(code: int):
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": "try later"}, status_code=code)


@contextlib.asynccontextmanager
async def facade(fleets, **kwargs):
    client = RolloutClient(fleets.client)
    from rolloutd.store import BlobStore

    client.store = BlobStore(fleets.store_url)
    app = create_app(client, **kwargs)
    headers = {"Authorization": f"Bearer {kwargs['token']}"} if kwargs.get("token") else {}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://facade", headers=headers
    ) as http:
        yield http


async def test_polar_payload_runs_and_its_results_come_back(fleets):
    task_id = f"polar-{uuid.uuid4().hex[:6]}"
    async with receiver() as (callback_url, received), facade(fleets) as http:
        submitted = await http.post(
            "/rollout/task/submit",
            json=polar_payload(task_id, "echo 42 > answer.txt", callback_url),
        )
        assert submitted.status_code == 200, submitted.text
        answer = submitted.json()
        assert (answer["task_id"], answer["status"]) == (task_id, "running")
        assert len(answer["callback_secret"]) >= 32  # its callbacks are signed with it
        again = await http.post("/rollout/task/submit", json=polar_payload(task_id, "true"))
        assert again.status_code == 409

        async def status():
            return (await http.get(f"/rollout/task/{task_id}")).json()

        done = await poll(
            status, lambda s: s["status"] != "running", timeout_s=120, what="task finished"
        )
        assert done["status"] == "completed"
        assert done["total_sessions"] == done["completed_sessions"] == 2
        assert [r["status"] for r in done["results"]] == ["COMPLETED", "COMPLETED"]
        assert [r["reward"] for r in done["results"]] == [1.0, 1.0]
        assert done["failures"] == {"none": 2}
        for result in done["results"]:
            assert result["task_id"] == task_id
            assert result["failure"] is None and result["trajectory"]["failure"] is None
            assert result["trajectory"]["status"] == "COMPLETED"
            assert result["metadata"]["rolloutd"]["reward"] == 1.0
        # each session's result reached the receiver after one refused attempt
        await poll(
            lambda: asyncio.sleep(0, len(received)),
            lambda n: n == 2,
            timeout_s=60,
            what="two callbacks",
        )
        assert sorted(b["session_id"] for b in received) == [f"{task_id}/0", f"{task_id}/1"]
        assert all(b["reward"] == 1.0 for b in received)
        delivered = await poll(
            status,
            lambda s: s["callback"]["status"] == "delivered",
            timeout_s=30,
            what="callbacks delivered in the status",
        )
        assert [r["callback"]["attempts"] for r in delivered["results"]] == [2, 2]

        assert (await http.get("/rollout/task/no-such-task")).status_code == 404
        status_all = (await http.get("/rollout/status")).json()
        assert status_all["status"] == "ok" and status_all["running_tasks"] >= 0
        # every fleet of the fixture beats in the fleet registry
        assert {f: v["alive"] for f, v in status_all["fleets"].items()} == {
            "workflows": True,
            "sandbox": True,
            "gateway": True,
            "eval": True,
        }, status_all["fleets"]
        paths = (await http.get("/openapi.json")).json()["paths"]
        assert {
            "/rollout/task/submit",
            "/rollout/task/{task_id}",
            "/rollout/status",
            "/add_llm_server",
            "/clear_llm_server",
        } <= set(paths)


async def test_delete_cancels_a_running_task_and_bad_payloads_are_422(fleets, tmp_path):
    task_id = f"polar-del-{uuid.uuid4().hex[:6]}"
    gate = tmp_path / "never"
    async with facade(fleets) as http:
        bad = polar_payload(task_id, "true")
        bad["agent"] = {"import_path": "my.module:Harness"}
        assert (await http.post("/rollout/task/submit", json=bad)).status_code == 422
        bad = polar_payload(task_id, "true")
        bad["num_samples"] = 0
        assert (await http.post("/rollout/task/submit", json=bad)).status_code == 422

        wait = f"while [ ! -e {gate} ]; do sleep 0.1; done"
        assert (
            await http.post("/rollout/task/submit", json=polar_payload(task_id, wait))
        ).status_code == 200

        async def phase():
            try:
                return await fleets.client.get_workflow_handle(f"task/{task_id}/0").query("phase")
            except RPCError:
                return None  # not started yet

        await poll(phase, lambda p: p == "run", timeout_s=60, what="session running")
        cancelled = await http.delete(f"/rollout/task/{task_id}")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "running"

        async def status():
            return (await http.get(f"/rollout/task/{task_id}")).json()

        final = await poll(
            status, lambda s: s["status"] != "running", timeout_s=30, what="task cancelled"
        )
        assert final["status"] == "failed"
    gate.touch()


async def test_prorl_backend_calls_are_forwarded_to_the_gateway_admin_routes(fleets, tmp_path):
    """``/add_llm_server`` and ``/clear_llm_server`` reach a real gateway's admin routes (one
    of this test's own, with an admin token, over its own store: the shared fleets' pool is
    left alone) for a caller holding the facade's token, and only for one."""
    admin_token = "gateway-admin-token"
    gateway = Gateway.from_settings(
        GatewaySettings(
            store_url=str(tmp_path / "store"),
            backend_url=fleets.engine_url,
            gateway_public_url="http://gateway.test",
            admin_token=admin_token,
        )
    )
    try:
        async with served(gateway.app) as gateway_url:
            async with facade(fleets, gateway_url=gateway_url, admin_token=admin_token) as http:
                # forwarded only for callers holding the facade's token (docs/decisions.md)
                refused = await http.post("/add_llm_server", json={"address": fleets.engine_url})
                assert refused.status_code == 403, refused.text
                assert "ROLLOUTD_REST_TOKEN" in refused.text
            async with facade(
                fleets, gateway_url=gateway_url, admin_token=admin_token, token="rest-token"
            ) as http:
                added = await http.post(
                    "/add_llm_server", json={"address": fleets.engine_url, "name": "second"}
                )
                assert added.status_code == 200, added.text
                assert added.json()["status"] == "ok"
                async with BackendAdmin(gateway_url, admin_token) as admin:
                    listed = await admin.list()
                assert [b["name"] for b in listed] == [fleets.engine_url, "second"]
                assert listed[1]["url"] == fleets.engine_url
                cleared = await http.post("/clear_llm_server")
                assert cleared.status_code == 200, cleared.text
                async with BackendAdmin(gateway_url, admin_token) as admin:
                    assert await admin.list() == []
            # a facade holding a wrong admin token: the gateway's refusal comes back
            async with facade(
                fleets, gateway_url=gateway_url, admin_token="wrong", token="rest-token"
            ) as http:
                wrong = await http.post("/add_llm_server", json={"address": fleets.engine_url})
                assert wrong.status_code == 401, wrong.text
    finally:
        await gateway.aclose()


async def test_polar_a3_payload_is_refused_before_any_workflow_starts(fleets):
    task_id = f"polar-a3-{uuid.uuid4().hex[:6]}"
    async with facade(fleets) as http:
        refused = await http.post(
            "/rollout/task/submit", json=polar_a3_payload(task_id, "swebench_grader")
        )
        assert refused.status_code == 422, refused.text
        errors = {".".join(e["loc"]): e["msg"] for e in refused.json()["detail"]}
        # codex has an adapter (tests/sandbox/harnesses/acceptance/test_polar_codex.py runs this
        # payload's shape to the end); a host without its CLI refuses it too, naming the setup
        # step
        # the payload's docker runtime: refused where no sandbox host runs docker (a docker
        # CLI without a reachable daemon does not count)
        assert set(errors) <= {"agent.harness", "evaluator.strategy", "runtime.backend"}
        assert (
            "'swebench_grader' is not in the eval fleet's registry" in errors["evaluator.strategy"]
        )
        if "agent.harness" in errors:
            assert "scripts/setup.sh" in errors["agent.harness"]
        if "runtime.backend" in errors:
            assert "'docker' is not installed on any sandbox host" in errors["runtime.backend"]
        # a harness nobody built is refused by name
        payload = polar_a3_payload(task_id, "swebench_harness")
        payload["agent"]["harness"] = "cursor-agent"
        refused = await http.post("/rollout/task/submit", json=payload)
        assert refused.status_code == 422, refused.text
        assert [e["loc"][:2] for e in refused.json()["detail"]] == [["agent", "harness"]]
        # an import path is never tried anywhere: evaluators come from the registry
        payload = polar_a3_payload(task_id, "no_such_package.graders:Grader")
        payload["agent"] = {"harness": "shell", "settings": {"command": "true"}}
        refused = await http.post("/rollout/task/submit", json=payload)
        assert refused.status_code == 422, refused.text
        (error,) = refused.json()["detail"]
        assert error["loc"] == ["evaluator", "strategy"]
        assert "import paths are not accepted" in error["msg"]
    with pytest.raises(RPCError) as info:
        await fleets.client.get_workflow_handle(f"task/{task_id}").describe()
    assert info.value.status == RPCStatusCode.NOT_FOUND


async def test_bwrap_task_with_unreachable_callback_completes_when_its_sessions_end(fleets):
    if not have_bwrap():
        pytest.skip("bubblewrap is not installed")
    task_id = f"polar-cb-{uuid.uuid4().hex[:6]}"
    payload = polar_payload(
        task_id, "echo 42 > answer.txt", callback_url=f"http://127.0.0.1:{free_port()}/callback"
    )
    payload["runtime"] = {"backend": "bwrap"}
    async with facade(fleets, callback_timeout_s=8.0) as http:
        submitted = await http.post("/rollout/task/submit", json=payload)
        assert submitted.status_code == 200, submitted.text

        async def status():
            return (await http.get(f"/rollout/task/{task_id}")).json()

        done = await poll(
            status, lambda s: s["status"] != "running", timeout_s=120, what="task finished"
        )
        assert done["status"] == "completed"
        assert done["completed_sessions"] == done["total_sessions"] == 2
        assert [r["reward"] for r in done["results"]] == [1.0, 1.0]
        # the task's workflow ends while its callbacks are still trying (for 8 s)
        task = fleets.client.get_workflow_handle(f"task/{task_id}")
        await poll(
            lambda: task.describe(),
            lambda d: d.status != WorkflowExecutionStatus.RUNNING,
            timeout_s=5,
            what="task workflow closed",
        )
        assert (await task.describe()).status == WorkflowExecutionStatus.COMPLETED
        # the last session's callback started as the task ended: still trying (the first
        # session's may have given up already on a loaded machine)
        states = [(r["callback"] or {}).get("status") for r in (await status())["results"]]
        assert "pending" in states, states
        failed = await poll(
            status,
            lambda s: all((r["callback"] or {}).get("status") == "failed" for r in s["results"]),
            timeout_s=30,
            what="callbacks given up",
        )
        assert failed["callback"]["status"] == "failed"
        assert failed["status"] == "completed"
        for result in failed["results"]:
            assert result["callback"]["status"] == "failed"
            assert result["callback"]["attempts"] >= 2
            error = result["callback"]["error"]
            assert error.endswith("callback failed: the receiver did not answer"), error


async def test_each_session_shows_in_the_status_as_soon_as_it_ends(fleets, tmp_path):
    task_id = f"polar-part-{uuid.uuid4().hex[:6]}"
    gate = tmp_path / "gate"
    # the first session to take the lock answers at once; the other waits for the gate
    command = (
        f"mkdir {tmp_path / 'first'} 2>/dev/null || "
        f"while [ ! -e {gate} ]; do sleep 0.1; done; echo 42 > answer.txt"
    )
    payload = polar_payload(task_id, command)
    async with facade(fleets) as http:
        assert (await http.post("/rollout/task/submit", json=payload)).status_code == 200

        async def status():
            return (await http.get(f"/rollout/task/{task_id}")).json()

        try:
            partial = await poll(
                status,
                lambda s: s["completed_sessions"] >= 1,
                timeout_s=60,
                what="first session ended",
            )
        finally:
            gate.touch()
        assert partial["status"] == "running" and partial["total_sessions"] == 2
        (first,) = partial["results"]
        assert (first["status"], first["reward"], first["error"]) == ("COMPLETED", 1.0, None)
        done = await poll(
            status, lambda s: s["status"] != "running", timeout_s=60, what="task finished"
        )
        assert done["status"] == "completed" and done["completed_sessions"] == 2
