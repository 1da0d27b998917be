"""``CallbackWorkflow`` on a real Temporal dev server, with the eval fleet's real
``post_callback`` activity and a real HTTP receiver: Temporal's retry policy retries a 503 and
an unreachable receiver, a final 4xx ends the retries at once, and the ``state`` query tells
how it ended and after how many attempts."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest
from fastapi import FastAPI, Request, Response
from temporalio.worker import Worker

from rolloutd import task_queues
from rolloutd.activities.trainer_io import LOOPBACK_HOSTS, TrainerIOActivities
from rolloutd.processes import free_port
from rolloutd.security.connection import connect_temporal
from rolloutd.settings import CommonSettings
from rolloutd.types import CallbackStatus, SessionResult
from rolloutd.workflows.callback import CallbackInput, CallbackWorkflow
from tests.support.namespaces import fresh_namespace
from tests.support.served import served

pytestmark = [pytest.mark.temporal]


@contextlib.asynccontextmanager
async def receiver(answers: list[int]) -> AsyncIterator[tuple[str, list[int]]]:
    """An HTTP receiver answering ``answers`` in order (then 200); yields its URL and the
    statuses it sent."""
    app = FastAPI()
    sent: list[int] = []

    @app.post("/callback")
    async def callback(request: Request) -> Response:
        await request.json()
        sent.append(answers[len(sent)] if len(sent) < len(answers) else 200)
        return Response(status_code=sent[-1])

    async with served(app) as url:
        yield f"{url}/callback", sent


@pytest.fixture
async def eval_worker(temporal_server) -> AsyncIterator:
    """A client in a fresh namespace, with the callback workflow and ``post_callback`` on
    their real queues there."""
    namespace = await fresh_namespace(temporal_server.address, "callback")
    settings = CommonSettings(temporal_address=temporal_server.address)
    client = await connect_temporal(settings, namespace=namespace)
    io = TrainerIOActivities(timeout_s=5.0, allowed_hosts=LOOPBACK_HOSTS)
    workflows = Worker(client, task_queue=task_queues.WORKFLOWS, workflows=[CallbackWorkflow])
    activities = Worker(client, task_queue=task_queues.EVAL, activities=[io.post_callback])
    async with workflows, activities:
        yield client
    await io.aclose()


async def run_callback(client, url: str, timeout_s: float) -> CallbackStatus:
    session = SessionResult(session_id=f"s-{uuid.uuid4().hex[:6]}", task_id="t", status="completed")
    return await client.execute_workflow(
        CallbackWorkflow.run,
        CallbackInput(url=url, session=session, timeout_s=timeout_s),
        id=f"callback-{session.session_id}",
        task_queue=task_queues.WORKFLOWS,
        result_type=CallbackStatus,
    )


async def test_a_503_is_retried_and_the_attempts_counted(eval_worker) -> None:
    async with receiver([503, 503]) as (url, sent):
        state = await run_callback(eval_worker, url, timeout_s=60)
    assert sent == [503, 503, 200]
    assert (state.status, state.status_code, state.attempts, state.error) == (
        "delivered",
        200,
        3,
        None,
    )


async def test_a_final_4xx_ends_the_retries_at_once(eval_worker) -> None:
    async with receiver([404]) as (url, sent):
        state = await run_callback(eval_worker, url, timeout_s=60)
    assert sent == [404]
    assert (state.status, state.attempts) == ("failed", 1)
    assert "callback answered 404" in (state.error or "")


async def test_an_unreachable_receiver_is_retried_until_the_total_time_is_spent(
    eval_worker,
) -> None:
    url = f"http://127.0.0.1:{free_port()}/callback"
    loop = asyncio.get_running_loop()
    started = loop.time()
    state = await run_callback(eval_worker, url, timeout_s=5)
    assert state.status == "failed"
    assert state.attempts >= 2  # at 0 s, 1 s, 3 s: the next backoff (4 s) passes the total
    # what the task's status shows says nothing the transport said (the port is closed)
    assert state.error == "CallbackHTTPError: callback failed: the receiver did not answer"
    assert loop.time() - started < 30
