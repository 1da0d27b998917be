"""Rollout statistics in the team's tracker (:mod:`rolloutd.trainer_client.tracking`).

The numbers from canned groups (rolloutd's own types); TensorBoard's event files read back
with TensorBoard's own reader (``event_accumulator``), an offline W&B run read back from its
``.wandb`` records, an MLflow run from its store; and a buffer on the shared fleets (real
Temporal, shell sessions in the local runtime) logged per batch. Default tier: seconds each
(the buffer test 2.6 s on the shared fleets, load 4-5).
"""

from __future__ import annotations

import json
import math
import sys
import uuid

import pytest

from rolloutd.trainer_client.tracking import (
    SAMPLE_COLUMNS,
    RolloutTracker,
    rollout_stats,
    session_url,
)
from rolloutd.types import FailureCause, PhaseTiming, SessionResult, SessionStatus, TaskResult
from rolloutd.workflows.buffer.models import Batch, BufferedGroup, BufferStats
from tests.support.bridges import have
from tests.support.tensorboard_events import events as tensorboard_events

#: how a tracker's package is installed, for the skips
EXTRA = "pip install 'rolloutd[{}]' (docs/trainers.md, 'Watching a run')"
VIEWER = "http://127.0.0.1:8400"


def session(index: int, reward: float | None, **fields) -> SessionResult:
    values: dict = {
        "session_id": f"t/{index}",
        "task_id": "t",
        "sample_index": index,
        "status": SessionStatus.COMPLETED,
        "reward": reward,
        "num_completions": 2,
        "num_trainable_tokens": 10,
        "phases": [
            PhaseTiming(phase="run", duration_s=1.5),
            PhaseTiming(phase="evaluate", duration_s=0.5),
        ],
    }
    values.update(fields)
    return SessionResult(**values)


def group() -> TaskResult:
    """Four sessions: 1.0, 0.0, a judge failure (no reward), a backend failure in run."""
    return TaskResult(
        task_id="t",
        sessions=[
            session(0, 1.0),
            session(1, 0.0, num_completions=4, num_trainable_tokens=30),
            session(
                2,
                None,
                status=SessionStatus.FAILED,
                failure=FailureCause(kind="evaluator", phase="judge", message="pool down"),
            ),
            session(
                3,
                None,
                status=SessionStatus.FAILED,
                failure=FailureCause(kind="backend", phase="run", message="502"),
            ),
        ],
        num_replacements=2,
        token_weighted_policy_version=1.5,
    )


def test_a_batchs_statistics() -> None:
    stats = rollout_stats(
        [group(), TaskResult(task_id="u", sessions=[session(0, 1.0)])],
        policy_version=3,
        start_versions=[1, 2],
        groups_left_out={"zero_variance": 1},
        rollout_wall_s=12.0,
    )
    # the failed sessions' missing rewards are never averaged in: 1.0, 0.0, 1.0
    assert stats.reward_mean == pytest.approx(2 / 3)
    assert stats.reward_std == pytest.approx(math.sqrt(2 / 9))
    assert stats.pass_rate == pytest.approx(2 / 3)
    assert (stats.num_groups, stats.num_sessions, stats.num_scored) == (2, 5, 3)
    # a judge's failure is counted apart from the evaluator's own, as every summary counts it
    assert stats.failures["evaluator/judge"] == 1 and stats.failures["evaluator"] == 0
    assert stats.failures["backend"] == 1
    assert stats.failures["sandbox"] == 0  # every kind, a continuous curve
    assert stats.num_replacements == 2
    assert stats.turns_per_session == pytest.approx((2 + 4 + 2 + 2 + 2) / 5)
    assert stats.tokens_per_session == pytest.approx((10 + 30 + 10 + 10 + 10) / 5)
    assert stats.session_wall_s == pytest.approx(2.0)
    # token-weighted for the first group (3 - 1.5), the start version for the second (3 - 2)
    assert (stats.staleness_mean, stats.staleness_max) == (pytest.approx(1.25), 1.5)
    metrics = stats.metrics()
    assert metrics["rolloutd/failures/evaluator/judge"] == 1.0
    assert metrics["rolloutd/groups_left_out"] == 1.0
    assert metrics["rolloutd/groups_left_out/zero_variance"] == 1.0
    assert metrics["rolloutd/rollout_wall_s"] == 12.0 and metrics["rolloutd/policy_version"] == 3
    # control: a batch without a scored session and without a version logs no reward, no
    # pass rate and no staleness (never 0.0)
    empty = rollout_stats([TaskResult(task_id="v", sessions=[group().sessions[3]])]).metrics()
    for name in ("reward_mean", "reward_std", "pass_rate", "staleness_mean", "policy_version"):
        assert f"rolloutd/{name}" not in empty
    assert empty["rolloutd/failures/backend"] == 1.0


def test_unknown_and_missing_trackers_are_named(monkeypatch, tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown tracker"):
        RolloutTracker("neptune", log_dir=tmp_path)
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed
    with pytest.raises(ImportError, match=r"rolloutd\[mlflow\]"):
        RolloutTracker("mlflow", log_dir=tmp_path)
    assert RolloutTracker([], log_dir=tmp_path).log_batch([group()], step=1).num_groups == 1


def batch(step: int) -> Batch:
    """A buffer's batch as the trainer client hands it: the group read, its start version."""
    return Batch(
        batch_id=f"b{step}",
        groups=[BufferedGroup.model_validate({"group": group(), "policy_version": 1})],
        policy_version=step + 1,
    )


def drops(n: int) -> BufferStats:
    return BufferStats(buffer_id="b", state_counters={"num_dropped_zero_variance": n})


@pytest.mark.skipif(not have("tensorboard"), reason=EXTRA.format("tensorboard"))
def test_tensorboard_event_files_hold_the_series(tmp_path) -> None:
    with RolloutTracker("tensorboard", log_dir=tmp_path, viewer_url=VIEWER) as tracker:
        for step, dropped in ((1, 2), (2, 3)):
            tracker.log_batch(batch(step), step=step, buffer_stats=drops(dropped), samples=3)
    events = tensorboard_events(tmp_path)

    def series(name: str) -> list[tuple[int, float]]:
        return [(e.step, e.value) for e in events.Scalars(f"rolloutd/{name}")]

    assert series("reward_mean") == [(1, 0.5), (2, 0.5)]
    assert series("pass_rate") == [(1, 0.5), (2, 0.5)]
    assert series("failures/evaluator/judge") == [(1, 1.0), (2, 1.0)]
    assert series("failures/backend") == [(1, 1.0), (2, 1.0)]
    assert series("failures/sandbox") == [(1, 0.0), (2, 0.0)]
    assert series("replacements") == [(1, 2.0), (2, 2.0)]
    # staleness against the batch's version at hand-out: 2 - 1.5, then 3 - 1.5
    assert series("staleness_mean") == [(1, 0.5), (2, 1.5)]
    assert series("policy_version") == [(1, 2.0), (2, 3.0)]
    # what the buffer dropped since the last batch: 2, then 1 more
    assert series("groups_left_out/zero_variance") == [(1, 2.0), (2, 1.0)]
    for name in ("reward_std", "turns_per_session", "tokens_per_session", "session_wall_s"):
        assert [s for s, _ in series(name)] == [1, 2], name
    (first, _) = events.Tensors("rolloutd/samples")
    table = first.tensor_proto.string_val[0].decode()
    assert table.splitlines()[0] == "| " + " | ".join(SAMPLE_COLUMNS) + " |"
    assert f"[open]({session_url(VIEWER, 't/2')})" in table
    assert "| evaluator/judge |" in table


@pytest.mark.skipif(not have("wandb"), reason=EXTRA.format("wandb"))
def test_an_offline_wandb_run_holds_the_series(tmp_path, monkeypatch) -> None:
    import wandb

    from tests.support.wandb_records import history, run_file

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb.teardown()  # wandb reads its environment once per process: start afresh
    with RolloutTracker(
        "wandb", log_dir=tmp_path, run_name="t", config={"lr": 1e-5}, viewer_url=VIEWER
    ) as tracker:
        for step in (1, 2):
            tracker.log_batch(batch(step), step=step, samples=3)
    rows = history(run_file(tmp_path))
    assert sorted(rows) == [1, 2]
    for step in (1, 2):
        assert rows[step]["rolloutd/reward_mean"] == 0.5
        assert rows[step]["rolloutd/failures/evaluator/judge"] == 1
        assert rows[step]["rolloutd/policy_version"] == step + 1
        assert rows[step]["rolloutd/samples/_type"] == "table-file"
    table = json.loads(
        (run_file(tmp_path).parent / "files" / rows[2]["rolloutd/samples/path"]).read_text()
    )
    assert table["columns"] == list(SAMPLE_COLUMNS)
    assert [row[-1] for row in table["data"]] == [session_url(VIEWER, f"t/{i}") for i in range(3)]


@pytest.mark.skipif(not have("mlflow"), reason=EXTRA.format("mlflow"))
def test_an_mlflow_run_holds_the_series(tmp_path, monkeypatch) -> None:
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with RolloutTracker("mlflow", log_dir=tmp_path, run_name="t") as tracker:
        for step in (1, 2):
            tracker.log_batch(batch(step), step=step, samples=2)
        run_id = tracker.writers["mlflow"].run.info.run_id
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    history = client.get_metric_history(run_id, "rolloutd/reward_mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 0.5)]
    assert [
        (m.step, m.value)
        for m in client.get_metric_history(run_id, "rolloutd/failures/evaluator/judge")
    ] == [(1, 1.0), (2, 1.0)]
    assert [a.path for a in client.list_artifacts(run_id, "rolloutd/samples")] == [
        "rolloutd/samples/step-1.json",
        "rolloutd/samples/step-2.json",
    ]


@pytest.mark.temporal
@pytest.mark.engine
@pytest.mark.skipif(not have("tensorboard"), reason=EXTRA.format("tensorboard"))
async def test_a_buffer_driven_run_logs_per_batch(fleets, tmp_path) -> None:
    """A buffer's consumer: two takes of one group, each logged with the buffer's stats; a
    zero-variance group the buffer dropped shows as left out, once."""
    from rolloutd.trainer_client import RolloutClient
    from tests.support.buffer_tasks import all_win, first_wins, local_task, poll

    u = uuid.uuid4().hex[:6]
    client = RolloutClient(fleets.client)
    buffer = await client.create_buffer(
        {"buffer_id": f"track-{u}", "num_in_flight": 3, "num_samples": 4}
    )
    await buffer.push(
        [
            local_task(f"a-{u}", all_win()),  # zero variance: dropped
            local_task(f"b-{u}", first_wins(tmp_path / "b")),
            local_task(f"c-{u}", first_wins(tmp_path / "c")),
        ]
    )
    taken = []
    try:
        with RolloutTracker("tensorboard", log_dir=tmp_path / "tb") as tracker:
            for step in (1, 2):
                taken.append(await buffer.take(1, timeout_s=120))
                await buffer.ack(taken[-1].batch_id)
                await buffer.set_policy_version(step)
                # by the second batch the all-win group has been dropped
                stats = await poll(
                    buffer.stats,
                    lambda s, step=step: (
                        step == 1 or s.state_counters.get("num_dropped_zero_variance") == 1
                    ),
                    what="the all-win group dropped",
                )
                tracker.log_batch(taken[-1], step=step, buffer_stats=stats)
    finally:
        await buffer.close()
    events = tensorboard_events(tmp_path / "tb")

    def series(name: str) -> list[tuple[int, float]]:
        return [(e.step, e.value) for e in events.Scalars(f"rolloutd/{name}")]

    # one winner of four in each mixed group
    assert series("reward_mean") == [(1, 0.25), (2, 0.25)]
    assert series("pass_rate") == [(1, 0.25), (2, 0.25)]
    assert series("num_sessions") == [(1, 4.0), (2, 4.0)]
    assert [v for _, v in series("policy_version")] == [b.policy_version for b in taken]
    # the all-win group was dropped once (DAPO), logged with the first batch after the drop
    assert sum(v for _, v in series("groups_left_out/zero_variance")) == 1.0
    assert [s for s, _ in series("groups_left_out")] == [1, 2]
