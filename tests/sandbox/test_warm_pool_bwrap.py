"""The warm pool with bwrap sandboxes: a claim only on an exact key, the session's files (in
a folder made for them, owned by the sandbox's user) and env applied at claim, a claimed
sandbox never handed out again, and nothing left after the pool's close. The bwrap escape
tests run again on pooled sandboxes in tests/sandbox/test_escape_bwrap_pooled.py.

Default tier (``sandbox``): real bwrap, under the sandbox fleet's default policy (so its
default limits: a cgroup and, with a root worker, a sized disk); about 1 s.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rolloutd.sandbox.warm_pool import WarmPool
from rolloutd.sandbox_policy import SandboxPolicy
from rolloutd.types import RuntimeSpec
from tests.sandbox.conftest import _runtime_pids, _wait_for

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.timeout(60),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]


async def test_a_bwrap_claim_matches_the_key_and_applies_the_session(tmp_path: Path) -> None:
    pool = WarmPool(tmp_path / "runtimes", SandboxPolicy(), size=1, grace_s=1.0)
    base = RuntimeSpec(type="bwrap", network="none")
    claimed = []
    try:
        assert await pool.claim(base) is None  # the key's first ask: a miss that fills
        assert await _wait_for(lambda: len(pool.runtime_ids()) == 1, 30)
        (warm_id,) = pool.runtime_ids()
        # control: a spec differing in a limit or the network misses
        assert await pool.claim(base.model_copy(update={"max_processes": 64})) is None
        assert await pool.claim(base.model_copy(update={"network": "gateway"})) is None
        session = base.model_copy(
            update={"files": {"sub/task.txt": "the task\n"}, "env": {"TASK_NAME": "pooled"}}
        )
        runtime = await pool.claim(session)
        assert runtime is not None and runtime.runtime_id == warm_id
        claimed.append(runtime)
        seen = await runtime.exec(
            'cat sub/task.txt; echo "$TASK_NAME"; stat -c %u sub sub/task.txt; id -u'
        )
        assert seen.exit_code == 0, seen
        words = seen.stdout.split()
        assert words[:3] == ["the", "task", "pooled"]
        assert words[3] == words[4] == words[5]  # folder and file are the command user's
        assert await _wait_for(lambda: len(pool.runtime_ids()) == 3, 30)  # refilled, 3 keys
        assert warm_id not in pool.runtime_ids()
        again = await pool.claim(base)
        assert again is not None and again.runtime_id != warm_id
        claimed.append(again)
        assert (await again.exec("ls")).stdout.split() == []  # nothing of the first session
    finally:
        await pool.close()
        for runtime in claimed:
            await runtime.stop()
    for runtime in claimed:
        assert _runtime_pids(runtime) == []
    assert pool.runtime_ids() == [] and len(pool) == 0
