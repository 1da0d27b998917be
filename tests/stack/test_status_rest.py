"""The REST facade's ``GET /stack/status``: the state file of ``rolloutd up`` and the sessions
in flight by phase, against a real Temporal dev server."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from rolloutd.rest import add_stack_status_route, create_app
from rolloutd.stack import StackState
from rolloutd.stack.state import ChildState, write_state
from rolloutd.trainer_client import RolloutClient
from tests.support.namespaces import fresh_namespace

pytestmark = [pytest.mark.temporal, pytest.mark.timeout(60)]


async def test_stack_status_route(temporal_server, tmp_path: Path):
    # a namespace of its own: other tests of this session run sessions on the same server
    namespace = await fresh_namespace(temporal_server.address, "status")
    client = await RolloutClient.connect(temporal_server.address, namespace=namespace)
    app = create_app(client)
    add_stack_status_route(app, client, tmp_path)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://rest"
    ) as http:
        assert (await http.get("/stack/status")).status_code == 404
        write_state(
            tmp_path,
            StackState(
                home=str(tmp_path),
                phase="running",
                temporal_address=temporal_server.address,
                children=[
                    ChildState(
                        name="sandbox",
                        kind="fleet",
                        phase="running",
                        pid=4242,
                        restarts=2,
                        last_exit_code=-9,
                        task_queues=["rolloutd-sandbox"],
                    )
                ],
            ),
        )
        response = await http.get("/stack/status")
    assert response.status_code == 200
    body = response.json()
    sandbox = body["state"]["children"][0]
    assert (sandbox["name"], sandbox["restarts"], sandbox["last_exit_code"]) == ("sandbox", 2, -9)
    assert body["sessions_by_phase"] == {}  # this server runs no session
