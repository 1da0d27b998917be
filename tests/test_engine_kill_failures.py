"""llama-server killed by SIGKILL in the middle of a batch (2 tasks x 2 samples) of a shell
harness that makes 8 chat calls and, like Qwen Code, carries on and exits 0 whatever its
calls get: no session has a reward unless every call it made was answered; the others end
with failure kind ``backend`` and ``reward = None``, and `rolloutd submit` would exit 1.

Its own llama-server (the shared one must survive) and its own namespace on the shared
Temporal dev server; the fleets run in this process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from rolloutd.cli.report import exit_code
from rolloutd.settings import EvalSettings, GatewaySettings, SandboxSettings
from rolloutd.stack import free_port
from rolloutd.trainer_client import RolloutClient
from rolloutd.workers import connect, run_fleet
from tests.support.namespaces import fresh_namespace
from tests.support.tee import Tee

pytestmark = [pytest.mark.slow, pytest.mark.temporal, pytest.mark.engine]

NUM_CALLS = 8
#: 8 calls in a row, each a fresh question; a failed call is skipped (|| true), and the
#: script ends with exit 0 and its output, as Qwen Code does
EIGHT_CALLS = (
    "; ".join(
        'curl -sS -f -o /dev/null "$OPENAI_BASE_URL/chat/completions" '
        "-H \"Authorization: Bearer $OPENAI_API_KEY\" -H 'Content-Type: application/json' "
        '-d \'{"model": "m", "messages": [{"role": "user", '
        f'"content": "count to {n}"}}]}}\' && echo ok >> answered.txt || true'
        for n in range(NUM_CALLS)
    )
    + "; touch answered.txt; exit 0"
)


def answered(tee: Tee) -> int:
    return sum(1 for ex in tee.exchanges if ex.path == "/completion" and ex.status == 200)


async def test_killing_the_engine_mid_batch_leaves_no_reward_on_a_broken_session(
    temporal_server, tmp_path: Path
) -> None:
    from rolloutd.engine.server import LlamaServer

    engine = await asyncio.to_thread(
        lambda: LlamaServer(
            "qwen2.5-coder-0.5b", parallel=2, ctx_size=4096, log_path=tmp_path / "engine.log"
        ).start(timeout_s=180)
    )
    tee = await Tee(engine.url).start()
    namespace = await fresh_namespace(temporal_server.address, "kill-engine")
    common = {
        "temporal_address": temporal_server.address,
        "temporal_namespace": namespace,
        "store_url": str(tmp_path / "store"),
        "host_id": "kill-engine",
        "log_json": False,
    }
    port = free_port()
    gateway = GatewaySettings(
        **common,
        gateway_port=port,
        backend_url=tee.url,
        gateway_public_url=f"http://127.0.0.1:{port}",
        model="qwen2.5-coder-0.5b",
    )
    try:
        client = await connect(gateway)
        async with contextlib.AsyncExitStack() as stack:
            root = stack.enter_context(tempfile.TemporaryDirectory(prefix="ke-"))
            await stack.enter_async_context(run_fleet("gateway", client, gateway))
            await stack.enter_async_context(
                run_fleet("sandbox", client, SandboxSettings(**common, runtime_root=root))
            )
            await stack.enter_async_context(run_fleet("eval", client, EvalSettings(**common)))
            await stack.enter_async_context(run_fleet("workflows", client, gateway))
            rollouts = RolloutClient(client)
            handles = [
                await rollouts.submit(
                    {
                        "task_id": f"kill-engine-{n}-{uuid.uuid4().hex[:6]}",
                        "instruction": "count",
                        "num_samples": 2,
                        "harness": {"type": "shell", "command": EIGHT_CALLS},
                        "runtime": {"type": "local"},
                        "sampling": {"max_tokens": 8, "policy": "override"},
                        "evaluator": {"type": "test_on_output", "command": "test -f answered.txt"},
                        "phases": {"run_s": 120},
                        "timeout_s": 300,
                    },
                    check_capabilities=False,
                )
                for n in range(2)
            ]
            deadline = time.monotonic() + 120
            while answered(tee) < 6:  # the batch is under way: some calls answered
                assert time.monotonic() < deadline, "no call answered"
                await asyncio.sleep(0.1)
            assert engine.process is not None
            os.killpg(engine.process.pid, signal.SIGKILL)
            engine.process.wait()
            results = [await asyncio.wait_for(h.result(), timeout=240) for h in handles]
    finally:
        await tee.stop()
        await asyncio.to_thread(engine.stop)
    sessions = [s for group in results for s in group.sessions]
    assert len(sessions) == 4
    for s in sessions:
        if s.reward is not None:  # scored: every call it made was answered
            assert s.failure is None and s.num_completions == NUM_CALLS, s
            assert s.num_call_errors == 0
        else:
            assert s.failure is not None and s.failure.kind == "backend", s
            assert s.num_unrecovered_call_errors >= 1
    assert any(s.failure is not None for s in sessions)  # the kill hit the batch
    assert exit_code(results) == 1
