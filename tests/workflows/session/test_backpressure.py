"""Backpressure from the inference backends on real parts (docs/tenancy.md): the real
llama-server of the test session (4 slots, ``--parallel 4``, read from its ``/props``), a real
Temporal dev server, the real four fleets in their own namespace, real gateway sessions and
harnesses that sleep about two seconds in real runtimes. The gateway allows 0.5 open sessions
per slot, so 2 sessions at once; the sandbox host allows 8, so only the backends bound them.

The figures (most sessions open at once, the waits) are printed (``-s``) for the closing note.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rolloutd.errors import BackendSaturatedError
from rolloutd.proxy.backends.pool import BackendPool
from rolloutd.proxy.backends.saturation import BackendCapacity
from rolloutd.proxy.backends.specs import make_backend
from rolloutd.proxy.http.server import Gateway
from rolloutd.proxy.sessions.manager import SessionManager
from rolloutd.store import BlobStore
from rolloutd.trainer_client import RolloutClient
from tests.support.namespaced_fleets import namespaced_fleets
from tests.support.tenancy import assert_all_completed, sampling, task

pytestmark = [pytest.mark.temporal]

#: open sessions per engine slot: with the engine's 4 slots, 2 sessions at once
PER_SLOT = 0.5
BOUND = 2


@dataclass
class Rig:
    client: RolloutClient
    gateway: Gateway


@contextlib.asynccontextmanager
async def rig(address: str, engine_url: str, home: Path) -> AsyncIterator[Rig]:
    """The four fleets in a fresh namespace; the gateway's backend is the real engine and
    it takes ``PER_SLOT`` open sessions per engine slot."""
    async with namespaced_fleets(
        address,
        home,
        engine_url,
        tag="bp",
        gateway={"max_sessions_per_slot": PER_SLOT},
        sandbox_host={"max_concurrent_sessions": 8},
    ) as fleets:
        yield Rig(
            RolloutClient(fleets.client, check_capabilities=False),
            fleets.handles["gateway"].resources["gateway"],
        )


async def sample_open_sessions(gateway: Gateway, stop: asyncio.Event, most: list[int]) -> None:
    """The most sessions open on the gateway's pool at once, every 20 ms until ``stop``."""
    while not stop.is_set():
        most[0] = max(most[0], sum(r["num_assigned"] for r in gateway.pool.describe()))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.02)


@pytest.mark.timeout(300)
async def test_sessions_wait_for_saturated_backends_and_proceed_when_they_free(
    temporal_server, engine, tmp_path: Path
) -> None:
    tag = random.randrange(10_000, 99_999)
    async with (
        rig(temporal_server.address, engine.url, tmp_path) as r,
        sampling([f"2.{tag:05d}"]) as harnesses,
    ):
        stop, most_open = asyncio.Event(), [0]
        sampler = asyncio.create_task(sample_open_sessions(r.gateway, stop, most_open))
        t0 = time.monotonic()
        # a session deadline of 5 s, shorter than the last sessions' wait for the backends
        handle = await r.client.submit(
            task(f"bp-{uuid.uuid4().hex[:6]}", f"sleep 2.{tag:05d}", 6, timeout_s=5)
        )
        group = await handle.result()
        wall = time.monotonic() - t0
        stop.set()
        await sampler
        load = r.gateway.sessions.capacity.check()
    assert_all_completed(group)
    waits = sorted(
        sum(p.duration_s for p in s.phases if p.phase == "backend_wait") for s in group.sessions
    )
    print(
        f"\nbackends bound {BOUND} ({load.num_slots} engine slots x {PER_SLOT}): 6 sessions "
        f"in {wall:.1f} s; at most {most_open[0]} open, {harnesses.most_total} harnesses "
        f"at once ({harnesses.samples} samples); backend waits "
        f"{', '.join(f'{w:.1f}' for w in waits)} s; deadline 5 s"
    )
    assert load.num_slots == 4  # llama-server's total_slots from /props
    assert most_open[0] == BOUND  # reached, never exceeded
    assert harnesses.most_total <= BOUND
    # at least 4 of 6 sessions waited for the backends; the longest waited past its deadline
    assert sum(w > 0 for w in waits) >= 4
    assert waits[-1] > 5
    assert load.num_sessions_open == 0 and not load.saturated


async def _num_events(client, workflow_id: str) -> int:
    handle = client.client.get_workflow_handle(workflow_id)
    return len((await handle.fetch_history()).events)


@pytest.mark.timeout(300)
async def test_a_session_waiting_for_the_backends_records_no_event_and_has_a_deadline(
    temporal_server, engine, tmp_path: Path
) -> None:
    """Two sessions hold both places of the backends for about 25 s; a third waits for a
    place in the admission queue and its history does not grow while it waits (a poll in
    workflow code recorded about 11 events a round); a fourth with ``capacity_wait_s`` 3 is
    failed at its deadline (``backend``, not retried) without ever opening."""
    tag = random.randrange(10_000, 99_999)
    u = uuid.uuid4().hex[:6]
    async with rig(temporal_server.address, engine.url, tmp_path) as r:
        holders = await r.client.submit(
            task(f"hold-{u}", f"sleep 2{tag % 10}.{tag:05d}", BOUND, timeout_s=60)
        )
        deadline = time.monotonic() + 60
        while r.gateway.sessions.capacity.check().num_sessions_open < BOUND:
            assert time.monotonic() < deadline, "the holders never opened"
            await asyncio.sleep(0.2)  # polling the gateway, bounded by the deadline
        waiter = await r.client.submit(task(f"wait-{u}", "true", 1, timeout_s=60))
        hurried = await r.client.submit(
            task(f"hurry-{u}", "true", 1, phases={"run_s": 30, "capacity_wait_s": 3})
        )
        await asyncio.sleep(3)  # let the waiter's first workflow tasks settle
        waiter_id = f"task/{waiter.task_id}/0"
        early = await _num_events(r.client, waiter_id)
        waited_from = time.monotonic()
        # the measured span: the holders (20-29 s) still hold both places at its end
        await asyncio.sleep(12)
        late = await _num_events(r.client, waiter_id)
        phase = await r.client.client.get_workflow_handle(waiter_id).query("phase")
        waited_s = time.monotonic() - waited_from
        [refused] = (await hurried.result()).sessions
        [waited] = (await waiter.result()).sessions
        assert_all_completed(await holders.result())
        history = await r.client.client.get_workflow_handle(waiter_id).fetch_history()
    print(
        f"\nwaiting session: {early} events after 3 s, {late} after {waited_s + 3:.0f} s "
        f"waiting; whole history {len(history.events)} events, "
        f"{len(history.to_json()) / 1024:.1f} KiB; deadline refusal: {refused.error}"
    )
    assert waited_s > 10 and phase == "open", phase
    assert late == early, [e.event_type for e in history.events[early : late + 1]]
    assert waited.status.value == "completed"
    assert any(p.phase == "backend_wait" and p.duration_s > 10 for p in waited.phases)
    assert refused.status.value == "failed" and refused.failure is not None
    assert (refused.failure.kind, refused.failure.retryable) == ("backend", False)
    assert "phases.capacity_wait_s (3 s)" in (refused.error or "")


@pytest.mark.timeout(120)
async def test_concurrent_opens_never_exceed_the_bound(engine, tmp_path: Path) -> None:
    """Many opens at once on one gateway: exactly the bound succeed, the others are refused
    with ``BackendSaturatedError`` (the check and the pinning are one step); a closed
    session frees its place."""
    pool = BackendPool([make_backend("llama_cpp", "engine", engine.url)])
    sessions = SessionManager(
        BlobStore(str(tmp_path / "store")), pool, public_url="http://127.0.0.1:1", default_model="m"
    )
    sessions.capacity = BackendCapacity(pool, max_sessions_per_slot=PER_SLOT, backend_slots=None)
    try:
        results = await asyncio.gather(
            *(sessions.open_session(f"t/{i}", "t", wait_for_backends=True) for i in range(8)),
            return_exceptions=True,
        )
        opened = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, BackendSaturatedError)]
        assert (len(opened), len(refused)) == (BOUND, 8 - BOUND), results
        assert "2 sessions open, bound 2 (4 slots" in str(refused[0])
        # without the flag (a replacement attempt, an old workflow) nothing is refused
        await sessions.open_session("t/extra", "t")
        await sessions.close_session(opened[0].session_id)
        await sessions.close_session("t/extra")
        again = await sessions.open_session("t/again", "t", wait_for_backends=True)
        assert again.backend == "engine"
        with pytest.raises(BackendSaturatedError):
            await sessions.open_session("t/over", "t", wait_for_backends=True)
    finally:
        await pool.aclose()


@pytest.mark.timeout(300)
async def test_the_buffer_keeps_its_in_flight_target_from_the_observed_capacity(
    temporal_server, engine, tmp_path: Path
) -> None:
    """A buffer configured for 10 tasks in flight over a fleet that runs 2 sessions at once
    (backends: 4 slots x 0.5; sandbox host: 8) keeps 2 x 2 / 1 = 4 tasks running."""
    tag = random.randrange(10_000, 99_999)
    async with rig(temporal_server.address, engine.url, tmp_path) as r:
        buffer = await r.client.create_buffer(
            {
                "buffer_id": f"bp-{uuid.uuid4().hex[:6]}",
                "num_in_flight": 10,
                "num_samples": 1,
                "adapt_in_flight": True,
                "drop_zero_variance": False,
            }
        )
        await buffer.push(
            [
                task(f"bpb-{uuid.uuid4().hex[:6]}-{i}", f"sleep 2.{tag:05d}", 1, timeout_s=5)
                for i in range(8)
            ]
        )
        most_running, stats = 0, await buffer.stats()
        deadline = time.monotonic() + 240
        while stats.state_counters.get("num_groups_finished", 0) < 8:
            assert time.monotonic() < deadline, f"groups not finished: {stats}"
            most_running = max(most_running, len(stats.running))
            await asyncio.sleep(0.1)
            stats = await buffer.stats()
        await buffer.close()
    print(
        f"\nbuffer: num_in_flight 10, observed {stats.observed_sessions} sessions at once, "
        f"target {stats.in_flight_target} tasks; at most {most_running} running"
    )
    assert (stats.observed_sessions, stats.in_flight_target) == (BOUND, 4)
    assert most_running == 4
    assert stats.num_failed_by_kind == {}
