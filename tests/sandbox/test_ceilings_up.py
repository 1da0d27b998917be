"""The ceilings on ``rolloutd up``'s stack, where the sandbox worker is a process of its own
(in the default tier's ``tests/sandbox/test_ceilings_bwrap.py`` the fleets run in the test's
process): the three cheats of that test, each after one real model call, end scored 0.0
naming their limit, honest sessions submitted beside them are scored 1.0, and the sandbox
worker that ran them all is the same live process afterwards, its memory far below what the
cheats asked for.

Acceptance tier: a ``LocalStack`` (Temporal, the four fleets as processes) on the session's
engine; 47 s here (load about 5).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from rolloutd.security.connection import connect_temporal
from rolloutd.settings import CommonSettings
from rolloutd.store import BlobStore
from rolloutd.trainer_client import RolloutClient
from tests.conftest import have_bwrap
from tests.sandbox.test_ceilings_bwrap import CHEATS, SLEEP_S, task
from tests.support.shell_calls import call
from tests.support.stacks import stack_on_engine

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.temporal,
    pytest.mark.engine,
    pytest.mark.sandbox,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not have_bwrap(), reason="no bubblewrap"),
]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


async def test_up_survives_the_cheats_and_scores_them_0(engine, monkeypatch) -> None:
    stack = stack_on_engine(engine.url, "up-ceilings")
    monkeypatch.setenv("ROLLOUTD_HOME", str(stack.home))
    await asyncio.to_thread(stack.start)
    try:
        assert stack.temporal is not None
        sandbox = stack.workers["sandbox"]
        client = await connect_temporal(CommonSettings(temporal_address=stack.temporal.address))
        rollout = RolloutClient(client, BlobStore(stack.store_url))
        tag = uuid.uuid4().hex[:6]
        jobs = {
            f"cheat-{name}": f"{call('hi')} && {{ {cheat}; }}; sleep {SLEEP_S}; true"
            for name, cheat in CHEATS.items()
        }
        jobs |= {f"honest-{i}": f"{call('hi')} && sleep 3 && {call('again')}" for i in range(2)}
        handles = {
            name: await rollout.submit(task(f"{name}-{tag}", command))
            for name, command in jobs.items()
        }
        results = {}
        for name, handle in handles.items():
            [session] = (await asyncio.wait_for(handle.result(), timeout=300)).sessions
            results[name] = session
        print({n: (s.reward, s.failure and s.failure.message) for n, s in results.items()})
        for limit in CHEATS:
            session = results[f"cheat-{limit}"]
            assert session.reward == 0.0 and session.failure is not None, session
            assert session.failure.policy_accountable and f"{limit}=" in session.failure.message
        for i in range(2):
            assert results[f"honest-{i}"].reward == 1.0, results[f"honest-{i}"]
        assert sandbox.poll() is None and stack.workers["sandbox"].pid == sandbox.pid
        assert rss_mb(sandbox.pid) < 2048
    finally:
        await asyncio.to_thread(stack.stop)
