"""Tenants are who their token says, on real parts (Temporal dev server, the four fleets, shell
tasks in the local runtime): two tenants with their own tokens cannot read, view or cancel each
other's tasks; a tenant claiming another tenant, a priority above its own or a fairness weight
above its token's is refused; no token names the operator's tenant ``default``; a task id
taken by another tenant answers exactly as one's own; backend and stack routes need the
operator's token. Tokens are kept hashed. Each test fails when its guard is removed.
"""

from __future__ import annotations

import contextlib
import json
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from fastapi import HTTPException
from pydantic import ValidationError
from temporalio.client import WorkflowExecutionStatus

from rolloutd.errors import ConfigError
from rolloutd.rest import add_stack_status_route, claim_tenant, create_app
from rolloutd.security.tenants import (
    OPERATOR,
    Caller,
    TenantTokens,
    add_tenant_token,
    hash_token,
    new_tenant_token,
    resolve_caller,
)
from rolloutd.store import BlobStore
from rolloutd.trainer_client import RestClient, RestError, RolloutClient
from rolloutd.viewer import add_viewer_routes
from tests.support.buffer_tasks import poll

OPERATOR_TOKEN = "operator-rest-token-0123456789"


def test_tokens_are_kept_hashed_and_resolve_to_their_tenant(tmp_path: Path) -> None:
    path = tmp_path / "tenants.json"
    token_a, entry_a = new_tenant_token("team-a", 2)
    token_b, entry_b = new_tenant_token("team-b", 4)
    add_tenant_token(path, entry_a)
    add_tenant_token(path, entry_b)
    text = path.read_text()
    assert token_a not in text and token_b not in text and hash_token(token_a) in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    tenants = TenantTokens.load(path)
    a = resolve_caller(token_a, [OPERATOR_TOKEN], tenants)
    assert a is not None and (a.tenant, a.max_priority, a.operator) == ("team-a", 2, False)
    assert resolve_caller(OPERATOR_TOKEN, [OPERATOR_TOKEN], tenants) is OPERATOR
    assert resolve_caller("rt_unknown", [OPERATOR_TOKEN], tenants) is None
    assert resolve_caller(None, [OPERATOR_TOKEN], tenants) is None
    # no token configured at all: a loopback-only facade, the operator's
    assert resolve_caller(None, [None], TenantTokens()) is OPERATOR
    with pytest.raises(ConfigError):
        add_tenant_token(path, entry_a)  # one token, two entries


def test_a_malformed_tokens_file_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({"tenants": [{"tenant": "a", "token": "plain-text"}]}))
    with pytest.raises(ConfigError, match="token_sha256|token"):
        TenantTokens.load(path)


def test_no_token_names_the_operators_default_tenant(tmp_path: Path) -> None:
    """``default`` is the tenant of every task that names none: a token named so would read
    and cancel the operator's tasks. It is refused when made, in the file, and by the CLI."""
    with pytest.raises(ValidationError, match="default"):
        new_tenant_token("default")
    _, entry = new_tenant_token("team-a")
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({"tenants": [{**entry.model_dump(), "tenant": "default"}]}))
    with pytest.raises(ConfigError, match="default"):
        TenantTokens.load(path)
    run = subprocess.run(
        [sys.executable, "-m", "rolloutd.cli", "tenant-token", "default", "--file", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1 and "cannot name 'default'" in run.stderr, run.stderr
    assert not run.stdout.strip()  # no token printed


def test_a_token_bounds_the_fairness_weight_as_it_bounds_the_priority() -> None:
    """The REST facade's claim: above the token's ``max_fairness_weight`` is refused naming
    the field; none given gets the default, lowered to the bound; the operator is unbound."""
    token, entry = new_tenant_token("team-a", 3, max_fairness_weight=0.5)
    assert new_tenant_token("team-b")[1].max_fairness_weight == 1.0  # the default bound
    tenant = resolve_caller(token, [OPERATOR_TOKEN], TenantTokens([entry]))
    assert tenant == Caller("team-a", 3, 0.5)
    for weight in (0.6, 1000.0):
        with pytest.raises(HTTPException) as refused:
            claim_tenant({"fairness_weight": weight}, tenant)
        assert refused.value.status_code == 403
        assert [d["loc"] for d in refused.value.detail] == [["fairness_weight"]]
    within = {"fairness_weight": 0.25}
    claim_tenant(within, tenant)
    assert within["fairness_weight"] == 0.25 and within["tenant"] == "team-a"
    none_given: dict = {}
    claim_tenant(none_given, tenant)
    assert none_given["fairness_weight"] == 0.5
    unbounded = {"fairness_weight": 1000.0}
    claim_tenant(unbounded, OPERATOR)
    assert unbounded == {"fairness_weight": 1000.0}


def test_rolloutd_tenant_token_prints_the_token_and_keeps_its_hash(tmp_path) -> None:
    path = tmp_path / "tenants.json"
    run = subprocess.run(
        [sys.executable, "-m", "rolloutd.cli", "tenant-token", "team-c", "--file", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    token = run.stdout.strip()
    assert token.startswith("rt_") and token not in path.read_text()
    caller = TenantTokens.load(path).caller(token)
    assert caller is not None and caller.tenant == "team-c"


# --------------------------------------------------------------------------- on real parts


@contextlib.asynccontextmanager
async def facade(fleets, tenants: TenantTokens):
    client = RolloutClient(fleets.client)
    client.store = BlobStore(fleets.store_url)
    app = create_app(client, token=OPERATOR_TOKEN, tenant_tokens=tenants, gateway_url="http://x")
    add_stack_status_route(app, client, Path(fleets.store_url).parent)
    add_viewer_routes(app, client, authorize=app.state.authorize_task)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://facade"
    ) as http:
        yield http, client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def gated_task(task_id: str, gate: Path, **fields: object) -> dict:
    """A POLAR body whose shell session waits for ``gate`` (so it is running while tested)."""
    return {
        "task_id": task_id,
        "instruction": "wait",
        "runtime": {"backend": "local", "image": "host", "network": "host"},
        "agent": {
            "harness": "shell",
            "settings": {"command": f"while [ ! -e {gate} ]; do sleep 0.1; done; true"},
        },
        "evaluator": {"strategy": "session_completed"},
        **fields,
    }


@pytest.mark.temporal
@pytest.mark.engine
async def test_two_tenants_cannot_read_view_or_cancel_each_others_tasks(
    fleets, tmp_path: Path
) -> None:
    token_a, entry_a = new_tenant_token("team-a", 2)
    token_b, entry_b = new_tenant_token("team-b", 3)
    tenants = TenantTokens([entry_a, entry_b])
    u = uuid.uuid4().hex[:6]
    gate = tmp_path / "go"
    task_a, task_b = f"ten-a-{u}", f"ten-b-{u}"
    async with facade(fleets, tenants) as (http, client):
        try:
            r = await http.post(
                "/rollout/task/submit", json=gated_task(task_a, gate), headers=bearer(token_a)
            )
            assert r.status_code == 200, r.text
            r = await http.post(
                "/rollout/task/submit", json=gated_task(task_b, gate), headers=bearer(token_b)
            )
            assert r.status_code == 200, r.text
            # the task is its token's tenant's, at the tenant's bound when none was asked
            assert await client.task_tenant(task_a) == "team-a"

            for reader, other in ((token_a, task_b), (token_b, task_a)):
                for method, path in (
                    ("GET", f"/rollout/task/{other}"),
                    ("DELETE", f"/rollout/task/{other}"),
                    ("GET", f"/view/task/{other}"),
                    ("GET", f"/view/session/{other}/0"),
                ):
                    r = await http.request(method, path, headers=bearer(reader))
                    assert r.status_code == 404, (method, path, r.text)
            for mine, token in ((task_a, token_a), (task_b, token_b)):
                r = await http.get(f"/rollout/task/{mine}", headers=bearer(token))
                assert r.status_code == 200 and r.json()["status"] == "running", r.text
                r = await http.get(f"/view/task/{mine}", headers=bearer(token))
                assert r.status_code == 200, r.text
            # the refused DELETEs cancelled nothing
            for task_id in (task_a, task_b):
                described = await client.get_handle(task_id).describe()
                assert described.status == WorkflowExecutionStatus.RUNNING

            # a tenant's status counts its own running tasks (visibility catches up: polled)
            for token, tenant in ((token_a, "team-a"), (token_b, "team-b")):
                mine = await poll(
                    lambda token=token: _json(http.get("/rollout/status", headers=bearer(token))),
                    lambda s: s.get("running_tasks") == 1,
                    what=f"{tenant}'s one running task counted",
                )
                assert mine["tenant"] == tenant and "running_buffers" not in mine
            everyone = (await http.get("/rollout/status", headers=bearer(OPERATOR_TOKEN))).json()
            assert everyone["running_tasks"] >= 2 and "running_buffers" in everyone

            # the operator sees both; a tenant cancels its own
            r = await http.get(f"/rollout/task/{task_b}", headers=bearer(OPERATOR_TOKEN))
            assert r.status_code == 200
            r = await http.delete(f"/rollout/task/{task_a}", headers=bearer(token_a))
            assert r.status_code == 200, r.text
            await poll(
                lambda: client.get_handle(task_a).describe(),
                lambda d: d.status != WorkflowExecutionStatus.RUNNING,
                what="A's task cancelled",
            )
            assert (
                await client.get_handle(task_b).describe()
            ).status == WorkflowExecutionStatus.RUNNING
        finally:
            gate.touch()


@pytest.mark.temporal
@pytest.mark.engine
async def test_a_tenant_claiming_another_tenant_or_a_higher_priority_is_refused(
    fleets, tmp_path: Path
) -> None:
    token_a, entry_a = new_tenant_token("team-a", 2, max_fairness_weight=0.5)
    tenants = TenantTokens([entry_a])
    u = uuid.uuid4().hex[:6]
    gate = tmp_path / "go"
    async with facade(fleets, tenants) as (http, client):
        cases = [
            ({"tenant": "team-b"}, ["tenant"]),
            ({"priority": 1}, ["priority"]),
            ({"dispatch_priority": 2}, ["priority"]),  # Polar's: maps to priority 1
            ({"fairness_weight": 1000.0}, ["fairness_weight"]),
        ]
        for i, (fields, loc) in enumerate(cases):
            r = await http.post(
                "/rollout/task/submit",
                json=gated_task(f"claim-{i}-{u}", gate, **fields),
                headers=bearer(token_a),
            )
            assert r.status_code == 403, r.text
            assert [d["loc"] for d in r.json()["detail"]] == [loc]
        # nothing was started
        for i in range(len(cases)):
            with pytest.raises(Exception, match="not found"):
                await client.task_tenant(f"claim-{i}-{u}")
        # within its bound and for itself: accepted, at the token's weight when none is asked
        r = await http.post(
            "/rollout/task/submit",
            json=gated_task(f"claim-ok-{u}", gate, tenant="team-a", priority=2),
            headers=bearer(token_a),
        )
        gate.touch()
        assert r.status_code == 200, r.text
        # what Temporal's fairness uses: the task workflow's own priority
        described = await client.get_handle(f"claim-ok-{u}").describe()
        assert described.raw_info.priority.fairness_weight == 0.5
        assert described.raw_info.priority.priority_key == 2


@pytest.mark.temporal
@pytest.mark.engine
async def test_a_task_id_another_tenant_holds_answers_as_ones_own(fleets, tmp_path: Path) -> None:
    """Task ids are global (workflow ids); the 409 a taken id gets says nothing of whose it
    is: a tenant re-submitting its own id and another tenant submitting it get the same status
    and the same body, and the task stays its owner's."""
    token_a, entry_a = new_tenant_token("team-a", 3)
    token_b, entry_b = new_tenant_token("team-b", 3)
    u = uuid.uuid4().hex[:6]
    gate = tmp_path / "go"
    task_id = f"taken-{u}"
    async with facade(fleets, TenantTokens([entry_a, entry_b])) as (http, client):
        try:
            r = await http.post(
                "/rollout/task/submit", json=gated_task(task_id, gate), headers=bearer(token_a)
            )
            assert r.status_code == 200, r.text
            answers = []
            for token in (token_a, token_b):
                r = await http.post(
                    "/rollout/task/submit", json=gated_task(task_id, gate), headers=bearer(token)
                )
                answers.append((r.status_code, r.content))
            assert answers[0][0] == 409, answers
            assert answers[0] == answers[1]
            assert await client.task_tenant(task_id) == "team-a"
        finally:
            gate.touch()


@pytest.mark.temporal
@pytest.mark.engine
async def test_backend_and_stack_routes_need_the_operators_token(fleets) -> None:
    token_a, entry_a = new_tenant_token("team-a", 3)
    async with facade(fleets, TenantTokens([entry_a])) as (http, _):
        for path in ("/add_llm_server", "/clear_llm_server"):
            body = {"address": "http://127.0.0.1:9"} if path == "/add_llm_server" else None
            r = await http.post(path, json=body, headers=bearer(token_a))
            assert r.status_code == 403, r.text
        assert (await http.get("/stack/status", headers=bearer(token_a))).status_code == 403
        # no token, or an unknown one: 401
        assert (await http.get("/rollout/task/x")).status_code == 401
        assert (await http.get("/rollout/task/x", headers=bearer("rt_nope"))).status_code == 401


@pytest.mark.temporal
@pytest.mark.engine
async def test_the_trainers_rest_client_carries_its_tenant_token(
    fleets, tmp_path: Path, monkeypatch
) -> None:
    token_a, entry_a = new_tenant_token("team-a", 3)
    token_b, entry_b = new_tenant_token("team-b", 3)
    client = RolloutClient(fleets.client)
    app = create_app(client, token=OPERATOR_TOKEN, tenant_tokens=TenantTokens([entry_a, entry_b]))
    transport = httpx.ASGITransport(app=app)
    gate = tmp_path / "go"
    task_id = f"rest-client-{uuid.uuid4().hex[:6]}"
    monkeypatch.setenv("ROLLOUTD_TENANT_TOKEN", token_a)  # the trainer's setting
    async with (
        RestClient("http://facade", transport=transport) as a,
        RestClient("http://facade", token_b, transport=transport) as b,
    ):
        try:
            assert (await a.submit(gated_task(task_id, gate)))["task_id"] == task_id
            assert await client.task_tenant(task_id) == "team-a"
            assert (await a.status(task_id))["status"] == "running"
            with pytest.raises(RestError) as refused:
                await b.cancel(task_id)
            assert refused.value.status_code == 404
            await a.cancel(task_id)
        finally:
            gate.touch()


async def _json(response) -> dict:
    return (await response).json()
