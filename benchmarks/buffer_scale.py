"""A buffer of many groups through a slow trainer: payloads, history sizes, stuck slots.

A Temporal dev server, llama-server (SmolLM2-135M: the one-line shell harness makes no model
call; the gateway only needs a backend) and the four fleets run in this process. A buffer of
``--groups`` tasks x ``--samples`` sessions of ``true`` (local runtime) is filled
``--in-flight`` tasks at a time while a trainer takes ``--take`` groups every ``--take-every``
seconds, so finished groups pile up in the buffer; with ``--hold-until N`` the trainer takes
nothing until N groups wait (or every task has ended), then keeps taking (``--hold-until 130
--samples 8``: 1,000+ sessions wait whatever the machine's speed). Once ``--cancel-after``
groups have finished, ``--cancel`` running tasks are cancelled from outside (as from the UI or
REST): they never report, and the buffer must free their slots by asking Temporal.

Printed: wall time, the most groups (and sessions) waiting in the buffer at once, each buffer
run's history (events, bytes, largest event), the largest payload of any buffer or task
history, the tasks reaped and what still runs at the end (no stuck slot: 0).

    python benchmarks/buffer_scale.py [--groups 500] [--samples 8] [--in-flight 64]
        [--take 16] [--take-every 5] [--cancel 50] [--cancel-after 100] [--hold-until 0]

The test suite reaches the same limits with lowered thresholds
(``tests/workflows/buffer/test_buffer_limits.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
import uuid
from pathlib import Path

from rolloutd.engine.server import LlamaServer
from rolloutd.sandbox_policy import SandboxPolicy
from rolloutd.settings import EvalSettings, GatewaySettings, SandboxSettings
from rolloutd.stack import TemporalDevServer, free_port
from rolloutd.store import BlobStore
from rolloutd.trainer_client import RolloutClient
from rolloutd.workers import connect, run_fleet

MB = 1024 * 1024


def task(task_id: str) -> dict:
    return {
        "task_id": task_id,
        "instruction": "a one-line shell harness",
        "harness": {"type": "shell", "command": "true"},
        "runtime": {"type": "local"},
        "evaluator": {"type": "session_completed"},
    }


async def history_sizes(
    client, workflow_id: str, run_id: str | None = None
) -> tuple[int, int, int]:
    history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    sizes = [e.ByteSize() for e in history.events]
    return len(sizes), sum(sizes), max(sizes, default=0)


async def main(args: argparse.Namespace) -> None:
    home = Path(tempfile.mkdtemp(prefix="bufscale-"))
    temporal = TemporalDevServer(headless=True).start()
    engine = LlamaServer("smollm2-135m", parallel=2).start(timeout_s=180)
    try:
        port = free_port()
        common = {
            "temporal_address": temporal.address,
            "store_url": str(home / "store"),
            "host_id": "bench",
            "log_json": False,
            "log_level": "warning",
        }
        gateway = GatewaySettings(
            **common,
            gateway_port=port,
            backend_url=engine.url,
            gateway_public_url=f"http://127.0.0.1:{port}",
            model="smollm2-135m",
        )
        client = await connect(gateway)
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(run_fleet("gateway", client, gateway))
            root = stack.enter_context(tempfile.TemporaryDirectory(prefix="bs-"))
            await stack.enter_async_context(
                run_fleet(
                    "sandbox",
                    client,
                    SandboxSettings(
                        **common,
                        runtime_root=root,
                        max_concurrent_sessions=args.runtimes,
                        # the operator turns the local runtime on (the default policy refuses it)
                        sandbox_policy=SandboxPolicy(runtimes=["local", "bwrap"]),
                    ),
                )
            )
            await stack.enter_async_context(run_fleet("eval", client, EvalSettings(**common)))
            await stack.enter_async_context(run_fleet("workflows", client, gateway))
            await run(client, BlobStore(common["store_url"]), args)
    finally:
        engine.stop()
        temporal.stop()


async def run(client, store: BlobStore, args: argparse.Namespace) -> None:
    rc = RolloutClient(client, store, check_capabilities=False)
    u = uuid.uuid4().hex[:6]
    buffer_id = f"scale-{u}"
    buffer = await rc.create_buffer(
        {
            "buffer_id": buffer_id,
            "num_in_flight": args.in_flight,
            "num_samples": args.samples,
            "drop_zero_variance": False,
            "reap_every_s": args.reap_every,
            "max_ready": args.groups,
        }
    )
    names = [f"{buffer_id}-{i}" for i in range(args.groups)]
    for i in range(0, len(names), 200):
        await buffer.push([task(n) for n in names[i : i + 200]])
    t0 = time.monotonic()
    taken, most_ready, cancelled = 0, 0, []
    holding = args.hold_until > 0
    next_take = time.monotonic() + args.take_every
    while True:
        stats = await buffer.stats()
        most_ready = max(most_ready, stats.num_ready)
        finished = stats.state_counters.get("num_groups_finished", 0)
        if not cancelled and finished >= args.cancel_after and stats.running:
            cancelled = [r.workflow_id for r in stats.running[: args.cancel]]
            await asyncio.gather(*(client.get_workflow_handle(w).cancel() for w in cancelled))
            print(f"{time.monotonic() - t0:.0f} s: cancelled {len(cancelled)} running tasks")
        reaped = stats.state_counters.get("num_reaped", 0)
        if taken + reaped >= args.groups and not stats.running:
            break
        if holding and (stats.num_ready >= args.hold_until or not stats.running):
            holding = False
            print(
                f"{time.monotonic() - t0:.0f} s: {stats.num_ready} groups "
                f"({stats.num_ready * args.samples} sessions) waiting; the trainer starts taking"
            )
        if not holding and time.monotonic() >= next_take and stats.num_ready:
            batch = await buffer.take(min(args.take, stats.num_ready), timeout_s=60)
            await buffer.ack(batch.batch_id)
            taken += len(batch.groups)
            next_take = time.monotonic() + args.take_every
        await asyncio.sleep(1)
    wall = time.monotonic() - t0
    summary = await buffer.close()
    print(
        f"\n{args.groups} groups x {args.samples} sessions, {args.in_flight} in flight, "
        f"{args.runtimes} runtimes: {wall:.0f} s; {taken} groups taken ({args.take} every "
        f"{args.take_every:g} s); most waiting at once {most_ready} groups = "
        f"{most_ready * args.samples} sessions"
    )
    print(
        f"cancelled from outside {len(cancelled)}; reaped {summary.state.num_reaped}; "
        f"running at the end {len(summary.state.running)}; runs {summary.state.num_runs}"
    )
    largest = 0
    async for execution in client.list_workflows(f"WorkflowId = 'buffer/{buffer_id}'"):
        events, size, big = await history_sizes(client, execution.id, execution.run_id)
        largest = max(largest, big)
        print(
            f"  buffer run {execution.run_id[:8]}: {events} events, {size / MB:.2f} MB, "
            f"largest event {big} bytes"
        )
    task_largest = 0
    for name in names[:: max(1, len(names) // 50)]:
        with contextlib.suppress(Exception):
            task_largest = max(task_largest, (await history_sizes(client, f"task/{name}"))[2])
    print(
        f"largest event: buffer {largest} bytes, tasks (every {max(1, len(names) // 50)}th) "
        f"{task_largest} bytes; over 1 MB: {max(largest, task_largest) > MB}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=500)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--runtimes", type=int, default=16)
    parser.add_argument("--take", type=int, default=16)
    parser.add_argument("--take-every", type=float, default=5.0)
    parser.add_argument("--cancel", type=int, default=50)
    parser.add_argument("--cancel-after", type=int, default=100)
    parser.add_argument("--reap-every", type=float, default=10.0)
    parser.add_argument("--hold-until", type=int, default=0)
    asyncio.run(main(parser.parse_args()))
