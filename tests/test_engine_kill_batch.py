"""llama-server killed by SIGKILL in the middle of a batch of 4 tasks x 4 samples, then
restarted on the same port with the same command: the acceptance test of a dead engine.

The harness is a real tool-using agent, examples/agents/file_agent.py on the ``python``
harness (its write_file and run tools execute; the engine's answers carry tool calls through
the lenient hermes parser), which, like Qwen Code, exits on its own with its output. Checked: a
waiting caller gets ``FleetUnavailableError`` naming the engine within 60 s of the kill; no
session has a reward unless every call it made was answered, and every session replaced shows
failure kind ``backend``; once the engine is back, replacements (waiting for it, not counted)
make every group whole, so the groups a trainer takes hold no session without a reward; the
scored sessions ran a tool. ``ROLLOUTD_KILL_BATCH_HARNESS=script`` runs a scripted client
instead (3 chat calls, each offering a tool, exit 0 whatever happened).

Its own llama-server (the shared one must survive) and its own namespace on the shared
Temporal dev server; the fleets run in this process; the real local runtime."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from rolloutd.scoring import scored_sessions
from rolloutd.settings import EvalSettings, GatewaySettings, SandboxSettings
from rolloutd.stack import free_port
from rolloutd.store import BlobStore, CompletionLog
from rolloutd.trainer_client import FleetUnavailableError, RolloutClient
from rolloutd.workers import connect, run_fleet
from tests.support.harness_run import executed_tool_calls
from tests.support.namespaces import fresh_namespace

pytestmark = [pytest.mark.slow, pytest.mark.temporal, pytest.mark.engine, pytest.mark.timeout(1500)]

NUM_TASKS = NUM_SAMPLES = 4
NUM_CALLS = 3
HARNESS = os.environ.get("ROLLOUTD_KILL_BATCH_HARNESS", "python")
AGENT = Path(__file__).parents[1] / "examples" / "agents" / "file_agent.py"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "list_files",
            "description": "list the files of the workspace",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]


def task_body(marks: Path) -> dict:
    """The harness, instruction, sampling and evaluator of each task (module docstring)."""
    if HARNESS == "python":
        return {
            "instruction": "Use the write_file tool to create hello.py that prints hello world.",
            "harness": {
                "type": "python",
                "entry": "file_agent:agent",
                "max_turns": 2,
                "files": {"file_agent.py": AGENT.read_text()},
            },
            "sampling": {"max_tokens": 256, "temperature": 0.2, "seed": 7},
            "evaluator": {
                "type": "test_on_output",
                "command": "python3 hello.py",
                "expected_output": "hello world",
            },
        }
    return {
        "instruction": "list the files",
        "harness": {"type": "shell", "command": script(marks)},
        "sampling": {"max_tokens": 4, "policy": "override"},
        "evaluator": {"type": "test_on_output", "command": "test -f answered.txt"},
    }


def num_recorded(store: Path) -> int:
    """Completions recorded so far in the store (``sessions/{task}/{n}/completions/*.json``:
    a session id holds a ``/``)."""
    return len(list(store.glob("sessions/**/completions/*.json")))


def script(marks: Path) -> str:
    """3 calls in a row, each offering a tool; a failed call is skipped (``|| true``); each
    answered call is marked in ``marks`` (the local runtime shares the host's files)."""
    calls = []
    for n in range(NUM_CALLS):
        body = json.dumps(
            {
                "model": "m",
                "tools": TOOLS,
                "messages": [
                    {"role": "user", "content": f"Step {n}: list the files with the tool."}
                ],
            }
        )
        calls.append(
            'curl -sS -f -o /dev/null "$OPENAI_BASE_URL/chat/completions" '
            "-H \"Authorization: Bearer $OPENAI_API_KEY\" -H 'Content-Type: application/json' "
            f"-d '{body}' && echo ok >> answered.txt && echo ok >> {marks} || true"
        )
    return "; ".join(calls) + "; touch answered.txt; exit 0"


@pytest.mark.acceptance
async def test_a_killed_engine_is_reported_and_replacements_make_every_group_whole(
    temporal_server, tmp_path: Path
) -> None:
    """llama-server killed mid-batch: the dead engine is reported, the sessions whose calls it
    failed get no reward, and their replacements make every group whole once it is back.
    Acceptance tier (a long kill): about 80 s here."""
    from rolloutd.engine.server import LlamaServer

    def engine_on(port: int, log_name: str) -> LlamaServer:
        return LlamaServer(
            "qwen2.5-coder-0.5b", port=port, parallel=4, ctx_size=8192, log_path=tmp_path / log_name
        ).start(timeout_s=180)

    engine = await asyncio.to_thread(engine_on, 0, "engine.log")
    restarted: LlamaServer | None = None
    marks = tmp_path / "answered-calls"
    marks.touch()
    namespace = await fresh_namespace(temporal_server.address, "kill-batch")
    common = {
        "temporal_address": temporal_server.address,
        "temporal_namespace": namespace,
        "store_url": str(tmp_path / "store"),
        "host_id": "kill-batch",
        "log_json": False,
    }
    port = free_port()
    gateway_url = f"http://127.0.0.1:{port}"
    gateway = GatewaySettings(
        **common,
        gateway_port=port,
        backend_url=engine.url,
        gateway_public_url=gateway_url,
        model="qwen2.5-coder-0.5b",
        tool_parser="hermes_lenient",
    )  # as the shared fleets
    try:
        client = await connect(gateway)
        async with contextlib.AsyncExitStack() as stack:
            root = stack.enter_context(tempfile.TemporaryDirectory(prefix="kb-"))
            await stack.enter_async_context(run_fleet("gateway", client, gateway))
            await stack.enter_async_context(
                run_fleet("sandbox", client, SandboxSettings(**common, runtime_root=root))
            )
            await stack.enter_async_context(run_fleet("eval", client, EvalSettings(**common)))
            await stack.enter_async_context(run_fleet("workflows", client, gateway))
            rollouts = RolloutClient(client, gateway_url=gateway_url, check_capabilities=False)
            handles = [
                await rollouts.submit(
                    {
                        "task_id": f"kill-batch-{n}-{uuid.uuid4().hex[:6]}",
                        "num_samples": NUM_SAMPLES,
                        "runtime": {"type": "local"},
                        **task_body(marks),
                        # the engine gets as long as a dead sandbox fleet to come back; a run budget
                        # that a saturated engine (48 s a call at load 16, measured) cannot exhaust
                        "phases": {"run_s": 600, "provision_wait_s": 240},
                        "timeout_s": 1200,
                    }
                )
                for n in range(NUM_TASKS)
            ]
            deadline = time.monotonic() + 400
            while (
                max(
                    len(marks.read_text().split()),  # the batch is under way
                    num_recorded(tmp_path / "store"),
                )
                < 4
            ):
                assert time.monotonic() < deadline, "no call answered"
                await asyncio.sleep(0.1)  # polling the marks file, bounded by the deadline
            assert engine.process is not None
            os.killpg(engine.process.pid, signal.SIGKILL)
            engine.process.wait()
            killed_at = time.monotonic()

            # a waiting caller hears of it within a minute, not after an empty wait
            with pytest.raises(FleetUnavailableError) as raised:
                await asyncio.wait_for(handles[0].result(), timeout=120)
            reported_s = time.monotonic() - killed_at
            print(f"\nkill reported to the waiting caller after {reported_s:.1f} s: {raised.value}")
            assert raised.value.fleet == "engine", raised.value
            assert reported_s < 60, reported_s

            # the fixture's command on the same port: the pool's probes see it come back
            restarted = await asyncio.to_thread(engine_on, engine.port, "engine-2.log")
            results = await asyncio.wait_for(
                asyncio.gather(*(h.workflow.result() for h in handles)), timeout=900
            )
    finally:
        await asyncio.to_thread(engine.stop)
        if restarted is not None:
            await asyncio.to_thread(restarted.stop)

    replaced = [s for group in results for s in group.replaced]
    for s in replaced:
        print(
            f"replaced {s.session_id}: {s.failure}, completions {s.num_completions}, "
            f"call errors {s.num_call_errors}"
        )
    assert replaced, "the kill hit no session"
    for s in replaced:  # a broken session never becomes a reward
        assert s.reward is None and s.failure is not None, s
        assert s.failure.kind == "backend", s.failure
    for group in results:  # every group whole; what a trainer takes holds rewards only
        assert not group.incomplete, group
        assert len(scored_sessions(group)) == NUM_SAMPLES
        for s in group.sessions:
            assert s.reward is not None and s.failure is None, s
            assert s.num_call_errors == 0, s
            if HARNESS != "python":
                assert s.num_completions == NUM_CALLS, s
    if HARNESS == "python":  # the agent's tools ran: a later request holds their results
        store = BlobStore(str(tmp_path / "store"))
        tool_results = [
            executed_tool_calls(CompletionLog(store, s.session_id).read_all())
            for group in results
            for s in group.sessions
        ]
        print(
            "tool results per scored session:",
            tool_results,
            "rewards:",
            [s.reward for group in results for s in group.sessions],
        )
        assert sum(tool_results) >= 1
    print(
        f"{len(replaced)} sessions replaced (all backend); "
        f"{sum(len(g.sessions) for g in results)} sessions scored"
    )
