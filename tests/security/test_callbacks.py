"""Signed callbacks, limited to allowed hosts: each POST carries an HMAC-SHA256 of its exact body
with the task's own secret (Stripe's webhook scheme), which a real receiver verifies; a URL on
a host the operator did not allow is refused without a request, and by default no host is
allowed, loopback included; what a failed callback reports says nothing the target said; the
client gives each task with a callback URL its own secret. Each test fails when its guard is
removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest
from fastapi import FastAPI, Request, Response
from temporalio.client import WorkflowExecutionStatus
from temporalio.worker import Worker

from rolloutd import task_queues
from rolloutd.activities.trainer_io import TrainerIOActivities, callback_host_allowed
from rolloutd.security.callbacks import SIGNATURE_HEADER, sign_callback, verify_callback
from rolloutd.security.connection import connect_temporal
from rolloutd.settings import CommonSettings, EvalSettings
from rolloutd.trainer_client import RolloutClient
from rolloutd.trainer_client.client import InvalidTaskError, validate_task
from rolloutd.types import CallbackStatus, SessionResult
from rolloutd.workflows.callback import CallbackInput, CallbackWorkflow
from tests.support.namespaces import fresh_namespace
from tests.support.served import served

SECRET = "a-task-secret-0123456789"


def test_a_signature_verifies_only_for_its_body_secret_and_time() -> None:
    body = b'{"session_id": "s1", "reward": 1.0}'
    header = sign_callback(SECRET, body, timestamp=1_700_000_000)
    assert verify_callback(SECRET, body, header, now=1_700_000_010)
    assert not verify_callback(SECRET, body.replace(b"1.0", b"0.0"), header, now=1_700_000_010)
    assert not verify_callback("another-secret-0123456", body, header, now=1_700_000_010)
    assert not verify_callback(SECRET, body, header, now=1_700_000_000 + 3600)  # replayed
    assert not verify_callback(SECRET, body, None)
    assert not verify_callback(SECRET, body, "t=x,v1=00")


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://127.0.0.1:8080/cb", True),
        ("http://localhost/cb", True),
        ("http://[::1]:9/cb", True),
        ("http://127.0.0.2:8080/cb", False),
        ("http://169.254.169.254/latest/meta-data/", False),
        ("http://10.0.0.5:7233/", False),
        ("file:///etc/passwd", False),
        ("http://127.0.0.1.evil.test/cb", False),
    ],
)
def test_only_allowed_hosts_are_reached(url: str, allowed: bool) -> None:
    assert callback_host_allowed(url, ("127.0.0.1", "localhost", "::1")) is allowed


def test_a_host_pattern_with_a_port_allows_that_port_only() -> None:
    allowed = ("trainer-*.svc.cluster.local:8080",)
    assert callback_host_allowed("http://trainer-0.svc.cluster.local:8080/cb", allowed)
    assert not callback_host_allowed("http://trainer-0.svc.cluster.local:9090/cb", allowed)


def test_a_callback_url_that_is_not_http_is_refused_at_submit() -> None:
    task = {
        "task_id": "t",
        "instruction": "x",
        "harness": {"type": "shell", "command": "true"},
        "callback_url": "file:///etc/passwd",
    }
    with pytest.raises(InvalidTaskError, match="callback_url"):
        validate_task(task)


@contextlib.asynccontextmanager
async def verifying_receiver(host: str = "127.0.0.1") -> AsyncIterator[tuple[str, list]]:
    """A real HTTP receiver: 200 for a POST signed with :data:`SECRET`, 401 otherwise."""
    app = FastAPI()
    seen: list[tuple[int, bytes]] = []

    @app.post("/callback")
    async def callback(request: Request) -> Response:
        body = await request.body()
        ok = verify_callback(SECRET, body, request.headers.get(SIGNATURE_HEADER))
        seen.append((200 if ok else 401, body))
        return Response(status_code=200 if ok else 401)

    async with served(app, host) as url:
        yield f"{url}/callback", seen


@contextlib.asynccontextmanager
async def callback_worker(temporal_server, allowed_hosts: list[str]) -> AsyncIterator:
    """The callback workflow and ``post_callback`` with the eval fleet's setting
    ``callback_allowed_hosts`` in a fresh namespace of the real dev server."""
    namespace = await fresh_namespace(temporal_server.address, "signed")
    client = await connect_temporal(
        CommonSettings(temporal_address=temporal_server.address), namespace=namespace
    )
    io = TrainerIOActivities(timeout_s=5.0, allowed_hosts=allowed_hosts)
    workflows = Worker(client, task_queue=task_queues.WORKFLOWS, workflows=[CallbackWorkflow])
    activities = Worker(client, task_queue=task_queues.EVAL, activities=[io.post_callback])
    try:
        async with workflows, activities:
            yield client
    finally:
        await io.aclose()


@pytest.fixture
async def eval_worker(temporal_server) -> AsyncIterator:
    """:func:`callback_worker` with the operator allowing 127.0.0.1 (the receivers' host)."""
    async with callback_worker(temporal_server, ["127.0.0.1"]) as client:
        yield client


async def run_callback(client, url: str, secret: str | None) -> CallbackStatus:
    session = SessionResult(session_id=f"s-{uuid.uuid4().hex[:6]}", task_id="t", status="completed")
    return await client.execute_workflow(
        CallbackWorkflow.run,
        CallbackInput(url=url, session=session, timeout_s=10, secret=secret),
        id=f"callback-{session.session_id}",
        task_queue=task_queues.WORKFLOWS,
        result_type=CallbackStatus,
    )


@pytest.mark.temporal
async def test_a_callback_is_signed_with_the_tasks_secret(eval_worker) -> None:
    async with verifying_receiver() as (url, seen):
        signed = await run_callback(eval_worker, url, SECRET)
        unsigned = await run_callback(eval_worker, url, None)
    assert (signed.status, signed.status_code) == ("delivered", 200)
    # without the secret the receiver refuses it: a final 4xx
    assert unsigned.status == "failed" and "401" in (unsigned.error or "")
    assert [code for code, _ in seen] == [200, 401]
    assert b'"session_id"' in seen[0][1]


@pytest.mark.temporal
async def test_a_callback_to_a_host_not_allowed_is_refused_unsent(eval_worker) -> None:
    async with verifying_receiver(host="127.0.0.2") as (url, seen):
        state = await run_callback(eval_worker, url, SECRET)
    assert state.status == "failed" and state.attempts == 1
    assert "is not allowed" in (state.error or "")
    assert "127.0.0.1" not in (state.error or "")  # the operator's list is not shown
    assert seen == []


@pytest.mark.temporal
async def test_by_default_no_host_is_allowed_not_even_loopback(temporal_server) -> None:
    """A task's URL on the eval host's loopback would reach every service listening there
    (any port): until the operator lists hosts, every callback is refused unsent. Control:
    the same receiver, once allowed, gets the POST."""
    assert EvalSettings().callback_allowed_hosts == []
    async with verifying_receiver() as (url, seen):
        default = EvalSettings().callback_allowed_hosts
        async with callback_worker(temporal_server, default) as client:
            refused = await run_callback(client, url, SECRET)
        assert (refused.status, refused.attempts) == ("failed", 1)
        assert "is not allowed" in (refused.error or "") and seen == []
        async with callback_worker(temporal_server, ["127.0.0.1"]) as client:
            delivered = await run_callback(client, url, SECRET)
        assert (delivered.status, delivered.status_code) == ("delivered", 200)
        assert len(seen) == 1


@pytest.mark.temporal
async def test_a_failed_callback_reports_nothing_the_target_said(eval_worker) -> None:
    """A target that is no HTTP server at all (it reads the request, answers a line of its
    own, then hangs up) makes the HTTP client raise with the target's words in its message
    (h11: ``illegal status line: bytearray(b'SSH-2.0-...')``); the status the task shows is the
    generic one, without them."""
    said = b"SSH-2.0-OpenSSH_9.2 secret-banner-0451\r\n\r\n"

    async def speak(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(said)
        await writer.drain()
        await reader.read()  # until the client, having read the line, hangs up
        writer.close()

    server = await asyncio.start_server(speak, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        state = await run_callback(eval_worker, f"http://127.0.0.1:{port}/cb", SECRET)
    finally:
        server.close()
        await server.wait_closed()
    assert state.status == "failed" and "secret-banner" not in (state.error or "")
    assert state.error == "CallbackHTTPError: callback failed: the receiver did not answer"


@pytest.mark.temporal
async def test_the_client_gives_each_task_with_a_callback_its_own_secret(temporal_server) -> None:
    namespace = await fresh_namespace(temporal_server.address, "secret")
    client = RolloutClient(
        await connect_temporal(
            CommonSettings(temporal_address=temporal_server.address), namespace=namespace
        ),
        check_capabilities=False,
        check_fleets=False,
    )
    handles = []
    for _ in range(2):
        task = {
            "task_id": f"cb-{uuid.uuid4().hex[:6]}",
            "instruction": "x",
            "harness": {"type": "shell", "command": "true"},
            "callback_url": "http://127.0.0.1:9/cb",
        }
        handles.append(await client.submit(task))
    try:
        secrets_ = [h.task.callback_secret for h in handles]
        assert all(s and len(s) >= 32 for s in secrets_) and secrets_[0] != secrets_[1]
        assert secrets_[0] not in repr(handles[0].task)
    finally:
        for h in handles:
            await h.workflow.terminate()
            assert (await h.workflow.describe()).status == WorkflowExecutionStatus.TERMINATED
