"""``rolloutd reverify`` over a stored batch of the Harbor examples scored by the old verifier,
through the whole stack on podman (real Temporal, the four fleets in a namespace of their own,
real llama-server behind the gateway).

The batch runs with ``store_final_state`` and the ``harbor`` verifier of revision 1, reproduced
as the registered evaluator ``tests_harbor_r1`` (:class:`tests.support.old_evaluators.HarborR1`:
rolloutd's steps before the fix, which carry every change and run the agent's programs). Each
session makes one real model call first. Cheats: a fake ``python3`` and a fake ``cat`` first on
``PATH``, a ``pytest.py`` in the workdir of fix-word-count, each earning 1.00 from the old
verifier; honest sessions: the oracle on every example (1.00), a harness that makes its call and
does nothing (0.00), an honest wrong answer (0.00).

``rolloutd reverify --results FILE --evaluator tests_harbor_r1=harbor`` (the CLI, in a process of
its own) then restores each session's final state (its workdir and its container's system
changes) into a fresh container of the task's image and runs today's ``harbor`` verifier: the
cheats' records say 0.00 (a tamper finding, or the changes not carried named), the honest ones
the same reward as before; no ``reward`` is rewritten. Measured (2026-12-06, load average
5-9 on 2 cores, images cached): the batch of 11 sessions 37 s, the reverify CLI 11-17 s (final
states of 20-100 KiB), 77 s in all with the fleets' start.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time

import pytest

from rolloutd.activities.models import ReverifySummary
from rolloutd.final_state import FinalState
from rolloutd.store import final_state_key, trajectory_key
from rolloutd.tasksets import read_task_set
from rolloutd.types import TaskRequest, Trajectory
from tests.support.harbor_cheats import fake_on_path, shell
from tests.support.taskset_stack import Rig, report, run_all

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.temporal,
    pytest.mark.engine,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(shutil.which("podman") is None, reason="needs podman"),
]

#: the cheats, by name: (task, what the harness does after its model call, a path the new
#: record names: a finding's, or one not carried)
CHEATS = {
    "fake-python3": ("fix-word-count", fake_on_path("python3"), "/usr/local/bin/python3"),
    "fake-cat": ("fix-word-count", fake_on_path("cat"), "/usr/local/bin/cat"),
    "pytest-py": (
        "fix-word-count",
        "printf 'import sys\\nsys.exit(0)\\n' > pytest.py\n"
        "python3 -m pytest -q -p no:cacheprovider /tests/none.py",
        "/app/textstats/pytest.py",
    ),
}


def old_task(rig: Rig, name: str, harness: dict, prefix: str) -> TaskRequest:
    """A Harbor example scored by the old verifier, its final state stored."""
    (task,) = read_task_set(
        "harbor",
        rig.tasks / "harbor" / name,
        {
            "harness": harness,
            "task_id_prefix": prefix,
            "max_replacements": 0,
            "store_final_state": True,
        },
    )
    old = task.evaluator.model_copy(update={"type": "tests_harbor_r1"})
    return task.model_copy(update={"evaluator": old})


async def test_reverify_turns_the_old_verifiers_cheats_to_zero(rig, temporal_server, tmp_path):
    names = sorted(p.name for p in (rig.tasks / "harbor").iterdir() if p.is_dir())
    cheats = {
        f"cheat-{name}-": old_task(rig, task, shell(body), f"cheat-{name}-")
        for name, (task, body, _) in CHEATS.items()
    }
    honest = [
        *(old_task(rig, n, {"type": "oracle"}, "oracle-") for n in names),
        old_task(rig, "fix-word-count", shell("true"), "nothing-"),
        old_task(
            rig,
            "fix-word-count",
            shell("sed -i 's/text.split(\" \")/text.split()/' textstats/counts.py"),
            "wrong-",
        ),
    ]
    t0 = time.monotonic()
    results = await run_all(rig, [*cheats.values(), *honest])
    batch_s = time.monotonic() - t0
    report("old", results)
    old = {}
    for task, group, _ in results:
        (session,) = group.sessions
        assert session.failure is None, (task.task_id, session.error)
        if not task.task_id.startswith("oracle-"):  # the oracle calls no model
            assert session.num_completions >= 1, task.task_id
        assert session.evaluation is not None and session.evaluation.version == "r1-reproduced"
        old[session.session_id] = (task, session)
    cheat_ids = {s.session_id for t, s in old.values() if t.task_id.startswith("cheat-")}
    for task, session in old.values():
        want = 1.0 if task.task_id.startswith(("cheat-", "oracle-")) else 0.0
        assert session.reward == want, (task.task_id, session.evaluation)

    results_file = tmp_path / "results.jsonl"
    results_file.write_text("".join(g.model_dump_json() + "\n" for _, g, _ in results))
    out = tmp_path / "summary.json"
    argv = [
        sys.executable,
        "-m",
        "rolloutd.cli",
        "reverify",
        "--results",
        str(results_file),
        "--evaluator",
        "tests_harbor_r1=harbor",
        "--out",
        str(out),
        "--address",
        temporal_server.address,
        "--store-url",
        rig.store.url,
    ]
    env = {"ROLLOUTD_TEMPORAL_NAMESPACE": rig.client.client.namespace}
    t0 = time.monotonic()
    done = await asyncio.to_thread(
        subprocess.run,
        argv,
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, **env},
    )
    reverify_s = time.monotonic() - t0
    print(done.stdout, done.stderr[-3000:], sep="\n")
    sizes = [rig.store.get_model(final_state_key(sid), FinalState).num_bytes for sid in sorted(old)]
    print(
        f"batch of {len(old)} sessions {batch_s:.0f} s, reverify {reverify_s:.0f} s; final "
        f"states {min(sizes) / 1024:.0f}-{max(sizes) / 1024:.0f} KiB"
    )
    assert done.returncode == 0, done.stderr[-3000:]

    summary = ReverifySummary.model_validate_json(out.read_text())
    assert summary.counts == {"rescored": len(old)}, summary.counts
    assert {o.session_id for o in summary.changed} == cheat_ids
    for outcome in summary.sessions:
        task, session = old[outcome.session_id]
        assert outcome.new_evaluator == "harbor", task.task_id
        assert outcome.new_version and outcome.new_version.endswith("+r2"), task.task_id
        if outcome.session_id in cheat_ids:
            assert (outcome.old_reward, outcome.new_reward) == (1.0, 0.0), task.task_id
            named = next(
                p for n, (_, _, p) in CHEATS.items() if task.task_id.startswith(f"cheat-{n}-")
            )
            assert named in (outcome.reason or ""), (task.task_id, outcome.reason)
        else:
            assert outcome.new_reward == session.reward and not outcome.changed, task.task_id
        trajectory = rig.store.get_model(trajectory_key(outcome.session_id), Trajectory)
        assert trajectory.reward == session.reward and trajectory.evaluation == session.evaluation
        (record,) = trajectory.rescores
        assert record.source == "reverify" and record.reward == outcome.new_reward
        assert record.tamper is not None, task.task_id  # the new verifier examined the state
    (pair,) = summary.by_version
    assert (pair.old_version, pair.num_sessions, pair.num_changed, pair.num_lower) == (
        "r1-reproduced",
        len(old),
        len(cheat_ids),
        len(cheat_ids),
    )
