"""Secure by default, on the embedded stack: ``rolloutd up``'s ``LocalStack`` with no codec key
configured generates one, runs its codec server and points the Temporal UI at it. A session
(a ``shell`` harness in bwrap making one model call) runs; then ``temporal workflow show``
holds neither the prompt nor the session key in clear, not even inside a base64 payload,
while the same command through the stack's codec server (its token read from the home's
file) shows both; headless Chromium opens the stack's Temporal UI and sees both decoded.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import uuid

import pytest

from rolloutd.security.connection import connect_temporal
from rolloutd.settings import CommonSettings, codec_server_token_file
from rolloutd.store import BlobStore
from rolloutd.trainer_client import RolloutClient
from rolloutd.types import SessionStatus
from rolloutd.workflows.task import session_workflow_id, task_workflow_id
from tests.conftest import have_bwrap
from tests.security.test_history_secrets import curl_call, readable_text, workflow_show
from tests.support.chromium_cdp import history_page_url, open_page
from tests.support.stacks import stack_on_engine

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.temporal,
    pytest.mark.engine,
    pytest.mark.sandbox,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not have_bwrap(), reason="no bubblewrap"),
]


async def test_up_encrypts_every_payload_and_its_ui_decodes_them(engine, monkeypatch) -> None:
    """About 60-90 s: a LocalStack (Temporal with its UI, codec server, four fleets as
    processes) on the session's engine, one session, two CLI reads, one Chromium page."""
    # a fresh machine: no key configured anywhere; clients find the stack's as `up` says
    for name in ("ROLLOUTD_CODEC_KEYS", "ROLLOUTD_CODEC_KEY_FILE", "ROLLOUTD_UI_CODEC_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    stack = stack_on_engine(engine.url, "up-codec")
    home = stack.home
    monkeypatch.setenv("ROLLOUTD_HOME", str(home))
    await asyncio.to_thread(stack.start)
    try:
        assert stack.codec_key_file is not None and stack.codec_url and stack.temporal
        client = await connect_temporal(CommonSettings(temporal_address=stack.temporal.address))
        assert client.data_converter.payload_codec is not None  # found the stack's key
        rollout = RolloutClient(client, BlobStore(stack.store_url))
        marker = f"secret-prompt-{uuid.uuid4().hex[:8]}"
        task_id = f"up-codec-{uuid.uuid4().hex[:6]}"
        handle = await rollout.submit(
            {
                "task_id": task_id,
                "instruction": f"Answer {marker}",
                "harness": {"type": "shell", "command": curl_call(f"Say {marker}")},
                "runtime": {"type": "bwrap"},
                "sampling": {"max_tokens": 4},
                "evaluator": {"type": "test_on_output", "command": "test -s reply.json"},
            }
        )
        group = await asyncio.wait_for(handle.result(), timeout=300)
        (session,) = group.sessions
        assert session.status == SessionStatus.COMPLETED and session.num_completions == 1, (
            session.failure,
            session.error,
        )

        session_wf = session_workflow_id(task_workflow_id(task_id), 0)
        token = codec_server_token_file(home).read_text().strip()
        auth = ["--codec-endpoint", stack.codec_url, "--codec-auth", f"Bearer {token}"]
        decoded = readable_text(await workflow_show(stack.temporal.address, session_wf, *auth))
        keys = set(re.findall(r'"session_key":\s*"([^"]+)"', decoded))
        assert len(keys) == 1 and marker in decoded  # so the checks below can fail
        (session_key,) = keys
        for workflow_id in (task_workflow_id(task_id), session_wf):
            raw = readable_text(await workflow_show(stack.temporal.address, workflow_id))
            assert "binary/encrypted" in raw
            assert session_key not in raw and marker not in raw, workflow_id

        run_id = (await client.get_workflow_handle(session_wf).describe()).run_id
        url = history_page_url(stack.temporal.ui_url, session_wf, run_id)
        async with open_page(url, height=2000) as page:
            # the workflow's input (the prompt) and open_session's result (the session key),
            # decoded by the stack's codec server, which the UI was pointed at
            await page.wait_for_text(marker, '"session_key":', timeout_s=120)
    finally:
        await asyncio.to_thread(stack.stop)
        shutil.rmtree(home, ignore_errors=True)
