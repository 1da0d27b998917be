"""Acceptance: POLAR's appendix A.3 payload through the REST facade ends scored, with callbacks.

The payload (examples/polar_a3.json, built by examples/swebench_task/make_task.py): harness
``codex``, builder ``prefix_merging``, evaluator ``swebench_harness`` with ``refresh_runtime``,
a ``callback_url`` and ``metadata``, ``runtime.backend: bwrap`` with the example's repository
(a failing test the agent must fix). It is posted to the facade of ``rolloutd rest`` (the app
in-process, over the real fleets: Temporal, llama-server with Qwen2.5-Coder-0.5B, bwrap, the
real codex CLI); every session must end with a reward (0.0 when the small model does not fix
the bug: the point is the pipeline) and its result must reach a callback receiver listening
on a local port.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request

from rolloutd.rest import create_app
from rolloutd.sandbox.config import npm_prefix
from rolloutd.sandbox.harnesses.codex import ENTRY, PACKAGE
from rolloutd.store import BlobStore
from rolloutd.trainer_client import RolloutClient
from tests.conftest import have_bwrap
from tests.support.buffer_tasks import poll
from tests.support.served import served

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "polar_a3.json"


@contextlib.asynccontextmanager
async def callback_receiver() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A real HTTP server on a free port that keeps every callback body."""
    app = FastAPI()
    received: list[dict[str, Any]] = []

    @app.post("/callback")
    async def callback(request: Request) -> dict[str, bool]:
        received.append(await request.json())
        return {"ok": True}

    async with served(app) as url:
        yield f"{url}/callback", received


@pytest.mark.temporal
@pytest.mark.engine
@pytest.mark.sandbox
@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed")
@pytest.mark.skipif(
    not (npm_prefix() / "node_modules" / PACKAGE / ENTRY).is_file(),
    reason=f"codex is not installed in {npm_prefix()}: bash scripts/setup.sh",
)
async def test_polar_a3_payload_ends_scored_and_calls_back(fleets):
    """examples/polar_a3.json (one sample) posted to the REST facade: the task completes, every
    session has a reward and a trajectory with traces, and each session's result reaches the
    callback receiver with the task's id. About 10-60 s here (11 s in a run of the
    whole acceptance tier)."""
    payload = json.loads(EXAMPLE.read_text())
    payload["task_id"] = f"polar-a3-{uuid.uuid4().hex[:6]}"
    # one sample keeps the run within CI's time on a 2-core CPU (a turn can take minutes)
    payload["num_samples"] = 1
    client = RolloutClient(fleets.client, BlobStore(fleets.store_url))
    async with (
        callback_receiver() as (callback_url, received),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(client)), base_url="http://rest"
        ) as http,
    ):
        payload["callback_url"] = callback_url
        submitted = await http.post("/rollout/task/submit", json=payload)
        assert submitted.status_code == 200, submitted.text

        async def status() -> dict[str, Any]:
            return (await http.get(f"/rollout/task/{payload['task_id']}")).json()

        done = await poll(
            status, lambda s: s["status"] != "running", timeout_s=2100, what="the POLAR task ended"
        )
        await poll(
            lambda: asyncio.sleep(0, len(received)),
            lambda n: n == 1,
            timeout_s=120,
            what="both callbacks received",
        )
    for r in done["results"]:
        print(
            f"polar a3 {r['session_id']}: {r['status']} reward {r['reward']} failure "
            f"{r['failure']} traces {len(r['trajectory']['traces'])} "
            f"callback {r['callback']}"
        )
    assert done["status"] == "completed", done.get("error")
    assert done["total_sessions"] == done["completed_sessions"] == 1
    assert all(r["reward"] is not None for r in done["results"]), done["results"]
    assert all(r["trajectory"]["traces"] for r in done["results"])
    assert sorted(b["session_id"] for b in received) == sorted(
        r["session_id"] for r in done["results"]
    )
    assert all(b["task_id"] == payload["task_id"] for b in received)
