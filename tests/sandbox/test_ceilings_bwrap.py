"""The operator's ceilings hold while a session runs, on bwrap with the default sandbox policy.

Each cheat below is a default task (it asks no limit: the policy's defaults apply where its
runtime starts) whose shell harness first makes one real model call through the gateway
(llama-server), then tries to take the host: a 50 GB ``fallocate`` in the workspace, 6 GB into
``/tmp``, a fork bomb. Each script would exit 0 after a sleep, which ``session_completed``
scores 1.0: the sandbox stops it at the ceiling instead, and the session is the policy's
(``harness``/``run``, not retryable) with reward 0.0 and the limit named in its cause and in
its evaluation record. The same cheat before any answered call gets no reward and no
replacement. Honest sessions run beside the cheats on the same host, and another one after
them: each is scored 1.0, so the worker (these fleets run in the test process) and the other
sessions went on.

Default tier: 55 s on 2 cores with the Temporal server and engine starting (load about 2).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from rolloutd.sandbox_policy import DEFAULT_LIMITS
from rolloutd.store import BlobStore, artifact_key
from rolloutd.trainer_client import RolloutClient
from rolloutd.types import RuntimeSpec, SessionResult
from tests.conftest import have_bwrap
from tests.support.shell_calls import call

pytestmark = [
    pytest.mark.temporal,
    pytest.mark.engine,
    pytest.mark.sandbox,
    pytest.mark.skipif(not have_bwrap(), reason="no bubblewrap"),
]

#: what each script does after its model call; then it sleeps and exits 0
CHEATS = {
    "disk_mb": "fallocate -l 50G big",
    "tmpfs_mb": "head -c 6G /dev/zero > /tmp/x",
    "max_processes": "bash -c ':(){ :|:& };:'",
}
#: seconds each cheat sleeps before exiting 0: the ceiling must end it well before
SLEEP_S = 60


def task(task_id: str, command: str) -> dict:
    return {
        "task_id": task_id,
        "instruction": "test",
        "harness": {"type": "shell", "command": command},
        "runtime": {"type": "bwrap"},
    }


async def run(client: RolloutClient, task_id: str, command: str) -> tuple[SessionResult, float]:
    t0 = time.monotonic()
    handle = await client.submit(task(task_id, command))
    [session] = (await handle.result()).sessions
    return session, time.monotonic() - t0


async def test_each_ceiling_ends_its_session_scored_0_naming_the_limit(fleets) -> None:
    client = RolloutClient(fleets.client, BlobStore(fleets.store_url))
    tag = uuid.uuid4().hex[:6]
    honest = f"{call('hi')} && sleep 5 && {call('again')}"
    jobs = {
        f"cheat-{name}": f"{call('hi')} && {{ {cheat}; }}; sleep {SLEEP_S}; true"
        for name, cheat in CHEATS.items()
    }
    jobs["cheat-disk-no-call"] = f"{CHEATS['disk_mb']}; sleep {SLEEP_S}; true"
    jobs |= {f"honest-{i}": honest for i in range(2)}
    names = list(jobs)
    results = await asyncio.gather(*(run(client, f"{name}-{tag}", jobs[name]) for name in names))
    by_name = dict(zip(names, results, strict=True))

    def ran_s(session: SessionResult) -> float:
        """Seconds the harness ran (the sandbox's ``harness`` artifact)."""
        return client.store.get_json(artifact_key(session.session_id, "harness"))["duration_s"]

    # the outcomes, the harness's and the session's seconds, for the note
    print(
        {
            n: (s.reward, s.failure and s.failure.message, ran_s(s), d)
            for n, (s, d) in by_name.items()
        }
    )

    for limit in CHEATS:
        session, duration = by_name[f"cheat-{limit}"]
        failure = session.failure
        assert failure is not None, session
        assert (failure.kind, failure.phase) == ("harness", "run"), failure
        assert failure.policy_accountable and not failure.retryable, failure
        assert f"{limit}={getattr(DEFAULT_LIMITS, limit)} reached" in failure.message, failure
        assert session.reward == 0.0 and session.num_completions >= 1, session
        assert session.evaluation is not None and session.evaluation.forced
        assert limit in (session.evaluation.reason or ""), session.evaluation
        # stopped at the ceiling, not at its end: the harness ran for seconds, not SLEEP_S
        assert ran_s(session) < SLEEP_S / 2, (limit, ran_s(session), duration)

    session, _ = by_name["cheat-disk-no-call"]
    assert session.reward is None and session.num_completions == 0, session
    assert session.failure is not None and session.failure.kind == "harness"
    assert not session.failure.retryable and not session.failure.policy_accountable
    assert (
        "disk_mb=" in session.failure.message and "before any answered" in session.failure.message
    )

    for i in range(2):  # beside the cheats, on the same host
        session, _ = by_name[f"honest-{i}"]
        assert session.failure is None and session.reward == 1.0, session
        assert session.num_completions == 2
    # and after them: the worker goes on
    session, _ = await run(client, f"after-{tag}", f"{call('after')} && echo ok > out.txt")
    assert session.failure is None and session.reward == 1.0, session


async def test_without_a_sized_disk_no_file_grows_past_disk_mb_and_the_folder_is_measured(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback of a host that cannot mount a sized disk (no root, no free loop device):
    RLIMIT_FSIZE stops a 50 GB ``fallocate`` at once (SIGXFSZ), and files that together pass
    ``disk_mb`` are seen by the measurement. The control: under it, nothing is reached."""
    from rolloutd.sandbox.runtimes import create_runtime, exec_runtime
    from rolloutd.sandbox_policy import SandboxPolicy

    monkeypatch.setattr(exec_runtime, "sized_disks_available", lambda: False)
    spec = {"type": "bwrap", "disk_mb": 64}
    runtime = create_runtime(
        RuntimeSpec.model_validate(spec), "nodisk", tmp_path / "rt", policy=SandboxPolicy()
    )
    await runtime.start()
    try:
        assert runtime.disk is None
        big = await runtime.exec("fallocate -l 50G big; echo rc=$?; stat -c %s big")
        # the kernel's SIGXFSZ ends it (128 + 25); nothing was allocated past the limit
        assert big.stdout.split() == ["rc=153", "0"], big
        small = await runtime.exec("head -c 40M /dev/zero > a")
        assert small.exit_code == 0 and runtime.ceilings_reached() == {}
        await runtime.exec("head -c 40M /dev/zero > b")
        assert runtime.ceilings_reached()["disk_mb"].startswith("disk_mb=64 reached")
    finally:
        await runtime.stop()
