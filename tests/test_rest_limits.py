"""The REST facade's request size limit: a 20 MB submit gets 413 in FastAPI's error shape
before anything reads it (it used to be accepted, and Temporal's 2 MB payload limit then
surfaced as a 500), declared or sent in chunks; a body under the limit reaches its route
whole. Real Temporal dev server (the submit route's client); no fleet is needed, since
nothing is started."""

from __future__ import annotations

import json

import httpx
import pytest

from rolloutd.rest import create_app
from rolloutd.trainer_client import RolloutClient
from tests.test_rest import polar_payload

pytestmark = [pytest.mark.temporal]


async def test_a_20_mb_submit_gets_413_and_a_small_one_reaches_its_route(temporal_server):
    client = await RolloutClient.connect(temporal_server.address)
    app = create_app(client, max_body_bytes=2**20)
    big = polar_payload("big", "true")
    big["instruction"] = "x" * (20 * 2**20)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://facade"
    ) as http:
        refused = await http.post("/rollout/task/submit", json=big)
        assert refused.status_code == 413
        assert "exceeds the limit of 1048576 bytes" in refused.json()["detail"]

        async def chunks():
            data = json.dumps(big).encode()
            for at in range(0, len(data), 2**16):
                yield data[at : at + 2**16]

        refused = await http.post("/rollout/task/submit", content=chunks())
        assert refused.status_code == 413

        # under the limit the route reads the body whole: a bad payload is its 422
        small = polar_payload("small", "true")
        small["num_samples"] = 0
        answered = await http.post("/rollout/task/submit", json=small)
        assert answered.status_code == 422, answered.text
        assert answered.json()["detail"]
