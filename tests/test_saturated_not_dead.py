"""Saturated is not dead, and dead is told within about a minute, through ``rolloutd submit``
(acceptance: about 5 minutes).

The gateway (the real engine), eval and workflows fleets run in this process in a fresh
namespace; the sandbox fleet is a ``rolloutd worker --fleet sandbox`` process with the
default host's 8 runtimes. 12 sessions of a 100 s harness (one model call, then 100 s): 8 run
while 4 wait in the sandbox queue, and the host, full, polls nothing for 100 s; its worker
process still beats in the fleet registry, so ``submit`` waits and exits 0 with 12 completed
and no "unavailable".
Then the sandbox worker is killed (SIGKILL, none restarted) and the same batch is submitted
again: ``submit`` must report the sandbox fleet unavailable within about a minute of the
kill (the fleet is dead 45 s after its last beat; the client checks every 10 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from rolloutd.settings import EvalSettings, GatewaySettings
from rolloutd.stack import free_port
from rolloutd.workers import connect, run_fleet
from tests.conftest import have_bwrap
from tests.support.namespaces import fresh_namespace

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.temporal,
    pytest.mark.engine,
    pytest.mark.timeout(1200),
]

ROOT = Path(__file__).parents[1]
#: one model call (a session that never called the model is a failure for ``submit``), then
#: 100 s of work
HARNESS = (
    'curl -sS -f -o /dev/null "$OPENAI_BASE_URL/chat/completions" '
    "-H \"Authorization: Bearer $OPENAI_API_KEY\" -H 'Content-Type: application/json' "
    """-d '{"model": "m", "messages": [{"role": "user", "content": "Say hi."}]}'; sleep 100"""
)


def batch(path: Path, task_id: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "task_id": task_id,
                "instruction": "wait",
                "num_samples": 12,
                "harness": {"type": "shell", "command": HARNESS},
                "sampling": {"max_tokens": 4},
                "runtime": {"type": "bwrap" if have_bwrap() else "local"},
                "evaluator": {"type": "session_completed"},
                "phases": {"run_s": 200},
                "timeout_s": 400,
                "max_replacements": 0,
            }
        )
        + "\n"
    )
    return path


async def test_a_full_host_is_saturated_and_a_killed_fleet_is_reported_in_a_minute(
    temporal_server, engine, tmp_path: Path
) -> None:
    """12 sessions of a 100 s harness on a full 8-runtime host: ``submit`` exits 0, no
    "unavailable"; the sandbox worker killed: reported unavailable within about a minute
    (the module's docstring). About 5 minutes (274 s in a run of the whole acceptance tier)."""
    namespace = await fresh_namespace(temporal_server.address, "saturated")
    store = str(tmp_path / "store")
    common = {
        "temporal_address": temporal_server.address,
        "temporal_namespace": namespace,
        "store_url": store,
        "host_id": "sat-host",
        "log_json": False,
    }
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",
        "ROLLOUTD_TEMPORAL_ADDRESS": temporal_server.address,
        "ROLLOUTD_TEMPORAL_NAMESPACE": namespace,
        "ROLLOUTD_STORE_URL": store,
        "ROLLOUTD_HOST_ID": "sat-sandbox",
        "ROLLOUTD_LOG_JSON": "false",
    }
    port = free_port()
    gateway = GatewaySettings(
        **common,
        gateway_port=port,
        backend_url=engine.url,
        gateway_public_url=f"http://127.0.0.1:{port}",
        model="qwen2.5-coder-0.5b",
    )
    client = await connect(gateway)
    submit = [sys.executable, "-m", "rolloutd.cli", "submit", "--address", temporal_server.address]
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(run_fleet("gateway", client, gateway))
        await stack.enter_async_context(run_fleet("eval", client, EvalSettings(**common)))
        await stack.enter_async_context(run_fleet("workflows", client, gateway))
        root = stack.enter_context(tempfile.TemporaryDirectory(prefix="sat-"))
        sandbox = subprocess.Popen(
            [sys.executable, "-m", "rolloutd.cli", "worker", "--fleet", "sandbox"],
            cwd=ROOT,
            env={**env, "ROLLOUTD_RUNTIME_ROOT": root},
            stdout=open(tmp_path / "sandbox.log", "ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        async def submit_batch(name: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
            """``rolloutd submit`` of the batch, as a user runs it."""
            tasks = batch(tmp_path / f"{name}.jsonl", f"{name}-{uuid.uuid4().hex[:6]}")
            return await asyncio.to_thread(
                subprocess.run,
                [*submit, str(tasks)],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )

        try:
            t0 = time.monotonic()
            full = await submit_batch("full", 900)
            full_s = time.monotonic() - t0
            os.killpg(sandbox.pid, signal.SIGKILL)
            sandbox.wait()
            killed_at = time.monotonic()
            dead = await submit_batch("dead", 600)
            told_s = time.monotonic() - killed_at
        finally:
            if sandbox.poll() is None:
                os.killpg(sandbox.pid, signal.SIGKILL)
                sandbox.wait()
    out = full.stdout + full.stderr
    print(f"\n12 x 100 s on 8 runtimes: submit exit {full.returncode} in {full_s:.0f} s")
    print(out[-1500:])
    dead_out = dead.stdout + dead.stderr
    print(f"sandbox worker killed: submit exit {dead.returncode} {told_s:.0f} s after the kill")
    print(dead_out[-1500:])
    assert full.returncode == 0, out[-3000:]
    assert "unavailable" not in out
    assert "12/12 completed" in out, out[-3000:]
    assert full_s > 200  # two waves of 100 s: the host was full for the first
    assert dead.returncode != 0 and "unavailable" in dead_out, dead_out[-3000:]
    assert told_s < 90, told_s
