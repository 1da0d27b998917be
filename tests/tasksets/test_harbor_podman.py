"""Harbor tasks on the real podman runtime, without Temporal: the agent's container built from
the task's Dockerfile, a harness in it, then the ``harbor`` verifier in a fresh container.

Figures printed for the note: reward and wall time per task and harness.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest

from rolloutd.evaluators import get_evaluator
from rolloutd.evaluators.base import EvaluationContext
from rolloutd.sandbox.harnesses import HarnessContext, get_harness
from rolloutd.sandbox.runtimes import create_runtime
from rolloutd.sandbox_policy import SandboxPolicy
from rolloutd.tasksets import read_task_set
from rolloutd.types import SessionStatus, TaskRequest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "harbor"
NOP = "true"
#: the adversarial agent: it cannot see tests/, so it plants a reward, writes its own
#: /tests/test.sh, "fixes" the package's own visible tests, then deletes /tests
ADVERSARY = (
    "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt && "
    "echo '{\"reward\": 1}' > /logs/verifier/reward.json && "
    "mkdir -p /tests && printf '#!/bin/sh\\necho 1 > /logs/verifier/reward.txt\\n' "
    "> /tests/test.sh && chmod +x /tests/test.sh && "
    "for f in tests/*.py; do printf 'def test_ok():\\n    assert True\\n' > $f; done; "
    "rm -rf /tests"
)

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.skipif(shutil.which("podman") is None, reason="needs podman"),
]


@pytest.fixture
def runtime_root():
    """A short runtime root: a runtime's folder holds unix sockets (108-byte paths)."""
    root = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def task_sets(tmp_path_factory) -> Path:
    """The Harbor examples copied below a folder the test's sandbox policy allows."""
    root = tmp_path_factory.mktemp("harbor") / "tasks"
    shutil.copytree(EXAMPLES, root)
    return root


def policy(root: Path) -> SandboxPolicy:
    """The operator's policy of these tests: podman, build contexts and tests/solutions from
    the copied tasks, and the network for builds (the tasks install Debian packages)."""
    return SandboxPolicy(
        runtimes=["podman"],
        networks=["gateway", "none"],
        image_roots=[str(root)],
        upload_sources=[str(root)],
        build_network=True,
    )


async def run_one(task: TaskRequest, runtime_root: Path, policy: SandboxPolicy) -> dict:
    """Provision, run the harness to its end, verify; the reward and the wall time."""
    t0 = time.monotonic()
    runtime = create_runtime(task.runtime, f"t-{task.task_id}"[:24], runtime_root, policy=policy)
    try:
        await runtime.start()
        adapter = get_harness(task.harness)
        ctx = HarnessContext(
            instruction=task.instruction,
            openai_base_url="http://127.0.0.1:9/v1",
            api_key="unused",
            model="none",
            workdir=runtime.workdir,
        )
        command = await adapter.prepare(runtime, ctx)
        proc = await runtime.spawn(command.command, env=command.env, cwd=command.cwd)
        exit_code = await proc.wait(task.phases.run_s)
        evaluator = get_evaluator(task.evaluator)
        check = await evaluator.collect(runtime)  # type: ignore[attr-defined]
    finally:
        await runtime.stop()
    outcome = await evaluator.evaluate(
        EvaluationContext(
            task_id=task.task_id,
            session_id="s",
            status=SessionStatus.COMPLETED,
            harness_exit_code=exit_code,
            artifacts={"check": check},
        )
    )
    return {"reward": outcome.reward, "wall_s": time.monotonic() - t0, "exit": exit_code}


async def test_oracle_earns_1_and_nop_0_on_every_example(task_sets, runtime_root):
    """Every examples/harbor task, its oracle (solution/solve.sh) and a harness that does
    nothing: rewards 1.00 and 0.00. Measured: 50 s with the images built (3-5 s a run), about
    3 min more when the six images are built first (apt in four of them)."""
    rules = policy(task_sets)
    rewards: dict[tuple[str, str], float | None] = {}
    for harness in ({"type": "oracle"}, {"type": "shell", "command": NOP}):
        for task in read_task_set("harbor", task_sets, {"harness": harness}):
            got = await run_one(task, runtime_root, rules)
            rewards[(task.task_id, harness["type"])] = got["reward"]
            print(
                f"{task.task_id} {harness['type']}: reward {got['reward']:.2f}, "
                f"harness exit {got['exit']}, {got['wall_s']:.1f} s"
            )
    assert len(rewards) >= 12
    for (task_id, harness), reward in rewards.items():
        assert reward == (1.0 if harness == "oracle" else 0.0), (task_id, harness)


async def test_adversarial_agent_earns_0(task_sets, runtime_root):
    """An agent that writes /logs/verifier/reward.txt = 1 (and reward.json), plants its own
    /tests/test.sh, rewrites the package's visible tests and deletes /tests gets 0.00, with the
    image built. Measured: 5 s."""
    rules = policy(task_sets)
    (task,) = read_task_set(
        "harbor",
        task_sets / "fix-word-count",
        {"harness": {"type": "shell", "command": ADVERSARY}},
    )
    got = await run_one(task, runtime_root, rules)
    print(f"adversary on fix-word-count: reward {got['reward']:.2f}, {got['wall_s']:.1f} s")
    assert got["exit"] == 0  # the attack itself ran through
    assert got["reward"] == 0.0


async def test_fresh_runtime_sees_the_workdir_and_carries_system_changes_on_request(
    task_sets, runtime_root
):
    """By default the fresh container is the task's image plus the agent's workdir: a file the
    agent made in /opt, a file it deleted in /etc are the image's again, the workdir's new and
    deleted files are the agent's. With carry_system_changes the changes outside the workdir
    are carried too, with the container's own owners (a new user's file) and through a pack
    of the worker's own bound (a bound below the pack: not carried, said). Its HOME never, and
    nothing of the agent's runs there. Measured: 1.5-2.3 s."""
    from rolloutd.sandbox.snapshot import FreshRuntime

    (task,) = read_task_set(
        "harbor", task_sets / "csv-column-stats", {"harness": {"type": "shell", "command": NOP}}
    )
    runtime = create_runtime(task.runtime, "t-fresh", runtime_root, policy=policy(task_sets))
    await runtime.start()
    look = (
        "stat -c '%U %n' /opt/tool/VERSION 2>/dev/null || echo no-tool; "
        "test -e /etc/issue && echo issue || echo no-issue; test -e $HOME/key || echo no-key; "
        "cat /app/new.csv; test -e /app/sample.csv || echo no-sample; "
        "pgrep -x sleep || echo no-sleep; echo $X"
    )
    try:
        setup = await runtime.exec(
            "useradd -M builder && mkdir -p /opt/tool && echo v1 > /opt/tool/VERSION && "
            "chown -R builder /opt/tool && rm /etc/issue && echo secret > $HOME/key && "
            "echo new > /app/new.csv && rm /app/sample.csv && (sleep 300 &)"
        )
        assert setup.exit_code == 0, setup.stderr
        seen = {}
        for carry in (False, True):
            fresh = FreshRuntime(
                runtime, network="none", env={"X": "1"}, carry_system_changes=carry
            )
            async with fresh as verifier:
                seen[carry] = (await verifier.exec(look)).stdout.split("\n")[:7]
                assert fresh.report is not None and not fresh.report.tampered, fresh.report
                assert fresh.report.carried_system_changes is carry
        small = FreshRuntime(
            runtime, network="none", env={}, carry_system_changes=True, max_pack_bytes=1000
        )
        async with small as verifier:
            assert small.pack_too_large and "1000 bytes" in small.pack_too_large
            assert (await verifier.exec("test -e /opt/tool || echo none")).stdout == "none\n"
    finally:
        await runtime.stop()
    assert seen[False] == ["no-tool", "issue", "no-key", "new", "no-sample", "no-sleep", "1"], seen
    assert seen[True] == [
        "builder /opt/tool/VERSION",
        "no-issue",
        "no-key",
        "new",
        "no-sample",
        "no-sleep",
        "1",
    ], seen
