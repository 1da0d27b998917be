"""The SkyRL bridge against skyrl 0.4.0 itself, in skyrl's own Python 3.12 environment
(scripts/setup_trainers.sh).

``tests/support/skyrl_child.py`` runs there: SkyRL's ``GeneratorInput`` (3 instances x 2
repetitions, ``TrajectoryID``s), ``RolloutdGenerator.generate`` against the fleets of this
test session (the shell harness in bwrap, Qwen2.5-Coder-0.5B on llama-server) and SkyRL's own
``validate_generator_output``. One instance's evaluator raises (an ``evaluator`` failure
cause, no replacement): its group must reach SkyRL masked whole and counted. About 1-3
minutes.

``test_skyrl_grpo_gives_a_group_with_a_failed_session_no_advantage`` puts the generator's
answer for canned groups (the stand-in client of ``tests/support/bridges.py``) through SkyRL's
own padding and GRPO estimator (``tests/support/skyrl_advantage_child.py``): seconds, no
fleets.

Not exercised: SkyRL's trainer (Ray, FSDP/Megatron workers, a GPU); only the generator
interface, SkyRL's own check of its output, its padding and its advantage estimator.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.support.bridges import INSTALL, ask_task, trainer_python

ROOT = Path(__file__).resolve().parents[3]
CHILD = ROOT / "tests" / "support" / "skyrl_child.py"
ADVANTAGE_CHILD = ROOT / "tests" / "support" / "skyrl_advantage_child.py"
SKYRL = trainer_python("skyrl")

pytestmark = [
    # the trainer packages come from scripts/setup_trainers.sh, which README's acceptance
    # command runs first
    pytest.mark.acceptance,
    pytest.mark.trainers,
    pytest.mark.skipif(
        not SKYRL.exists()
        or subprocess.run(
            [SKYRL, "-c", "import skyrl.train.utils.trainer_utils"], capture_output=True
        ).returncode
        != 0,
        reason=f"skyrl's Python 3.12 environment ({SKYRL}) is missing; {INSTALL}",
    ),
]


@pytest.mark.temporal
@pytest.mark.engine
@pytest.mark.sandbox
@pytest.mark.timeout(900)
async def test_skyrl_generate_returns_a_generator_output_skyrl_accepts(fleets, temporal_server):
    """SkyRL's validate_generator_output accepts the bridge's answer; its rows are the
    sessions' traces in the input's order; the group with a failed session is masked whole
    (all-zero loss masks) and counted. About 1-3 minutes."""
    from rolloutd.engine.models import load_tokenizer
    from rolloutd.store import BlobStore
    from rolloutd.trainer_client import RolloutClient

    prefix = f"skyrl-{uuid.uuid4().hex[:6]}"
    failing = {
        **ask_task(),
        "evaluator": {"type": "tests_raising"},
        "max_replacements": 0,
    }
    tasks = {
        "fruit": ["Name a fruit. One word.", ask_task()],
        "planet": ["Name a planet. One word.", ask_task()],
        "broken": ["Name a metal. One word.", failing],
    }
    eos = load_tokenizer("qwen2.5-coder-0.5b").eos_token_id
    proc = await asyncio.create_subprocess_exec(
        str(SKYRL),
        str(CHILD),
        "--temporal",
        temporal_server.address,
        "--store",
        fleets.store_url,
        "--tasks",
        json.dumps(tasks),
        "--n",
        "2",
        "--eos",
        str(eos),
        "--task-prefix",
        prefix,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        start_new_session=True,
        limit=2**26,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 800)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, out[-3000:]
    report = json.loads(out.decode().strip().splitlines()[-1])
    assert report["validated"]
    output = report["output"]
    assert output["trajectory_ids"] == [
        [i, r] for i in ("fruit", "planet", "broken") for r in (0, 1)
    ]
    client = RolloutClient(fleets.client, BlobStore(fleets.store_url))
    for number, instance in enumerate(("fruit", "planet", "broken")):
        group = await client.result(f"{prefix}-1-{number}")
        rows = [2 * number, 2 * number + 1]
        for row, session in zip(rows, sorted(group.sessions, key=lambda s: s.sample_index)):
            if instance == "broken":
                # left out: one masked end-of-sequence token, no reward of the session
                assert session.failure is not None and session.failure.kind == "evaluator"
                assert output["prompt_token_ids"][row] == output["response_ids"][row] == [eos]
                assert output["loss_masks"][row] == [0]
                assert output["rewards"][row] == 0.0
                assert output["stop_reasons"][row] == "failed"
            else:
                (trace,) = client.trajectory(session).traces
                assert output["prompt_token_ids"][row] == trace.prompt_ids
                assert output["response_ids"][row] == trace.response_ids
                assert output["rollout_logprobs"][row] == trace.response_logprobs
                assert session.failure is None, session.error
                assert output["loss_masks"][row] == trace.loss_mask
                assert output["rewards"][row] == session.reward == 1.0
                assert output["stop_reasons"][row] in ("stop", "length")
    stats = report["stats"]
    assert stats["num_groups"] == 3 and stats["num_groups_masked"] == 1
    assert stats["num_sessions_left_out"] == 2
    assert stats["left_out_by_reason"] == {"evaluator": 2}
    assert output["rollout_metrics"]["rolloutd/num_groups_masked"] == 1


@pytest.mark.timeout(300)
def test_skyrl_grpo_gives_a_group_with_a_failed_session_no_advantage():
    """SkyRL's GRPO (its registry's ``grpo``, grouped by instance) over the generator's answer:
    the group with a session that failed for the infrastructure reaches SkyRL masked whole
    (reward 0.0 and loss mask 0 on every row), so every row of it gets advantage 0 and no
    sibling gains from the failure; the whole group's advantages are the ones it gets alone,
    and it has a signal (they differ)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run(
        [SKYRL, ADVANTAGE_CHILD], env=env, capture_output=True, text=True, timeout=240
    )
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    broken = [i for i, (uid, _, _) in enumerate(report["rows"]) if uid == "broken"]
    whole = [i for i, (uid, _, _) in enumerate(report["rows"]) if uid == "whole"]
    assert [report["rows"][i][1:] for i in broken] == [[0.0, 0]] * 4
    assert [report["all"][i] for i in broken] == [0.0] * 4
    assert [report["all"][i] for i in whole] == report["whole_alone"]
    assert len(set(report["whole_alone"])) > 1
    assert report["stats"]["num_groups_masked"] == 1
    assert report["stats"]["left_out_by_reason"] == {"backend": 1}
