"""``rolloutd tasks`` with a tenant token goes through the REST facade (served over real HTTP,
on the shared fleets), which gains a listing and a trajectory route: a tenant lists, shows
(evaluation records included) and cancels its own tasks only; another tenant's task and its
trajectory answer 404, as an unknown one; the operator's token lists every tenant's."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import httpx
import pytest
from temporalio.client import WorkflowExecutionStatus

from rolloutd.rest import create_app
from rolloutd.security.tenants import TenantTokens, new_tenant_token
from rolloutd.store import BlobStore
from rolloutd.trainer_client import RestClient, RolloutClient
from rolloutd.types import Trajectory
from tests.support.buffer_tasks import poll
from tests.support.cli_runs import cli_env, run_cli
from tests.support.served import served

pytestmark = [pytest.mark.temporal, pytest.mark.engine, pytest.mark.timeout(600)]

OPERATOR_TOKEN = "operator-rest-token-tasks-0123456789"


def polar_task(task_id: str, gate: Path) -> dict:
    """A POLAR body whose local shell session waits for ``gate``."""
    return {
        "task_id": task_id,
        "instruction": "wait",
        "runtime": {"backend": "local", "image": "host", "network": "host"},
        "agent": {
            "harness": "shell",
            "settings": {"command": f"while [ ! -e {gate} ]; do sleep 0.1; done; true"},
        },
        "evaluator": {"strategy": "session_completed"},
    }


async def test_a_tenant_lists_shows_and_cancels_its_own_tasks_through_rest(fleets, tmp_path):
    token_a, entry_a = new_tenant_token("team-a", 3)
    token_b, entry_b = new_tenant_token("team-b", 3)
    u = uuid.uuid4().hex[:6]
    done_a, running_a, task_b = f"tr{u}-a1", f"tr{u}-a2", f"tr{u}-b1"
    opened, closed = tmp_path / "open", tmp_path / "closed"
    opened.touch()
    client = RolloutClient(fleets.client, BlobStore(fleets.store_url))
    app = create_app(client, token=OPERATOR_TOKEN, tenant_tokens=TenantTokens([entry_a, entry_b]))
    try:
        async with served(app) as url:
            async with RestClient(url, token_a) as a, RestClient(url, token_b) as b:
                await a.submit(polar_task(done_a, opened))
                await a.submit(polar_task(running_a, closed))
                await b.submit(polar_task(task_b, opened))
                for task_id in (done_a, task_b):
                    await client.result(task_id)

                # the routes themselves: a listing of one's own, a trajectory of one's own
                mine = await poll(
                    lambda: a.list_tasks(prefix=f"tr{u}-"),
                    lambda body: len(body["tasks"]) == 2,
                    what="A's two tasks listed",
                )
                assert sorted(r["task_id"] for r in mine["tasks"]) == [done_a, running_a]
                everyone = await RestClient(url, OPERATOR_TOKEN).list_tasks(prefix=f"tr{u}-")
                assert len(everyone["tasks"]) == 3
                trajectory = Trajectory.model_validate(await a.trajectory(f"{done_a}/0"))
                assert trajectory.evaluation is not None
                assert trajectory.evaluation.evaluator == "session_completed"
                async with httpx.AsyncClient(base_url=url) as http:
                    for token, path in (
                        (token_a, f"/rollout/session/{task_b}/0/trajectory"),
                        (token_b, f"/rollout/session/{done_a}/0/trajectory"),
                    ):
                        r = await http.get(path, headers={"Authorization": f"Bearer {token}"})
                        assert r.status_code == 404, r.text
                    r = await http.get(
                        "/rollout/tasks",
                        params={"status": "nonsense"},
                        headers={"Authorization": f"Bearer {token_a}"},
                    )
                    assert r.status_code == 422 and "status must be one of" in r.text

            # the command, as tenant A: REST only (no Temporal address it could use)
            env = {
                **cli_env(fleets.store_url),
                "ROLLOUTD_TENANT_TOKEN": token_a,
                "ROLLOUTD_REST_URL": url,
                "ROLLOUTD_TEMPORAL_ADDRESS": "127.0.0.1:1",
            }
            code, out, err = await run_cli(
                "tasks", "list", "--prefix", f"tr{u}-", "--json", env=env
            )
            assert code == 0, err
            assert sorted(json.loads(x)["task_id"] for x in out.splitlines()) == [
                done_a,
                running_a,
            ]
            code, out, err = await run_cli("tasks", "show", done_a, env=env)
            assert code == 0, err
            assert f"task {done_a}: completed; 1/1 sessions ended" in out
            assert "session_completed" in out, out
            code, out, err = await run_cli("tasks", "show", done_a, "--session", "0", env=env)
            assert code == 0, err
            assert "evaluation record:" in out and "trajectory: 0 trace(s)" in out, out
            code, out, err = await run_cli("tasks", "show", task_b, env=env)
            assert code == 1 and "404" in err, out + err
            code, out, err = await run_cli("tasks", "cancel", task_b, env=env)
            assert code == 1 and "not cancelled" in err
            assert (await client.get_handle(task_b).describe()).status == (
                WorkflowExecutionStatus.COMPLETED
            )
            code, out, err = await run_cli("tasks", "cancel", running_a, env=env)
            assert code == 0 and f"task {running_a}: cancelled" in out, out + err
            await poll(
                lambda: client.get_handle(running_a).describe(),
                lambda d: d.status == WorkflowExecutionStatus.CANCELED,
                what="A's running task cancelled",
            )
            # a tenant token without a facade to reach is refused, naming what to set
            no_url = {k: v for k, v in env.items() if k != "ROLLOUTD_REST_URL"}
            code, _, err = await run_cli("tasks", "list", env=no_url)
            assert code == 1 and "ROLLOUTD_REST_URL" in err
    finally:
        closed.touch()
        os.environ.pop("ROLLOUTD_TENANT_TOKEN", None)
