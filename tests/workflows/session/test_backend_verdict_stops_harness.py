"""The gateway's dead-backend verdict stops a harness whose model call hangs, killing
nothing: the backend (llama-server behind a recording proxy) stops answering, its health
probe included, while the harness waits on its only call with no client timeout. Real
Temporal dev server (one of its own, so that this test's gateway, whose
``backend_dead_after_s`` is lowered, is the only one polling), real llama-server, the four
fleets in this process, the shell harness on the local runtime."""

from __future__ import annotations

import contextlib
import time
import uuid

import pytest

from rolloutd.proxy.backends.health import ANSWERS_PROBE_TIMEOUT_S
from rolloutd.stack import TemporalDevServer, free_port
from rolloutd.store import BlobStore
from rolloutd.trainer_client import RolloutClient
from rolloutd.types import SessionStatus
from tests.support.shell_calls import call
from tests.support.tee import Tee

pytestmark = [pytest.mark.temporal, pytest.mark.engine]

#: the gateway's ``backend_dead_after_s`` in this test, seconds
DEAD_AFTER_S = 6.0
#: the run budget: the harness would wait this long without the verdict
RUN_S = 240


@pytest.mark.acceptance
async def test_a_hanging_backend_stops_the_harness_within_the_configured_time(
    engine, tmp_path
) -> None:
    """About 60 s (a Temporal dev server and four fleets started, then one session of
    about 22 s). The harness's call hangs at the backend; the gateway's verdict
    (``backend_dead_after_s`` 6 s, then the health probe that tells a hung backend from a
    saturated one gets no answer within ``ANSWERS_PROBE_TIMEOUT_S``, 15 s) stops the
    harness at a heartbeat, so the run phase ends within those two and 10 s of slack, far
    inside its 240 s budget. The call the verdict ended is a failed call of the backend's
    (503 to the harness), so the session ends ``backend`` naming it, with no reward, and
    not the policy's."""
    from rolloutd.settings import EvalSettings, GatewaySettings, SandboxSettings
    from rolloutd.workers import connect, run_fleet

    server = TemporalDevServer(headless=True).start()
    tee = await Tee(engine.url).start()
    try:
        common = {
            "temporal_address": server.address,
            "store_url": str(tmp_path / "store"),
            "host_id": "verdict-host",
            "log_json": False,
        }
        port = free_port()
        gateway_settings = GatewaySettings(
            **common,
            gateway_port=port,
            backend_url=tee.url,
            gateway_public_url=f"http://127.0.0.1:{port}",
            model="qwen2.5-coder-0.5b",
            backend_dead_after_s=DEAD_AFTER_S,
        )
        sandbox_settings = SandboxSettings(**common, runtime_root=str(tmp_path / "runtimes"))
        client = await connect(gateway_settings)
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(run_fleet("gateway", client, gateway_settings))
            await stack.enter_async_context(run_fleet("sandbox", client, sandbox_settings))
            await stack.enter_async_context(run_fleet("eval", client, EvalSettings(**common)))
            await stack.enter_async_context(run_fleet("workflows", client, gateway_settings))
            tee.hanging = True  # from here on the backend takes requests and never answers
            rollouts = RolloutClient(client, BlobStore(common["store_url"]))
            handle = await rollouts.submit(
                {
                    "task_id": f"verdict-{uuid.uuid4().hex[:6]}",
                    "instruction": "test",
                    # curl without a timeout: only the verdict ends this call
                    "harness": {"type": "shell", "command": call("hi")},
                    "runtime": {"type": "local"},
                    "evaluator": {"type": "test_on_output", "command": "test -s reply.json"},
                    "sampling": {"max_tokens": 8, "policy": "override"},
                    "phases": {"run_s": RUN_S},
                    "timeout_s": RUN_S + 120,
                    "max_replacements": 0,
                },
                check_capabilities=False,
            )
            started = time.monotonic()
            result = await handle.result()
            waited = time.monotonic() - started
            tee.release()
    finally:
        await tee.stop()
        server.stop()
    [s] = result.sessions
    assert s.failure is not None and (s.failure.kind, s.failure.phase) == ("backend", "run"), s
    assert "the gateway's verdict ended it" in s.failure.message, s.failure.message
    assert not s.failure.policy_accountable and s.reward is None
    assert s.status == SessionStatus.FAILED
    [run] = [p for p in s.phases if p.phase == "run"]
    assert run.duration_s <= DEAD_AFTER_S + ANSWERS_PROBE_TIMEOUT_S + 10, (run.duration_s, s.phases)
    assert waited < RUN_S / 2, waited
    # the probe that found the backend hung reached it (nothing was killed or refused)
    assert any(e.path == "/health" for e in tee.exchanges), [e.path for e in tee.exchanges]
